// Failure handling with real processes: mismatched ops, a daemon SIGKILLed
// mid-op, a client that vanishes mid-op, garbage on the data-plane port.
#include <fcntl.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cstring>
#include <fstream>
#include <functional>
#include <memory>
#include <thread>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "cli/local_cluster.h"
#include "common/metrics_testing.h"
#include "common/net.h"
#include "gtest/gtest.h"
#include "tests/cluster_util.h"
#include "transport/wire.h"

namespace gradsync {
namespace {

using testing::OnEveryRank;
using testing::OpenJob;
using testing::StartCluster;


// Every rank sums ones; checks the result on every rank.
// Polls until `pred` holds or `timeout` passes; returns pred().
bool Eventually(const std::function<bool()>& pred, absl::Duration timeout = absl::Seconds(20)) {
  const absl::Time deadline = absl::Now() + timeout;
  while (!pred() && absl::Now() < deadline) absl::SleepFor(absl::Milliseconds(10));
  return pred();
}

// Ops submitted to daemon `d` and not finished (gradsync_daemon_queue_depth),
// -1 if its metrics cannot be read.
double QueueDepth(LocalCluster& cluster, int d) {
  auto text = HttpGet("127.0.0.1", cluster.daemon_metrics_port(d), "/metrics");
  if (!text.ok()) return -1;
  return FindSample(*text, "gradsync_daemon_queue_depth").value_or(-1);
}

void ExpectWorkingAllreduce(LocalCluster& cluster, const std::string& job,
                            const std::vector<int>& daemons) {
  auto ranks = OpenJob(cluster, job, daemons);
  ASSERT_TRUE(ranks.ok()) << ranks.status();
  const int n = static_cast<int>(daemons.size());
  std::vector<std::string> errors(n);
  OnEveryRank(n, [&](int r) {
    auto& s = *(*ranks)[r].session;
    auto b = s.AllocateBuffer(1000 * sizeof(float));
    if (!b.ok()) return void(errors[r] = std::string(b.status().message()));
    for (int i = 0; i < 1000; ++i) (*b)->as<float>()[i] = 1.0f;
    auto res = s.Allreduce(**b, 0, 1000, DType::kF32, ReduceOp::kSum, "check");
    if (!res.ok()) return void(errors[r] = std::string(res.status().message()));
    if ((*b)->as<float>()[999] != static_cast<float>(n)) errors[r] = "wrong sum";
  });
  for (int r = 0; r < n; ++r) EXPECT_EQ(errors[r], "") << "rank " << r;
}

TEST(Failure, MismatchedOpFailsOnEveryRankNamingTheRanksAndBothSignatures) {
  auto cluster = StartCluster(4);
  ASSERT_NE(cluster, nullptr);
  auto ranks = OpenJob(*cluster, "mismatch", testing::FirstN(4), /*op_timeout_ms=*/10000);
  ASSERT_TRUE(ranks.ok()) << ranks.status();
  std::vector<absl::Status> st(4), cross(4);
  std::vector<absl::Duration> took(4);
  OnEveryRank(4, [&](int r) {
    auto& s = *(*ranks)[r].session;
    auto b = s.AllocateBuffer(20000 * sizeof(float));
    ASSERT_TRUE(b.ok());
    const absl::Time t0 = absl::Now();
    st[r] = s.Allreduce(**b, 0, r == 2 ? 1000 : 1024, DType::kF32, ReduceOp::kSum, "grad")
                .status();
    took[r] = absl::Now() - t0;
    // The job stays usable after a mismatch: the same op, agreed, works.
    for (int i = 0; i < 1024; ++i) (*b)->as<float>()[i] = 2.0f;
    auto again = s.Allreduce(**b, 0, 1024, DType::kF32, ReduceOp::kSum, "grad");
    EXPECT_TRUE(again.ok()) << again.status();
    EXPECT_EQ((*b)->as<float>()[1023], 8.0f);
    // Across oneshot's cap: ranks 0, 1, 3 send their 4 KiB with the signature,
    // rank 2's 80 KB op does not ride along. Still a clean mismatch.
    cross[r] = s.Allreduce(**b, 0, r == 2 ? 20000 : 1024, DType::kF32, ReduceOp::kSum, "big")
                   .status();
    for (int i = 0; i < 1024; ++i) (*b)->as<float>()[i] = 1.0f;
    auto third = s.Allreduce(**b, 0, 1024, DType::kF32, ReduceOp::kSum, "grad");
    EXPECT_TRUE(third.ok()) << third.status();
    EXPECT_EQ((*b)->as<float>()[0], 4.0f);
  });
  for (int r = 0; r < 4; ++r) {
    EXPECT_TRUE(absl::IsInvalidArgument(st[r])) << "rank " << r << ": " << st[r];
    EXPECT_NE(st[r].message().find("rank 2 submitted allreduce 'grad' f32[1000] sum"),
              std::string::npos) << st[r];
    EXPECT_NE(st[r].message().find("ranks 0,1,3 submitted allreduce 'grad' f32[1024] sum"),
              std::string::npos) << st[r];
    EXPECT_LT(took[r], absl::Seconds(10));
    EXPECT_TRUE(absl::IsInvalidArgument(cross[r])) << "rank " << r << ": " << cross[r];
    EXPECT_NE(cross[r].message().find("rank 2 submitted allreduce 'big' f32[20000] sum"),
              std::string::npos) << cross[r];
  }
}

TEST(Failure, DaemonKilledMidOpFailsEveryOtherRankNamingItAndSurvivorsServeNewJobs) {
  auto cluster = StartCluster(4);
  ASSERT_NE(cluster, nullptr);
  auto ranks = OpenJob(*cluster, "victim", testing::FirstN(4), /*op_timeout_ms=*/60000,
                       /*heartbeat_timeout_ms=*/2000);
  ASSERT_TRUE(ranks.ok()) << ranks.status();
  std::atomic<int> started[4] = {0, 0, 0, 0};  // ops each rank submitted
  absl::Mutex mu;
  absl::Time killed_at = absl::InfiniteFuture();
  std::vector<absl::Status> st(4);
  std::vector<absl::Time> failed_at(4, absl::InfiniteFuture());
  std::thread killer([&] {
    // Every rank finished an op and is in the next one: data is moving.
    EXPECT_TRUE(Eventually(
        [&] { return started[0] >= 2 && started[1] >= 2 && started[2] >= 2 && started[3] >= 2; },
        absl::Seconds(60)));
    absl::MutexLock l(&mu);
    killed_at = absl::Now();
    cluster->SignalDaemon(2, SIGKILL);
  });
  OnEveryRank(4, [&](int r) {
    auto& s = *(*ranks)[r].session;
    const size_t count = 4 << 20;  // 16 MiB of f32: each op takes a while on loopback
    auto b = s.AllocateBuffer(count * sizeof(float));
    ASSERT_TRUE(b.ok()) << b.status();
    for (int it = 0; it < 1000; ++it) {
      ++started[r];
      auto res = s.Allreduce(**b, 0, count, DType::kF32, ReduceOp::kSum, "big");
      if (!res.ok()) {
        st[r] = res.status();
        failed_at[r] = absl::Now();
        return;
      }
    }
  });
  killer.join();
  for (int r : {0, 1, 3}) {
    EXPECT_FALSE(st[r].ok()) << "rank " << r;
    EXPECT_NE(st[r].message().find("rank 2"), std::string::npos) << "rank " << r << ": " << st[r];
    EXPECT_LT(failed_at[r] - killed_at, absl::Seconds(10)) << "rank " << r;
  }
  const absl::Time reap_deadline = absl::Now() + absl::Seconds(5);
  while (cluster->DaemonAlive(2) && absl::Now() < reap_deadline) absl::SleepFor(absl::Milliseconds(10));
  EXPECT_FALSE(cluster->DaemonAlive(2));
  for (int d : {0, 1, 3}) EXPECT_TRUE(cluster->DaemonAlive(d)) << "daemon " << d;
  // The old job's sessions are unusable, with the reason; new jobs work.
  auto b = (*ranks)[0].session->AllocateBuffer(64);
  ASSERT_TRUE(b.ok());
  auto again = (*ranks)[0].session->Allreduce(**b, 0, 16, DType::kF32, ReduceOp::kSum, "x");
  EXPECT_TRUE(absl::IsFailedPrecondition(again.status())) << again.status();
  EXPECT_NE(again.status().message().find("open a new session"), std::string::npos) << again.status();
  ExpectWorkingAllreduce(*cluster, "after-kill", {0, 1, 3});
}

// When rank 2's daemon dies while ranks 0, 1 and 3 wait in the op's
// signature exchange for rank 2 (which never submits), their daemons see the
// connections close and end the wait naming rank 2, long before the op's
// 60 s deadline.
TEST(Failure, DaemonKilledWhileTheOthersWaitForItsRankEndsTheirWaitNamingIt) {
  auto cluster = StartCluster(4);
  ASSERT_NE(cluster, nullptr);
  auto ranks = OpenJob(*cluster, "victim-waiting", testing::FirstN(4), /*op_timeout_ms=*/60000,
                       /*heartbeat_timeout_ms=*/2000);
  ASSERT_TRUE(ranks.ok()) << ranks.status();
  std::vector<std::unique_ptr<client::Buffer>> bufs(4);
  std::vector<client::OpHandle> ops(4);
  for (int r : {0, 1, 3}) {
    auto b = (*ranks)[r].session->AllocateBuffer(64);
    ASSERT_TRUE(b.ok()) << b.status();
    bufs[r] = std::move(*b);
    auto h = (*ranks)[r].session->AllreduceAsync(*bufs[r], 0, 4, DType::kF32, ReduceOp::kSum, "w");
    ASSERT_TRUE(h.ok()) << h.status();
    ops[r] = *h;
  }
  // Their daemons took the op and wait for rank 2.
  for (int d : {0, 1, 3}) {
    EXPECT_TRUE(Eventually([&] { return QueueDepth(*cluster, d) == 1; })) << "daemon " << d;
  }
  const absl::Time killed_at = absl::Now();
  cluster->SignalDaemon(2, SIGKILL);
  OnEveryRank(4, [&](int r) {
    if (r == 2) return;
    auto res = (*ranks)[r].session->Wait(ops[r], absl::Seconds(30));
    EXPECT_FALSE(res.ok()) << "rank " << r;
    EXPECT_NE(res.status().message().find("rank 2"), std::string::npos)
        << "rank " << r << ": " << res.status();
    EXPECT_LT(absl::Now() - killed_at, absl::Seconds(10)) << "rank " << r;
  });
  for (int d : {0, 1, 3}) EXPECT_TRUE(cluster->DaemonAlive(d)) << "daemon " << d;
}

// A client process (tests/client_process: rank 0 of job "orphan", through
// daemon 0) submits a 4 MB allreduce and is killed before rank 1 (this
// process, through daemon 1) submits its own; then rank 1 submits it.
// Returns rank 1's result (its buffer holds 2.0f; 3.0f once summed).
struct OrphanRun {
  absl::StatusOr<client::OpResult> result;
  absl::Duration took;  // rank 1's allreduce
  float last = 0;       // its buffer's last element after it
  pid_t pid = -1;       // the killed client's
};
void RunOrphan(LocalCluster& cluster, absl::Duration timeout, OrphanRun* out) {
  const std::string helper = "tests/client_process";
  int pipe_fds[2];
  ASSERT_EQ(::pipe(pipe_fds), 0);
  const std::string target = cluster.daemon_target(0);
  pid_t pid = ::fork();
  if (pid == 0) {
    ::dup2(pipe_fds[1], 1);
    ::close(pipe_fds[0]);
    const std::string t = "--target=" + target;
    ::execl(helper.c_str(), helper.c_str(), t.c_str(), "--job=orphan", "--world=2", "--rank=0",
            "--count=1000000", static_cast<char*>(nullptr));
    _exit(127);
  }
  ::close(pipe_fds[1]);
  // Rank 1 joins through daemon 1 while the helper joins as rank 0.
  auto c = client::Client::Connect(cluster.daemon_target(1));
  ASSERT_TRUE(c.ok());
  client::SessionOptions so;
  so.job_id = "orphan";
  so.world_size = 2;
  so.rank = 1;
  so.timeout = absl::Seconds(20);
  auto s = (*c)->OpenSession(so);
  ASSERT_TRUE(s.ok()) << s.status();
  // Wait for the helper's submission, then kill it before rank 1 submits.
  std::string line;
  char ch;
  while (::read(pipe_fds[0], &ch, 1) == 1 && ch != '\n') line += ch;
  ::close(pipe_fds[0]);
  ASSERT_EQ(line, "SUBMITTED");
  auto b = (*s)->AllocateBuffer(1000000 * sizeof(float));
  ASSERT_TRUE(b.ok());
  for (int i = 0; i < 1000000; ++i) (*b)->as<float>()[i] = 2.0f;
  ::kill(pid, SIGKILL);
  int wstatus = 0;
  ::waitpid(pid, &wstatus, 0);
  out->pid = pid;
  // Rank 1 submits once daemon 0 closed the dead client's session (else the
  // orphaned op, already at daemon 0, may still run with it and complete).
  const std::string closed = absl::StrCat("rank 0 (client pid ", pid,
                                          ") of job 'orphan' disconnected: its process exited");
  const absl::Time give_up = absl::Now() + absl::Seconds(10);
  while (!absl::StrContains(testing::ReadTextFile(cluster.daemon_log(0)), closed) &&
         absl::Now() < give_up) {
    absl::SleepFor(absl::Milliseconds(10));
  }
  const absl::Time start = absl::Now();
  out->result =
      (*s)->Allreduce(**b, 0, 1000000, DType::kF32, ReduceOp::kSum, "orphan", timeout);
  out->took = absl::Now() - start;
  out->last = (*b)->as<float>()[999999];
}

// Daemon 0 closes the dead client's session at once (its pidfd), so rank 1's
// matching op fails naming rank 0, not at the op timeout; the daemon lives on
// (DeadClient.* in dead_client_test.cc: the leaks and a 4-rank job).
TEST(Failure, ClientKilledMidOpFailsThePeerNamingItAndDoesNotTakeItsDaemonDown) {
  auto cluster = StartCluster(2);
  ASSERT_NE(cluster, nullptr);
  OrphanRun run;
  RunOrphan(*cluster, absl::Seconds(20), &run);
  ASSERT_FALSE(run.result.ok());
  // Daemon 1 hears it from daemon 0's ABORT, or (should its heartbeat come
  // first, within 500 ms) from the coordinator, where rank 0 left the job.
  const std::string msg(run.result.status().message());
  const std::string aborted =
      absl::StrCat("allreduce 'orphan' f32[1000000] sum (op 1) failed at rank 1: aborted by "
                   "rank 0: rank 0 (client pid ", run.pid,
                   ") of job 'orphan' disconnected: its process exited");
  EXPECT_TRUE(msg == aborted ||
              (absl::StrContains(msg, "job 'orphan' epoch 1 ended: rank 0 (member ") &&
               absl::StrContains(msg, ") left the job")))
      << msg;
  EXPECT_LT(run.took, absl::Seconds(5));  // not the 60 s op timeout
  EXPECT_TRUE(cluster->DaemonAlive(0));
  ExpectWorkingAllreduce(*cluster, "after-orphan", {0, 1});
}

// Reads the daemon's refusal (HelloAck with an error and its message), then EOF.
std::string ReadRefusal(int fd, absl::Time deadline) {
  transport::HelloAck ack;
  absl::Status s = ReadFull(fd, &ack, sizeof(ack), deadline);
  if (!s.ok()) return absl::StrCat("no refusal: ", s.message());
  if (ack.magic != transport::kHelloMagic || ack.code == 0) return "not a refusal";
  std::string msg(ack.message_len, '\0');
  s = ReadFull(fd, msg.data(), msg.size(), deadline);
  if (!s.ok()) return absl::StrCat("short refusal: ", s.message());
  char c;
  if (!absl::IsUnavailable(ReadFull(fd, &c, 1, deadline))) return "connection left open";
  return msg;
}

absl::StatusOr<int> DataPort(LocalCluster& cluster, int i) {
  std::ifstream f(absl::StrCat(cluster.work_dir(), "/daemon", i, ".port"));
  int port = 0;
  if (!(f >> port)) return absl::NotFoundError("no port file");
  return port;
}

TEST(Failure, GarbageAndTruncatedHandshakesOnTheDataPortAreRefused) {
  auto cluster = StartCluster(2);
  ASSERT_NE(cluster, nullptr);
  auto port = DataPort(*cluster, 0);
  ASSERT_TRUE(port.ok());
  const HostPort addr{"127.0.0.1", *port};
  const absl::Time deadline = absl::Now() + absl::Seconds(10);

  {  // Random garbage: the daemon closes the connection.
    auto fd = TcpConnect(addr, deadline);
    ASSERT_TRUE(fd.ok());
    std::string junk(4096, '\0');
    for (size_t i = 0; i < junk.size(); ++i) junk[i] = static_cast<char>(i * 131 + 7);
    (void)WriteFull(fd->get(), junk.data(), junk.size(), deadline);
    char c;
    absl::Status s = ReadFull(fd->get(), &c, 1, deadline);
    EXPECT_TRUE(absl::IsUnavailable(s)) << s;  // closed, nothing sent back
  }
  {  // A truncated hello, then silence: refused at the handshake deadline.
    auto fd = TcpConnect(addr, deadline);
    ASSERT_TRUE(fd.ok());
    transport::Hello h{transport::kHelloMagic, transport::kWireVersion, 3, 1, 0, 1, 2, 0};
    ASSERT_TRUE(WriteFull(fd->get(), &h, 10, deadline).ok());
    EXPECT_EQ(ReadRefusal(fd->get(), deadline), "read timed out");
  }
  {  // A future wire version is told why it was refused.
    auto fd = TcpConnect(addr, deadline);
    ASSERT_TRUE(fd.ok());
    transport::Hello h{transport::kHelloMagic, 99, 3, 1, 0, 1, 2, 0};
    ASSERT_TRUE(WriteFull(fd->get(), &h, sizeof(h), deadline).ok());
    ASSERT_TRUE(WriteFull(fd->get(), "job", 3, deadline).ok());
    EXPECT_EQ(ReadRefusal(fd->get(), deadline),
              "unsupported wire version 99 (this daemon speaks 4)");
  }
  {  // Absurd sizes in an otherwise well-formed hello.
    auto fd = TcpConnect(addr, deadline);
    ASSERT_TRUE(fd.ok());
    transport::Hello h{transport::kHelloMagic, transport::kWireVersion, 60000, 1, 0, 1, 1 << 30, 0};
    ASSERT_TRUE(WriteFull(fd->get(), &h, sizeof(h), deadline).ok());
    EXPECT_EQ(ReadRefusal(fd->get(), deadline), "bad job id length 60000");
  }
  {  // A valid hello for a job that does not exist here, then frame garbage:
     // parked, never claimed, never read into any job.
    auto fd = TcpConnect(addr, deadline);
    ASSERT_TRUE(fd.ok());
    transport::Hello h{transport::kHelloMagic, transport::kWireVersion, 5, 1, 0, 1, 2, 0};
    ASSERT_TRUE(WriteFull(fd->get(), &h, sizeof(h), deadline).ok());
    ASSERT_TRUE(WriteFull(fd->get(), "ghost", 5, deadline).ok());
    std::string junk(1 << 16, 'x');
    (void)WriteFull(fd->get(), junk.data(), junk.size(), deadline);
  }
  EXPECT_TRUE(cluster->DaemonAlive(0));
  ExpectWorkingAllreduce(*cluster, "after-garbage", {0, 1});
  EXPECT_TRUE(cluster->DaemonAlive(0));
}

}  // namespace
}  // namespace gradsync

