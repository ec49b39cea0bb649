#include "worker/client_watch.h"

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <utility>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "gtest/gtest.h"

namespace gradsync {
namespace {

// A child that waits to be killed.
pid_t SpawnSleeper() {
  const pid_t pid = ::fork();
  if (pid == 0) {
    ::pause();
    ::_exit(0);
  }
  return pid;
}

// What on_exit saw, in order.
struct Exits {
  absl::Mutex mu;
  std::vector<std::pair<std::string, int64_t>> seen ABSL_GUARDED_BY(mu);

  ClientWatch::OnExit Callback() {
    return [this](const std::string& id, int64_t pid) {
      absl::MutexLock l(&mu);
      seen.emplace_back(id, pid);
    };
  }
  // Waits up to `timeout` for `n` exits; returns what was seen.
  std::vector<std::pair<std::string, int64_t>> WaitFor(size_t n, absl::Duration timeout) {
    absl::MutexLock l(&mu);
    auto enough = [this, n]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) { return seen.size() >= n; };
    mu.AwaitWithTimeout(absl::Condition(&enough), timeout);
    return seen;
  }
};

TEST(ClientWatch, AKilledClientIsReportedAtOnceWithItsSessionAndPid) {
  Exits exits;
  auto watch = ClientWatch::Start(exits.Callback());
  ASSERT_TRUE(watch.ok()) << watch.status();
  const pid_t a = SpawnSleeper();
  const pid_t b = SpawnSleeper();
  ASSERT_TRUE((*watch)->Watch("s-a", a).ok());
  ASSERT_TRUE((*watch)->Watch("s-b", b).ok());
  EXPECT_EQ((*watch)->watched(), 2u);
  const absl::Time killed = absl::Now();
  ASSERT_EQ(::kill(b, SIGKILL), 0);
  auto seen = exits.WaitFor(1, absl::Seconds(5));
  const absl::Duration took = absl::Now() - killed;
  ASSERT_EQ(seen.size(), 1u);
  EXPECT_EQ(seen[0], std::make_pair(std::string("s-b"), static_cast<int64_t>(b)));
  EXPECT_LT(took, absl::Milliseconds(500));  // milliseconds; generous for a loaded machine
  EXPECT_EQ((*watch)->watched(), 1u);  // reported once, then forgotten
  ::kill(a, SIGKILL);
  ::waitpid(a, nullptr, 0);
  ::waitpid(b, nullptr, 0);
  seen = exits.WaitFor(2, absl::Seconds(5));
  ASSERT_EQ(seen.size(), 2u);
  EXPECT_EQ(seen[1].first, "s-a");
}

TEST(ClientWatch, AnUnwatchedSessionIsNotReported) {
  Exits exits;
  auto watch = ClientWatch::Start(exits.Callback());
  ASSERT_TRUE(watch.ok()) << watch.status();
  const pid_t gone = SpawnSleeper();
  const pid_t marker = SpawnSleeper();
  ASSERT_TRUE((*watch)->Watch("closed", gone).ok());
  ASSERT_TRUE((*watch)->Watch("marker", marker).ok());
  (*watch)->Unwatch("closed");
  (*watch)->Unwatch("never-watched");  // no-op
  ::kill(gone, SIGKILL);
  ::waitpid(gone, nullptr, 0);
  ::kill(marker, SIGKILL);  // reported after `gone` would have been
  ::waitpid(marker, nullptr, 0);
  auto seen = exits.WaitFor(1, absl::Seconds(5));
  ASSERT_EQ(seen.size(), 1u);
  EXPECT_EQ(seen[0].first, "marker");
  EXPECT_EQ((*watch)->watched(), 0u);
}

TEST(ClientWatch, AProcessThatAlreadyExitedIsNotFound) {
  Exits exits;
  auto watch = ClientWatch::Start(exits.Callback());
  ASSERT_TRUE(watch.ok()) << watch.status();
  const pid_t pid = SpawnSleeper();
  ::kill(pid, SIGKILL);
  ::waitpid(pid, nullptr, 0);  // reaped: the pid is free
  const absl::Status s = (*watch)->Watch("late", pid);
  EXPECT_TRUE(absl::IsNotFound(s)) << s;
  EXPECT_EQ(s.message(), "client pid " + std::to_string(pid) + " has already exited");
  EXPECT_TRUE(absl::IsInvalidArgument((*watch)->Watch("none", 0)));
  EXPECT_EQ((*watch)->watched(), 0u);
}

}  // namespace
}  // namespace gradsync
