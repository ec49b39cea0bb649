#include "collective/collectives.h"

#include "absl/strings/str_cat.h"
#include "collective/algorithms.h"
#include "collective/compressed_ring.h"
#include "collective/sparse_allreduce.h"
#include "collective/op_validation.h"
#include "common/status_macros.h"

namespace gradsync {

size_t CollectiveBufferBytes(CollectiveKind kind, size_t count, DType dtype, int world) {
  const size_t block = count * DTypeSize(dtype);
  switch (kind) {
    case CollectiveKind::kAllreduce:
    case CollectiveKind::kBroadcast:
    case CollectiveKind::kReduce:
    case CollectiveKind::kSend:
    case CollectiveKind::kRecv: return block;
    case CollectiveKind::kReduceScatter:
    case CollectiveKind::kAllgather:
    case CollectiveKind::kAlltoall:
    case CollectiveKind::kGather:
    case CollectiveKind::kScatter: return static_cast<size_t>(world < 1 ? 1 : world) * block;
    case CollectiveKind::kBarrier: return 0;
  }
  return 0;
}

absl::Status RunCollective(transport::Context& ctx, const CollectiveCall& call, Algorithm algo,
                           transport::Scratch* scratch) {
  const CollectiveKind kind = call.kind;
  OpContext op_ctx;
  op_ctx.rank = ctx.rank();
  op_ctx.world_size = ctx.size();
  RETURN_IF_ERROR(CheckOpValues(kind, call.dtype, call.op, call.root, op_ctx));
  if (!Implements(algo, kind)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "algorithm '", AlgorithmName(algo), "' does not implement ", CollectiveName(kind),
        " (algorithms for ", CollectiveName(kind), ": ", ImplementingAlgorithms(kind), ")"));
  }
  if (kind != CollectiveKind::kBarrier) {
    if (call.buffer.ptr == nullptr && call.count > 0) {
      return absl::InvalidArgumentError(
          absl::StrCat(CollectiveName(kind), " of ", call.count, " elements: null buffer"));
    }
    const size_t need = CollectiveBufferBytes(kind, call.count, call.dtype, ctx.size());
    if (call.buffer.size < need) {
      return absl::InvalidArgumentError(absl::StrCat(
          CollectiveName(kind), " of ", call.count, " ", DTypeName(call.dtype), " elements at ",
          ctx.size(), " ranks needs a buffer of ", need, " bytes; got ", call.buffer.size));
    }
  }
  if (algo == Algorithm::kOneShot &&
      CollectiveBufferBytes(kind, call.count, call.dtype, ctx.size()) > kOneShotMaxBytes) {
    return absl::InvalidArgumentError(absl::StrCat(
        "oneshot ", CollectiveName(kind), " of ",
        CollectiveBufferBytes(kind, call.count, call.dtype, ctx.size()),
        " bytes: oneshot carries at most ", kOneShotMaxBytes, " bytes per rank"));
  }
  // The reducer (which also copies) must work on the buffer's memory (the
  // context refuses a kind its device cannot move when it is registered).
  if (kind != CollectiveKind::kBarrier && !(call.reduce().kind() == call.buffer.kind)) {
    return absl::InvalidArgumentError(absl::StrCat(
        CollectiveName(kind), ": the buffer is ", call.buffer.kind.ToString(),
        " memory, the reducer works on ", call.reduce().kind().ToString(), " memory"));
  }
  // The algorithms stage through scratch of the buffer's own memory kind.
  if (kind != CollectiveKind::kBarrier && !(scratch->kind() == call.buffer.kind)) {
    return absl::InvalidArgumentError(absl::StrCat(
        CollectiveName(kind), ": the buffer is ", call.buffer.kind.ToString(),
        " memory, the scratch is ", scratch->kind().ToString(), " memory"));
  }
  if (call.sparse.spec.on()) {
    RETURN_IF_ERROR(internal::CheckSparseApplies(kind, call.dtype, call.op, call.count,
                                                 call.buffer.kind));
    return internal::SparseAllreduce(ctx, call, scratch);
  }
  if (call.codec != CodecId::kNone) {
    RETURN_IF_ERROR(internal::CheckCodecApplies(call.codec, kind, algo, call.dtype, call.op,
                                                call.buffer.kind,
                                                call.codec_feedback != nullptr));
    return internal::CompressedRing(ctx, call, scratch);
  }
  using A = Algorithm;
  switch (kind) {
    case CollectiveKind::kAllreduce:
      switch (algo) {
        case A::kRing:
          return RingAllreduce(ctx, call.buffer, call.count, call.dtype, call.op, call.seq,
                               call.deadline, call.ring, scratch, nullptr, &call.reduce(),
                               call.region);
        case A::kRecursiveHalvingDoubling: return internal::RhdAllreduce(ctx, call, scratch);
        case A::kRecursiveDoubling: return internal::RdAllreduce(ctx, call, scratch);
        case A::kBinomialTree: return internal::TreeAllreduce(ctx, call, scratch);
        case A::kOneShot: return internal::OneShotAllreduce(ctx, call, scratch);
        default: break;
      }
      break;
    case CollectiveKind::kReduceScatter:
      switch (algo) {
        case A::kRing: return internal::RingReduceScatter(ctx, call, scratch);
        case A::kRecursiveHalvingDoubling: return internal::RhdReduceScatter(ctx, call, scratch);
        default: break;
      }
      break;
    case CollectiveKind::kAllgather:
      switch (algo) {
        case A::kRing: return internal::RingAllgather(ctx, call, scratch);
        case A::kRecursiveHalvingDoubling: return internal::RhdAllgather(ctx, call, scratch);
        case A::kRecursiveDoubling: return internal::RdAllgather(ctx, call, scratch);
        default: break;
      }
      break;
    case CollectiveKind::kBroadcast:
      switch (algo) {
        case A::kRing: return internal::RingBroadcast(ctx, call, scratch);
        case A::kBinomialTree: return internal::TreeBroadcast(ctx, call, scratch);
        default: break;
      }
      break;
    case CollectiveKind::kReduce:
      switch (algo) {
        case A::kRing: return internal::RingReduce(ctx, call, scratch);
        case A::kBinomialTree: return internal::TreeReduce(ctx, call, scratch);
        default: break;
      }
      break;
    case CollectiveKind::kAlltoall:
      if (algo == A::kPairwise) return internal::PairwiseAlltoall(ctx, call, scratch);
      break;
    case CollectiveKind::kGather:
      if (algo == A::kPairwise) return internal::LinearGather(ctx, call);
      break;
    case CollectiveKind::kScatter:
      if (algo == A::kPairwise) return internal::LinearScatter(ctx, call);
      break;
    case CollectiveKind::kBarrier:
      switch (algo) {
        case A::kRecursiveDoubling: return internal::DisseminationBarrier(ctx, call);
        case A::kBinomialTree: return internal::TreeBarrier(ctx, call);
        case A::kPairwise:
        case A::kOneShot: return internal::PairwiseBarrier(ctx, call);
        default: break;
      }
      break;
    case CollectiveKind::kSend:
    case CollectiveKind::kRecv: break;  // not collectives (Implements() said no)
  }
  // Unreachable while Implements() matches the switch above.
  return absl::InternalError(
      absl::StrCat("no implementation of ", AlgorithmName(algo), " ", CollectiveName(kind)));
}

}  // namespace gradsync
