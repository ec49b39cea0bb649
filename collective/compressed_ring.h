// Ring allreduce and reduce_scatter of f32 values whose messages travel
// through a wire codec (kernels/codec.h) - the shape of ZeRO++'s qgZ: a
// quantized reduce-scatter, then an allgather of the reduced chunks
// quantized once.
//
// The ring, its chunks and segments are RingPlan's (ring_plan.h), exactly as
// for the dense ring with the same RingOptions; each segment is encoded on
// its own (its codec blocks start at the segment's first element), so every
// rank cuts the same runs. Per segment of chunk c (ranks mod n):
//
//   reduce-scatter  rank c encodes x_c; each next rank decodes what it
//                   received and adds it to its own values in f32, then
//                   encodes that partial sum for its right neighbour; the
//                   owner (rank c-1) ends with an f32 sum: one quantization
//                   per hop, accumulation never below f32. avg divides it
//                   once there.
//   allgather       (allreduce) the owner encodes its sum once and replaces
//                   its own values with the decoded bytes; the other ranks
//                   decode and forward the same bytes unchanged. Every rank
//                   ends with the same bits.
//
// reduce_scatter leaves each rank's own block in f32 (only the hops are
// quantized). premul_sum arrives premultiplied and sums.
//
// Error feedback (call.codec_feedback, kept per op name by the daemon): the
// residual joins the input first; then each value this rank encodes leaves
// what the encoding lost, sent - decoded, in its place in the residual (the
// owner's loss times n under avg, whose division came first). Each rank
// encodes every element at most once per op, so the residual is exactly
// what this rank's quantizations took from the result, and over a run of
// ops the results add up to the inputs' sum less only the last residuals
// (EF-SGD's argument; compressed_ring_test checks it). Non-finite losses
// are not kept.
//
// The codec's kernels are the call's reducer's (collective/reducer.h): on a
// device buffer the CUDA kernels encode and decode in GPU memory, and only
// the encoded bytes cross to the host (or go straight to the NIC). Error
// feedback is kept for host buffers only.
//
// Encoded segments live in one staging area (`scratch`, the encoded size of
// the whole buffer): a segment's reduce-scatter receive, its encoded send,
// its allgather receive and the forward of those bytes use the same place,
// one after the other (the dense ring's ordering guarantees it). Messages
// carry MessageTag{seq, message index, f32, byte offset in that area}.
#ifndef GRADSYNC_COLLECTIVE_COMPRESSED_RING_H_
#define GRADSYNC_COLLECTIVE_COMPRESSED_RING_H_

#include "absl/status/status.h"
#include "collective/collectives.h"
#include "collective/ring_plan.h"
#include "kernels/codec.h"
#include "transport/memory.h"
#include "transport/transport.h"

namespace gradsync::internal {

// Whether `call` (with `algo`) can travel through a codec: InvalidArgument
// naming the codec and what does not apply (a collective other than
// allreduce and reduce_scatter, an algorithm other than ring, a dtype other
// than f32, a reduction other than sum, avg and premul_sum, error feedback
// for device memory).
absl::Status CheckCodecApplies(CodecId codec, CollectiveKind kind, Algorithm algo, DType dtype,
                               ReduceOp op, transport::MemKind memory, bool error_feedback);

// The ring plan of a compressed `kind` of `count` elements per rank-block
// (the dense ring's: the same chunks and segments).
RingPlan CompressedRingPlan(CollectiveKind kind, size_t count, int world, int rank,
                            const RingOptions& options);

// Runs `call` (call.codec is not kNone; CheckCodecApplies passed).
absl::Status CompressedRing(transport::Context& ctx, const CollectiveCall& call,
                            transport::Scratch* scratch);

}  // namespace gradsync::internal

#endif  // GRADSYNC_COLLECTIVE_COMPRESSED_RING_H_
