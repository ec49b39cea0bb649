// The ranks of one job epoch that live on this daemon, for hierarchical
// collectives ("hier"): their buffers are all mapped in this process, so they
// are reduced in place in memory, only one rank per daemon (the node leader)
// talks to the other daemons, and the result is copied back to every local
// buffer. One daemon per node, however many GPUs (clients) it serves.
//
// Hierarchical allreduce of op `seq`, on every local rank's executor thread:
//   A. every local rank arrives with its buffer (bounded by the op deadline);
//   B. local rank i reduces slice i of the buffer across all local buffers
//      into the leader's buffer, in local-rank order (so in parallel on
//      several cores);
//   C. the leader runs the allreduce across daemons on its buffer (node
//      context, one rank per daemon; skipped with one daemon), then divides
//      once by the world size for avg;
//   D. every other local rank copies the leader's buffer into its own;
//   E. all leave together (the leader's buffer is read until the last copy).
// Small messages (<= small_bytes) skip the stages: the last local rank to
// arrive does B-D alone and wakes the others once (fewer thread hand-offs).
// Every element is reduced in a fixed order (local ranks ascending within a
// daemon, then the node-level algorithm's order), so every rank gets the same
// bits. Any failure or deadline fails the op on every local rank; a failure
// of the node context breaks the group (later hier ops fail at once).
#ifndef GRADSYNC_WORKER_JOB_GROUP_H_
#define GRADSYNC_WORKER_JOB_GROUP_H_

#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "collective/cost_model.h"
#include "collective/ring_allreduce.h"
#include "common/types.h"
#include "transport/transport.h"

namespace gradsync {

struct GroupLayout {
  int world_size = 1;
  int nodes = 1;                 // distinct daemons in the job
  int node_index = 0;            // this daemon's index among them
  std::vector<int> local_ranks;  // ranks on this daemon, ascending
};

class JobGroup {
 public:
  // How long a local rank waiting for the others polls (yielding the CPU)
  // before it sleeps: the last arriver usually comes within microseconds,
  // and a futex wake-up costs tens of them on a virtual CPU.
  static constexpr absl::Duration kSpin = absl::Microseconds(30);

  // `node_ctx` connects the node leaders (null when nodes == 1).
  // `small_bytes`: the largest allreduce (bytes per rank) the last local rank
  // runs alone (PlannerSettings::hier_rendezvous_max_bytes).
  JobGroup(GroupLayout layout, std::unique_ptr<transport::Context> node_ctx, LinkParams link,
           RingOptions ring, size_t small_bytes);

  const GroupLayout& layout() const { return layout_; }

  // The small local allreduce, in place: combines bufs[1..] into bufs[0] in
  // rank order, divides by `world_size` for avg, copies the result into every
  // other buffer. Every buffer gets the same bits.
  static void ReduceLocal(const std::vector<char*>& bufs, size_t count, DType dtype, ReduceOp op,
                          int world_size);
  int LocalIndex(int rank) const;

  // Runs stage A-E for the local rank `rank`. `data` is its buffer.
  absl::Status HierAllreduce(int rank, uint64_t seq, char* data, size_t count, DType dtype,
                             ReduceOp op, absl::Time deadline);

  // When every rank of the job is on this daemon (nodes == 1): the op
  // signature check done in memory instead of over the network. Every local
  // rank calls it with its encoded signature; all get the same result
  // (collective/op_signature.h CompareSignatures).
  // `agreed` receives rank 0's proposal on success.
  //
  // `small`: a hierarchical allreduce of at most small_bytes, done in this
  // same rendezvous when every rank passes one and rank 0 proposed "hier": the
  // last rank to arrive reduces every buffer in rank order, divides for avg,
  // copies the result to all and calls every rank's `complete` (tells its
  // client) before it wakes the others;
  // `small->done` says it happened (else the caller runs HierAllreduce).
  struct LocalAllreduce {
    char* data = nullptr;
    size_t count = 0;
    DType dtype = DType::kF32;
    ReduceOp op = ReduceOp::kSum;
    std::function<void()> complete;  // may be empty; runs on the last arriver's thread
    bool done = false;  // out
  };
  absl::Status CheckLocalSignatures(int rank, uint64_t seq, const std::string& encoded,
                                    absl::Time deadline, uint8_t* agreed,
                                    LocalAllreduce* small = nullptr);

  // The local ranks that have reached CheckLocalSignatures for op `seq` (for
  // status: who the others wait for).
  std::vector<int> ArrivedAt(uint64_t seq);

  // Fails every pending and future hierarchical op (session closed, epoch
  // aborted).
  void Abort(const absl::Status& reason);

 private:
  struct Slot {
    std::vector<char*> buffers;
    int arrived = 0;
    int reduced = 0;     // stage B done
    bool leader_done = false;  // stage C done
    int copied = 0;      // stage D done
    int left = 0;
    bool done = false;  // small-message path: the last arriver did everything
    absl::Status status;
  };
  // The network stage and avg on the leader's buffer (any one thread).
  absl::Status CrossDaemons(uint64_t seq, char* data, size_t count, DType dtype, ReduceOp op,
                            absl::Time deadline);
  // Waits until cond or failure or deadline; returns the slot's/group's error.
  absl::Status WaitFor(Slot& slot, const std::function<bool()>& cond, absl::Time deadline,
                       const std::string& what) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const GroupLayout layout_;
  std::unique_ptr<transport::Context> node_ctx_;  // leader thread only
  const LinkParams link_;
  const RingOptions ring_;
  const size_t small_bytes_;
  std::vector<char> scratch_;  // leader only

  absl::Mutex mu_;
  std::map<uint64_t, Slot> slots_ ABSL_GUARDED_BY(mu_);
  struct SigSlot {
    std::vector<std::string> encoded;
    std::vector<LocalAllreduce*> small;  // by local index; null: none passed
    int arrived = 0;
    int left = 0;
    bool compared = false;  // result, agreed and small_done are final
    std::atomic<bool> decided{false};  // = compared, readable without mu_ (waiters spin on it)
    bool small_done = false;
    bool running = false;  // the last arriver is doing the small op
    uint8_t agreed = 0;
    absl::Status result;
  };
  std::map<uint64_t, SigSlot> sig_slots_ ABSL_GUARDED_BY(mu_);
  absl::Status broken_ ABSL_GUARDED_BY(mu_);
};

}  // namespace gradsync

#endif  // GRADSYNC_WORKER_JOB_GROUP_H_
