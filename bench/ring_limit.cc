// gradsync-ring-limit: what a perfect TCP ring could do on this host.
//
// Ring mode (default). The parent opens one loopback listener per rank, then
// forks --ranks children. Rank r connects --streams sockets to rank r+1 (its
// right neighbour) and accepts as many from rank r-1 (its left one), so every
// ring link is S sockets carrying one direction. For each message size B it
// then moves exactly the bytes of a ring allreduce, without reducing them:
//
//   * the B-byte buffer is cut into N chunks whose sizes differ by at most one
//     byte (as in collective/ring_plan.h);
//   * there are 2(N-1) steps; in step s rank r sends chunk (r - s) mod N to the
//     right while it receives chunk (r - s - 1) mod N from the left, full
//     duplex, from a single thread driving non-blocking sockets with poll();
//   * each chunk is cut into pieces (one per stream, times the number of
//     --segment_bytes segments); piece p goes on stream p mod S, and piece p of
//     step s+1 is sent only once piece p of step s has arrived — the data
//     dependency of a real ring, where a rank forwards what it just received.
//     With --segment_bytes=0 (the default) a chunk is one segment, so each step
//     waits for the previous one; with a segment size the steps pipeline the way
//     gradsync's ring does.
//
// Every iteration starts after a barrier (a token passed twice around the ring
// on stream 0) and each rank times its own iteration: from the barrier's release
// to the moment its last send and receive are done. The parent collects every
// rank's times through a socketpair; the reported time is the mean over iterations of
// the slowest rank's time. busbw follows nccl-tests for allreduce:
// algbw = B / time, busbw = algbw * 2(N-1)/N.
//
// Link mode (--single_stream_throughput). Two children; rank 0 sends B bytes
// (striped over the streams) one way to rank 1, which acks with one byte when
// all has arrived. Rank 0's time from first send to ack gives the one-way
// loopback TCP throughput B / time: the link limit. It runs with 1 stream and,
// when --streams > 1, again with S streams.
//
// Waiting: by default a rank blocks in poll() as soon as no socket can move
// (gradsync's transport also blocks), so small-message times include scheduler
// wake-ups. --spin_us=T keeps retrying (with sched_yield) for T microseconds
// after the last progress first, the way MPI progress engines poll; such runs
// print `ring_limit_spin` / `tcp_link_spin` instead of `ring_limit` / `tcp_link`.
//
// Sockets are set up like gradsync's data plane (common/net.h TuneDataSocket:
// TCP_NODELAY, --socket_buffer_bytes send and receive buffers, non-blocking).
// Only 127.0.0.1 is used. Every wait has a deadline (--timeout_ms for the whole
// run); children die with the parent (PR_SET_PDEATHSIG) and the parent reaps
// them all, killing the rest when one fails.
//
// Output: one result line per size, e.g.
//   ring_limit,ranks=4,streams=1,bytes=67108864,time_us=51234.10,busbw_gbps=1.96467
//   tcp_link,streams=1,bytes=67108864,time_us=20000.00,gbps=3.35544
// and a human-readable line starting with "# ".

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "common/build_info.h"
#include "common/process.h"
#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "bench/bench_util.h"
#include "bench/ring_limit_children.h"
#include "bench/ring_limit_engine.h"
#include "common/net.h"
#include "common/status_macros.h"

ABSL_FLAG(int32_t, ranks, 4, "number of ring processes (ring mode)");
ABSL_FLAG(int32_t, streams, 1, "TCP sockets per neighbour pair; data is striped across them");
ABSL_FLAG(std::string, bytes, "", "a single message size (overrides --sizes/--min_bytes/--max_bytes)");
ABSL_FLAG(std::string, sizes, "", "comma-separated message sizes, e.g. 8,1M,64M (overrides min/max)");
ABSL_FLAG(std::string, min_bytes, "4K", "smallest message (K/M/G suffixes)");
ABSL_FLAG(std::string, max_bytes, "64M", "largest message (K/M/G suffixes)");
ABSL_FLAG(int64_t, step_factor, 4, "size multiplier from one message size to the next");
ABSL_FLAG(bool, latency, false, "also run 8 bytes (latency)");
ABSL_FLAG(int32_t, iters, 10, "timed iterations per size");
ABSL_FLAG(int32_t, warmup, 2, "untimed iterations per size");
ABSL_FLAG(std::string, segment_bytes, "0",
          "pipeline segment per chunk and stream (0 = whole chunk: step s+1 waits for step s)");
