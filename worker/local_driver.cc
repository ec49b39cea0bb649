#include "worker/local_driver.h"

#include <sched.h>

#include <algorithm>
#include <limits>

#include "common/clock.h"
#include "common/logging.h"
#include "common/process.h"
#include "worker/daemon_observer.h"
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

// The driver thread's state, co-owned by the thread and the LocalDriver
// handle, so the handle may be destroyed on the thread itself.
class LocalDriverCore {
 public:
  LocalDriverCore(std::string job_id, int world_size, absl::Duration spin,
                  DaemonObserver* observer)
      : job_id_(std::move(job_id)),
        world_(world_size),
        spin_(spin),
        observer_(observer),
        members_(world_size, nullptr),
        pumped_(world_size, 0),
        feeds_(world_size) {}

  void Run();
  // Asks Run to return (any thread, including the driver's own, with or
  // without mu_ held there).
  void Stop() {
    stop_.store(true);
    Kick(/*force=*/true);
  }
  void Attach(Session* session);
  void Detach(Session* session);
  void Kick(bool force = false);
  uint64_t released() const {
    absl::MutexLock l(&mu_);
    return released_;
  }
  uint64_t ran() const { return ran_.load(std::memory_order_relaxed); }

 private:
  bool Step(bool* waiting) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void Release(uint64_t seq, const char* reason) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Sleeps until rank `rank`'s `feed` rings after `snapshot`, Kick(), or
  // `timeout`; not at all if a session detached since `detaches` was read.
  void Sleep(const std::shared_ptr<SubmissionFeed>& feed, int rank, uint32_t snapshot,
             absl::Duration timeout, uint64_t changes, uint64_t detaches);

  const std::string job_id_;
  const int world_;
  const absl::Duration spin_;
  DaemonObserver* const observer_;  // may be null
  std::atomic<bool> stop_{false};
  std::atomic<uint64_t> changes_{0};   // Kick()s so far
  std::atomic<uint64_t> detaches_{0};  // Detach()es so far

  mutable absl::Mutex mu_;  // held for a whole Step: Detach waits for it
  std::vector<Session*> members_ ABSL_GUARDED_BY(mu_);  // by rank; null: not attached
  std::vector<uint32_t> pumped_ ABSL_GUARDED_BY(mu_);   // by rank: bell value last pumped
  std::vector<std::shared_ptr<SubmissionFeed>> feeds_ ABSL_GUARDED_BY(mu_);  // by rank
  uint64_t looked_ ABSL_GUARDED_BY(mu_) = ~uint64_t{0};  // changes_ at the last full look
  bool relook_ ABSL_GUARDED_BY(mu_) = false;  // the last step changed something: look again
  int sleep_rank_ ABSL_GUARDED_BY(mu_) = -1;  // whose bell to sleep on: a rank being waited for
  uint64_t released_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t wait_seq_ ABSL_GUARDED_BY(mu_) = 0;  // the op waiting for a rank, since wait_since_
  absl::Time wait_since_ ABSL_GUARDED_BY(mu_);

  absl::Mutex sleep_mu_;
  std::shared_ptr<SubmissionFeed> sleep_feed_ ABSL_GUARDED_BY(sleep_mu_);  // the driver sleeps on it
  int sleep_feed_rank_ ABSL_GUARDED_BY(sleep_mu_) = -1;                    // ... rank's
  std::atomic<bool> sleeping_{false};
  std::atomic<uint64_t> ran_{0};
};

LocalDriver::LocalDriver(std::string job_id, int world_size, absl::Duration spin,
                         DaemonObserver* observer)
    : core_(std::make_shared<LocalDriverCore>(std::move(job_id), world_size, spin, observer)) {
  thread_ = std::thread([core = core_] {
    t_on_driver = true;
    core->Run();
  });
  NameThread(thread_, "gs-local");
}

LocalDriver::~LocalDriver() {
  core_->Stop();
  if (thread_.get_id() == std::this_thread::get_id()) {
    thread_.detach();  // Run returns once this unwinds; the thread owns core_ too
  } else if (thread_.joinable()) {
    thread_.join();
  }
}

