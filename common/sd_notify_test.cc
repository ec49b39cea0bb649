#include "common/sd_notify.h"

#include <unistd.h>

#include <atomic>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "common/sd_notify_testing.h"

namespace gradsync {
namespace {

TEST(SdNotify, NoOpWithoutNotifySocket) {
  unsetenv("NOTIFY_SOCKET");
  EXPECT_FALSE(NotifySocketSet());
  EXPECT_TRUE(NotifyReady().ok());
  EXPECT_TRUE(NotifyStatus("x").ok());
  EXPECT_TRUE(NotifyStopping().ok());
}

TEST(SdNotify, ReadyStatusAndStoppingArrive) {
  FakeSystemd systemd;
  ASSERT_TRUE(systemd.bound());
  EXPECT_TRUE(NotifySocketSet());
  ASSERT_TRUE(NotifyReady().ok());
  EXPECT_EQ(systemd.Receive(), "READY=1");
  ASSERT_TRUE(NotifyReady("serving on 127.0.0.1:7070").ok());
  EXPECT_EQ(systemd.Receive(), "READY=1\nSTATUS=serving on 127.0.0.1:7070");
  ASSERT_TRUE(NotifyStatus("two\nlines").ok());
  EXPECT_EQ(systemd.Receive(), "STATUS=two lines");  // a newline would start a new assignment
  ASSERT_TRUE(NotifyStopping("bye").ok());
  EXPECT_EQ(systemd.Receive(), "STOPPING=1\nSTATUS=bye");
}

TEST(SdNotify, UnreachableSocketIsAnError) {
  setenv("NOTIFY_SOCKET", "@gradsync-sd-notify-test-nobody-listens", 1);
  absl::Status s = NotifyReady();
  unsetenv("NOTIFY_SOCKET");
  EXPECT_EQ(s.code(), absl::StatusCode::kUnavailable) << s;
  EXPECT_TRUE(absl::StrContains(s.message(), "nobody-listens")) << s;
}

TEST(SystemdWatchdog, DisabledWithoutWatchdogUsec) {
  FakeSystemd systemd;
  unsetenv("WATCHDOG_USEC");
  auto watchdog = SystemdWatchdog::Start();
  ASSERT_TRUE(watchdog.ok()) << watchdog.status();
  EXPECT_FALSE((*watchdog)->enabled());
  EXPECT_EQ(systemd.Receive(absl::Milliseconds(200)), "");
}

TEST(SystemdWatchdog, DisabledForAnotherPid) {
  FakeSystemd systemd;
  setenv("WATCHDOG_USEC", "100000", 1);
  setenv("WATCHDOG_PID", "1", 1);
  auto watchdog = SystemdWatchdog::Start();
  unsetenv("WATCHDOG_USEC");
  unsetenv("WATCHDOG_PID");
  ASSERT_TRUE(watchdog.ok()) << watchdog.status();
  EXPECT_FALSE((*watchdog)->enabled());
}

TEST(SystemdWatchdog, MalformedUsecIsAnError) {
  setenv("WATCHDOG_USEC", "soon", 1);
  auto watchdog = SystemdWatchdog::Start();
  unsetenv("WATCHDOG_USEC");
  ASSERT_FALSE(watchdog.ok());
  EXPECT_EQ(watchdog.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(absl::StrContains(watchdog.status().message(), "soon")) << watchdog.status();
}

TEST(SystemdWatchdog, PingsAtHalfTheIntervalUntilStopped) {
  FakeSystemd systemd;
  setenv("WATCHDOG_USEC", "100000", 1);  // 100 ms: pings every 50 ms
  setenv("WATCHDOG_PID", absl::StrCat(getpid()).c_str(), 1);
  auto watchdog = SystemdWatchdog::Start();
  unsetenv("WATCHDOG_USEC");
  unsetenv("WATCHDOG_PID");
  ASSERT_TRUE(watchdog.ok()) << watchdog.status();
  ASSERT_TRUE((*watchdog)->enabled());
  EXPECT_EQ((*watchdog)->interval(), absl::Milliseconds(100));
  EXPECT_EQ((*watchdog)->ping_period(), absl::Milliseconds(50));
  const absl::Time start = absl::Now();
  for (int i = 0; i < 4; ++i) EXPECT_EQ(systemd.Receive(), "WATCHDOG=1") << i;
  // The first ping is immediate, then one every 50 ms: 4 take about 150 ms.
  EXPECT_GE(absl::Now() - start, absl::Milliseconds(100));
  (*watchdog)->Stop();
  while (!systemd.Receive(absl::Milliseconds(10)).empty()) {  // drain one in flight
  }
  EXPECT_EQ(systemd.Receive(absl::Milliseconds(200)), "");
  (*watchdog)->Stop();  // idempotent
}

TEST(SystemdWatchdog, NoPingWhileUnhealthy) {
  FakeSystemd systemd;
  setenv("WATCHDOG_USEC", "40000", 1);
  std::atomic<bool> healthy{false};
  std::atomic<int> checks{0};
  auto watchdog = SystemdWatchdog::Start([&] {
    ++checks;
    return healthy.load();
  });
  unsetenv("WATCHDOG_USEC");
  ASSERT_TRUE(watchdog.ok()) << watchdog.status();
  EXPECT_EQ(systemd.Receive(absl::Milliseconds(200)), "");
  EXPECT_GE(checks.load(), 2);
  healthy = true;
  EXPECT_EQ(systemd.Receive(), "WATCHDOG=1");
}

}  // namespace
}  // namespace gradsync
