// Internal to //client (not part of the SDK's API).
//
// The node-local path: a session of a job whose ranks all use one gradsyncd
// gets the job's arena (ipc/arena.h) when it opens. From then on every op of
// the session goes through LocalPath:
//
//   - It is numbered here: op k is the k-th op the session submitted (the
//     daemon uses the same number; OpHandle::op_id = sequence = k).
//   - Its signature is published in frame k of this rank's arena slot at
//     submission, before anything else, so whoever checks that the ranks
//     agree on op k reads the same n signatures.
//   - Small allreduces (up to the arena's data size, gradsyncd
//     --local_ops_max_bytes) and barriers, with the algorithm "auto" or
//     "local", run here: the client copies its contribution into the frame
//     with the signature and returns. The op completes (in a later Wait, Poll
//     or Submit) once every rank's frame k is there: the signatures are
//     compared, and the n contributions are reduced in rank order (rank 0's,
//     then 1's, ...; avg divided once by n) into this rank's buffer. Every
//     rank computes the same bits, the same as the daemon's hierarchical
//     path. No daemon thread is involved; the cost is the clients' own
//     shared-memory traffic.
//   - Every other op goes to the daemon (the OpChannel) numbered k; the daemon
//     checks its signature in the arena too.
//
// Order. A session's ops keep their submission order where it matters: an
// op is held back (a local op not published, a daemon op not sent) while an
// earlier, unfinished op uses an overlapping byte range of the same buffer
// (for a daemon op: an earlier local one; the daemon orders its own), and a
// barrier is ordered against everything. Ops on disjoint ranges may
// complete out of submission order (on the daemon alone they could not: a
// session's executor runs one op at a time).
//
// Errors, the same as the daemon's for the same cause:
//   - a mismatch: InvalidArgument "op 5 does not match across ranks: rank 2
//     submitted ..., ranks 0,1,3 submitted ..." (the job goes on);
//   - a rank that does not submit: after the op's timeout, DeadlineExceeded
//     "allreduce 'g' (op 5) failed at rank 0: timed out at rank 0 waiting for
//     rank(s) 2 to submit op 5 (...)"; the arena then fails (the ranks are out
//     of step) and the daemon ends the epoch, as for any deadline;
//   - the arena failed (a session of the job closed, the epoch failed, the
//     daemon stopped): the ops that were still waiting fail with its reason,
//     and new submissions get FailedPrecondition.
// An op whose n frames are all there completes even after a failure: frames
// are immutable until every rank is done with them, so its result is right.
//
// Progress happens inside the session's calls (Submit, Wait, Poll): a rank
// that submitted a local op has given the others everything they need from
// it, but it reads the others' contributions only when it is next called.
// A rank that never calls in keeps its frames, so the others can get at most
// `frames` ops ahead of it (then their Submit waits, up to the op timeout).
//
// Thread-safe: one mutex guards the state; waits happen without it.
#ifndef GRADSYNC_CLIENT_LOCAL_PATH_H_
#define GRADSYNC_CLIENT_LOCAL_PATH_H_

#include <cstdint>
#include <map>
#include <memory>
#include <set>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "client/op_channel.h"
#include "client/op_path.h"
#include "collective/algorithm.h"
#include "ipc/arena.h"
#include "ipc/shared_memory.h"

namespace gradsync {
namespace client {
namespace internal {

struct LocalPathOptions {
  // A wait polls (yielding the CPU) this long before it sleeps on the
  // arena's futex (GRADSYNC_WAIT_SPIN_US, as the op queue's waits).
  absl::Duration spin = absl::Microseconds(100);
  // Op timeout when the op has none (the job's op_timeout_ms).
  absl::Duration default_op_timeout = absl::Seconds(60);
};

class LocalPath final : public OpPath {
 public:
  // Attaches to the arena `mem` as rank `rank`. `channel` (not owned,
  // outlives this) carries the ops the daemon runs. FailedPrecondition if the
  // segment is not an arena of `world_size` ranks.
  static absl::StatusOr<std::unique_ptr<LocalPath>> Open(std::unique_ptr<ipc::SharedMemory> mem,
                                                         int rank, int world_size,
                                                         OpChannel* channel,
                                                         std::string session_id,
                                                         LocalPathOptions options);