void LocalDriver::Attach(Session* session) { core_->Attach(session); }
void LocalDriver::Detach(Session* session) { core_->Detach(session); }
void LocalDriver::Kick() { core_->Kick(); }
uint64_t LocalDriver::released() const { return core_->released(); }
uint64_t LocalDriver::ran() const { return core_->ran(); }

void LocalDriverCore::Attach(Session* session) {
  const int rank = session->info().rank;
  {
    absl::MutexLock l(&mu_);
    members_[rank] = session;
    feeds_[rank] = nullptr;  // taken at the next look (Kick below)
    absl::MutexLock sl(&session->mu_);
    session->released_seq_ = std::max(session->released_seq_, released_);
    session->released_cv_.SignalAll();
  }
  Kick();
}

void LocalDriverCore::Detach(Session* session) {
  const int rank = session->info().rank;
  {
    absl::MutexLock l(&mu_);  // waits for a step using the session
    if (members_[rank] != session) return;
    members_[rank] = nullptr;
    feeds_[rank] = nullptr;
    detaches_.fetch_add(1);
  }
  // The driver may be asleep on this rank's bell, holding its op queue
  // (Feed::Wait): wake it and wait until it lets go, so the queue (and the
  // session it holds) is never released on the driver's thread. A Sleep that
  // starts later sees detaches_ moved and does not sleep on it.
  absl::MutexLock l(&sleep_mu_);
  if (sleep_feed_rank_ != rank || sleep_feed_ == nullptr) return;
  sleep_feed_->Wake();
  auto let_go = [this, rank]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(sleep_mu_) {
    return sleep_feed_rank_ != rank;
  };
  if (!sleep_mu_.AwaitWithTimeout(absl::Condition(&let_go), absl::Seconds(10))) {
    GS_LOG(ERROR) << "job '" << job_id_ << "': the local driver did not wake within 10 s";
  }
}

