// What a Session needs of the executor that runs its ops: the job's
// JobExecutor on this daemon (worker/job_executor.h) implements it. The
// interface keeps the session layer below the executor layer (//worker:session
// does not depend on //worker:executor): a session queues ops and wakes the
// executor; how they run is not its concern.
#ifndef GRADSYNC_WORKER_SESSION_EXECUTOR_H_
#define GRADSYNC_WORKER_SESSION_EXECUTOR_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "collective/topology.h"

namespace gradsync {

class Session;
struct QueuedOp;

// For status: what op `seq` is doing ("negotiating" / "running <plan>", empty
// if it is not the current op) and the ranks known to have submitted it.
struct OpProgress {
  std::string phase;
  std::vector<int> arrived;
};

class SessionExecutor {
 public:
  virtual ~SessionExecutor() = default;

  // The job's ranks on the daemons, and whether it has parameter-server
  // shards: what the session validates an op against.
  virtual const JobPlacement& placement() const = 0;
  virtual bool has_ps() const = 0;

  // The session queued an op or changed its submission feed.
  virtual void Kick() = 0;
  // A send or recv of `session`'s rank (numbered by the session, not
  // queued): the executor's point-to-point engine matches and moves it and
  // finishes it (Session::FinishPointToPoint), never on this thread.
  virtual void SubmitPointToPoint(Session* session, std::shared_ptr<QueuedOp> op) = 0;
  // The session's rank leaves: breaks the epoch with `why` and returns once
  // the executor no longer uses the session.
  virtual void Detach(int rank, const absl::Status& why) = 0;
  // Fails the epoch from outside and tells the job's other daemons.
  virtual void Abort(const absl::Status& reason) = 0;
  virtual OpProgress Progress(uint64_t seq) const = 0;
};

}  // namespace gradsync

#endif  // GRADSYNC_WORKER_SESSION_EXECUTOR_H_
