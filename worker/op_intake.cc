#include "worker/op_intake.h"

#include <sched.h>

#include <algorithm>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/clock.h"
#include "common/logging.h"
#include "worker/session.h"
#include "worker/submission_feed.h"

namespace gradsync {
namespace {

// Sleep bounds while local ranks are missing: the executor sleeps on one
// missing rank's doorbell and looks at the others this often.
constexpr absl::Duration kWaitingPoll = absl::Milliseconds(1);
constexpr absl::Duration kIdlePoll = absl::Milliseconds(1);
constexpr absl::Duration kLongIdlePoll = absl::Milliseconds(10);
constexpr absl::Duration kLongIdleAfter = absl::Milliseconds(100);
constexpr absl::Duration kSingleIdlePoll = absl::Milliseconds(100);

std::string RankList(const std::vector<int>& ranks) {
  return absl::StrCat(ranks.size() == 1 ? "rank " : "ranks ", absl::StrJoin(ranks, ","));
}

}  // namespace

OpIntake::OpIntake(std::string job_id, std::vector<int> local_ranks, int world,
                   absl::Duration spin)
    : job_id_(std::move(job_id)), local_(std::move(local_ranks)), spin_(spin) {
  slots_.resize(local_.size());
  members_.resize(local_.size());
  progress_arrived_.assign(world, false);
}

void OpIntake::BindToThisThread() { owner_.store(std::this_thread::get_id()); }
bool OpIntake::OnOwnThread() const { return owner_.load() == std::this_thread::get_id(); }

void OpIntake::Attach(Session* session) {
  const auto it = std::find(local_.begin(), local_.end(), session->info().rank);
  if (it == local_.end()) return;
  {
    absl::MutexLock l(&mu_);
    members_[it - local_.begin()] = session;
  }
  Kick();
}

std::optional<uint64_t> OpIntake::Detach(int rank, const absl::Status& why) {
  const auto it = std::find(local_.begin(), local_.end(), rank);
  if (it == local_.end()) return std::nullopt;
  absl::MutexLock l(&mu_);
  members_[it - local_.begin()] = nullptr;
  if (broken_.ok()) broken_ = why;
  return generation_;
}

void OpIntake::AwaitRelease(int rank, uint64_t generation) {
  if (OnOwnThread()) return;
  // A running op ends quickly once the node context is aborted; an
  // in-memory one is short. The bound only guards against a bug.
  absl::MutexLock l(&mu_);
  auto released = [this, generation]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return !using_ || generation_ != generation || stop_;
  };
  if (!mu_.AwaitWithTimeout(absl::Condition(&released), absl::Seconds(30))) {
    GS_LOG(ERROR) << "job '" << job_id_ << "': rank " << rank
                  << "'s session waited 30 s for the executor to let it go";
  }
}

void OpIntake::Break(const absl::Status& reason, bool tell_peers) {
  {
    absl::MutexLock l(&mu_);
    if (tell_peers) tell_peers_ = true;
    if (broken_.ok()) broken_ = reason;
  }
  Kick();
}

void OpIntake::Stop() {
  std::shared_ptr<SubmissionFeed> feed;
  {
    absl::MutexLock l(&mu_);
    stop_ = true;
    feed = sleep_feed_;
    cv_.SignalAll();
  }
  if (feed != nullptr) feed->Wake();
}

void OpIntake::Kick() {
  kicks_.fetch_add(1, std::memory_order_acq_rel);
  if (OnOwnThread()) return;
  std::shared_ptr<SubmissionFeed> feed;
  {
    absl::MutexLock l(&mu_);
    if (!sleeping_) return;
    feed = sleep_feed_;
    cv_.SignalAll();
  }
  if (feed != nullptr) feed->Wake();
}

OpProgress OpIntake::ProgressOf(uint64_t seq) const {
  OpProgress p;
  absl::MutexLock l(&progress_mu_);
  if (seq != progress_seq_) return p;
  p.phase = progress_phase_;
  for (int r = 0; r < static_cast<int>(progress_arrived_.size()); ++r) {
    if (progress_arrived_[r]) p.arrived.push_back(r);
  }
  return p;
}

void OpIntake::NoteArrived(int rank) {
  absl::MutexLock l(&progress_mu_);
  if (rank >= 0 && rank < static_cast<int>(progress_arrived_.size())) progress_arrived_[rank] = true;
}

void OpIntake::SetPhase(std::string phase) {
  absl::MutexLock l(&progress_mu_);
  progress_phase_ = std::move(phase);
}

bool OpIntake::BeginLook(Look* look) {
  absl::MutexLock l(&mu_);
  if (stop_) return false;
  look->members = members_;
  look->broken = broken_;
  look->tell_peers = tell_peers_;
  using_ = true;
  ++generation_;
  return true;
}

void OpIntake::EndLook() {
  absl::MutexLock l(&mu_);
  using_ = false;
}

