#include "worker/session_epoch.h"

#include "absl/strings/str_cat.h"

namespace gradsync {

bool SessionEpoch::Fail(const absl::Status& cause) {
  absl::MutexLock l(&mu_);
  if (!error_.ok() || cause.ok()) return false;
  error_ = cause;
  return true;
}

void SessionEpoch::StopAccepting(const std::string& reason) {
  absl::MutexLock l(&mu_);
  not_accepting_ = reason;
}

void SessionEpoch::Close(const absl::Status& why) {
  absl::MutexLock l(&mu_);
  closed_ = true;
  if (error_.ok()) error_ = why.ok() ? absl::CancelledError("session closed") : why;
}

absl::Status SessionEpoch::health() const {
  absl::MutexLock l(&mu_);
  return error_;
}

absl::Status SessionEpoch::Refusal() const {
  absl::MutexLock l(&mu_);
  if (closed_) return absl::FailedPreconditionError("session is closed");
  if (!not_accepting_.empty()) return absl::UnavailableError(not_accepting_);
  if (!error_.ok()) {
    return absl::FailedPreconditionError(
        absl::StrCat("job '", job_id_, "' epoch ", epoch_,
                     " is no longer usable (open a new session): ", error_.message()));
  }
  return absl::OkStatus();
}

bool SessionEpoch::closed() const {
  absl::MutexLock l(&mu_);
  return closed_;
}

}  // namespace gradsync
