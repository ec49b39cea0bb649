#include "worker/session_ops.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "common/clock.h"
#include "common/status_macros.h"
#include "common/types.h"

namespace gradsync {

absl::StatusOr<uint64_t> SessionOps::Push(std::shared_ptr<QueuedOp> op, absl::Duration timeout) {
  absl::MutexLock l(&mu_);
  // Under mu_: a Close that refuses ops from now on takes the queue after
  // this op is in it (TakeQueued), or this op is refused.
  RETURN_IF_ERROR(epoch_->Refusal());
  if (ops_.size() >= kMaxUnreportedOps) {
    return absl::ResourceExhaustedError(absl::StrCat(
        ops_.size(), " ops are queued or unreported; Wait for some before submitting more"));
  }
  op->id = next_id_++;
  op->submitted = FastNow();
  op->deadline = op->submitted + timeout;
  ops_[op->id] = op;
  const uint64_t id = op->id;
  if (IsPointToPoint(op->sig.kind)) {  // the caller hands it to the executor
    op->started = op->submitted;
    return id;
  }
  op->seq = next_seq_++;
  op->sig.seq = op->seq;
  queue_.push_back(std::move(op));
  return id;
}

std::shared_ptr<QueuedOp> SessionOps::TakeNext() {
  absl::MutexLock l(&mu_);
  if (queue_.empty()) return nullptr;
  std::shared_ptr<QueuedOp> op = std::move(queue_.front());
  queue_.pop_front();
  const absl::Time now = FastNow();
  op->started = now;
  current_seq_ = op->seq;
  current_sig_ = op->sig;  // described only when someone asks (Status)
  current_since_ = now;
  return op;
}

bool SessionOps::Finish(QueuedOp& op, const absl::Status& s, absl::string_view plan,
                        absl::Time end, bool* newly_failed, bool may_break_epoch,
                        int source) {
  std::shared_ptr<const CompletionListener> listener;
  OpOutcome outcome;
  {
    absl::MutexLock l(&mu_);
    if (op.outcome.done) return false;
    op.outcome.status = s;
    op.outcome.algorithm = std::string(plan);
    op.outcome.queued_time = op.started - op.submitted;
    op.outcome.run_time = end - op.started;
    op.outcome.source = source;
    // The epoch breaks before anyone can see the op done.
    *newly_failed =
        may_break_epoch && !s.ok() && !absl::IsInvalidArgument(s) && epoch_->Fail(s);
    op.outcome.done = true;
    if (op.seq != 0) {  // a collective (point-to-point ops have no sequence number)
      last_completed_seq_ = op.seq;
      last_completed_sig_ = op.sig;
      last_completed_code_ = s.code();
      last_completed_at_ = end;
      if (current_seq_ == op.seq) current_seq_ = 0;
    }
    listener = listener_;
    outcome = op.outcome;
  }
  // The client first; metrics come after, overlapping with its next op.
  if (listener != nullptr && (*listener)(op.id, outcome)) {
    absl::MutexLock l(&mu_);
    ops_.erase(op.id);
  }
  return true;
}

absl::StatusOr<OpOutcome> SessionOps::Wait(uint64_t op_id, absl::Time deadline) {
  absl::MutexLock l(&mu_);
  auto it = ops_.find(op_id);
  if (it == ops_.end()) {
    return absl::NotFoundError(absl::StrCat("op ", op_id, " is not pending in session ",
                                            session_id_,
                                            " (already reported, or never submitted)"));
  }
  std::shared_ptr<QueuedOp> op = it->second;
  auto done = [&op]() { return op->outcome.done; };
  mu_.AwaitWithDeadline(absl::Condition(&done), deadline);
  OpOutcome out = op->outcome;
  if (out.done) ops_.erase(op_id);
  return out;
}

std::deque<std::shared_ptr<QueuedOp>> SessionOps::TakeQueued() {
  std::deque<std::shared_ptr<QueuedOp>> queued;
  absl::MutexLock l(&mu_);
  queued.swap(queue_);
  return queued;
}

void SessionOps::FailUntaken(const std::deque<std::shared_ptr<QueuedOp>>& ops,
                             const absl::Status& why) {
  const absl::Time now = FastNow();
  for (const auto& op : ops) {
    {
      absl::MutexLock l(&mu_);
      op->started = now;
    }
    bool newly_failed = false;
    Finish(*op, why, "", now, &newly_failed);
  }
}

void SessionOps::SetCompletionListener(CompletionListener listener) {
  absl::MutexLock l(&mu_);
  listener_ = listener ? std::make_shared<const CompletionListener>(std::move(listener)) : nullptr;
}

void SessionOps::SetFeed(std::shared_ptr<SubmissionFeed> feed) {
  absl::MutexLock l(&mu_);
  feed_ = std::move(feed);
}

std::shared_ptr<SubmissionFeed> SessionOps::feed() const {
  absl::MutexLock l(&mu_);
  return feed_;
}

bool SessionOps::has_pending() const {
  absl::MutexLock l(&mu_);
  for (const auto& [id, op] : ops_) {
    if (!op->outcome.done) return true;
  }
  return false;
}

OpsStatus SessionOps::Status() const {
  OpsStatus st;
  absl::MutexLock l(&mu_);
  st.queued = static_cast<int>(queue_.size());
  st.last_completed_seq = last_completed_seq_;
  if (last_completed_seq_ != 0) {
    st.last_completed = absl::StrCat(
        last_completed_sig_.Describe(), " (op ", last_completed_seq_, "): ",
        last_completed_code_ == absl::StatusCode::kOk
            ? "OK"
            : absl::StatusCodeToString(last_completed_code_));
  }
  st.last_completed_at = last_completed_at_;
  if (current_seq_ != 0) {
    st.has_current = true;
    st.current_seq = current_seq_;
    st.current = absl::StrCat(current_sig_.Describe(), " (op ", current_seq_, ")");
    st.current_since = current_since_;
  }
  return st;
}

}  // namespace gradsync
