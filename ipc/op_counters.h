// Counters a client keeps in shared memory of the ops it runs itself (in a
// node-local job's arena, ipc/arena.h, or on the direct path, in its op
// queue, ipc/op_queue.h), for the daemon's metrics; and, for the direct
// path, the ops it runs and ran last, for the daemon's status. The client
// adds to the counters with relaxed atomics; the daemon reads the running
// totals now and then and counts their increase (a total that went
// backwards only re-bases).
#ifndef GRADSYNC_IPC_OP_COUNTERS_H_
#define GRADSYNC_IPC_OP_COUNTERS_H_

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <string>

#include "common/types.h"

namespace gradsync {
namespace ipc {

// One block per collective the client runs itself.
inline constexpr int kOpCounterAllreduce = 0;
inline constexpr int kOpCounterBarrier = 1;
inline constexpr int kOpCounterKinds = 2;
inline constexpr int kOpStatusCodes = 17;  // absl::StatusCode 0..16

struct OpCounters {
  std::atomic<uint64_t> ok;
  std::atomic<uint64_t> bytes;    // buffer bytes of successful ops
  std::atomic<uint64_t> run_ns;   // summed submission-to-completion time of successful ops
  std::atomic<uint64_t> wait_ns;  // summed waiting for the last rank (successful ops)
  std::atomic<uint64_t> failed[kOpStatusCodes];  // failed ops by absl::StatusCode
};
static_assert(std::atomic<uint64_t>::is_always_lock_free, "counter words must be lock-free");

// Ops for the daemon that failed on the client's direct path before they
// reached it (in the clients' signature exchange: a mismatch, a rank that
// did not submit, the path failed), by CollectiveKind (1..7) and
// absl::StatusCode. Added with relaxed atomics.
inline constexpr int kCollectiveSlots = 8;
struct UnsentFailures {
  std::atomic<uint64_t> failed[kCollectiveSlots][kOpStatusCodes];
};

// One op of the client's direct path, as the daemon's status shows it.
inline constexpr size_t kDirectOpNameBytes = 64;  // longer names are cut here
struct DirectOp {
  uint64_t seq = 0;   // 0: none
  int64_t at_us = 0;  // the current op: submitted; the last: finished (Unix epoch)
  CollectiveKind kind = CollectiveKind::kAllreduce;
  DType dtype = DType::kF32;
  ReduceOp reduce_op = ReduceOp::kSum;
  uint64_t count = 0;
  int32_t code = 0;  // the last op: its absl::StatusCode
  std::string name;
};
struct DirectOpWords {
  std::atomic<uint64_t> seq;
  std::atomic<int64_t> at_us;
  std::atomic<uint64_t> meta;  // kind | dtype << 8 | reduce_op << 16 | code << 24 | name bytes << 40
  std::atomic<uint64_t> count;
  std::atomic<uint64_t> name[kDirectOpNameBytes / 8];
};
// A seqlock: the client writes (version odd while it does), the daemon
// reads and retries on a change.
struct DirectOpsWords {
  std::atomic<uint64_t> version;
  DirectOpWords current, last;
};
// What the daemon reads of a client's direct path.
struct DirectOpsSnapshot {
  uint64_t in_flight = 0;  // ops not yet done or at the daemon
  bool read = false;       // current and last were read (the client kept rewriting them)
  DirectOp current, last;
};

}  // namespace ipc
}  // namespace gradsync

#endif  // GRADSYNC_IPC_OP_COUNTERS_H_
