// Ring allreduce over a transport::Context: reduce-scatter then allgather,
// chunked and pipelined (see ring_plan.h for the arithmetic).
//
// Pipelining: up to `max_inflight` segments are in flight in each direction.
// Received reduce-scatter segments land in a staging slot and are reduced into
// the buffer with the CPU kernels while the next segments stream in; allgather
// segments are received straight into the buffer. Sends go straight from the
// buffer. Every wait is bounded by `deadline`.
//
// Float sums: each element of chunk c is accumulated in ring order, starting
// at rank c: ((x_c + x_{c+1}) + x_{c+2}) + ... (ranks mod world). The result is
// identical on every rank (the owner's reduced chunk is copied, not
// recomputed). avg divides once, on the owner, before the allgather.
#ifndef GRADSYNC_COLLECTIVE_RING_ALLREDUCE_H_
#define GRADSYNC_COLLECTIVE_RING_ALLREDUCE_H_

#include <cstddef>
#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "collective/reducer.h"
#include "common/types.h"
#include "transport/memory.h"
#include "transport/transport.h"

namespace gradsync {

struct RingOptions {
  size_t segment_bytes = 1 << 20;  // upper bound of one pipelined message
  size_t min_segment_bytes = 64 << 10;
  int max_inflight = 4;
};

struct RingStats {
  size_t messages = 0;
  size_t segments_per_chunk = 0;
  uint64_t bytes_sent = 0;
};

// In-place allreduce of `count` elements at `data`. `scratch` is reused
// between calls (grown as needed). Errors: the transport's (Unavailable,
// Aborted, DataLoss), DeadlineExceeded naming what this rank waited for.
// `reducer` (null: the CPU's) reduces `data`, which is `memory`.
absl::Status RingAllreduce(transport::Context& ctx, const transport::Buffer& data, size_t count,
                           DType dtype, ReduceOp op, uint64_t seq, absl::Time deadline,
                           const RingOptions& options, transport::Scratch* scratch,
                           RingStats* stats = nullptr, const Reducer* reducer = nullptr,
                           const transport::MemoryRegion* region = nullptr);

}  // namespace gradsync

#endif  // GRADSYNC_COLLECTIVE_RING_ALLREDUCE_H_
