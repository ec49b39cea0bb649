// The gradsync-coordinator binary as systemd and Prometheus see it: a config
// file (command-line flags win), READY/STATUS/WATCHDOG/STOPPING on
// NOTIFY_SOCKET, /metrics over HTTP, and start-up errors that exit 1.
#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/strip.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "common/metrics.h"
#include "common/metrics_testing.h"
#include "common/sd_notify_testing.h"
#include "proto/coordinator.grpc.pb.h"

extern char** environ;

namespace gradsync {
namespace {

std::string BinaryPath() {
  const char* srcdir = std::getenv("TEST_SRCDIR");
  const char* workspace = std::getenv("TEST_WORKSPACE");
  if (srcdir == nullptr) return "server/gradsync-coordinator";
  return absl::StrCat(srcdir, "/", workspace ? workspace : "gradsync",
                      "/server/gradsync-coordinator");
}

std::string TmpPath(const std::string& name) {
  const char* tmp = std::getenv("TEST_TMPDIR");
  return absl::StrCat(tmp ? tmp : "/tmp", "/", name, ".", getpid());
}

void WriteFile(const std::string& path, const std::string& text) {
  std::ofstream(path) << text;
}

std::string ReadFile(const std::string& path) {
  std::ifstream in(path);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

// Starts the binary with stderr going to `stderr_path`; the environment is
// this process's (so NOTIFY_SOCKET from a FakeSystemd is inherited).
// The coordinator runs with --insecure unless `insecure` is false.
pid_t Spawn(std::vector<std::string> args, const std::string& stderr_path, bool insecure = true) {
  if (insecure) args.insert(args.begin(), "--insecure");
  args.insert(args.begin(), BinaryPath());
  std::vector<char*> argv;
  for (auto& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_addopen(&actions, 2, stderr_path.c_str(),
                                   O_WRONLY | O_CREAT | O_TRUNC, 0644);
  pid_t pid = -1;
  const int rc = posix_spawn(&pid, argv[0], &actions, nullptr, argv.data(), environ);
  posix_spawn_file_actions_destroy(&actions);
  return rc == 0 ? pid : -1;
}

// The exit status, or -1 if it did not exit within `timeout` (then killed).
int WaitExit(pid_t pid, absl::Duration timeout) {
  const absl::Time deadline = absl::Now() + timeout;
  while (absl::Now() < deadline) {
    int status = 0;
    if (waitpid(pid, &status, WNOHANG) == pid) return WIFEXITED(status) ? WEXITSTATUS(status) : 128;
    absl::SleepFor(absl::Milliseconds(10));
  }
  kill(pid, SIGKILL);
  waitpid(pid, nullptr, 0);
  return -1;
}

// "... metrics on http://127.0.0.1:PORT/metrics" -> PORT (0 if absent).
int MetricsPortFromStatus(const std::string& status) {
  const std::string marker = "metrics on http://127.0.0.1:";
  const size_t at = status.find(marker);
  if (at == std::string::npos) return 0;
  const size_t begin = at + marker.size();
  const size_t end = status.find('/', begin);
  int port = 0;
  if (!absl::SimpleAtoi(status.substr(begin, end - begin), &port)) return 0;
  return port;
}

TEST(CoordinatorMain, ConfigFileNotifyWatchdogAndMetrics) {
  FakeSystemd systemd;
  ASSERT_TRUE(systemd.bound());
  setenv("WATCHDOG_USEC", "200000", 1);  // pings every 100 ms
  const std::string config = TmpPath("coordinator.conf");
  const std::string port_file = TmpPath("coordinator.port");
  const std::string log = TmpPath("coordinator.log");
  WriteFile(config, absl::StrCat("# as in deploy/config\n"
                                 "listen = 127.0.0.1:0\n"
                                 "metrics_listen = 127.0.0.1:0\n"
                                 "port_file = ",
                                 port_file,
                                 "\n"
                                 "heartbeat_timeout_ms = 1500\n"
                                 "op_timeout_ms = 1234\n"));
  const pid_t pid = Spawn({absl::StrCat("--config=", config), "--op_timeout_ms=4321"}, log);
  unsetenv("WATCHDOG_USEC");
  ASSERT_GT(pid, 0);

  const std::string ready = systemd.ReceiveSkippingWatchdog(absl::Seconds(10));
  ASSERT_TRUE(absl::StartsWith(ready, "READY=1\nSTATUS=serving gRPC (plaintext) on 127.0.0.1:"))
      << "'" << ready << "'\n" << ReadFile(log);
  const int metrics_port = MetricsPortFromStatus(ready);
  ASSERT_GT(metrics_port, 0) << ready;
  int grpc_port = 0, port_file_metrics = 0;
  const std::vector<std::string> port_lines =
      absl::StrSplit(absl::StripSuffix(ReadFile(port_file), "\n"), '\n');
  ASSERT_EQ(port_lines.size(), 2u) << "port file written before READY";
  ASSERT_TRUE(absl::SimpleAtoi(port_lines[0], &grpc_port));
  ASSERT_TRUE(absl::SimpleAtoi(port_lines[1], &port_file_metrics));
  EXPECT_EQ(port_file_metrics, metrics_port);

  auto stub = v1::Coordinator::NewStub(grpc::CreateChannel(
      absl::StrCat("127.0.0.1:", grpc_port), grpc::InsecureChannelCredentials()));
  grpc::ClientContext ctx;
  ctx.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(5)));
  v1::CreateJobRequest req;
  req.set_job_id("bin-job");
  req.set_world_size(2);
  v1::CreateJobResponse resp;
  ASSERT_TRUE(stub->CreateJob(&ctx, req, &resp).ok());
  EXPECT_EQ(resp.options().heartbeat_timeout_ms(), 1500);  // from the file
  EXPECT_EQ(resp.options().op_timeout_ms(), 4321);         // the command line wins

  absl::StatusOr<std::string> body = HttpGet("127.0.0.1", metrics_port, "/metrics");
  ASSERT_TRUE(body.ok()) << body.status();
  EXPECT_EQ(FindSample(*body, "gradsync_coordinator_jobs{state=\"forming\"}").value_or(-1), 1);
  EXPECT_EQ(FindSample(*body, "gradsync_coordinator_rpc_seconds_count{method=\"CreateJob\"}")
                .value_or(-1),
            1);
  EXPECT_EQ(FindSample(*body, absl::StrCat("gradsync_build_info{version=\"", kGradsyncVersion,
                                           "\"}"))
                .value_or(-1),
            1);
  EXPECT_TRUE(FindSample(*body, "process_start_time_seconds").ok());

  // Two more watchdog pings (every 100 ms) while it serves.
  int pings = 0;
  const absl::Time deadline = absl::Now() + absl::Seconds(10);
  while (pings < 2 && absl::Now() < deadline) {
    const std::string m = systemd.Receive(deadline - absl::Now());
    if (m == "WATCHDOG=1") {
      ++pings;
    } else if (!m.empty()) {
      ADD_FAILURE() << "unexpected notification '" << m << "'";
    }
  }
  EXPECT_EQ(pings, 2);
  ASSERT_EQ(kill(pid, SIGTERM), 0);
  EXPECT_EQ(systemd.ReceiveSkippingWatchdog(), "STOPPING=1\nSTATUS=draining");
  EXPECT_EQ(WaitExit(pid, absl::Seconds(5)), 0) << ReadFile(log);
}

TEST(CoordinatorMain, UnknownConfigKeyExitsOneNamingTheLine) {
  const std::string config = TmpPath("bad.conf");
  const std::string log = TmpPath("bad.log");
  WriteFile(config, "listen = 127.0.0.1:0\nmetrics_lisen = 127.0.0.1:0\n");
  const pid_t pid = Spawn({absl::StrCat("--config=", config)}, log);
  ASSERT_GT(pid, 0);
  EXPECT_EQ(WaitExit(pid, absl::Seconds(5)), 1);
  EXPECT_TRUE(absl::StrContains(ReadFile(log), absl::StrCat(config, ":2: unknown key 'metrics_lisen'")))
      << ReadFile(log);
}

// Secure by default: without certificates the coordinator starts only when
// told --insecure; otherwise it exits 2 saying both ways out.
TEST(CoordinatorMain, WithoutTlsOrInsecureItDoesNotStart) {
  const std::string log = TmpPath("notls.log");
  const pid_t pid = Spawn({"--listen=127.0.0.1:0", "--metrics_listen="}, log, /*insecure=*/false);
  ASSERT_GT(pid, 0);
  EXPECT_EQ(WaitExit(pid, absl::Seconds(5)), 2);
  EXPECT_TRUE(absl::StrContains(ReadFile(log),
                                "gradsync-coordinator needs --tls_cert, --tls_key and --tls_ca"))
      << ReadFile(log);
  EXPECT_TRUE(absl::StrContains(ReadFile(log), "or --insecure")) << ReadFile(log);
}

TEST(CoordinatorMain, MissingConfigFileExitsOne) {
  const std::string log = TmpPath("missing.log");
  const pid_t pid = Spawn({"--config=/nonexistent/gradsync-coordinator.conf"}, log);
  ASSERT_GT(pid, 0);
  EXPECT_EQ(WaitExit(pid, absl::Seconds(5)), 1);
  EXPECT_TRUE(absl::StrContains(ReadFile(log), "/nonexistent/gradsync-coordinator.conf"))
      << ReadFile(log);
}

TEST(CoordinatorMain, MetricsPortInUseExitsOneNamingTheAddress) {
  MetricsRegistry registry;
  auto taken = MetricsServer::Start("127.0.0.1:0", registry);
  ASSERT_TRUE(taken.ok()) << taken.status();
  const std::string log = TmpPath("inuse.log");
  const pid_t pid = Spawn({"--listen=127.0.0.1:0",
                           absl::StrCat("--metrics_listen=", (*taken)->address())},
                          log);
  ASSERT_GT(pid, 0);
  EXPECT_EQ(WaitExit(pid, absl::Seconds(5)), 1);
  EXPECT_TRUE(absl::StrContains(ReadFile(log), (*taken)->address())) << ReadFile(log);
}

TEST(CoordinatorMain, EmptyMetricsListenTurnsMetricsOff) {
  FakeSystemd systemd;
  const std::string log = TmpPath("off.log");
  const pid_t pid = Spawn({"--listen=127.0.0.1:0", "--metrics_listen="}, log);
  ASSERT_GT(pid, 0);
  const std::string ready = systemd.Receive(absl::Seconds(10));
  EXPECT_TRUE(absl::EndsWith(ready, ", metrics off")) << ready;
  kill(pid, SIGTERM);
  EXPECT_EQ(WaitExit(pid, absl::Seconds(5)), 0) << ReadFile(log);
}

}  // namespace
}  // namespace gradsync
