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

#include <cstdint>
#include <memory>
#include <string>
#include <thread>

#include "absl/time/time.h"

namespace gradsync {

class DaemonObserver;
class Session;
class LocalDriverCore;  // the thread's state (local_driver.cc)

class LocalDriver {
 public:
  // How long an op may wait at the driver for a rank that has not submitted
  // before the ranks' executors take it over.
  static constexpr absl::Duration kGrace = absl::Milliseconds(2);

  // Starts the thread. `spin`: how long it keeps polling after the last
  // activity before sleeping (gradsyncd --local_driver_spin_us). `observer`
  // (may be null; outlives the driver) hears of every op run and handed over.
  LocalDriver(std::string job_id, int world_size, absl::Duration spin,
              DaemonObserver* observer = nullptr);
  // Stops the thread; every session must have detached. It may run on the
  // driver's own thread (the last session's last reference can be dropped
  // there, e.g. with an op queue the driver was polling): the thread then
  // finishes on its own, on state it co-owns.
  ~LocalDriver();

  // A session of the job (its rank: session->info().rank). The session's
  // executor then only runs the ops the driver hands it.
  void Attach(Session* session);
  // Blocks until the driver no longer uses `session` (nor holds its op queue).
  void Detach(Session* session);
  // Something the driver must look at happened other than through an op
  // queue's bell: a gRPC submission, a new feed, an executor finishing an op,
  // a failed epoch. Cheap when the driver is awake.
  void Kick();

  // Ops handed to executors so far (for tests and logs).
  uint64_t released() const;
  // Ops the driver ran itself, one per rank per op.
  uint64_t ran() const;

 private:
  std::shared_ptr<LocalDriverCore> core_;
  std::thread thread_;
};

}  // namespace gradsync

#endif  // GRADSYNC_WORKER_LOCAL_DRIVER_H_
