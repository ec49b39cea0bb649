// The pipelined ring engine behind ring allreduce, reduce_scatter and
// allgather (internal to //collective).
//
// A pass is a run of consecutive ring steps of a RingPlan (ring_plan.h): the
// whole plan for allreduce, its first n-1 steps (reduce-scatter) or its last
// n-1 steps (allgather). Every step moves one chunk to the right neighbour as
// `segments` messages. The chunk indices of the plan can be rotated by
// `chunk_shift`: the plan leaves rank r owning chunk r+1 after reduce-scatter
// (what allreduce uses); a shift of -1 makes it chunk r, which is what
// reduce_scatter and allgather promise.
//
// Pipelining (the same for every pass): up to `max_inflight` segments are in
// flight each way. Reduce-scatter segments land in a staging slot and are
// reduced into the buffer with the CPU kernel while the next ones stream in;
// allgather segments land straight in the buffer. Send i (i >= segments)
// forwards what receive i-segments delivered and is posted as soon as that
// receive was processed. In a pass with both phases an allgather receive
// waits until the reduce-scatter send of the same region has left.
//
// Message i of a pass has slot i and offset = the byte offset of its segment
// in the buffer. kAvg divides once, on the chunk's owner, when the last
// reduce-scatter step reduced it.
#ifndef GRADSYNC_COLLECTIVE_RING_PIPELINE_H_
#define GRADSYNC_COLLECTIVE_RING_PIPELINE_H_

#include <cstddef>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "collective/ring_allreduce.h"
#include "collective/reducer.h"
#include "collective/ring_plan.h"
#include "common/types.h"
#include "transport/memory.h"
#include "transport/transport.h"

namespace gradsync::internal {

struct RingPass {
  const RingPlan* plan = nullptr;
  int first_step = 0;          // the plan step of the pass's first message
  int steps = 0;               // ring steps in the pass
  int chunk_shift = 0;         // added to the plan's chunk indices (mod world)
  const char* label = "ring";  // "timed out at rank R in <label> step S of <steps>: ..."
  const Reducer* reducer = nullptr;  // null: the CPU's
  // A registration covering the data (null: registered for this pass).
  const transport::MemoryRegion* region = nullptr;
};

// Where one message of a pass lives: bytes [offset, offset+len) of a
// registered region, and the offset its tag carries (the segment's byte
// offset in the op's buffer, or in the compressed ring's encoded area).
struct RingSpan {
  const transport::MemoryRegion* region = nullptr;
  size_t offset = 0;
  size_t len = 0;
  uint64_t tag_offset = 0;
};

// What a pass does with its messages around the pipeline's scheduling: the
// dense ring sends from the buffer and reduces staged receives, the
// compressed ring (compressed_ring.h) encodes and decodes.
class RingMessageIo {
 public:
  virtual ~RingMessageIo() = default;
  // Send i (message m) is posted now that its data are final: prepares it
  // and says where its bytes are.
  virtual RingSpan Send(size_t i, const RingMessage& m) = 0;
  // Where receive i lands.
  virtual RingSpan Recv(size_t i, const RingMessage& m) = 0;
  // Receive i arrived.
  virtual void Arrived(size_t i, const RingMessage& m) = 0;
};

// Segments in flight per direction: min(options.max_inflight, ctx.max_in_flight()).
size_t RingInflight(const transport::Context& ctx, const RingOptions& options);

// Runs `pass`'s messages through `io` in the order and with the bounds
// described above; every message's tag carries `tag_dtype`. The deadline's
// error names the step and both neighbours.
absl::Status DriveRingPass(transport::Context& ctx, const RingPass& pass, uint8_t tag_dtype,
                           uint64_t seq, absl::Time deadline, const RingOptions& options,
                           RingMessageIo& io, RingStats* stats);

// The segment size every ring pass uses for chunks of `chunk_bytes`: at least
// 4 segments per chunk when chunks are large, never smaller than
// min_segment_bytes nor larger than segment_bytes (except single elements).
size_t RingSegmentBytes(size_t chunk_bytes, const RingOptions& options);

// Runs `pass` on data[0, data_bytes) (the plan's count elements). Requires a
// world of at least 2. `scratch` (of the data's memory kind) holds the
// staging slots. At most min(options.max_inflight, ctx.max_in_flight())
// segments are in flight per direction.
absl::Status RunRingPass(transport::Context& ctx, const transport::Buffer& data, DType dtype,
                         ReduceOp op, uint64_t seq, absl::Time deadline, const RingOptions& options,
                         const RingPass& pass, transport::Scratch* scratch, RingStats* stats);

}  // namespace gradsync::internal

#endif  // GRADSYNC_COLLECTIVE_RING_PIPELINE_H_
