// gradsyncd's side of a node-local job's arena (ipc/arena.h): the segment,
// the signature check of the ops the daemon runs, failure, and the counters
// the clients keep of the ops they run themselves.
//
// A job epoch gets an arena when every one of its ranks uses this daemon and
// every local session asked for one (OpenSessionRequest.local_ops). Its
// clients then publish every op's signature in the arena, run small
// allreduces and barriers among themselves (client/local_path.h), and send
// every other op here numbered by its position in their stream. Before the
// daemon runs such an op it checks, in the arena, that every rank published
// the same op at that position (CheckSignatures); the clients check local
// ops the same way, so a mismatch between any two ranks, whichever path each
// one took, is the same InvalidArgument on every rank.
//
// Thread-safety: every method may be called from any thread.
#ifndef GRADSYNC_WORKER_JOB_ARENA_H_
#define GRADSYNC_WORKER_JOB_ARENA_H_

#include <array>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "collective/op_signature.h"
#include "common/types.h"
#include "ipc/arena.h"
#include "ipc/shared_memory.h"
#include "worker/daemon_observer.h"
#include "worker/op_counts.h"

namespace gradsync {

class JobArena {
 public:
  // How long a daemon thread checking signatures polls the arena (yielding
  // the CPU) before it sleeps on the bell.
  static constexpr absl::Duration kSpin = absl::Microseconds(30);

  // Creates "/gradsync.<pid>.<nonce>-a<n>" (swept like the buffers if a
  // SIGKILLed daemon leaves it) and formats it for `g`.
  static absl::StatusOr<std::shared_ptr<JobArena>> Create(const std::string& job_id, uint64_t epoch,
                                                          const ipc::ArenaGeometry& g);
  ~JobArena();  // unlinks the segment (clients keep their mappings)

  const std::string& job_id() const { return job_id_; }
  const std::string& shm_name() const { return mem_->name(); }
  size_t size_bytes() const { return mem_->size(); }
  const ipc::ArenaView& view() const { return view_; }

  // The signature check of op `op.seq` on rank `rank`'s executor, before the
  // daemon runs it. `op` is the op as rank `rank`'s client submitted it to
  // the daemon. Waits until every rank has published op `seq` (= op.seq),
  // calling `on_arrival(r)` as each rank's frame is first seen; then compares
  // them all (CompareSignatures). Errors:
  //   - InvalidArgument: the ranks disagree (the same message on every rank,
  //     wherever it is checked); the job goes on;
  //   - DeadlineExceeded "timed out at rank R waiting for rank(s) X to
  //     submit op K (...)"; the arena then fails with it;
  //   - the arena's failure, once it failed;
  //   - Cancelled if a rank that has not published op `seq` left (closed
  //     its session);
  //   - Internal / DataLoss if rank `rank`'s client published something else
  //     than it submitted, or a frame is corrupted (the arena fails).
  absl::Status CheckSignatures(int rank, const OpSignature& op, absl::Time deadline,
                               const std::function<void(int rank)>& on_arrival);

  // Fails the arena (the first reason wins) and wakes every waiter.
  void Fail(const absl::Status& reason) { view_.Fail(reason); }
  // Rank `rank`'s session closed: ops it never published fail (Cancelled
  // "rank R closed its session after op K ..."), the rest can complete.
  void Leave(int rank) { view_.Leave(rank); }
  absl::Status failure() const { return view_.failure(); }

  // The clients' local ops since the last call (for metrics): one record per
  // (collective, code) that moved. A counter that went backwards (a client
  // scribbled on it) is re-based silently.
  std::vector<LocalOpsRecord> TakeLocalOps();

 private:
  JobArena(std::string job_id, std::unique_ptr<ipc::SharedMemory> mem, ipc::ArenaView view);



  const std::string job_id_;
  const std::unique_ptr<ipc::SharedMemory> mem_;
  ipc::ArenaView view_;
  absl::Mutex mu_;
  // [rank][kind]: what TakeLocalOps last read
  std::vector<std::array<OpCounts, ipc::kArenaCounterKinds>> seen_ ABSL_GUARDED_BY(mu_);
};

}  // namespace gradsync

#endif  // GRADSYNC_WORKER_JOB_ARENA_H_