ABSL_FLAG(std::string, socket_buffer_bytes, "0",
          "SO_SNDBUF/SO_RCVBUF of every data socket; 0 = the kernel's, autotuned (gradsyncd's default)");
ABSL_FLAG(bool, single_stream_throughput, false,
          "measure one-way loopback TCP throughput between 2 processes (1 stream, then "
          "--streams) instead of the ring");
ABSL_FLAG(int64_t, spin_us, 0,
          "keep retrying non-blocking I/O (with sched_yield) this long before blocking in poll(); "
          "0 = block at once, like gradsync's transport");
ABSL_FLAG(int64_t, timeout_ms, 300000, "deadline for the whole run; then everything is killed");

namespace gradsync {
namespace bench {
namespace {

using namespace ring_limit;  // NOLINT(build/namespaces): this binary's engine

constexpr uint32_t kHelloMagic = 0x52494E47;  // "RING"

struct Config {
  int ranks = 4;
  int streams = 1;
  std::vector<uint64_t> sizes;
  int iters = 10;
  int warmup = 2;
  uint64_t segment_bytes = 0;
  int socket_buffer_bytes = 0;
  absl::Duration spin;
  absl::Time deadline;
};

// ---------------------------------------------------------------------------
// Connections.

struct Hello {
  uint32_t magic;
  int32_t src_rank;
  uint32_t stream;
};

// Connects `streams` sockets to `port` and says who we are on each.
absl::StatusOr<std::vector<UniqueFd>> ConnectStreams(int port, int rank, int streams,
                                                     int buffer_bytes, absl::Time deadline) {
  std::vector<UniqueFd> fds;
  for (int i = 0; i < streams; ++i) {
    ASSIGN_OR_RETURN(UniqueFd fd, TcpConnect({"127.0.0.1", port}, deadline, true));
    RETURN_IF_ERROR(TuneDataSocket(fd.get(), buffer_bytes));
    Hello h{kHelloMagic, rank, static_cast<uint32_t>(i)};
    RETURN_IF_ERROR(WriteFull(fd.get(), &h, sizeof(h), deadline));
    fds.push_back(std::move(fd));
  }
  return fds;
}

// Accepts `streams` sockets from `expect_rank`, ordered by their stream index.
absl::StatusOr<std::vector<UniqueFd>> AcceptStreams(int listen_fd, int expect_rank, int streams,
                                                    int buffer_bytes, absl::Time deadline) {
  std::vector<UniqueFd> fds(streams);
  for (int got = 0; got < streams; ++got) {
    struct pollfd p = {listen_fd, POLLIN, 0};
    int n = ::poll(&p, 1, PollTimeoutMs(deadline));
    if (n == 0) {
      return absl::DeadlineExceededError(absl::StrCat("accepted ", got, " of ", streams,
                                                      " streams from rank ", expect_rank,
                                                      " before the deadline"));
    }
    if (n < 0) {
      if (errno == EINTR) { --got; continue; }
      return absl::InternalError(absl::StrCat("poll: ", ErrnoString(errno)));
    }
    UniqueFd fd(::accept4(listen_fd, nullptr, nullptr, SOCK_CLOEXEC));
    if (!fd.valid()) return absl::UnavailableError(absl::StrCat("accept: ", ErrnoString(errno)));
    RETURN_IF_ERROR(TuneDataSocket(fd.get(), buffer_bytes));
    Hello h;
    RETURN_IF_ERROR(ReadFull(fd.get(), &h, sizeof(h), deadline));
    if (h.magic != kHelloMagic || h.src_rank != expect_rank || h.stream >= static_cast<uint32_t>(streams) ||
        fds[h.stream].valid()) {
      return absl::DataLossError(absl::StrCat("bad hello: magic ", h.magic, " rank ", h.src_rank,
                                              " stream ", h.stream, " (expected rank ", expect_rank,
                                              ")"));
    }
    fds[h.stream] = std::move(fd);
  }
  return fds;
}

// Two token rounds around the ring on stream 0: the first proves everyone has
// arrived, the second releases them. Rank 0 returns once the release token has
// come back (so no token is left in front of the next iteration's data).
// Reads one byte, retrying for up to `spin` before blocking.
absl::Status ReadToken(int fd, char* token, absl::Duration spin, absl::Time deadline) {
  if (spin > absl::ZeroDuration()) {
    const auto until = std::chrono::steady_clock::now() + absl::ToChronoNanoseconds(spin);
    do {
      ssize_t got = ::recv(fd, token, 1, MSG_DONTWAIT);
      if (got == 1) return absl::OkStatus();
      if (got == 0 || (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)) break;
      ::sched_yield();
    } while (std::chrono::steady_clock::now() < until);
  }
  return ReadFull(fd, token, 1, deadline);
}

absl::Status RingBarrier(int rank, int right_fd, int left_fd, absl::Duration spin,
                         absl::Time deadline) {
  char token = 'T';
  for (int round = 0; round < 2; ++round) {
    if (rank == 0) {
      RETURN_IF_ERROR(WriteFull(right_fd, &token, 1, deadline));
      RETURN_IF_ERROR(ReadToken(left_fd, &token, spin, deadline));
    } else {
      RETURN_IF_ERROR(ReadToken(left_fd, &token, spin, deadline));
      RETURN_IF_ERROR(WriteFull(right_fd, &token, 1, deadline));
    }
  }
  return absl::OkStatus();
}

std::vector<int> RawFds(const std::vector<UniqueFd>& v) {
  std::vector<int> out;
  for (const auto& f : v) out.push_back(f.get());
  return out;
}

absl::Status WriteTimes(int fd, const std::vector<double>& t, absl::Time deadline) {
  return WriteFull(fd, t.data(), t.size() * sizeof(double), deadline);
}

// Effective kernel buffer sizes of a socket (Linux doubles the requested value).
std::pair<int, int> BufferSizes(int fd) {
  int snd = 0, rcv = 0;
  socklen_t len = sizeof(int);
  getsockopt(fd, SOL_SOCKET, SO_SNDBUF, &snd, &len);
  len = sizeof(int);
  getsockopt(fd, SOL_SOCKET, SO_RCVBUF, &rcv, &len);
  return {snd, rcv};
}

// ---------------------------------------------------------------------------
// Child processes.

absl::Status RunRingRank(int rank, const Config& cfg, int listen_fd,
                         const std::vector<int>& ports, int result_fd) {
  const int n = cfg.ranks;
  const int right = (rank + 1) % n, left = (rank + n - 1) % n;
  ASSIGN_OR_RETURN(std::vector<UniqueFd> out,
                   ConnectStreams(ports[right], rank, cfg.streams, cfg.socket_buffer_bytes,
                                  cfg.deadline));
  ASSIGN_OR_RETURN(std::vector<UniqueFd> in,
                   AcceptStreams(listen_fd, left, cfg.streams, cfg.socket_buffer_bytes,
                                 cfg.deadline));
  const auto [snd, rcv] = BufferSizes(out[0].get());
  const int32_t header[2] = {snd, rcv};
  RETURN_IF_ERROR(WriteFull(result_fd, header, sizeof(header), cfg.deadline));

  const uint64_t max_bytes = cfg.sizes.back();
  std::unique_ptr<char[]> buf(new char[max_bytes]);
  std::memset(buf.get(), rank + 1, max_bytes);  // touch every page before timing
  Engine engine(RawFds(out), RawFds(in), buf.get(),
                absl::StrCat("rank ", rank, " (right ", right, ", left ", left, ")"), cfg.spin);
  for (uint64_t bytes : cfg.sizes) {
    const Plan plan = RingPlan(rank, n, cfg.streams, bytes, cfg.segment_bytes);
    std::vector<double> times;
    for (int it = 0; it < cfg.warmup + cfg.iters; ++it) {
      RETURN_IF_ERROR(RingBarrier(rank, out[0].get(), in[0].get(), cfg.spin, cfg.deadline));
      const auto t0 = std::chrono::steady_clock::now();
      absl::Status s = engine.Run(plan, cfg.deadline);
      if (!s.ok()) {
        return absl::Status(s.code(), absl::StrCat(s.message(), " (", bytes, " B, iteration ", it, ")"));
      }
      const auto t1 = std::chrono::steady_clock::now();
      if (it >= cfg.warmup) times.push_back(std::chrono::duration<double>(t1 - t0).count());
    }
    RETURN_IF_ERROR(WriteTimes(result_fd, times, cfg.deadline));
  }
  // Nobody closes a socket while a neighbour may still read from it.
  return RingBarrier(rank, out[0].get(), in[0].get(), cfg.spin, cfg.deadline);
}

// Rank 0 sends, rank 1 receives and acks; rank 0 reports its times.
absl::Status RunLinkRank(int rank, const Config& cfg, int listen_fd, const std::vector<int>& ports,
                         int result_fd) {
  std::vector<UniqueFd> socks;
  if (rank == 0) {
    ASSIGN_OR_RETURN(socks, ConnectStreams(ports[1], 0, cfg.streams, cfg.socket_buffer_bytes,
                                           cfg.deadline));
  } else {
    ASSIGN_OR_RETURN(socks, AcceptStreams(listen_fd, 0, cfg.streams, cfg.socket_buffer_bytes,
                                          cfg.deadline));
  }
  const auto [snd, rcv] = BufferSizes(socks[0].get());
  const int32_t header[2] = {snd, rcv};
  RETURN_IF_ERROR(WriteFull(result_fd, header, sizeof(header), cfg.deadline));
  const uint64_t max_bytes = cfg.sizes.back();
  std::unique_ptr<char[]> buf(new char[max_bytes]);
  std::memset(buf.get(), 7, max_bytes);
  const std::vector<int> fds = RawFds(socks);
  Engine engine(fds, fds, buf.get(), absl::StrCat("link rank ", rank), cfg.spin);
  for (uint64_t bytes : cfg.sizes) {
    Plan plan;
    for (int i = 0; i < cfg.streams; ++i) {
      const auto [off, len] = Split(bytes, cfg.streams, i);
      (rank == 0 ? plan.sends : plan.recvs).push_back(Piece{off, len, i, -1});
    }
    FinishPlan(cfg.streams, &plan);
    std::vector<double> times;
    char ack = 'A';
    for (int it = 0; it < cfg.warmup + cfg.iters; ++it) {
      const auto t0 = std::chrono::steady_clock::now();
      RETURN_IF_ERROR(engine.Run(plan, cfg.deadline));
      if (rank == 0) {
        RETURN_IF_ERROR(ReadToken(fds[0], &ack, cfg.spin, cfg.deadline));
      } else {
        RETURN_IF_ERROR(WriteFull(fds[0], &ack, 1, cfg.deadline));
      }
      const auto t1 = std::chrono::steady_clock::now();
      if (it >= cfg.warmup) {
        times.push_back(rank == 0 ? std::chrono::duration<double>(t1 - t0).count() : 0.0);
      }
    }
    RETURN_IF_ERROR(WriteTimes(result_fd, times, cfg.deadline));
  }
  // Final handshake so neither side closes before the other is done.
  char bye = 'B';
  if (rank == 0) {
    RETURN_IF_ERROR(WriteFull(fds[0], &bye, 1, cfg.deadline));
    RETURN_IF_ERROR(ReadFull(fds[0], &bye, 1, cfg.deadline));
  } else {
    RETURN_IF_ERROR(ReadFull(fds[0], &bye, 1, cfg.deadline));
    RETURN_IF_ERROR(WriteFull(fds[0], &bye, 1, cfg.deadline));
  }
  return absl::OkStatus();
}

// ---------------------------------------------------------------------------
// Parent.

enum class Mode { kRing, kLink };

std::string SpinText(absl::Duration spin) {
  if (spin <= absl::ZeroDuration()) return "blocking poll()";
  return absl::StrCat("spin ", absl::ToInt64Microseconds(spin), " us before poll()");
}

// Forks the ranks, collects their times, prints one result per size.
absl::Status RunMode(Mode mode, Config cfg) {
  const int n = mode == Mode::kRing ? cfg.ranks : 2;
  std::vector<UniqueFd> listeners;
  std::vector<int> ports;
  for (int r = 0; r < n; ++r) {
    ASSIGN_OR_RETURN(UniqueFd l, TcpListen({"127.0.0.1", 0}));
    ASSIGN_OR_RETURN(int port, LocalPort(l.get()));
    listeners.push_back(std::move(l));
    ports.push_back(port);
  }
  std::fflush(stdout);
  std::fflush(stderr);
  const pid_t parent = ::getpid();
  std::vector<Child> children(n);
  for (int r = 0; r < n; ++r) {
    // A socketpair rather than a pipe, so ReadFull/WriteFull (send/recv) apply.
    int p[2];
    if (::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, p) != 0) {
      KillAndReap(children, absl::Now());
      return absl::InternalError(absl::StrCat("socketpair: ", ErrnoString(errno)));
    }
    pid_t pid = ::fork();
    if (pid < 0) {
      ::close(p[0]);
      ::close(p[1]);
      KillAndReap(children, absl::Now());
      return absl::InternalError(absl::StrCat("fork: ", ErrnoString(errno)));
    }
    if (pid == 0) {
      ::prctl(PR_SET_PDEATHSIG, SIGKILL);
      if (::getppid() != parent) ::_exit(3);
      ::close(p[0]);
      for (auto& c : children) c.result.Reset();  // earlier ranks' read ends
      for (int o = 0; o < n; ++o) {
        if (o != r) listeners[o].Reset();
      }
      absl::Status s = mode == Mode::kRing
                           ? RunRingRank(r, cfg, listeners[r].get(), ports, p[1])
                           : RunLinkRank(r, cfg, listeners[r].get(), ports, p[1]);
      if (!s.ok()) {
        std::fprintf(stderr, "gradsync-ring-limit: rank %d: %s\n", r, s.ToString().c_str());
        std::fflush(stderr);
        ::_exit(1);
      }
      ::_exit(0);
    }
    ::close(p[1]);
    children[r].pid = pid;
    children[r].result = UniqueFd(p[0]);
  }
  listeners.clear();