bool OpIntake::TakeArrivals(const std::vector<Session*>& members) {
  bool took = false;
  for (size_t i = 0; i < slots_.size(); ++i) {
    if (slots_[i] != nullptr || members[i] == nullptr) continue;
    slots_[i] = members[i]->TakeNext();
    if (slots_[i] == nullptr) continue;
    took = true;
    NoteArrived(local_[i]);
  }
  return took;
}

bool OpIntake::any_taken() const {
  return std::any_of(slots_.begin(), slots_.end(), [](const auto& s) { return s != nullptr; });
}

bool OpIntake::all_taken() const {
  return std::all_of(slots_.begin(), slots_.end(), [](const auto& s) { return s != nullptr; });
}

std::vector<QueuedOp*> OpIntake::taken() const {
  std::vector<QueuedOp*> ops(slots_.size());
  for (size_t i = 0; i < slots_.size(); ++i) ops[i] = slots_[i].get();
  return ops;
}

absl::Time OpIntake::EarliestDeadline() const {
  absl::Time t = absl::InfiniteFuture();
  for (const auto& op : slots_) {
    if (op != nullptr) t = std::min(t, op->deadline);
  }
  return t;
}

absl::Status OpIntake::LateRankError() const {
  std::vector<int> have, missing;
  const QueuedOp* any = nullptr;
  for (size_t i = 0; i < slots_.size(); ++i) {
    if (slots_[i] != nullptr) {
      have.push_back(local_[i]);
      any = slots_[i].get();
    } else {
      missing.push_back(local_[i]);
    }
  }
  return absl::DeadlineExceededError(absl::StrCat(
      "timed out at ", RankList(have), " waiting for rank(s) ", absl::StrJoin(missing, ","),
      " to submit op ", any->seq, " (", any->sig.Describe(), ")"));
}

void OpIntake::NextOp() {
  for (auto& slot : slots_) slot.reset();
  ++next_seq_;
  absl::MutexLock l(&progress_mu_);
  progress_seq_ = next_seq_;
  progress_phase_ = "negotiating";
  std::fill(progress_arrived_.begin(), progress_arrived_.end(), false);
}

void OpIntake::DropTaken() {
  for (auto& slot : slots_) slot.reset();
}

void OpIntake::PumpMissing(const std::vector<Session*>& members) {
  for (size_t i = 0; i < slots_.size(); ++i) {
    if (slots_[i] != nullptr || members[i] == nullptr) continue;
    if (std::shared_ptr<SubmissionFeed> f = members[i]->feed()) f->Pump();
  }
}

void OpIntake::WaitForArrivals(const std::vector<Session*>& members, absl::Time last_active,
                               const std::function<bool(absl::Time now)>& before_sleep) {
  const uint64_t seen = kicks_.load(std::memory_order_acquire);
  bool waiting = false;  // some local rank has submitted the next op
  std::shared_ptr<SubmissionFeed> feed;  // the doorbell to sleep on
  for (size_t i = 0; i < slots_.size(); ++i) {
    if (slots_[i] != nullptr) {
      waiting = true;
    } else if (feed == nullptr && members[i] != nullptr) {
      feed = members[i]->feed();
    }
  }
  const uint32_t snapshot = feed != nullptr ? feed->Snapshot() : 0;
  // Take the submissions waiting in the missing ranks' queues (they reach
  // the sessions, which Kick).
  PumpMissing(members);
  if (kicks_.load(std::memory_order_acquire) != seen) return;
  const absl::Time now = FastNow();
  if (now < last_active + spin_) {
    // Soon after activity: poll every missing rank's queue (yielding the
    // CPU), or the one doorbell when a single rank is missing.
    int missing = 0;
    for (size_t i = 0; i < slots_.size(); ++i) missing += slots_[i] == nullptr && members[i] != nullptr;
    if (missing == 1 && feed != nullptr) {
      feed->Spin(snapshot, last_active + spin_ - now);
      return;
    }
    while (FastNow() < last_active + spin_ && kicks_.load(std::memory_order_acquire) == seen) {
      sched_yield();
      PumpMissing(members);
    }
    return;
  }
  if (before_sleep && !before_sleep(now)) return;
  absl::Duration timeout = slots_.size() == 1 ? kSingleIdlePoll
                           : waiting          ? kWaitingPoll
                           : now - last_active < kLongIdleAfter ? kIdlePoll
                                                                : kLongIdlePoll;
  timeout = std::max(absl::ZeroDuration(), std::min(timeout, EarliestDeadline() - now));
  {
    absl::MutexLock l(&mu_);
    if (stop_ || kicks_.load(std::memory_order_acquire) != seen) return;
    sleeping_ = true;
    sleep_feed_ = feed;
    if (feed == nullptr) {
      cv_.WaitWithTimeout(&mu_, timeout);
      sleeping_ = false;
      return;
    }
  }
  feed->Wait(snapshot, timeout);
  absl::MutexLock l(&mu_);
  sleeping_ = false;
  sleep_feed_ = nullptr;
}

}  // namespace gradsync
