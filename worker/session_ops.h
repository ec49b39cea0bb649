// A session's ops from submission to report: numbering, the queue the job's
// executor takes them from, their outcomes, and what `gradsync status` shows
// of the current and the last finished op.
//
//   Push       gives the op its id (1, 2, ...: what the client waits on)
//              and, for a collective, its sequence number (seq, sig.seq:
//              1, 2, ... over the session's collectives, which every rank
//              numbers alike) and queues it; a point-to-point op gets no
//              sequence number and is not queued (the caller hands it to
//              the executor's point-to-point engine), unless the session refuses ops (SessionEpoch::Refusal) or
//              kMaxUnreportedOps are queued or unreported
//              (ResourceExhausted).
//   TakeNext   the executor takes the oldest queued op (FIFO); it becomes the
//              current op.
//   Finish     records an outcome once (false for an op already finished); a
//              failure other than InvalidArgument (a signature mismatch)
//              breaks the epoch first (unless told not to: a point-to-point
//              op's own failure), so a client that sees the failure
//              sees its new ops refused. Then the completion listener hears
//              of it, outside the lock; if the listener delivered it, the op
//              is forgotten.
//   Wait       blocks up to a deadline for the outcome (done=false if it
//              has not finished); a finished op reported once is forgotten
//              (NotFound afterwards).
//   TakeQueued / FailUntaken   Close: the ops the executor never took fail
//              with the close's cause.
//
// Thread-safe. Lock order: this class's mutex, then SessionEpoch's (a leaf).
// The listener is called with no lock held, on the thread that finishes the
// op (the executor's).
#ifndef GRADSYNC_WORKER_SESSION_OPS_H_
#define GRADSYNC_WORKER_SESSION_OPS_H_

#include <cstddef>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "worker/queued_op.h"
#include "worker/session_epoch.h"
#include "worker/submission_feed.h"

namespace gradsync {

// The op part of SessionStatus (worker/session.h).
struct OpsStatus {
  int queued = 0;  // ops waiting behind the current one
  uint64_t last_completed_seq = 0;
  std::string last_completed;  // e.g. "allreduce 'g' f32[10] sum (op 4): OK"
  absl::Time last_completed_at = absl::InfinitePast();
  bool has_current = false;
  uint64_t current_seq = 0;
  std::string current;  // "allreduce 'g' f32[10] sum (op 5)"
  absl::Time current_since;
};

class SessionOps {
 public:
  // Called each time an op finishes (see Finish). True: the outcome was
  // delivered elsewhere (a shared-memory completion queue) and the op is
  // forgotten.
  using CompletionListener = std::function<bool(uint64_t op_id, const OpOutcome& outcome)>;

  // Ops queued or finished but not yet reported, at most.
  static constexpr size_t kMaxUnreportedOps = 4096;

  // `session_id` names the session in errors; `epoch` (outlives this) says
  // whether ops are taken and hears of failures.
  SessionOps(std::string session_id, SessionEpoch* epoch)
      : session_id_(std::move(session_id)), epoch_(epoch) {}

  // Numbers `op` (id; a collective's seq and sig.seq), stamps it (submitted
  // = now, deadline = now + timeout) and queues a collective; returns its op
  // id. Refused as above.
  absl::StatusOr<uint64_t> Push(std::shared_ptr<QueuedOp> op, absl::Duration timeout);
  // The oldest queued op (null if none), marked started now and current.
  std::shared_ptr<QueuedOp> TakeNext();
  // Records the outcome of `op` (status `s`, the plan it ran, finished at
  // `end`), once: false if it was already finished. `newly_failed`: this
  // failure broke the epoch (never without `may_break_epoch`). `source`:
  // OpResult::source (point-to-point ops).
  bool Finish(QueuedOp& op, const absl::Status& s, absl::string_view plan, absl::Time end,
              bool* newly_failed, bool may_break_epoch = true, int source = -1);
  // Waits until `deadline` for op `op_id`. NotFound if it is not pending
  // (reported already, delivered by the listener, or never submitted).
  absl::StatusOr<OpOutcome> Wait(uint64_t op_id, absl::Time deadline);

  // The queued ops, taken out of the queue (they stay in the op table).
  std::deque<std::shared_ptr<QueuedOp>> TakeQueued();
  // Finishes `ops` (from TakeQueued) with `why`, started and ended now.
  void FailUntaken(const std::deque<std::shared_ptr<QueuedOp>>& ops, const absl::Status& why);

  // At most one listener; set it before ops are pushed. nullptr removes it.
  void SetCompletionListener(CompletionListener listener);
  void SetFeed(std::shared_ptr<SubmissionFeed> feed);
  std::shared_ptr<SubmissionFeed> feed() const;

  // Some op is queued or running (finished but unreported ones do not count).
  bool has_pending() const;
  OpsStatus Status() const;

 private:
  const std::string session_id_;
  SessionEpoch* const epoch_;

  mutable absl::Mutex mu_;
  uint64_t next_id_ ABSL_GUARDED_BY(mu_) = 1;
  uint64_t next_seq_ ABSL_GUARDED_BY(mu_) = 1;  // collectives only
  std::deque<std::shared_ptr<QueuedOp>> queue_ ABSL_GUARDED_BY(mu_);
  // Queued, running, and finished but unreported, by op id.
  std::map<uint64_t, std::shared_ptr<QueuedOp>> ops_ ABSL_GUARDED_BY(mu_);
  // Shared, so Finish takes a reference under mu_ and calls it outside
  // without copying the function (and what it captured) per op.
  std::shared_ptr<const CompletionListener> listener_ ABSL_GUARDED_BY(mu_);
  std::shared_ptr<SubmissionFeed> feed_ ABSL_GUARDED_BY(mu_);
  // The op in progress (0: none) and the last finished one; their
  // descriptions are made only when someone asks (Status).
  uint64_t current_seq_ ABSL_GUARDED_BY(mu_) = 0;
  OpSignature current_sig_ ABSL_GUARDED_BY(mu_);
  absl::Time current_since_ ABSL_GUARDED_BY(mu_);
  uint64_t last_completed_seq_ ABSL_GUARDED_BY(mu_) = 0;
  OpSignature last_completed_sig_ ABSL_GUARDED_BY(mu_);
  absl::StatusCode last_completed_code_ ABSL_GUARDED_BY(mu_) = absl::StatusCode::kOk;
  absl::Time last_completed_at_ ABSL_GUARDED_BY(mu_) = absl::InfinitePast();
};

}  // namespace gradsync

#endif  // GRADSYNC_WORKER_SESSION_OPS_H_
