// gradsync-ring-limit's transfer engine (bench/ring_limit.cc): a ring plan
// of ordered pieces per TCP stream, sends gated on the receives they forward,
// driven with non-blocking sockets. Only the benchmark includes it.
#ifndef GRADSYNC_BENCH_RING_LIMIT_ENGINE_H_
#define GRADSYNC_BENCH_RING_LIMIT_ENGINE_H_

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
#include "common/process.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "common/net.h"
#include "common/status_macros.h"

namespace gradsync {
namespace bench {
namespace ring_limit {

// ---------------------------------------------------------------------------
// The transfer engine: ordered pieces per stream, sends gated on receives.

struct Piece {
  uint64_t offset = 0;  // into the rank's buffer
  uint64_t len = 0;
  int stream = 0;
  int dep = -1;  // send pieces: index of the receive piece that must be complete first
};

// What one rank sends and receives in one iteration. Pieces of one stream go
// in index order.
struct Plan {
  std::vector<Piece> sends;
  std::vector<Piece> recvs;
  std::vector<std::vector<int>> send_order;  // per stream: indices into sends
  std::vector<std::vector<int>> recv_order;  // per stream: indices into recvs
};

void FinishPlan(int streams, Plan* plan) {
  plan->send_order.assign(streams, {});
  plan->recv_order.assign(streams, {});
  for (size_t i = 0; i < plan->sends.size(); ++i) {
    plan->send_order[plan->sends[i].stream].push_back(static_cast<int>(i));
  }
  for (size_t i = 0; i < plan->recvs.size(); ++i) {
    plan->recv_order[plan->recvs[i].stream].push_back(static_cast<int>(i));
  }
}

// Part i of n equal-as-possible parts of [0, total): sizes differ by <= 1.
std::pair<uint64_t, uint64_t> Split(uint64_t total, uint64_t n, uint64_t i) {
  const uint64_t base = total / n, rem = total % n;
  const uint64_t off = i * base + std::min(i, rem);
  return {off, base + (i < rem ? 1 : 0)};
}

// Ring allreduce traffic of one rank, see the file comment.
Plan RingPlan(int rank, int n, int streams, uint64_t bytes, uint64_t segment_bytes) {
  uint64_t segments = 1;
  const uint64_t max_chunk = Split(bytes, n, 0).second;
  const uint64_t per_stream = (max_chunk + streams - 1) / streams;
  if (segment_bytes > 0 && per_stream > segment_bytes) {
    segments = (per_stream + segment_bytes - 1) / segment_bytes;
  }
  const uint64_t pieces = segments * static_cast<uint64_t>(streams);
  Plan plan;
  const int steps = 2 * (n - 1);
  for (int s = 0; s < steps; ++s) {
    const int send_chunk = ((rank - s) % n + n) % n;
    const int recv_chunk = ((rank - s - 1) % n + n) % n;
    const auto [send_off, send_len] = Split(bytes, n, send_chunk);
    const auto [recv_off, recv_len] = Split(bytes, n, recv_chunk);
    for (uint64_t p = 0; p < pieces; ++p) {
      const int stream = static_cast<int>(p % streams);
      const auto [so, sl] = Split(send_len, pieces, p);
      const auto [ro, rl] = Split(recv_len, pieces, p);
      Piece snd{send_off + so, sl, stream, s == 0 ? -1 : static_cast<int>((s - 1) * pieces + p)};
      Piece rcv{recv_off + ro, rl, stream, -1};
      plan.sends.push_back(snd);
      plan.recvs.push_back(rcv);
    }
  }
  FinishPlan(streams, &plan);
  return plan;
}

// Runs one plan to completion over the given sockets (non-blocking). send_fds
// and recv_fds are indexed by stream; they may be the same sockets.
class Engine {
 public:
  // spin: how long to keep retrying (with sched_yield) after the last progress
  // before blocking in poll(); zero blocks at once.
  Engine(std::vector<int> send_fds, std::vector<int> recv_fds, char* buf, std::string who,
         absl::Duration spin)
      : send_fds_(std::move(send_fds)), recv_fds_(std::move(recv_fds)), buf_(buf),
        who_(std::move(who)), spin_(absl::ToChronoNanoseconds(spin)) {}

