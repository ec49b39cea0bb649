// Op intake: what the job's executor (worker/job_executor.h) knows of its
// local ranks, and how it takes their ops.
//
//   * Members: each local rank's Session, by local index (ranks ascending).
//     Attach/Detach may come from any thread. The executor's thread works on
//     a snapshot of them (BeginLook .. EndLook); Detach's AwaitRelease waits
//     until that snapshot is no longer used, so the session may then go.
//     The epoch's break (the first reason wins; Abort also asks the
//     executor to tell the other daemons) is part of the same snapshot, so
//     the executor never sees a missing member of an unbroken epoch.
//   * Slots: op k of every local rank. TakeArrivals takes what the sessions
//     have queued into the empty slots (sessions number ops alike); NextOp
//     empties them and moves on to op k+1.
//   * Waiting: WaitForArrivals takes submissions from the missing ranks' op
//     queues itself (SubmissionFeed::Pump), polls briefly after activity,
//     then sleeps on one missing rank's doorbell (or a condition variable)
//     with a bounded timeout, never past the earliest deadline of the ops
//     taken. Kick() (a session queued an op, a member changed) wakes it.
//     Before each sleep it calls the executor back (which looks at its node
//     context's peers then), and returns instead of sleeping if told to.
//   * Lateness: LateRankError names who waits for whom ("timed out at rank(s)
//     0,1 waiting for rank(s) 2 to submit op 5 (...)").
//   * Progress for status: the op being negotiated, its phase, and the ranks
//     known to have submitted it (NoteArrived; other daemons' ranks too).
//
// Threading: Attach, Detach, AwaitRelease, Break, Stop, Kick and Progress
// are thread-safe. Everything else is for the executor's thread only, which
// calls BindToThisThread() first. Nothing here fails or finishes an op: the
// executor completes the ops (Session::Finish) and then calls NextOp.
#ifndef GRADSYNC_WORKER_OP_INTAKE_H_
#define GRADSYNC_WORKER_OP_INTAKE_H_

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "worker/session_executor.h"

namespace gradsync {

class Session;
class SubmissionFeed;
struct QueuedOp;

class OpIntake {
 public:
  // `local_ranks`: this daemon's ranks of the job, ascending; `world`: the
  // job's ranks (for progress); `spin`: how long to keep polling after
  // activity before sleeping. `job_id` names the job in logs.
  OpIntake(std::string job_id, std::vector<int> local_ranks, int world, absl::Duration spin);
  OpIntake(const OpIntake&) = delete;
  OpIntake& operator=(const OpIntake&) = delete;

  const std::vector<int>& local_ranks() const { return local_; }

  // ---- Any thread.
  // Makes `session` the member of its rank (ignored if not a local rank) and
  // kicks.
  void Attach(Session* session);
  // Removes the member of `rank` and breaks the epoch with `why` (first
  // reason wins), in one step. Returns the generation to pass AwaitRelease,
  // nullopt if `rank` is not local.
  std::optional<uint64_t> Detach(int rank, const absl::Status& why);
  // Waits (at most 30 s, which only a bug reaches) until the executor's
  // thread no longer uses the snapshot it took before Detach returned
  // `generation`. Returns at once on the executor's own thread.
  void AwaitRelease(int rank, uint64_t generation);
  // Breaks the epoch (first reason wins); `tell_peers`: the executor should
  // send the other daemons an ABORT (Look::tell_peers). Kicks.
  void Break(const absl::Status& reason, bool tell_peers = false);
  // Ends the executor's loop: BeginLook returns false from now on; wakes it.
  void Stop();
  // Wakes WaitForArrivals (a no-op on the executor's own thread).
  void Kick();

  // For status: what op `seq` is doing (worker/session_executor.h).
  OpProgress ProgressOf(uint64_t seq) const;
  // Rank `rank` (of any daemon) is known to have submitted the current op.
  void NoteArrived(int rank);
  void SetPhase(std::string phase);

  // ---- The executor's thread.
  void BindToThisThread();
  bool OnOwnThread() const;

  // One look at the members and the epoch.
  struct Look {
    std::vector<Session*> members;  // by local index; null: not attached
    absl::Status broken;            // OK while the epoch is usable
    bool tell_peers = false;        // Break(..., true) was called
  };
  // Takes a snapshot; false once stopping. The members stay alive until
  // EndLook.
  bool BeginLook(Look* look);
  void EndLook();

  // Takes arrived ops of `members` into the empty slots; true if any.
  bool TakeArrivals(const std::vector<Session*>& members);
  bool any_taken() const;
  bool all_taken() const;
  // The op in local index i's slot (null: not taken yet).
  QueuedOp* slot(size_t i) const { return slots_[i].get(); }
  // Every slot's op by local index (call when all_taken()).
  std::vector<QueuedOp*> taken() const;
  // The deadline of the earliest op taken, InfiniteFuture if none.
  absl::Time EarliestDeadline() const;
  // DeadlineExceeded naming the ranks that have submitted op next_seq() and
  // those that have not (call when any_taken()).
  absl::Status LateRankError() const;
  // The op in the slots is done: empties them, and the progress moves on to
  // the next op ("negotiating", nobody arrived).
  void NextOp();
  // Drops what was taken (stopping).
  void DropTaken();
  uint64_t next_seq() const { return next_seq_; }

  // Sleeps until a submission, a Kick, or a bounded timeout (see the top).
  // `last_active`: when the executor last did something. `before_sleep` is
  // called (with the time) only when the wait is about to sleep, not spin,
  // so once per timed wake-up while nothing happens: the executor's
  // periodic work (flushing metrics, looking at its node context's peers).
  // It returns whether to sleep; false returns at once (it found something
  // for the executor to handle).
  void WaitForArrivals(const std::vector<Session*>& members, absl::Time last_active,
                       const std::function<bool(absl::Time now)>& before_sleep);

 private:
  void PumpMissing(const std::vector<Session*>& members);

  const std::string job_id_;
  const std::vector<int> local_;  // local ranks, ascending
  const absl::Duration spin_;

  uint64_t next_seq_ = 1;                          // executor thread only
  std::vector<std::shared_ptr<QueuedOp>> slots_;  // by local index; executor thread only

  mutable absl::Mutex mu_;
  absl::CondVar cv_;
  std::vector<Session*> members_ ABSL_GUARDED_BY(mu_);  // by local index; not owned
  // The executor thread uses a snapshot of members_ (from `generation_`)
  // while `using_`: a detaching session waits for it to end.
  bool using_ ABSL_GUARDED_BY(mu_) = false;
  uint64_t generation_ ABSL_GUARDED_BY(mu_) = 0;
  absl::Status broken_ ABSL_GUARDED_BY(mu_);
  bool tell_peers_ ABSL_GUARDED_BY(mu_) = false;
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  bool sleeping_ ABSL_GUARDED_BY(mu_) = false;
  std::shared_ptr<SubmissionFeed> sleep_feed_ ABSL_GUARDED_BY(mu_);
  std::atomic<uint64_t> kicks_{0};
  // The executor's thread (BindToThisThread); its own Kicks need no wake-up.
  std::atomic<std::thread::id> owner_{};

  mutable absl::Mutex progress_mu_;
  uint64_t progress_seq_ ABSL_GUARDED_BY(progress_mu_) = 1;
  std::string progress_phase_ ABSL_GUARDED_BY(progress_mu_) = "negotiating";
  std::vector<bool> progress_arrived_ ABSL_GUARDED_BY(progress_mu_);  // by rank
};

}  // namespace gradsync

#endif  // GRADSYNC_WORKER_OP_INTAKE_H_