namespace gradsync {
namespace {

TEST(Failure, SigtermDrainsTheRunningOpThenRefusesNewOnesAndExitsZero) {
  auto cluster = StartCluster(2);
  ASSERT_NE(cluster, nullptr);
  auto ranks = OpenJob(*cluster, "drain", {0, 1});
  ASSERT_TRUE(ranks.ok()) << ranks.status();
  std::vector<std::unique_ptr<client::Buffer>> bufs(2);
  for (int r = 0; r < 2; ++r) {
    auto b = (*ranks)[r].session->AllocateBuffer(1024 * sizeof(float));
    ASSERT_TRUE(b.ok());
    for (int i = 0; i < 1024; ++i) (*b)->as<float>()[i] = 1.0f + r;
    bufs[r] = std::move(*b);
  }
  // Rank 0 submits; its daemon gets SIGTERM before rank 1 submits.
  auto h0 = (*ranks)[0].session->AllreduceAsync(*bufs[0], 0, 1024, DType::kF32, ReduceOp::kSum, "d");
  ASSERT_TRUE(h0.ok());
  ASSERT_TRUE(Eventually([&] { return QueueDepth(*cluster, 0) == 1; })) << "daemon 0 never took op";
  cluster->SignalDaemon(0, SIGTERM);
  ASSERT_TRUE(Eventually([&] {
    return absl::StrContains(testing::ReadTextFile(cluster->daemon_log(0)),
                             "received SIGTERM, shutting down");
  })) << testing::ReadTextFile(cluster->daemon_log(0));
  EXPECT_TRUE(cluster->DaemonAlive(0)) << "daemon 0 must wait for the running op";
  // A new op on the draining daemon is refused, naming the drain.
  auto late = (*ranks)[0].session->Allreduce(*bufs[0], 0, 1024, DType::kF32, ReduceOp::kSum, "late");
  EXPECT_TRUE(absl::IsUnavailable(late.status())) << late.status();
  EXPECT_NE(late.status().message().find("draining"), std::string::npos) << late.status();
  auto r1 = (*ranks)[1].session->Allreduce(*bufs[1], 0, 1024, DType::kF32, ReduceOp::kSum, "d");
  EXPECT_TRUE(r1.ok()) << r1.status();
  auto r0 = (*ranks)[0].session->Wait(*h0, absl::Seconds(10));
  EXPECT_TRUE(r0.ok()) << r0.status();
  EXPECT_EQ(bufs[0]->as<float>()[1023], 3.0f);
  EXPECT_EQ(bufs[1]->as<float>()[1023], 3.0f);
  const absl::Time deadline = absl::Now() + absl::Seconds(5);
  while (cluster->DaemonAlive(0) && absl::Now() < deadline) absl::SleepFor(absl::Milliseconds(10));
  EXPECT_FALSE(cluster->DaemonAlive(0)) << "daemon 0 did not exit after draining";
  EXPECT_TRUE(WIFEXITED(cluster->DaemonWaitStatus(0)) && WEXITSTATUS(cluster->DaemonWaitStatus(0)) == 0)
      << "wait status " << cluster->DaemonWaitStatus(0);
}

// Clients keep calling while their daemon stops: calls that reach it during
// the shutdown (a session's RPCs, new sessions) get errors, and the daemon
// still exits 0, with nothing torn down under a call still being served.
TEST(Failure, SigtermWhileClientsKeepCallingExitsZero) {
  auto cluster = StartCluster(1);
  ASSERT_NE(cluster, nullptr);
  auto ranks = OpenJob(*cluster, "busy", {0});
  ASSERT_TRUE(ranks.ok()) << ranks.status();
  std::atomic<bool> stop{false};
  std::atomic<int> calls{0};
  std::vector<std::thread> callers;
  for (int t = 0; t < 2; ++t) {  // a session's RPCs: allocate, then free
    callers.emplace_back([&] {
      while (!stop) {
        auto b = (*ranks)[0].session->AllocateBuffer(4096);  // fails once the session closed
        if (b.ok()) ++calls;
      }
    });
  }
  callers.emplace_back([&] {  // new one-rank jobs
    for (int i = 0; !stop; ++i) {
      auto c = client::Client::Connect(cluster->daemon_target(0), absl::Seconds(1));
      if (!c.ok()) continue;
      client::SessionOptions so;
      so.job_id = absl::StrCat("busy-", i);
      so.timeout = absl::Seconds(2);
      auto s = (*c)->OpenSession(so);
      if (s.ok()) ++calls;
    }
  });
  EXPECT_TRUE(Eventually([&] { return calls.load() > 0; })) << "no call got through";
  cluster->SignalDaemon(0, SIGTERM);
  const absl::Time deadline = absl::Now() + absl::Seconds(15);
  while (cluster->DaemonAlive(0) && absl::Now() < deadline) absl::SleepFor(absl::Milliseconds(10));
  stop = true;
  for (auto& t : callers) t.join();
  EXPECT_GT(calls.load(), 0);
  ASSERT_FALSE(cluster->DaemonAlive(0)) << "the daemon did not exit within 15 s of SIGTERM";
  EXPECT_TRUE(WIFEXITED(cluster->DaemonWaitStatus(0)) && WEXITSTATUS(cluster->DaemonWaitStatus(0)) == 0)
      << "wait status " << cluster->DaemonWaitStatus(0) << "; log:\n"
      << testing::ReadTextFile(cluster->daemon_log(0));
}

}  // namespace
}  // namespace gradsync