  auto fail = [&](const absl::Status& s, int rank) {
    // Give the failing child a moment to print and exit, then stop everyone.
    absl::SleepFor(absl::Milliseconds(200));
    std::string exits = DescribeExits(children);
    KillAndReap(children, absl::Now());
    return absl::Status(s.code(), absl::StrCat("reading results of rank ", rank, ": ", s.message(),
                                               exits.empty() ? "" : " —", exits));
  };

  int32_t header[2] = {0, 0};
  for (int r = 0; r < n; ++r) {
    int32_t h[2];
    absl::Status s = ReadFull(children[r].result.get(), h, sizeof(h), cfg.deadline);
    if (!s.ok()) return fail(s, r);
    if (r == 0) std::memcpy(header, h, sizeof(h));
  }
  if (mode == Mode::kRing) {
    std::printf("# ring_limit: %d ranks on 127.0.0.1, %d stream(s) per neighbour, segment %s, "
                "socket buffers snd %d rcv %d (kernel values), %s, %d iters + %d warmup, "
                "busbw = bytes/time * 2(N-1)/N\n",
                n, cfg.streams,
                cfg.segment_bytes == 0 ? "whole chunk" : FormatBytes(cfg.segment_bytes).c_str(),
                header[0], header[1], SpinText(cfg.spin).c_str(), cfg.iters, cfg.warmup);
  } else {
    std::printf("# tcp_link: one-way TCP between 2 processes on 127.0.0.1, %d stream(s), "
                "socket buffers snd %d rcv %d (kernel values), %s, %d iters + %d warmup, "
                "gbps = bytes/time\n",
                cfg.streams, header[0], header[1], SpinText(cfg.spin).c_str(), cfg.iters,
                cfg.warmup);
  }
  std::fflush(stdout);

