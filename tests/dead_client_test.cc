// A client process SIGKILLed while the other ranks of its job wait for it:
// its daemon notices at once (worker/client_watch.h), closes the session,
// and the job's pending op fails on every other rank naming the dead rank;
// everything of the session and its job (the executor's gs-exec thread, its
// data-plane connections, descriptors) is freed.
#include <dirent.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <fstream>
#include <map>
#include <regex>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "cli/local_cluster.h"
#include "gtest/gtest.h"
#include "tests/cluster_util.h"

namespace gradsync {
namespace {

using testing::StartCluster;

// gRPC sizes these pools of its own as load comes and goes (a timer thread
// more or less from one job to the next); they hold nothing of a session.
bool IsGrpcPoolThread(const std::string& name) {
  return name == "grpc_global_tim" || name == "event_engine" || name == "grpcpp_sync_ser" ||
         name == "default-executo";
}

// What /proc says of a daemon.
struct ProcCounts {
  int threads = 0;  // except gRPC's pools
  int fds = 0;
  int executors = 0;  // threads named gs-exec
  std::map<std::string, int> names;  // threads by name
  std::string ToString() const {
    std::string s = absl::StrCat(threads, " threads besides gRPC's pools (all: ");
    for (const auto& [name, n] : names) absl::StrAppend(&s, name, " x", n, ", ");
    return absl::StrCat(s, "), ", fds, " fds");
  }
};

std::vector<std::string> DirEntries(const std::string& dir) {
  std::vector<std::string> out;
  DIR* d = ::opendir(dir.c_str());
  if (d == nullptr) return out;
  while (dirent* e = ::readdir(d)) {
    const std::string name = e->d_name;
    if (name != "." && name != "..") out.push_back(name);
  }
  ::closedir(d);
  return out;
}

ProcCounts Counts(pid_t pid) {
  ProcCounts c;
  const std::string proc = absl::StrCat("/proc/", pid);
  for (const std::string& tid : DirEntries(proc + "/task")) {
    std::ifstream comm(absl::StrCat(proc, "/task/", tid, "/comm"));
    std::string name;
    std::getline(comm, name);
    if (!IsGrpcPoolThread(name)) ++c.threads;
    if (name == "gs-exec") ++c.executors;
    ++c.names[name];
  }
  c.fds = static_cast<int>(DirEntries(proc + "/fd").size());
  return c;
}

// Waits up to `timeout` (polling /proc every 20 ms) until `done` holds for
// daemon `pid`'s counts; returns the last counts read.
template <typename Pred>
ProcCounts AwaitCounts(pid_t pid, absl::Duration timeout, Pred done) {
  const absl::Time deadline = absl::Now() + timeout;
  ProcCounts c = Counts(pid);
  while (!done(c) && absl::Now() < deadline) {
    absl::SleepFor(absl::Milliseconds(20));
    c = Counts(pid);
  }
  return c;
}

// A client process (tests/client_process --nosubmit) as `rank` of `job`
// through `target`; returns its pid once its session is open, with its
// stdout's read end in *out.
pid_t SpawnClient(const std::string& target, const std::string& job, int world, int rank,
                  int* out) {
  int fds[2];
  if (::pipe(fds) != 0) return -1;
  const pid_t pid = ::fork();
  if (pid == 0) {
    ::dup2(fds[1], 1);
    ::close(fds[0]);
    const std::string helper = "tests/client_process";
    const std::string args[] = {"--target=" + target, "--job=" + job,
                                absl::StrCat("--world=", world), absl::StrCat("--rank=", rank),
                                "--nosubmit"};
    ::execl(helper.c_str(), helper.c_str(), args[0].c_str(), args[1].c_str(), args[2].c_str(),
            args[3].c_str(), args[4].c_str(), static_cast<char*>(nullptr));
    ::_exit(127);
  }
  ::close(fds[1]);
  *out = fds[0];
  return pid;
}

std::string ReadLine(int fd) {
  std::string line;
  char ch;
  while (::read(fd, &ch, 1) == 1 && ch != '\n') line += ch;
  return line;
}

// Ranks 0, 1 and 3 of a 4-rank job are this process (daemons 0, 1, 2); rank
// 2 is a client process on daemon 2, which it shares with rank 3. The three
// submit an allreduce, then rank 2's process is SIGKILLed without having
// submitted it. Before: they waited for the op timeout (60 s by default)
// and failed blaming the deadline; now they fail within a second naming
// rank 2 and its pid.
TEST(DeadClient, KilledClientFailsThePendingOpOnEveryRankNamingItAndFreesItsSession) {
  auto cluster = StartCluster(3);
  ASSERT_NE(cluster, nullptr);
  const std::vector<int> daemon_of_rank = {0, 1, 2, 2};
  // A job of the same shape first, so the daemons' lazily made threads and
  // descriptors (gRPC's) exist before the baseline is read.
  {
    auto warm = testing::OpenJob(*cluster, "warm-up", daemon_of_rank);
    ASSERT_TRUE(warm.ok()) << warm.status();
    auto bufs = testing::AllocateOnEveryRank(*warm, 64);
    ASSERT_EQ(bufs.size(), 4u);
    testing::OnEveryRank(4, [&](int r) {
      auto res = (*warm)[r].session->Run(testing::AllreduceSpec(bufs[r].get(), 4, "w"));
      EXPECT_TRUE(res.ok()) << res.status();
    });
  }
  std::vector<ProcCounts> before(3);
  for (int d = 0; d < 3; ++d) {
    // The warm-up job's executors are gone once its sessions closed.
    before[d] = AwaitCounts(cluster->daemon_pid(d), absl::Seconds(10),
                            [](const ProcCounts& c) { return c.executors == 0; });
    ASSERT_EQ(before[d].executors, 0) << "daemon " << d << ": " << before[d].ToString();
  }

  const std::string job = "dead-client";
  int child_out = -1;
  const pid_t child = SpawnClient(cluster->daemon_target(2), job, 4, 2, &child_out);
  ASSERT_GT(child, 0);
  std::vector<int> survivors = {0, 1, 3};
  std::vector<testing::RankHandle> ranks(4);
  testing::OnEveryRank(3, [&](int i) {
    const int r = survivors[i];
    auto c = client::Client::Connect(cluster->daemon_target(daemon_of_rank[r]), absl::Seconds(10));
    ASSERT_TRUE(c.ok()) << c.status();
    client::SessionOptions so;
    so.job_id = job;
    so.world_size = 4;
    so.rank = r;
    so.timeout = absl::Seconds(30);
    so.op_timeout_ms = 10000;  // the old behaviour fails at 10 s, not 60
    auto s = (*c)->OpenSession(so);
    ASSERT_TRUE(s.ok()) << "rank " << r << ": " << s.status();
    ranks[r].client = std::move(*c);
    ranks[r].session = std::move(*s);
  });
  ASSERT_EQ(ReadLine(child_out), "OPENED");
  ::close(child_out);
  for (int r : survivors) ASSERT_NE(ranks[r].session, nullptr) << "rank " << r;

  std::vector<std::unique_ptr<client::Buffer>> bufs(4);
  std::vector<client::OpHandle> ops(4);
  for (int r : survivors) {
    auto b = ranks[r].session->AllocateBuffer(64);
    ASSERT_TRUE(b.ok()) << b.status();
    bufs[r] = std::move(*b);
    auto op = ranks[r].session->SubmitAsync(testing::AllreduceSpec(bufs[r].get(), 4, "w"));
    ASSERT_TRUE(op.ok()) << op.status();
    ops[r] = *op;
  }
  // Each survivor waits for its op; the kill comes while they wait.
  absl::Mutex mu;
  std::map<int, absl::Status> result;
  std::map<int, absl::Time> failed_at;
  std::vector<std::thread> waiters;
  for (int r : survivors) {
    waiters.emplace_back([&, r] {
      auto res = ranks[r].session->Wait(ops[r], absl::Seconds(30));
      const absl::Time now = absl::Now();
      absl::MutexLock l(&mu);
      result[r] = res.status();
      failed_at[r] = now;
    });
  }
  const absl::Time killed_at = absl::Now();
  ASSERT_EQ(::kill(child, SIGKILL), 0);
  for (auto& t : waiters) t.join();
  int wstatus = 0;
  ASSERT_EQ(::waitpid(child, &wstatus, 0), child);
  EXPECT_TRUE(WIFSIGNALED(wstatus) && WTERMSIG(wstatus) == SIGKILL);

  const std::string cause = absl::StrCat("rank 2 (client pid ", child, ") of job '", job,
                                         "' disconnected: its process exited");
  for (int r : survivors) {
    const absl::Duration took = failed_at[r] - killed_at;
    std::printf("rank %d: failed %.1f ms after the kill: %s\n", r,
                absl::ToDoubleMilliseconds(took), std::string(result[r].message()).c_str());
    ASSERT_FALSE(result[r].ok()) << "rank " << r;
    const std::string msg(result[r].message());
    const std::string head = absl::StrCat("allreduce 'w' f32[4] sum (op 1) failed at rank ", r, ": ");
    if (r == 3) {
      // Rank 3 shares daemon 2 with the dead rank.
      EXPECT_EQ(msg, absl::StrCat(head, "the epoch failed earlier: ", cause));
    } else {
      // Ranks 0 and 1 hear it from daemon 2's ABORT, directly or relayed by
      // another daemon (whichever came first): "aborted by rank K: " once or
      // more, then the cause. Nothing else: no deadline, no other rank.
      ASSERT_TRUE(absl::StartsWith(msg, head) && absl::EndsWith(msg, cause)) << msg;
      const std::string chain =
          msg.substr(head.size(), msg.size() - head.size() - cause.size());
      EXPECT_TRUE(std::regex_match(chain, std::regex("(aborted by rank [0-2]: )+"))) << msg;
    }
    // Milliseconds when idle; 1 s leaves room for a loaded 2-core machine.
    EXPECT_LT(took, absl::Seconds(1)) << "rank " << r;
  }

  // Everything of the dead client's session and of the job goes once the
  // survivors closed theirs: threads and descriptors back to their level.
  for (int r : survivors) {
    ranks[r].session.reset();
    ranks[r].client.reset();
  }
  bufs.clear();
  for (int d = 0; d < 3; ++d) {
    const ProcCounts after =
        AwaitCounts(cluster->daemon_pid(d), absl::Seconds(10), [&](const ProcCounts& c) {
          return c.executors == 0 && c.threads <= before[d].threads && c.fds <= before[d].fds;
        });
    std::printf("daemon %d: before %s; after %s\n", d, before[d].ToString().c_str(),
                after.ToString().c_str());
    EXPECT_EQ(after.executors, 0) << "daemon " << d;
    EXPECT_LE(after.threads, before[d].threads)
        << "daemon " << d << ": " << after.ToString() << ", before " << before[d].ToString();
    EXPECT_LE(after.fds, before[d].fds)
        << "daemon " << d << ": " << after.ToString() << ", before " << before[d].ToString();
  }
  EXPECT_TRUE(cluster->DaemonAlive(2));
  const absl::Status stopped = cluster->StopAll();
  EXPECT_TRUE(stopped.ok()) << stopped;
}

}  // namespace
}  // namespace gradsync