namespace gradsync {
namespace {

// The first rank to finish the job's last op closes its session at once (as a
// training process that exits): the others must still complete that op.
// Every rank of a new job `job` (rank r on daemons[r]) runs one op of
// `count` f32 elements with `algorithm` as the job's last, then closes its
// session at once, like a process exiting: every rank's op must succeed.
void ExpectLastOpSurvivesAnImmediateClose(LocalCluster& cluster, const std::string& job,
                                          const std::vector<int>& daemons, size_t count,
                                          const std::string& algorithm) {
  auto ranks = OpenJob(cluster, job, daemons);
  ASSERT_TRUE(ranks.ok()) << ranks.status();
  const int n = static_cast<int>(daemons.size());
  std::vector<absl::Status> st(n);
  OnEveryRank(n, [&](int r) {
    auto& s = *(*ranks)[r].session;
    auto b = s.AllocateBuffer(count * 4);
    ASSERT_TRUE(b.ok());
    client::CollectiveSpec spec;
    spec.buffer = b->get();
    spec.count = count;
    spec.algorithm = algorithm;
    spec.name = "last";
    st[r] = s.Run(spec).status();
    (void)s.Close();  // leave at once
  });
  for (int r = 0; r < n; ++r) EXPECT_TRUE(st[r].ok()) << job << " rank " << r << ": " << st[r];
}

TEST(Failure, RankLeavingRightAfterTheLastOpDoesNotFailTheOthersLastOp) {
  auto cluster = StartCluster(3);
  ASSERT_NE(cluster, nullptr);
  for (int round = 0; round < 8; ++round) {
    ExpectLastOpSurvivesAnImmediateClose(*cluster, absl::StrCat("last-op-", round), {0, 1, 2},
                                         (4 << 20) / 4, round % 2 == 0 ? "ring" : "rhd");
  }
}

// ---- Node-local jobs: every rank on one daemon, which combines them in
// memory (collective/hierarchical.h).

TEST(Failure, NodeLocalRankThatNeverSubmitsIsNamedAndTheEpochEnds) {
  auto cluster = StartCluster(1);
  ASSERT_NE(cluster, nullptr);
  auto ranks = OpenJob(*cluster, "local-stall", {0, 0, 0}, /*op_timeout_ms=*/1500);
  ASSERT_TRUE(ranks.ok()) << ranks.status();
  std::vector<absl::Status> st(2);
  std::vector<absl::Duration> took(2);
  OnEveryRank(2, [&](int r) {  // rank 2 never submits
    auto& s = *(*ranks)[r].session;
    auto b = s.AllocateBuffer(64);
    ASSERT_TRUE(b.ok());
    const absl::Time t0 = absl::Now();
    st[r] = s.Allreduce(**b, 0, 4, DType::kF32, ReduceOp::kSum, "w").status();
    took[r] = absl::Now() - t0;
  });
  for (int r = 0; r < 2; ++r) {
    EXPECT_FALSE(st[r].ok());
    EXPECT_NE(st[r].message().find("waiting for rank(s) 2 to submit op 1 (allreduce 'w' f32[4] sum)"),
              std::string::npos)
        << st[r];
    EXPECT_LT(took[r], absl::Seconds(10));
  }
  // The ranks are out of step now: every rank's next op, small or large, is
  // refused, and the daemon ends the epoch.
  OnEveryRank(3, [&](int r) {
    auto& s = *(*ranks)[r].session;
    auto b = s.AllocateBuffer(1 << 20);
    ASSERT_TRUE(b.ok());
    for (size_t count : {size_t{4}, size_t{1 << 18}}) {
      auto res = s.Allreduce(**b, 0, count, DType::kF32, ReduceOp::kSum, "next");
      EXPECT_FALSE(res.ok()) << "rank " << r << " count " << count;
      EXPECT_NE(res.status().message().find("waiting for rank(s) 2 to submit op 1"), std::string::npos)
          << res.status();
    }
  });
  ExpectWorkingAllreduce(*cluster, "after-local-stall", {0, 0, 0});
}

TEST(Failure, NodeLocalRankClosingItsSessionEndsTheOthersWaitAtOnce) {
  auto cluster = StartCluster(1);
  ASSERT_NE(cluster, nullptr);
  auto ranks = OpenJob(*cluster, "local-leave", {0, 0, 0}, /*op_timeout_ms=*/60000);
  ASSERT_TRUE(ranks.ok()) << ranks.status();
  std::vector<absl::Status> st(2);
  std::vector<absl::Duration> took(2);
  std::thread leaver([&] {
    // Ranks 0 and 1 submitted op 1 and wait for rank 2.
    EXPECT_TRUE(Eventually([&] { return QueueDepth(*cluster, 0) == 2; }));
    EXPECT_TRUE((*ranks)[2].session->Close().ok());
  });
  OnEveryRank(2, [&](int r) {
    auto& s = *(*ranks)[r].session;
    auto b = s.AllocateBuffer(64);
    ASSERT_TRUE(b.ok());
    const absl::Time t0 = absl::Now();
    st[r] = s.Allreduce(**b, 0, 4, DType::kF32, ReduceOp::kSum, "w").status();
    took[r] = absl::Now() - t0;
  });
  leaver.join();
  for (int r = 0; r < 2; ++r) {
    EXPECT_FALSE(st[r].ok());
    EXPECT_NE(st[r].message().find("rank 2 closed its session"), std::string::npos) << st[r];
    EXPECT_LT(took[r], absl::Seconds(5)) << "rank " << r;  // not the 60 s op timeout
  }
}

// Rank 2's op is large, the others' small: every rank gets the same clean
// mismatch, and the job goes on.
TEST(Failure, NodeLocalMismatchBetweenASmallAndALargeOpIsTheSameOnEveryRank) {
  auto cluster = StartCluster(1);
  ASSERT_NE(cluster, nullptr);
  auto ranks = OpenJob(*cluster, "local-cross", {0, 0, 0, 0}, /*op_timeout_ms=*/10000);
  ASSERT_TRUE(ranks.ok()) << ranks.status();
  std::vector<absl::Status> st(4);
  OnEveryRank(4, [&](int r) {
    auto& s = *(*ranks)[r].session;
    auto b = s.AllocateBuffer(100000 * sizeof(float));
    ASSERT_TRUE(b.ok());
    st[r] = s.Allreduce(**b, 0, r == 2 ? 100000 : 16, DType::kF32, ReduceOp::kSum, "g").status();
    for (size_t count : {size_t{16}, size_t{100000}}) {  // both paths still work
      for (size_t i = 0; i < count; ++i) (*b)->as<float>()[i] = 1.0f;
      auto res = s.Allreduce(**b, 0, count, DType::kF32, ReduceOp::kSum, "g");
      ASSERT_TRUE(res.ok()) << res.status();
      EXPECT_EQ(res->algorithm, "hier");
      EXPECT_EQ((*b)->as<float>()[count - 1], 4.0f);
    }
  });
  for (int r = 0; r < 4; ++r) {
    EXPECT_TRUE(absl::IsInvalidArgument(st[r])) << "rank " << r << ": " << st[r];
    EXPECT_EQ(st[r].message(),
              "op 1 does not match across ranks: rank 2 submitted allreduce 'g' f32[100000] sum, "
              "ranks 0,1,3 submitted allreduce 'g' f32[16] sum");
  }
}

// As RankLeavingRightAfterTheLastOp..., for a node-local job: the first rank
// done closes at once, the others still complete the op, small or large.
// (The hierarchical path used to fail them: a waiter that saw its stage
// complete after the group broke returned the break.)
TEST(Failure, NodeLocalRankLeavingRightAfterTheLastOpDoesNotFailTheOthersLastOp) {
  auto cluster = StartCluster(1);
  ASSERT_NE(cluster, nullptr);
  for (int round = 0; round < 12; ++round) {
    ExpectLastOpSurvivesAnImmediateClose(*cluster, absl::StrCat("local-last-", round), {0, 0, 0},
                                         round % 2 == 0 ? 16 : (4 << 20) / 4,  // small, then large
                                         "");
  }
}

// Sessions busy with small ops over the op queue (no RPC) are in use: the
// lease (an idle session is closed after --session_lease_ms, which here is
// 1 s) does not expire them.
TEST(Failure, NodeLocalSessionsBusyWithSmallOpsOnlyAreNotExpired) {
  LocalClusterOptions o;
  o.daemons = 1;
  o.daemon_flags = {"--session_lease_ms=1000"};
  auto c = LocalCluster::Start(o);
  ASSERT_TRUE(c.ok()) << c.status();
  auto ranks = OpenJob(**c, "local-busy", {0, 0});
  ASSERT_TRUE(ranks.ok()) << ranks.status();
  OnEveryRank(2, [&](int r) {
    auto& s = *(*ranks)[r].session;
    auto b = s.AllocateBuffer(1 << 20);
    ASSERT_TRUE(b.ok());
    // The same number of ops on every rank (at least 2 s: twice the lease),
    // so both submit "big" as their next op.
    for (int ops = 0; ops < 400; ++ops) {
      (*b)->as<float>()[0] = 1.0f;
      auto res = s.Allreduce(**b, 0, 1, DType::kF32, ReduceOp::kSum, "tick");
      ASSERT_TRUE(res.ok()) << "after " << ops << " ops: " << res.status();
      ASSERT_EQ(res->algorithm, "hier");
      absl::SleepFor(absl::Milliseconds(5));
    }
    (*b)->as<float>()[(1 << 18) - 1] = 1.0f;
    auto big = s.Allreduce(**b, 0, 1 << 18, DType::kF32, ReduceOp::kSum, "big");
    ASSERT_TRUE(big.ok()) << big.status();
    EXPECT_EQ((*b)->as<float>()[(1 << 18) - 1], 2.0f);
  });
}

// When the daemon of a node-local job dies, its clients find out within
// seconds (the op queue's heartbeat stops).
TEST(Failure, NodeLocalClientsNoticeTheirDaemonDying) {
  auto cluster = StartCluster(1);
  ASSERT_NE(cluster, nullptr);
  auto ranks = OpenJob(*cluster, "local-orphan", {0, 0});
  ASSERT_TRUE(ranks.ok()) << ranks.status();
  std::vector<absl::Status> last(2);
  std::vector<absl::Duration> took(2);
  std::atomic<bool> killed{false};
  std::atomic<int> done[2] = {0, 0};  // ops each rank finished
  std::thread killer([&] {
    EXPECT_TRUE(Eventually([&] { return done[0] > 0 && done[1] > 0; }));  // both ranks tick
    cluster->SignalDaemon(0, SIGKILL);
    killed = true;
  });
  OnEveryRank(2, [&](int r) {
    auto& s = *(*ranks)[r].session;
    auto b = s.AllocateBuffer(64);
    ASSERT_TRUE(b.ok());
    absl::Time killed_at = absl::InfiniteFuture();
    const absl::Time give_up = absl::Now() + absl::Seconds(30);
    while (absl::Now() < give_up) {
      if (killed && killed_at == absl::InfiniteFuture()) killed_at = absl::Now();
      last[r] = s.Allreduce(**b, 0, 1, DType::kF32, ReduceOp::kSum, "tick", absl::Seconds(20)).status();
      if (!last[r].ok()) break;
      ++done[r];
      absl::SleepFor(absl::Milliseconds(2));
    }
    took[r] = absl::Now() - killed_at;
  });
  killer.join();
  for (int r = 0; r < 2; ++r) {
    EXPECT_FALSE(last[r].ok()) << "rank " << r << " never noticed";
    EXPECT_LT(took[r], absl::Seconds(10)) << "rank " << r << ": " << last[r];
  }
  for (int r = 0; r < 2; ++r) {
    EXPECT_NE(last[r].message().find("stopped answering"), std::string::npos) << last[r];
  }
}

}  // namespace
}  // namespace gradsync