  // Spinning runs get their own result name so they never pass for the
  // blocking (gradsync-like) ones.
  const bool spin = cfg.spin > absl::ZeroDuration();
  const std::string name = absl::StrCat(mode == Mode::kRing ? "ring_limit" : "tcp_link",
                                        spin ? "_spin" : "");
  for (uint64_t bytes : cfg.sizes) {
    std::vector<std::vector<double>> per_rank(n, std::vector<double>(cfg.iters));
    for (int r = 0; r < n; ++r) {
      absl::Status s = ReadFull(children[r].result.get(), per_rank[r].data(),
                                cfg.iters * sizeof(double), cfg.deadline);
      if (!s.ok()) return fail(s, r);
    }
    const TimeStats st = Summarize(SlowestRank(per_rank));
    if (mode == Mode::kRing) {
      const double bus = AllreduceBusBwGBps(bytes, st.mean_s, n);
      std::printf("%s\n", ResultLine(name, {{"ranks", absl::StrCat(n)},
                                                    {"streams", absl::StrCat(cfg.streams)},
                                                    {"bytes", absl::StrCat(bytes)},
                                                    {"time_us", FormatUs(st.mean_s)},
                                                    {"busbw_gbps", FormatGBps(bus)}})
                                .c_str());
      std::printf("# %s %d ranks %d stream(s) %10s: %11.2f us/iter (median %.2f, min %.2f, "
                  "max %.2f)  algbw %8.3f GB/s  busbw %8.3f GB/s\n",
                  name.c_str(), n, cfg.streams, FormatBytes(bytes).c_str(), st.mean_s * 1e6,
                  st.median_s * 1e6, st.min_s * 1e6, st.max_s * 1e6, AlgBwGBps(bytes, st.mean_s),
                  bus);
    } else {
      const double bw = AlgBwGBps(bytes, st.mean_s);
      std::printf("%s\n", ResultLine(name, {{"streams", absl::StrCat(cfg.streams)},
                                                  {"bytes", absl::StrCat(bytes)},
                                                  {"time_us", FormatUs(st.mean_s)},
                                                  {"gbps", FormatGBps(bw)}})
                                .c_str());
      std::printf("# %s %d stream(s) %10s: %11.2f us (median %.2f, min %.2f, max %.2f)  %8.3f GB/s\n",
                  name.c_str(), cfg.streams, FormatBytes(bytes).c_str(), st.mean_s * 1e6,
                  st.median_s * 1e6, st.min_s * 1e6, st.max_s * 1e6, bw);
    }
    std::fflush(stdout);
  }

