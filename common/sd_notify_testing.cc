#include "common/sd_notify_testing.h"

#include <fcntl.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <cstddef>
#include <cstdlib>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"

namespace gradsync {

FakeSystemd::FakeSystemd() {
  // Autobind: the kernel picks a unique abstract name. (A name made from our
  // pid could clash: Bazel's sandboxes have their own pid namespaces but
  // share the network namespace, which holds the abstract names.)
  const int fd = socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  struct sockaddr_un addr = {};
  addr.sun_family = AF_UNIX;
  auto* sa = reinterpret_cast<struct sockaddr*>(&addr);
  socklen_t len = sizeof(addr);
  const bool bound = fd >= 0 && bind(fd, sa, sizeof(sa_family_t)) == 0 &&
                     getsockname(fd, sa, &len) == 0 &&
                     len > offsetof(struct sockaddr_un, sun_path) + 1 && addr.sun_path[0] == '\0';
  if (bound && pipe2(stop_pipe_, O_CLOEXEC) == 0) {
    fd_ = fd;
    name_ = absl::StrCat(
        "@", absl::string_view(addr.sun_path + 1, len - offsetof(struct sockaddr_un, sun_path) - 1));
    reader_ = std::thread([this] { ReadLoop(); });
    setenv("NOTIFY_SOCKET", name_.c_str(), 1);
  } else {
    if (fd >= 0) close(fd);
    setenv("NOTIFY_SOCKET", "@gradsync-fake-systemd-unbound", 1);
  }
}

FakeSystemd::~FakeSystemd() {
  unsetenv("NOTIFY_SOCKET");
  if (reader_.joinable()) {
    const char byte = 0;
    (void)!write(stop_pipe_[1], &byte, 1);
    reader_.join();
  }
  for (int fd : {fd_, stop_pipe_[0], stop_pipe_[1]}) {
    if (fd >= 0) close(fd);
  }
}

void FakeSystemd::ReadLoop() {
  while (true) {
    struct pollfd p[2] = {{fd_, POLLIN, 0}, {stop_pipe_[0], POLLIN, 0}};
    if (poll(p, 2, -1) < 0) continue;
    if (p[1].revents != 0) return;
    char buf[4096];
    const ssize_t n = recv(fd_, buf, sizeof(buf), MSG_DONTWAIT);
    if (n <= 0) continue;
    absl::MutexLock lock(&mu_);
    received_.emplace_back(buf, static_cast<size_t>(n));
  }
}

std::string FakeSystemd::Receive(absl::Duration timeout) {
  absl::MutexLock lock(&mu_);
  auto has_one = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return !received_.empty(); };
  if (!mu_.AwaitWithTimeout(absl::Condition(&has_one), timeout)) return "";
  std::string m = std::move(received_.front());
  received_.pop_front();
  return m;
}

std::string FakeSystemd::ReceiveSkippingWatchdog(absl::Duration timeout) {
  const absl::Time deadline = absl::Now() + timeout;
  while (true) {
    const absl::Duration left = deadline - absl::Now();
    if (left <= absl::ZeroDuration()) return "";
    std::string m = Receive(left);
    if (m != "WATCHDOG=1") return m;
    absl::MutexLock lock(&mu_);
    ++watchdog_pings_;
  }
}

int FakeSystemd::watchdog_pings() {
  absl::MutexLock lock(&mu_);
  return watchdog_pings_;
}

}  // namespace gradsync
