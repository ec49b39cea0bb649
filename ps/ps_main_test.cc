// The gradsync-ps binary as a real process: serves steps, and a shard that is
// stopped (SIGTERM) or killed (SIGKILL) mid-step fails every worker naming it.
#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "absl/time/clock.h"
#include "common/metrics_testing.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "ps/ps_testing.h"
#include "ps/slicer.h"
#include "ps/worker_client.h"

extern char** environ;

namespace gradsync::ps {
namespace {

using ::testing::HasSubstr;

std::string BinaryPath() {
  const char* srcdir = std::getenv("TEST_SRCDIR");
  const char* workspace = std::getenv("TEST_WORKSPACE");
  if (srcdir == nullptr) return "ps/gradsync-ps";
  return absl::StrCat(srcdir, "/", workspace ? workspace : "gradsync", "/ps/gradsync-ps");
}

std::string TmpPath(const std::string& name) {
  const char* tmp = std::getenv("TEST_TMPDIR");
  return absl::StrCat(tmp ? tmp : "/tmp", "/", name, ".", getpid());
}

// A running gradsync-ps on 127.0.0.1, its port and its metrics port.
struct Server {
  pid_t pid = -1;
  int port = 0;
  int metrics_port = 0;
};

Server Spawn(const std::string& base) {
  static int spawned = 0;
  const std::string name = absl::StrCat(base, ++spawned);  // a fresh port file each time
  Server s;
  const std::string port_file = TmpPath(name + ".port");
  const std::string log = TmpPath(name + ".log");
  std::vector<std::string> args = {BinaryPath(), "--listen=127.0.0.1:0",
                                   "--metrics_listen=127.0.0.1:0",
                                   "--port_file=" + port_file,
                                   "--step_timeout_ms=30000"};
  std::vector<char*> argv;
  for (auto& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_addopen(&actions, 2, log.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  const int rc = posix_spawn(&s.pid, argv[0], &actions, nullptr, argv.data(), environ);
  posix_spawn_file_actions_destroy(&actions);
  EXPECT_EQ(rc, 0) << BinaryPath();
  const absl::Time deadline = absl::Now() + absl::Seconds(10);
  while (absl::Now() < deadline) {
    std::ifstream in(port_file);
    std::stringstream text;
    text << in.rdbuf();
    const std::vector<std::string> lines = absl::StrSplit(text.str(), '\n');
    if (lines.size() >= 2 && absl::SimpleAtoi(lines[0], &s.port) && s.port > 0 &&
        absl::SimpleAtoi(lines[1], &s.metrics_port)) {
      break;
    }
    absl::SleepFor(absl::Milliseconds(10));
  }
  EXPECT_GT(s.port, 0) << "no port file from " << BinaryPath();
  EXPECT_GT(s.metrics_port, 0) << "no metrics port in the port file";
  return s;
}

// The exit status, or -1 if it did not exit within `timeout` (then killed).
int WaitExit(pid_t pid, absl::Duration timeout) {
  const absl::Time deadline = absl::Now() + timeout;
  while (absl::Now() < deadline) {
    int status = 0;
    if (waitpid(pid, &status, WNOHANG) == pid) {
      if (WIFEXITED(status)) return WEXITSTATUS(status);
      return 128 + (WIFSIGNALED(status) ? WTERMSIG(status) : 0);
    }
    absl::SleepFor(absl::Milliseconds(10));
  }
  kill(pid, SIGKILL);
  waitpid(pid, nullptr, 0);
  return -1;
}

// Partition bytes the shard took (its gradsync_ps_pushed_bytes_total), -1 if unknown.
double Pushed(const Server& s) {
  auto text = HttpGet("127.0.0.1", s.metrics_port, "/metrics");
  if (!text.ok()) return -1;
  return FindSample(*text, "gradsync_ps_pushed_bytes_total").value_or(-1);
}

// Runs a step of 50000 floats on `ranks` of `world` workers; returns the statuses.
std::vector<absl::Status> Step(std::vector<std::unique_ptr<PsWorker>>& w,
                               std::vector<std::vector<float>>& bufs, const std::vector<int>& ranks,
                               uint64_t step) {
  const BalancedSlicer slicer;
  const int world = static_cast<int>(w.size());
  return testing::RunRanks(ranks, [&](int r) {
    return w[r]->PushPull(step, bufs[r].data(), bufs[r].size(), DType::kF32, ReduceOp::kSum, world,
                          r, 16 << 10, slicer, absl::Now() + absl::Seconds(20));
  });
}

// Two processes; one is stopped by `signal` while a step waits for a third worker.
void StopShardMidStep(int signal, const std::string& want) {
  Server a = Spawn("a"), b = Spawn("b");
  const std::vector<HostPort> addrs = {{"127.0.0.1", a.port}, {"127.0.0.1", b.port}};
  auto w = testing::MakeWorkers(3, "procs", addrs);
  std::vector<std::vector<float>> bufs(3, std::vector<float>(50000, 1.5f));
  std::vector<absl::Status> st = Step(w, bufs, {0, 1, 2}, 1);
  for (const absl::Status& s : st) ASSERT_TRUE(s.ok()) << s;
  for (const auto& b : bufs) ASSERT_EQ(b[49999], 4.5f);

  const double before = Pushed(a) + Pushed(b);
  std::thread t([&] { st = Step(w, bufs, {0, 1}, 2); });  // rank 2 is missing
  // The shards took all of step 2 from ranks 0 and 1 (13 partitions fit
  // their windows of 8 per shard): those wait for their results now.
  const double taken = before + 2 * 50000 * sizeof(float);
  const absl::Time until = absl::Now() + absl::Seconds(10);
  while (Pushed(a) + Pushed(b) != taken && absl::Now() < until) {
    absl::SleepFor(absl::Milliseconds(5));
  }
  EXPECT_EQ(Pushed(a) + Pushed(b), taken);
  const absl::Time stopped = absl::Now();
  kill(b.pid, signal);
  t.join();
  EXPECT_LT(absl::Now() - stopped, absl::Seconds(5));
  for (const absl::Status& s : st) {
    EXPECT_TRUE(absl::IsUnavailable(s)) << s;
    // Normally "lost while pulling partition 1 of step 2: <want>"; on a slow
    // machine the workers may still be pushing when the shard goes.
    EXPECT_THAT(std::string(s.message()),
                HasSubstr(absl::StrCat("ps shard 1 (127.0.0.1:", b.port, ") lost while ")));
    EXPECT_THAT(std::string(s.message()), HasSubstr(" of step 2: "));
    if (absl::StrContains(s.message(), "pulling")) {
      EXPECT_THAT(std::string(s.message()), HasSubstr("pulling partition 1 of step 2: " + want));
    }
  }
  EXPECT_EQ(WaitExit(b.pid, absl::Seconds(5)), signal == SIGTERM ? 0 : 128 + SIGKILL);
  kill(a.pid, SIGTERM);
  EXPECT_EQ(WaitExit(a.pid, absl::Seconds(5)), 0);
}

TEST(GradsyncPs, StoppedShardFailsEveryWorkerNamingItAndExitsCleanly) {
  StopShardMidStep(SIGTERM, "the shard closed the connection: ps shard 1: shutting down");
}

TEST(GradsyncPs, KilledShardFailsEveryWorkerNamingIt) {
  StopShardMidStep(SIGKILL, "closed by peer");
}

}  // namespace
}  // namespace gradsync::ps
