// Element types and reduction operators, independent of the wire protos.
// Values match gradsync.v1.DataType / gradsync.v1.ReduceOp numerically.
#ifndef GRADSYNC_COMMON_TYPES_H_
#define GRADSYNC_COMMON_TYPES_H_

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace gradsync {

enum class DType : uint8_t {
  kF32 = 1,
  kF64 = 2,
  kF16 = 3,
  kBF16 = 4,
  kI32 = 5,
  kI64 = 6,
  kU8 = 7,
  kF8E4M3 = 8,  // OCP FP8 E4M3 (common/fp8.h): computed in f32, saturating
  kF8E5M2 = 9,  // OCP FP8 E5M2 (common/fp8.h): computed in f32, saturating
};

enum class ReduceOp : uint8_t {
  kSum = 1,
  kAvg = 2,
  kMin = 3,
  kMax = 4,
  kProd = 5,
  // A sum of every rank's input multiplied by that rank's factor
  // (OpDesc::premul_factor; NCCL's ncclPreMulSum, torch's PREMUL_SUM):
  // allreduce and reduce_scatter of float dtypes. The daemon multiplies the
  // input, then the algorithms sum (CombineOp).
  kPremulSum = 6,
};

// Values match gradsync.v1.CollectiveType. Buffer layouts: docs/collectives.md.
enum class CollectiveKind : uint8_t {
  kAllreduce = 1,
  kReduceScatter = 2,
  kAllgather = 3,
  kBroadcast = 4,
  kReduce = 5,
  kAlltoall = 6,
  kBarrier = 7,
  kGather = 8,   // rooted, blocked: the root collects every rank's block
  kScatter = 9,  // rooted, blocked: the root hands block j to rank j
  // Point-to-point (not collectives: only the two ranks take part; `root` is
  // the peer, OpDesc::tag matches them; worker/point_to_point.h).
  kSend = 10,
  kRecv = 11,  // root -1: from any source
};

inline constexpr CollectiveKind kAllCollectives[] = {
    CollectiveKind::kAllreduce, CollectiveKind::kReduceScatter, CollectiveKind::kAllgather,
    CollectiveKind::kBroadcast, CollectiveKind::kReduce,        CollectiveKind::kAlltoall,
    CollectiveKind::kBarrier,   CollectiveKind::kGather,        CollectiveKind::kScatter};
// Every op kind: the collectives, then send and recv.
inline constexpr CollectiveKind kAllOpKinds[] = {
    CollectiveKind::kAllreduce, CollectiveKind::kReduceScatter, CollectiveKind::kAllgather,
    CollectiveKind::kBroadcast, CollectiveKind::kReduce,        CollectiveKind::kAlltoall,
    CollectiveKind::kBarrier,   CollectiveKind::kGather,        CollectiveKind::kScatter,
    CollectiveKind::kSend,      CollectiveKind::kRecv};

inline constexpr DType kAllDTypes[] = {DType::kF32, DType::kF64, DType::kF16, DType::kBF16,
                                       DType::kI32, DType::kI64, DType::kU8, DType::kF8E4M3,
                                       DType::kF8E5M2};
// The ops the reduction kernels and algorithms take (kPremulSum reaches
// them as the sum it is after the multiplication).
inline constexpr ReduceOp kAllReduceOps[] = {ReduceOp::kSum, ReduceOp::kAvg, ReduceOp::kMin,
                                             ReduceOp::kMax, ReduceOp::kProd};
// Every op an op may ask for.
inline constexpr ReduceOp kAllOpReduceOps[] = {ReduceOp::kSum, ReduceOp::kAvg, ReduceOp::kMin,
                                               ReduceOp::kMax, ReduceOp::kProd,
                                               ReduceOp::kPremulSum};

// The element-wise operator that combines two ranks' values: avg and
// premul_sum sum (avg divides last; premul_sum multiplied each input first).
inline ReduceOp CombineOp(ReduceOp op) {
  return op == ReduceOp::kAvg || op == ReduceOp::kPremulSum ? ReduceOp::kSum : op;
}

// Bytes per element.
size_t DTypeSize(DType t);
// "f32", "f64", "f16", "bf16", "i32", "i64", "u8", "f8e4m3", "f8e5m2".
const char* DTypeName(DType t);
// "sum", "avg", "min", "max", "prod", "premul_sum".
const char* ReduceOpName(ReduceOp op);

// "allreduce", "reduce_scatter", "allgather", "broadcast", "reduce", "alltoall", "barrier",
// "gather", "scatter", "send", "recv".
const char* CollectiveName(CollectiveKind k);
bool IsValidCollective(int v);
absl::StatusOr<CollectiveKind> ParseCollective(absl::string_view name);
// Whether the buffer holds world_size blocks of `count` (reduce_scatter, allgather, alltoall,
// gather, scatter). Rank r's own block is block r; for gather and scatter the
// root's blocks are the result (gather) or the source (scatter), and a
// non-root rank uses only its own block (docs/collectives.md).
bool IsBlockedCollective(CollectiveKind k);
// Whether the op has a root rank (broadcast, reduce, gather, scatter).
bool IsRootedCollective(CollectiveKind k);
// Whether the reduce op matters (allreduce, reduce_scatter, reduce).
bool IsReducingCollective(CollectiveKind k);
// Send or recv: between two ranks, outside the job's collective sequence.
bool IsPointToPoint(CollectiveKind k);

// The longest op name (bytes): the SDK, the op queue and the signature cap it.
inline constexpr size_t kMaxOpNameBytes = 256;

bool IsValidDType(int v);
// The valid dtype values and names, for error messages: "1..9: f32 f64 ...".
std::string ValidDTypesText();
// Likewise "1..5: sum avg min max prod" and "1..11: allreduce reduce_scatter ... recv".
std::string ValidReduceOpsText();
std::string ValidCollectivesText();
// f32, f64, f16, bf16 and the fp8 types.
bool IsFloatDType(DType t);
bool IsValidReduceOp(int v);
// Parses the names above (case-insensitive); InvalidArgument names the choices.
absl::StatusOr<DType> ParseDType(absl::string_view name);
absl::StatusOr<ReduceOp> ParseReduceOp(absl::string_view name);

// IEEE binary16 and bfloat16 conversions (round to nearest even; NaN kept NaN).
float HalfToFloat(uint16_t h);
uint16_t FloatToHalf(float f);
inline float BFloat16ToFloat(uint16_t b) {
  uint32_t u = static_cast<uint32_t>(b) << 16;
  float f;
  std::memcpy(&f, &u, sizeof(f));
  return f;
}
inline uint16_t FloatToBFloat16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, sizeof(u));
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x40u);  // quiet NaN
  u += 0x7fffu + ((u >> 16) & 1u);
  return static_cast<uint16_t>(u >> 16);
}

}  // namespace gradsync

#endif  // GRADSYNC_COMMON_TYPES_H_
