// systemd service notifications (sd_notify(3)) for Type=notify units:
// readiness, stopping, a status line, and the watchdog.
//
//   NotifyReady("serving on 0.0.0.0:7070");       // after the server accepts calls
//   auto watchdog = SystemdWatchdog::Start([&] { return registry.JobCount() >= 0; });
//   ... wait for SIGTERM ...
//   NotifyStopping("draining");
//
// Everything is a no-op returning OK when the process does not run under
// systemd (NOTIFY_SOCKET unset), so binaries call these unconditionally.
// NOTIFY_SOCKET may name a path or an abstract socket ("@name").
// Thread-safe: sd_notify opens a fresh datagram socket for every message.
#ifndef GRADSYNC_COMMON_SD_NOTIFY_H_
#define GRADSYNC_COMMON_SD_NOTIFY_H_

#include <functional>
#include <memory>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

namespace gradsync {

// Sends "READY=1" (plus "STATUS=<status>" when not empty). Call once the
// service accepts requests; systemd's start job waits for it.
// OK: sent, or not under systemd. UNAVAILABLE: sd_notify failed (errno text).
absl::Status NotifyReady(absl::string_view status = "");
// Sends "STOPPING=1" (plus STATUS). Call when a graceful stop begins.
absl::Status NotifyStopping(absl::string_view status = "");
// Sends "STATUS=<status>", shown by `systemctl status`. Newlines become spaces.
absl::Status NotifyStatus(absl::string_view status);
// true if NOTIFY_SOCKET is set, i.e. the notifications go somewhere.
bool NotifySocketSet();

// Pings the systemd watchdog ("WATCHDOG=1") from a thread, at half the
// interval the unit's WatchdogSec= asked for (sd_watchdog_enabled(3):
// WATCHDOG_USEC, and WATCHDOG_PID if set, must name this process). If the
// unit has no watchdog, no thread runs and enabled() is false.
//
// `healthy` (optional) is called before every ping from the watchdog thread;
// when it returns false the ping is skipped, so a wedged process gets
// restarted. It may block (e.g. take a mutex that a deadlock holds): then no
// ping is sent either, which is the point. Thread-safe.
class SystemdWatchdog {
 public:
  // INVALID_ARGUMENT: WATCHDOG_USEC/WATCHDOG_PID are malformed.
  static absl::StatusOr<std::unique_ptr<SystemdWatchdog>> Start(
      std::function<bool()> healthy = nullptr);
  ~SystemdWatchdog();  // Stop()
  SystemdWatchdog(const SystemdWatchdog&) = delete;
  SystemdWatchdog& operator=(const SystemdWatchdog&) = delete;

  // Ends the thread (waits for a running `healthy` call). Idempotent.
  void Stop();

  bool enabled() const { return interval_ > absl::ZeroDuration(); }
  // WatchdogSec= (zero when disabled), and the ping period (half of it).
  absl::Duration interval() const { return interval_; }
  absl::Duration ping_period() const { return interval_ / 2; }

 private:
  SystemdWatchdog(absl::Duration interval, std::function<bool()> healthy);
  void Loop();

  const absl::Duration interval_;
  const std::function<bool()> healthy_;
  absl::Mutex mu_;
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  std::thread thread_;
};

}  // namespace gradsync

#endif  // GRADSYNC_COMMON_SD_NOTIFY_H_