  absl::Status Run(const Plan& plan, absl::Time deadline) {
    const int streams = static_cast<int>(plan.send_order.size());
    std::vector<Cursor> sc(streams), rc(streams);
    recv_done_.assign(plan.recvs.size(), 0);
    size_t sends_left = plan.sends.size(), recvs_left = plan.recvs.size();
    uint64_t recv_bytes = 0, send_bytes = 0;
    std::vector<struct pollfd> pfds;
    auto last_progress = std::chrono::steady_clock::now();
    while (sends_left > 0 || recvs_left > 0) {
      bool progress = false;
      for (int i = 0; i < streams; ++i) {
        // Receives first: they unblock sends.
        const auto& ro = plan.recv_order[i];
        Cursor& r = rc[i];
        while (r.idx < ro.size()) {
          const Piece& pc = plan.recvs[ro[r.idx]];
          if (r.off == pc.len) {
            recv_done_[ro[r.idx]] = 1;
            ++r.idx;
            r.off = 0;
            --recvs_left;
            progress = true;
            continue;
          }
          ssize_t got = ::recv(recv_fds_[i], buf_ + pc.offset + r.off, pc.len - r.off, MSG_DONTWAIT);
          if (got > 0) {
            r.off += static_cast<uint64_t>(got);
            recv_bytes += static_cast<uint64_t>(got);
            progress = true;
          } else if (got == 0) {
            return absl::UnavailableError(absl::StrCat(who_, ": stream ", i,
                                                       " closed by peer while receiving"));
          } else if (errno == EAGAIN || errno == EWOULDBLOCK) {
            break;
          } else if (errno != EINTR) {
            return absl::UnavailableError(absl::StrCat(who_, ": recv on stream ", i, ": ",
                                                       ErrnoString(errno)));
          }
        }
        const auto& so = plan.send_order[i];
        Cursor& s = sc[i];
        while (s.idx < so.size()) {
          const Piece& pc = plan.sends[so[s.idx]];
          if (pc.dep >= 0 && !recv_done_[pc.dep]) break;
          if (s.off == pc.len) {
            ++s.idx;
            s.off = 0;
            --sends_left;
            progress = true;
            continue;
          }
          ssize_t put = ::send(send_fds_[i], buf_ + pc.offset + s.off, pc.len - s.off,
                               MSG_DONTWAIT | MSG_NOSIGNAL);
          if (put > 0) {
            s.off += static_cast<uint64_t>(put);
            send_bytes += static_cast<uint64_t>(put);
            progress = true;
          } else if (put < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
            break;
          } else if (put < 0 && errno != EINTR) {
            return absl::UnavailableError(absl::StrCat(who_, ": send on stream ", i, ": ",
                                                       ErrnoString(errno)));
          }
        }
      }
      if (progress) {
        if (spin_.count() > 0) last_progress = std::chrono::steady_clock::now();
        continue;
      }
      if (spin_.count() > 0 && std::chrono::steady_clock::now() - last_progress < spin_) {
        ::sched_yield();
        continue;
      }
      // Nothing moved: wait for a socket that can.
      pfds.clear();
      for (int i = 0; i < streams; ++i) {
        if (rc[i].idx < plan.recv_order[i].size()) pfds.push_back({recv_fds_[i], POLLIN, 0});
        if (sc[i].idx < plan.send_order[i].size()) {
          const Piece& pc = plan.sends[plan.send_order[i][sc[i].idx]];
          if (pc.dep < 0 || recv_done_[pc.dep]) pfds.push_back({send_fds_[i], POLLOUT, 0});
        }
      }
      if (pfds.empty()) {
        return absl::InternalError(absl::StrCat(who_, ": plan stuck (bug): nothing to wait for"));
      }
      int n = ::poll(pfds.data(), pfds.size(), PollTimeoutMs(deadline));
      if (n == 0) {
        return absl::DeadlineExceededError(absl::StrCat(
            who_, ": timed out with ", recvs_left, " of ", plan.recvs.size(),
            " pieces still to receive and ", sends_left, " of ", plan.sends.size(),
            " to send (", recv_bytes, " B received, ", send_bytes, " B sent this iteration)"));
      }
      if (n < 0 && errno != EINTR) {
        return absl::InternalError(absl::StrCat(who_, ": poll: ", ErrnoString(errno)));
      }
      for (const auto& p : pfds) {
        if (p.revents & (POLLERR | POLLNVAL)) {
          return absl::UnavailableError(absl::StrCat(who_, ": socket error"));
        }
      }
    }
    return absl::OkStatus();
  }

 private:
  struct Cursor {
    size_t idx = 0;
    uint64_t off = 0;
  };
  std::vector<int> send_fds_, recv_fds_;
  char* buf_;
  std::string who_;
  std::chrono::nanoseconds spin_;
  std::vector<uint8_t> recv_done_;
};


}  // namespace ring_limit
}  // namespace bench
}  // namespace gradsync

#endif  // GRADSYNC_BENCH_RING_LIMIT_ENGINE_H_
