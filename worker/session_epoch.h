// Whether a session may still run ops in its job epoch, and if not, why.
//
// A session is in one of four states, each later one sticky:
//   healthy   Refusal() OK, health() OK;
//   draining  StopAccepting(reason): new ops refused with Unavailable(reason),
//             queued and running ops go on (health() stays OK);
//   failed    Fail(cause) / EndEpoch: health() is the first cause; new ops
//             refused with FailedPrecondition "job 'J' epoch E is no longer
//             usable (open a new session): <cause>";
//   closed    Close(why): new ops refused with FailedPrecondition "session is
//             closed"; health() is the earlier cause, else `why` (by
//             default Cancelled "session closed").
// Refusal() reports the strongest: closed, then draining, then failed.
//
// Thread-safe. Its mutex is a leaf: SessionOps calls Refusal() and Fail()
// while holding its own (worker/session_ops.h), so nothing here calls out.
#ifndef GRADSYNC_WORKER_SESSION_EPOCH_H_
#define GRADSYNC_WORKER_SESSION_EPOCH_H_

#include <cstdint>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"

namespace gradsync {

class SessionEpoch {
 public:
  // `job_id` and `epoch` name the epoch in Refusal()'s message.
  SessionEpoch(std::string job_id, int64_t epoch) : job_id_(std::move(job_id)), epoch_(epoch) {}

  // Breaks the epoch with `cause` (not OK) unless it already broke; true if
  // this call broke it.
  bool Fail(const absl::Status& cause);
  // Refuses new ops with Unavailable(`reason`); the epoch stays usable.
  void StopAccepting(const std::string& reason);
  // Closed for good; health() is `why` unless the epoch failed earlier (an
  // executor that looks at the session before the close broke the epoch
  // then names the same cause).
  void Close(const absl::Status& why = absl::CancelledError("session closed"));

  // OK while the epoch is usable; else the first cause.
  absl::Status health() const;
  // OK while new ops are taken; else why not (see above).
  absl::Status Refusal() const;
  bool closed() const;

 private:
  const std::string job_id_;
  const int64_t epoch_;
  mutable absl::Mutex mu_;
  absl::Status error_ ABSL_GUARDED_BY(mu_);
  bool closed_ ABSL_GUARDED_BY(mu_) = false;
  std::string not_accepting_ ABSL_GUARDED_BY(mu_);  // non-empty: draining
};

}  // namespace gradsync

#endif  // GRADSYNC_WORKER_SESSION_EPOCH_H_
