// When a session was last used by its client (a submission, a wait, a
// keep-alive), so the daemon can close sessions whose client went quiet with
// nothing pending (gradsyncd --session_lease, worker/daemon_heartbeat.cc).
//
// Thread-safe, lock-free (one atomic): Touch is on every op's path.
#ifndef GRADSYNC_WORKER_SESSION_LEASE_H_
#define GRADSYNC_WORKER_SESSION_LEASE_H_

#include <atomic>
#include <cstdint>

#include "absl/time/time.h"
#include "common/clock.h"

namespace gradsync {

class SessionLease {
 public:
  SessionLease() { Touch(); }  // a new session was just used

  void Touch() { last_used_ns_.store(absl::ToUnixNanos(FastNow()), std::memory_order_relaxed); }
  absl::Time last_used() const {
    return absl::FromUnixNanos(last_used_ns_.load(std::memory_order_relaxed));
  }

 private:
  std::atomic<int64_t> last_used_ns_{0};
};

}  // namespace gradsync

#endif  // GRADSYNC_WORKER_SESSION_LEASE_H_
