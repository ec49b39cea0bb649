// One op of one session, as the session queues it and the job's executor runs
// it (worker/session_ops.h, worker/job_executor.h): plain data, no behaviour.
//
// Ownership: shared (std::shared_ptr) by the session's op table and queue and
// by the executor's slot while it runs. The op keeps its buffer (and device
// memory) alive, so a buffer freed or a session closed while the op runs
// stays mapped until the op is done with it.
//
// Thread-safety: everything but `outcome` and `started` is written before the
// op is queued and only read afterwards. `started` and `outcome` are guarded
// by the owning SessionOps' mutex (SessionOps::TakeNext / Finish write them).
#ifndef GRADSYNC_WORKER_QUEUED_OP_H_
#define GRADSYNC_WORKER_QUEUED_OP_H_

#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "collective/op_signature.h"
#include "common/op_desc.h"
#include "worker/device_memory.h"
#include "worker/shm_segment.h"

namespace gradsync {

class SessionBuffers;

// What the client learns of a finished op (Session::Wait, the completion
// listener). done=false: still queued or running.
// An op's result as its session records it: done once the executor finished
// it (queued_time: submitted -> taken by the executor; run_time: taken ->
// finished).
struct OpOutcome : OpResult {
  bool done = false;
};

// One queued op, shared by its session and the job's executor.
struct QueuedOp {
  uint64_t id = 0;   // the op id in its session (what the client waits on)
  uint64_t seq = 0;  // a collective's sequence number (sig.seq); 0: point-to-point
  OpSignature sig;                     // sig.forced: the requested plan code
  std::shared_ptr<ShmSegment> buffer;  // null for a buffer-less barrier
  // A device buffer's GPU memory; `buffer` is then its host twin, which the
  // executor fills before the op runs and copies back after it succeeded.
  std::shared_ptr<DeviceMemory> device;
  uint64_t offset = 0;
  // The session's quotas, charged for state the daemon keeps for this op's
  // key (error feedback); null in tests that build ops by hand.
  std::shared_ptr<SessionBuffers> quota;
  double premul_factor = 1.0;  // premul_sum: the executor multiplies the input by it first
  absl::Time submitted;
  absl::Time started;   // when the executor took it
  absl::Time deadline;
  OpOutcome outcome;    // guarded by the session's op table (SessionOps)

  char* data() const { return buffer != nullptr ? buffer->data() + offset : nullptr; }
};

}  // namespace gradsync

#endif  // GRADSYNC_WORKER_QUEUED_OP_H_