  // Wait for clean exits (bounded), then check them.
  std::string bad;
  const absl::Time reap_deadline = std::min(cfg.deadline, absl::Now() + absl::Seconds(10));
  for (size_t r = 0; r < children.size(); ++r) {
    int st = 0;
    pid_t got = 0;
    while ((got = ::waitpid(children[r].pid, &st, WNOHANG)) == 0 && absl::Now() < reap_deadline) {
      absl::SleepFor(absl::Milliseconds(2));
    }
    if (got == children[r].pid) {
      children[r].pid = -1;
      if (!WIFEXITED(st) || WEXITSTATUS(st) != 0) absl::StrAppend(&bad, " rank ", r, " failed;");
    } else {
      absl::StrAppend(&bad, " rank ", r, " did not exit;");
    }
  }
  KillAndReap(children, absl::Now());
  if (!bad.empty()) return absl::InternalError(absl::StrCat("after the run:", bad));
  return absl::OkStatus();
}

absl::StatusOr<Config> ConfigFromFlags() {
  Config cfg;
  cfg.ranks = absl::GetFlag(FLAGS_ranks);
  cfg.streams = absl::GetFlag(FLAGS_streams);
  cfg.iters = absl::GetFlag(FLAGS_iters);
  cfg.warmup = absl::GetFlag(FLAGS_warmup);
  if (cfg.ranks < 2 || cfg.ranks > 256) {
    return absl::InvalidArgumentError(absl::StrCat("--ranks must be 2..256, got ", cfg.ranks));
  }
  if (cfg.streams < 1 || cfg.streams > 64) {
    return absl::InvalidArgumentError(absl::StrCat("--streams must be 1..64, got ", cfg.streams));
  }
  if (cfg.iters < 1 || cfg.warmup < 0) {
    return absl::InvalidArgumentError("--iters must be >= 1 and --warmup >= 0");
  }
  SizeSpec spec;
  spec.sizes = absl::GetFlag(FLAGS_bytes).empty() ? absl::GetFlag(FLAGS_sizes)
                                                  : absl::GetFlag(FLAGS_bytes);
  spec.min_bytes = absl::GetFlag(FLAGS_min_bytes);
  spec.max_bytes = absl::GetFlag(FLAGS_max_bytes);
  spec.step_factor = absl::GetFlag(FLAGS_step_factor);
  spec.latency = absl::GetFlag(FLAGS_latency);
  ASSIGN_OR_RETURN(cfg.sizes, MessageSizes(spec));
  ASSIGN_OR_RETURN(cfg.segment_bytes, ParseBytes(absl::GetFlag(FLAGS_segment_bytes)));
  ASSIGN_OR_RETURN(uint64_t sock, ParseBytes(absl::GetFlag(FLAGS_socket_buffer_bytes)));
  if (sock > (1u << 30)) return absl::InvalidArgumentError("--socket_buffer_bytes too large");
  cfg.socket_buffer_bytes = static_cast<int>(sock);
  const int64_t spin_us = absl::GetFlag(FLAGS_spin_us);
  if (spin_us < 0) return absl::InvalidArgumentError("--spin_us must be >= 0");
  cfg.spin = absl::Microseconds(spin_us);
  const int64_t timeout_ms = absl::GetFlag(FLAGS_timeout_ms);
  if (timeout_ms <= 0) return absl::InvalidArgumentError("--timeout_ms must be positive");
  cfg.deadline = absl::Now() + absl::Milliseconds(timeout_ms);
  return cfg;
}

}  // namespace
}  // namespace bench
}  // namespace gradsync

