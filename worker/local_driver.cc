#include "worker/local_driver.h"

#include <sched.h>

#include <algorithm>
#include <limits>

#include "common/logging.h"
#include "common/process.h"
#include "worker/job_group.h"
#include "worker/session.h"

namespace gradsync {
namespace {

// Sleep bounds while idle: a member whose bell the driver does not sleep on
// is seen within this long (its op cannot complete before the slept-on rank
// submits anyway; only the hand-off of a large op waits for it).
constexpr absl::Duration kIdlePoll = absl::Milliseconds(1);
constexpr absl::Duration kLongIdlePoll = absl::Milliseconds(10);
constexpr absl::Duration kLongIdleAfter = absl::Milliseconds(100);

// True on a driver's own thread: the submissions it pumps need no Kick().
thread_local bool t_on_driver = false;

}  // namespace

LocalDriver::LocalDriver(std::string job_id, int world_size, absl::Duration spin)
    : job_id_(std::move(job_id)),
      world_(world_size),
      spin_(spin),
      members_(world_size, nullptr),
      pumped_(world_size, 0),
      feeds_(world_size) {
  thread_ = std::thread([this] { Run(); });
  NameThread(thread_, "gs-local");
}

LocalDriver::~LocalDriver() {
  {
    absl::MutexLock l(&mu_);
    stop_ = true;
  }
  Kick();
  if (thread_.joinable()) thread_.join();
}

void LocalDriver::Attach(Session* session) {
  const int rank = session->info().rank;
  {
    absl::MutexLock l(&mu_);
    members_[rank] = session;
    pumped_[rank] = 0;
    absl::MutexLock sl(&session->mu_);
    session->released_seq_ = std::max(session->released_seq_, released_);
    session->released_cv_.SignalAll();
  }
  Kick();
}

void LocalDriver::Detach(Session* session) {
  absl::MutexLock l(&mu_);
  const int rank = session->info().rank;
  if (members_[rank] == session) members_[rank] = nullptr;
}

void LocalDriver::Kick() {
  if (t_on_driver) return;  // its own pump or batch: it looks again anyway
  changes_.fetch_add(1, std::memory_order_seq_cst);
  // The driver sets sleeping_ before it checks changes_ a last time: either
  // it sees this change, or this sees it sleeping.
  if (!sleeping_.load(std::memory_order_seq_cst)) return;
  std::shared_ptr<SubmissionFeed> feed;
  {
    absl::MutexLock l(&sleep_mu_);  // its release wakes a feed-less Sleep
    feed = sleep_feed_;
  }
  if (feed != nullptr) feed->Wake();
}

uint64_t LocalDriver::released() const {
  absl::MutexLock l(&mu_);
  return released_;
}

void LocalDriver::Release(uint64_t seq) {
  if (seq <= released_) return;
  released_ = seq;
  wait_seq_ = 0;
  for (Session* m : members_) {
    if (m == nullptr) continue;
    absl::MutexLock l(&m->mu_);
    m->released_seq_ = std::max(m->released_seq_, seq);
    m->released_cv_.SignalAll();
  }
}

// Locks every attached member in rank order (Session::mu_ of several
// sessions at once: only this thread ever does that).
bool LocalDriver::Step(bool* waiting) ABSL_NO_THREAD_SAFETY_ANALYSIS {
  bool progress = false;
  // Look at the members' queues only if something happened: a bell rang, a
  // Kick(), or an op waits for a rank.
  bool look = *waiting || relook_;  // after a batch or hand-off the next op may be ready
  *waiting = false;
  relook_ = false;
  const uint64_t changes = changes_.load(std::memory_order_seq_cst);
  if (changes != looked_) {
    looked_ = changes;
    look = true;
    for (int r = 0; r < world_; ++r) {
      Session* m = members_[r];
      if (m == nullptr) {
        feeds_[r] = nullptr;
        continue;
      }
      absl::MutexLock l(&m->mu_);
      feeds_[r] = m->feed_;
    }
  }
  // 1. Take what the clients submitted (a member's feed is pumped only when
  // its bell moved: the bell rings on every submission).
  for (int r = 0; r < world_; ++r) {
    const std::shared_ptr<SubmissionFeed>& feed = feeds_[r];
    if (feed == nullptr || members_[r] == nullptr) continue;
    const uint32_t bell = feed->Snapshot();
    if (bell != pumped_[r]) {
      pumped_[r] = bell;
      feed->Pump();
      progress = true;
      look = true;
    }
  }
  if (!look) return false;
  // 2. Look at every rank's next op, all locked at once.
  for (Session* m : members_) {
    if (m != nullptr) m->mu_.Lock();
  }
  bool complete = true;  // every rank attached, idle, with an op above released_
  bool idle = true;      // no executor has work
  uint64_t release = 0;
  uint64_t lowest = std::numeric_limits<uint64_t>::max();
  const Session::Op* first = nullptr;
  for (Session* m : members_) {
    if (m == nullptr) {
      complete = false;
      continue;
    }
    if (m->executing_ || (!m->queue_.empty() && m->queue_.front()->seq <= m->released_seq_)) {
      idle = false;
      complete = false;
      continue;
    }
    if (m->queue_.empty()) {
      complete = false;
      continue;
    }
    const Session::Op& op = *m->queue_.front();
    lowest = std::min(lowest, op.seq);
    if (!m->DriverMayRun(op)) {
      release = std::max(release, op.seq);  // not for the driver: the executors run it
    } else if (first == nullptr) {
      first = &op;
    } else if (op.seq != first->seq || !Session::SameOp(*first, op)) {
      // Ranks disagree: the executors' rendezvous reports the mismatch.
      release = std::max({release, op.seq, first->seq});
    }
  }
  std::vector<std::shared_ptr<Session::Op>> batch;
  if (release == 0 && complete && first != nullptr) {
    batch.reserve(world_);
    for (Session* m : members_) {
      batch.push_back(m->queue_.front());
      m->queue_.pop_front();
    }
  }
  for (auto it = members_.rbegin(); it != members_.rend(); ++it) {
    if (*it != nullptr) (*it)->mu_.Unlock();
  }
  if (release != 0) {
    Release(release);
    relook_ = true;
    return true;
  }
  if (batch.empty()) {
    if (lowest == std::numeric_limits<uint64_t>::max() || !idle) {
      wait_seq_ = 0;
      return progress;
    }
    // An op waits for a rank: hand it to the executors after kGrace.
    *waiting = true;
    const absl::Time now = absl::Now();
    if (wait_seq_ != lowest) {
      wait_seq_ = lowest;
      wait_since_ = now;
    } else if (now - wait_since_ >= kGrace) {
      GS_LOG(DEBUG) << "job '" << job_id_ << "': op " << lowest << " waited " << kGrace
                    << " for a rank; the ranks' executors take it over";
      Release(lowest);
      *waiting = false;
      relook_ = true;
      return true;
    }
    return progress;
  }
  // 3. Every rank submitted the same small op: run it here, for all of them.
  wait_seq_ = 0;
  const absl::Time start = absl::Now();
  const Session::Op& op0 = *batch[0];
  const bool allreduce = op0.sig.kind == CollectiveKind::kAllreduce;
  if (allreduce) {
    std::vector<char*> bufs(world_);
    for (int r = 0; r < world_; ++r) bufs[r] = batch[r]->buffer->data() + batch[r]->offset;
    JobGroup::ReduceLocal(bufs, op0.sig.count, op0.sig.dtype, op0.sig.op, world_);
  }
  const absl::Time end = absl::Now();
  // The labels the executors' path gives these ops (rank 0's proposal).
  const char* algorithm = allreduce ? "hier" : "oneshot";
  ran_.fetch_add(world_, std::memory_order_relaxed);  // before the clients can see it
  for (int r = 0; r < world_; ++r) members_[r]->FinishDriven(*batch[r], algorithm, start, end);
  relook_ = true;
  return true;
}

void LocalDriver::Sleep(const std::shared_ptr<SubmissionFeed>& feed, uint32_t snapshot,
                        absl::Duration timeout, uint64_t changes) {
  {
    absl::MutexLock l(&sleep_mu_);
    sleep_feed_ = feed;
    sleeping_.store(true, std::memory_order_seq_cst);
    if (changes_.load(std::memory_order_seq_cst) != changes) {  // kicked since the step
      sleeping_.store(false);
      sleep_feed_ = nullptr;
      return;
    }
    if (feed == nullptr) {
      auto kicked = [this, changes] { return changes_.load() != changes; };
      sleep_mu_.AwaitWithTimeout(absl::Condition(&kicked), timeout);
      sleeping_.store(false);
      return;
    }
  }
  feed->Wait(snapshot, timeout);
  absl::MutexLock l(&sleep_mu_);
  sleeping_.store(false);
  sleep_feed_ = nullptr;
}

void LocalDriver::Run() {
  t_on_driver = true;
  absl::Time last_active = absl::Now();
  bool waiting = false;  // an op waits for a rank (Step looks again each time)
  while (true) {
    std::shared_ptr<SubmissionFeed> sleep_feed;
    uint32_t snapshot = 0;
    bool progress = false;
    uint64_t changes = 0;
    {
      absl::MutexLock l(&mu_);
      if (stop_) return;
      // Sleep on the lowest rank's bell (taken before the step, so a
      // submission after it ends the sleep at once).
      for (int r = 0; r < world_ && sleep_feed == nullptr; ++r) {
        if (members_[r] != nullptr) sleep_feed = feeds_[r];
      }
      if (sleep_feed != nullptr) snapshot = sleep_feed->Snapshot();
      changes = changes_.load(std::memory_order_seq_cst);
      progress = Step(&waiting);
    }
    const absl::Time now = absl::Now();
    if (progress) last_active = now;
    if (now - last_active < spin_) {
      ::sched_yield();
      continue;
    }
    const absl::Duration idle = now - last_active;
    Sleep(sleep_feed, snapshot,
          waiting ? std::min(kIdlePoll, kGrace)
                  : (idle < kLongIdleAfter ? kIdlePoll : kLongIdlePoll),
          changes);
  }
}

}  // namespace gradsync