void LocalDriverCore::Kick(bool force) {
  if (t_on_driver && !force) return;  // its own pump or batch: it looks again anyway
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

void LocalDriverCore::Release(uint64_t seq, const char* reason) {
  if (seq <= released_) return;
  if (observer_ != nullptr) observer_->OnLocalDriverHandoff(reason);
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
bool LocalDriverCore::Step(bool* waiting) ABSL_NO_THREAD_SAFETY_ANALYSIS {
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
      if (feeds_[r] != m->feed_) {
        feeds_[r] = m->feed_;
        // A new queue: pump it at the next look whatever its bell says.
        if (feeds_[r] != nullptr) pumped_[r] = ~feeds_[r]->Snapshot();
      }
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
  sleep_rank_ = -1;
  const absl::Time now = FastNow();
  bool complete = true;  // every rank attached, idle, with an op above released_
  bool idle = true;      // no executor has work
  uint64_t release = 0;
  const char* reason = "other_op";
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
      if (sleep_rank_ < 0) sleep_rank_ = m->info().rank;  // the rank to wait for
      continue;
    }
    const Session::Op& op = *m->queue_.front();
    lowest = std::min(lowest, op.seq);
    if (!m->DriverMayRun(op, now)) {
      release = std::max(release, op.seq);  // not for the driver: the executors run it
    } else if (first == nullptr) {
      first = &op;
    } else if (op.seq != first->seq || !Session::SameOp(*first, op)) {
      // Ranks disagree: the executors' rendezvous reports the mismatch.
      if (release == 0) reason = "mismatch";
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
    Release(release, reason);
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
    if (wait_seq_ != lowest) {
      wait_seq_ = lowest;
      wait_since_ = now;
    } else if (now - wait_since_ >= LocalDriver::kGrace) {
      GS_LOG(DEBUG) << "job '" << job_id_ << "': op " << lowest << " waited " << LocalDriver::kGrace
                    << " for a rank; the ranks' executors take it over";
      Release(lowest, "late_rank");
      *waiting = false;
      relook_ = true;
      return true;
    }
    return progress;
  }
  // 3. Every rank submitted the same small op: run it here, for all of them.
  wait_seq_ = 0;
  const absl::Time start = FastNow();
  const Session::Op& op0 = *batch[0];
  const bool allreduce = op0.sig.kind == CollectiveKind::kAllreduce;
  if (allreduce) {
    std::vector<char*> bufs(world_);
    for (int r = 0; r < world_; ++r) bufs[r] = batch[r]->buffer->data() + batch[r]->offset;
    JobGroup::ReduceLocal(bufs, op0.sig.count, op0.sig.dtype, op0.sig.op, world_);
  }
  const absl::Time end = FastNow();
  // The labels the executors' path gives these ops (rank 0's proposal).
  const char* algorithm = allreduce ? "hier" : "oneshot";
  ran_.fetch_add(world_, std::memory_order_relaxed);  // before the clients can see it
  if (observer_ != nullptr) observer_->OnLocalDriverOp(world_);
  for (int r = 0; r < world_; ++r) members_[r]->FinishDriven(*batch[r], algorithm, start, end);
  relook_ = true;
  return true;
}

void LocalDriverCore::Sleep(const std::shared_ptr<SubmissionFeed>& feed, int rank,
                            uint32_t snapshot, absl::Duration timeout, uint64_t changes,
                            uint64_t detaches) {
  {
    absl::MutexLock l(&sleep_mu_);
    if (detaches_.load() != detaches) return;  // `feed` may belong to a detached session
    sleep_feed_ = feed;
    sleep_feed_rank_ = feed != nullptr ? rank : -1;
    sleeping_.store(true, std::memory_order_seq_cst);
    if (changes_.load(std::memory_order_seq_cst) != changes) {  // kicked since the step
      sleeping_.store(false);
      sleep_feed_ = nullptr;
      sleep_feed_rank_ = -1;
      return;
    }
    if (feed == nullptr) {
      auto kicked = [this, changes] { return changes_.load() != changes; };
      sleep_mu_.AwaitWithTimeout(absl::Condition(&kicked), timeout);
      sleeping_.store(false);
      return;
    }
  }
  feed->Wait(snapshot, timeout);  // holds the op queue while it waits
  absl::MutexLock l(&sleep_mu_);
  sleeping_.store(false);
  sleep_feed_ = nullptr;
  sleep_feed_rank_ = -1;  // Detach may go on
}

void LocalDriverCore::Run() {
  absl::Time last_active = FastNow();
  bool waiting = false;  // an op waits for a rank (Step looks again each time)
  while (!stop_.load()) {
    std::shared_ptr<SubmissionFeed> sleep_feed;
    int sleep_rank = -1;
    uint32_t snapshot = 0;
    bool progress = false;
    uint64_t changes = 0, detaches = 0;
    {
      absl::MutexLock l(&mu_);
      changes = changes_.load(std::memory_order_seq_cst);
      detaches = detaches_.load();
      progress = Step(&waiting);
      // Sleep on the bell of a rank the driver waits for (else the lowest
      // rank's), from the value it had at the last pump: a submission since
      // then ends the sleep at once.
      if (sleep_rank_ >= 0 && members_[sleep_rank_] != nullptr && feeds_[sleep_rank_] != nullptr) {
        sleep_rank = sleep_rank_;
      } else {
        for (int r = 0; r < world_ && sleep_rank < 0; ++r) {
          if (members_[r] != nullptr && feeds_[r] != nullptr) sleep_rank = r;
        }
      }
      if (sleep_rank >= 0) {
        sleep_feed = feeds_[sleep_rank];
        snapshot = pumped_[sleep_rank];
      }
    }
    const absl::Time now = FastNow();
    if (progress) last_active = now;
    if (now - last_active < spin_) {
      ::sched_yield();
      continue;
    }
    const absl::Duration idle = now - last_active;
    Sleep(sleep_feed, sleep_rank, snapshot,
          waiting ? std::min(kIdlePoll, LocalDriver::kGrace)
                  : (idle < kLongIdleAfter ? kIdlePoll : kLongIdlePoll),
          changes, detaches);
  }
}

}  // namespace gradsync