int main(int argc, char** argv) {
  using namespace gradsync::bench;
  gradsync::InitFlagsUsage("gradsync-ring-limit", 
      "gradsync-ring-limit [--ranks N] [--streams S] [--min_bytes 4K --max_bytes 64M "
      "--step_factor 4 | --sizes 8,1M | --bytes B] [--iters I --warmup W] "
      "[--single_stream_throughput]\n"
      "Moves a ring allreduce's bytes (no reduction) between N processes over loopback TCP "
      "and prints `ring_limit,ranks=N,streams=S,bytes=B,time_us=T,busbw_gbps=G` per size; "
      "with --single_stream_throughput, one-way throughput `tcp_link,streams=S,...,gbps=G`.", __FILE__);
  std::vector<char*> rest = absl::ParseCommandLine(argc, argv);
  gradsync::InitProcess();
  if (rest.size() > 1) {
    std::fprintf(stderr, "gradsync-ring-limit: unexpected argument '%s'\n", rest[1]);
    return 2;
  }
  ::signal(SIGPIPE, SIG_IGN);
  auto cfg = ConfigFromFlags();
  if (!cfg.ok()) {
    std::fprintf(stderr, "gradsync-ring-limit: %s\n", std::string(cfg.status().message()).c_str());
    return 2;
  }
  absl::Status s;
  if (absl::GetFlag(FLAGS_single_stream_throughput)) {
    const int streams = cfg->streams;
    Config one = *cfg;
    one.streams = 1;
    s = RunMode(Mode::kLink, one);
    if (s.ok() && streams > 1) s = RunMode(Mode::kLink, *cfg);
  } else {
    s = RunMode(Mode::kRing, *cfg);
  }
  if (!s.ok()) {
    std::fprintf(stderr, "gradsync-ring-limit: %s\n", s.ToString().c_str());
    return 1;
  }
  return 0;
}
