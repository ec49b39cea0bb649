#include "common/sd_notify.h"

#include <systemd/sd-daemon.h>

#include <cstdlib>
#include <cstring>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "common/logging.h"

namespace gradsync {
namespace {

// One line: newlines would start a new assignment.
std::string OneLine(absl::string_view text) {
  return absl::StrReplaceAll(text, {{"\n", " "}, {"\r", " "}});
}

absl::Status Notify(const std::string& state) {
  const int r = sd_notify(/*unset_environment=*/0, state.c_str());
  if (r >= 0) return absl::OkStatus();  // 0: NOTIFY_SOCKET unset
  return absl::UnavailableError(absl::StrCat("sd_notify(\"", OneLine(state), "\") to '",
                                             std::getenv("NOTIFY_SOCKET") ? std::getenv("NOTIFY_SOCKET") : "",
                                             "': ", std::strerror(-r)));
}

absl::Status NotifyWithStatus(absl::string_view assignment, absl::string_view status) {
  std::string state(assignment);
  if (!status.empty()) absl::StrAppend(&state, "\nSTATUS=", OneLine(status));
  return Notify(state);
}

}  // namespace

absl::Status NotifyReady(absl::string_view status) { return NotifyWithStatus("READY=1", status); }

absl::Status NotifyStopping(absl::string_view status) {
  return NotifyWithStatus("STOPPING=1", status);
}

absl::Status NotifyStatus(absl::string_view status) {
  return Notify(absl::StrCat("STATUS=", OneLine(status)));
}

bool NotifySocketSet() {
  const char* socket = std::getenv("NOTIFY_SOCKET");
  return socket != nullptr && socket[0] != '\0';
}

// ---------------------------------------------------------------------------
// SystemdWatchdog

absl::StatusOr<std::unique_ptr<SystemdWatchdog>> SystemdWatchdog::Start(
    std::function<bool()> healthy) {
  uint64_t usec = 0;
  const int r = sd_watchdog_enabled(/*unset_environment=*/0, &usec);
  if (r < 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "systemd watchdog: WATCHDOG_USEC='", std::getenv("WATCHDOG_USEC") ? std::getenv("WATCHDOG_USEC") : "",
        "' WATCHDOG_PID='", std::getenv("WATCHDOG_PID") ? std::getenv("WATCHDOG_PID") : "",
        "': ", std::strerror(-r)));
  }
  const absl::Duration interval =
      r > 0 ? absl::Microseconds(static_cast<int64_t>(usec)) : absl::ZeroDuration();
  return std::unique_ptr<SystemdWatchdog>(new SystemdWatchdog(interval, std::move(healthy)));
}

SystemdWatchdog::SystemdWatchdog(absl::Duration interval, std::function<bool()> healthy)
    : interval_(interval), healthy_(std::move(healthy)) {
  if (enabled()) {
    GS_LOG(INFO) << "systemd watchdog: pinging every " << absl::FormatDuration(ping_period())
                 << " (WatchdogSec " << absl::FormatDuration(interval_) << ")";
    thread_ = std::thread([this] { Loop(); });
  }
}

SystemdWatchdog::~SystemdWatchdog() { Stop(); }

void SystemdWatchdog::Stop() {
  {
    absl::MutexLock lock(&mu_);
    stop_ = true;
  }
  if (thread_.joinable()) thread_.join();
}

void SystemdWatchdog::Loop() {
  absl::MutexLock lock(&mu_);
  while (!stop_) {
    mu_.Unlock();
    const bool healthy = !healthy_ || healthy_();
    absl::Status sent = absl::OkStatus();
    if (healthy) sent = Notify("WATCHDOG=1");
    mu_.Lock();
    if (!healthy) {
      GS_LOG(WARNING) << "systemd watchdog: the health check failed; not pinging";
    } else if (!sent.ok()) {
      GS_LOG(WARNING) << "systemd watchdog: " << sent.message();
    }
    mu_.AwaitWithTimeout(absl::Condition(&stop_), ping_period());
  }
}

}  // namespace gradsync
