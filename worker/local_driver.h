// The node path's executor: one thread per job whose ranks all live on this
// daemon (one node, several GPUs), running the job's small ops for every rank
// at once.
//
// Without it each local rank's session has its own executor thread, and a
// small allreduce is a rendezvous of those threads: every executor has to be
// scheduled to take its client's submission, the last one to arrive reduces,
// and the others have to be scheduled again to leave. With 4 ranks that is 4
// clients and 4 executors polling on the same cores for one op of a few
// bytes. The driver instead polls every rank's op queue itself; once every
// rank has submitted the same small op it reduces the buffers in rank order
// and posts every rank's completion, on one thread, with no hand-off.
//
// What it runs: allreduce of at most JobGroup::kSmallBytes per rank on the
// hierarchical path (auto or forced "hier"), and barrier (auto). Everything
// else, and any op whose ranks disagree (signature mismatch), is handed to the
// ranks' own executors, which run it as before (JobGroup rendezvous, the
// mismatch error naming both sides, deadlines naming the missing ranks). The
// hand-off is by sequence number for the whole job: `released` is the highest
// op sequence number the executors own; the driver only ever takes ops above
// it, and only while no executor is running one, so each rank's ops still
// complete in submission order. An op waiting for a rank that has not
// submitted is handed off after kGrace, so `gradsync status` and the deadline
// error name the missing rank as before.
//
// Thread-safety: Attach/Detach/Kick from any thread. Detach returns once the
// driver no longer touches the session. Lock order: the driver's mu_, then
// op queue locks, then session locks (several sessions: in rank order).
#ifndef GRADSYNC_WORKER_LOCAL_DRIVER_H_
#define GRADSYNC_WORKER_LOCAL_DRIVER_H_

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "worker/submission_feed.h"

namespace gradsync {

class Session;

class LocalDriver {
 public:
  // How long an op may wait at the driver for a rank that has not submitted
  // before the ranks' executors take it over.
  static constexpr absl::Duration kGrace = absl::Milliseconds(2);

  // `spin`: how long to keep polling after the last activity before sleeping
  // (gradsyncd --queue_spin_us).
  LocalDriver(std::string job_id, int world_size, absl::Duration spin);
  ~LocalDriver();  // stops the thread; every session must have detached

  // A session of the job (its rank: session->info().rank). The session's
  // executor then only runs the ops the driver hands it.
  void Attach(Session* session);
  // Blocks until the driver no longer uses `session`.
  void Detach(Session* session);
  // Something the driver must look at happened other than through an op
  // queue's bell: a gRPC submission, a new feed, an executor finishing an op,
  // a failed epoch. Cheap when the driver is awake.
  void Kick();

  // Ops handed to executors so far (for tests and logs).
  uint64_t released() const;
  // Ops the driver ran itself, one per rank per op.
  uint64_t ran() const { return ran_.load(std::memory_order_relaxed); }

 private:
  // One look at every member: pumps their queues, then runs a batch or hands
  // ops to the executors. `waiting`: an op waits for a rank.
  bool Step(bool* waiting) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void Release(uint64_t seq) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void Run();
  // Sleeps until `feed` rings after `snapshot`, Kick(), or `timeout`.
  void Sleep(const std::shared_ptr<SubmissionFeed>& feed, uint32_t snapshot,
             absl::Duration timeout, uint64_t changes);

  const std::string job_id_;
  const int world_;
  const absl::Duration spin_;
  std::atomic<uint64_t> changes_{0};  // Kick()s so far

  mutable absl::Mutex mu_;  // held for a whole Step: Detach waits for it
  std::vector<Session*> members_ ABSL_GUARDED_BY(mu_);  // by rank; null: not attached
  std::vector<uint32_t> pumped_ ABSL_GUARDED_BY(mu_);   // by rank: bell value last pumped
  std::vector<std::shared_ptr<SubmissionFeed>> feeds_ ABSL_GUARDED_BY(mu_);  // by rank
  uint64_t looked_ ABSL_GUARDED_BY(mu_) = ~uint64_t{0};  // changes_ at the last full look
  bool relook_ ABSL_GUARDED_BY(mu_) = false;  // the last step changed something: look again
  uint64_t released_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t wait_seq_ ABSL_GUARDED_BY(mu_) = 0;  // the op waiting for a rank, since wait_since_
  absl::Time wait_since_ ABSL_GUARDED_BY(mu_);
  bool stop_ ABSL_GUARDED_BY(mu_) = false;

  absl::Mutex sleep_mu_;
  std::shared_ptr<SubmissionFeed> sleep_feed_ ABSL_GUARDED_BY(sleep_mu_);  // the driver sleeps on it
  std::atomic<bool> sleeping_{false};
  std::atomic<uint64_t> ran_{0};
  std::thread thread_;
};

}  // namespace gradsync

#endif  // GRADSYNC_WORKER_LOCAL_DRIVER_H_