  uint8_t code() const override { return kLocalCode; }
  // The largest allreduce (bytes per rank) this path runs itself.
  uint64_t max_local_bytes() const override { return arena_.data_bytes(); }

  // Numbers and publishes the op; a local one stays here, any other goes to
  // the channel. Waits only when the arena's frames are all in use (a rank
  // `frames` ops behind), up to the op's timeout.
  absl::StatusOr<SubmitTicket> Submit(const PathOp& op) override;
  // As OpChannel::Wait, for ops of either path.
  absl::StatusOr<WaitOutcome> Wait(uint64_t op_id, absl::Time deadline) override;

 private:
  enum class State {
    kHeld,       // waits for an earlier overlapping op of the other path
    kPublished,  // local: in the arena; daemon: sent to the channel
    kDone,       // outcome known
  };
  struct Entry {
    uint64_t seq = 0;
    PathOp op;
    std::string signature;  // encoded (collective/op_signature.h)
    State state = State::kHeld;
    absl::Time submitted;
    absl::Time published;
    absl::Time deadline;
    std::string name, algorithm;  // what op.args' views point at
    bool in_channel_wait = false;  // daemon op: a thread waits for it in channel_->Wait
    absl::Status status;    // kDone
    WaitOutcome outcome;    // kDone and OK
    absl::Duration arrival_wait;  // local: from this rank's frame to the last one
  };

  LocalPath(std::unique_ptr<ipc::SharedMemory> mem, ipc::ArenaView arena, int rank,
            OpChannel* channel, std::string session_id, LocalPathOptions options);

  // One non-blocking pass over the pending ops, in order: publish or send
  // what may go, finish what can be finished, poll the daemon's ops; then
  // publish how far this rank is done (consumed).
  void ProgressLocked(absl::Time now) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The earlier, unfinished op `e` must wait for, or null: for a local op
  // any op on overlapping bytes (its contribution is copied when it is
  // published, so it must see the earlier op's result); for a daemon op a
  // local one on overlapping bytes, or an earlier daemon op still held
  // (the daemon takes a session's ops in sequence order, and orders them
  // itself). A barrier is ordered against every earlier op, and every later
  // op against it.
  const Entry* BlockerLocked(const Entry& e) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // A rank that has not published op `seq` and has left (its session
  // closed), or -1; *done_up_to: the last op it finished.
  int LeftRankMissing(uint64_t seq, uint64_t* done_up_to) const;
  absl::Status PublishLocked(Entry& e) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // PublishLocked; if it fails (a length over the arena's limits), the op
  // fails and so does the arena (the others would wait for this frame).
  void PublishOrFailLocked(Entry& e, absl::Time now) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void SendLocked(Entry& e) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // A published local op whose frames are all present: compare, reduce.
  void FinishLocalLocked(Entry& e, absl::Time now) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void CompleteLocked(Entry& e, absl::Status s, absl::Time now) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // "allreduce 'g' f32[2] sum", built from the signature only when an error
  // needs it (not per op).
  static std::string Describe(const Entry& e);
  // "allreduce 'g' f32[2] sum (op 5) failed at rank 0: " + why, with why's code.
  absl::Status Annotate(const Entry& e, const absl::Status& why) const;
  std::string Missing(uint64_t seq) const;

  const std::unique_ptr<ipc::SharedMemory> mem_;
  ipc::ArenaView arena_;
  const int rank_;
  const int world_;
  OpChannel* const channel_;
  const std::string session_id_;
  const LocalPathOptions options_;

  // One submitter at a time: numbering and publishing an op is one step,
  // even when it has to wait for a frame (which releases mu_).
  absl::Mutex submit_mu_ ABSL_ACQUIRED_BEFORE(mu_);
  absl::Mutex mu_;
  absl::CondVar done_cv_;  // an op finished (a waiter behind another thread's channel wait)
  uint64_t next_seq_ ABSL_GUARDED_BY(mu_) = 1;
  std::map<uint64_t, Entry> pending_ ABSL_GUARDED_BY(mu_);  // submitted, not yet reported
  std::set<uint64_t> unfinished_ ABSL_GUARDED_BY(mu_);      // not kDone
  uint64_t consumed_ ABSL_GUARDED_BY(mu_) = 0;              // as published in the arena
};

}  // namespace internal
}  // namespace client
}  // namespace gradsync

#endif  // GRADSYNC_CLIENT_LOCAL_PATH_H_
