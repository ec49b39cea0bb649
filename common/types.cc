#include "common/types.h"

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"

namespace gradsync {

size_t DTypeSize(DType t) {
  switch (t) {
    case DType::kF32: return 4;
    case DType::kF64: return 8;
    case DType::kF16: return 2;
    case DType::kBF16: return 2;
    case DType::kI32: return 4;
    case DType::kI64: return 8;
    case DType::kU8: return 1;
    case DType::kF8E4M3: return 1;
    case DType::kF8E5M2: return 1;
  }
  return 0;
}

const char* DTypeName(DType t) {
  switch (t) {
    case DType::kF32: return "f32";
    case DType::kF64: return "f64";
    case DType::kF16: return "f16";
    case DType::kBF16: return "bf16";
    case DType::kI32: return "i32";
    case DType::kI64: return "i64";
    case DType::kU8: return "u8";
    case DType::kF8E4M3: return "f8e4m3";
    case DType::kF8E5M2: return "f8e5m2";
  }
  return "invalid-dtype";
}

const char* ReduceOpName(ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum: return "sum";
    case ReduceOp::kAvg: return "avg";
    case ReduceOp::kMin: return "min";
    case ReduceOp::kMax: return "max";
    case ReduceOp::kProd: return "prod";
    case ReduceOp::kPremulSum: return "premul_sum";
  }
  return "invalid-op";
}

const char* CollectiveName(CollectiveKind k) {
  switch (k) {
    case CollectiveKind::kAllreduce: return "allreduce";
    case CollectiveKind::kReduceScatter: return "reduce_scatter";
    case CollectiveKind::kAllgather: return "allgather";
    case CollectiveKind::kBroadcast: return "broadcast";
    case CollectiveKind::kReduce: return "reduce";
    case CollectiveKind::kAlltoall: return "alltoall";
    case CollectiveKind::kBarrier: return "barrier";
    case CollectiveKind::kGather: return "gather";
    case CollectiveKind::kScatter: return "scatter";
    case CollectiveKind::kSend: return "send";
    case CollectiveKind::kRecv: return "recv";
  }
  return "invalid-collective";
}

bool IsValidCollective(int v) { return v >= 1 && v <= 11; }

absl::StatusOr<CollectiveKind> ParseCollective(absl::string_view name) {
  std::string n = absl::AsciiStrToLower(name);
  for (CollectiveKind k : kAllOpKinds) {
    if (n == CollectiveName(k)) return k;
  }
  if (n == "reducescatter") return CollectiveKind::kReduceScatter;
  return absl::InvalidArgumentError(absl::StrCat(
      "unknown collective '", name,
      "' (expected allreduce, reduce_scatter, allgather, broadcast, reduce, alltoall, barrier, gather, scatter, send or recv)"));
}

bool IsBlockedCollective(CollectiveKind k) {
  return k == CollectiveKind::kReduceScatter || k == CollectiveKind::kAllgather ||
         k == CollectiveKind::kAlltoall || k == CollectiveKind::kGather ||
         k == CollectiveKind::kScatter;
}
bool IsRootedCollective(CollectiveKind k) {
  return k == CollectiveKind::kBroadcast || k == CollectiveKind::kReduce ||
         k == CollectiveKind::kGather || k == CollectiveKind::kScatter;
}
bool IsPointToPoint(CollectiveKind k) {
  return k == CollectiveKind::kSend || k == CollectiveKind::kRecv;
}
bool IsReducingCollective(CollectiveKind k) {
  return k == CollectiveKind::kAllreduce || k == CollectiveKind::kReduceScatter ||
         k == CollectiveKind::kReduce;
}

bool IsValidDType(int v) { return v >= 1 && v <= 9; }
namespace {
// "1..N: name1 name2 ..." of an enum whose values run 1..N.
template <typename E, size_t N>
std::string ValuesText(const E (&all)[N], const char* (*name)(E)) {
  std::string names;
  for (E e : all) absl::StrAppend(&names, " ", name(e));
  return absl::StrCat("1..", N, ":", names);
}
}  // namespace

std::string ValidDTypesText() { return ValuesText(kAllDTypes, DTypeName); }
std::string ValidReduceOpsText() { return ValuesText(kAllOpReduceOps, ReduceOpName); }
std::string ValidCollectivesText() { return ValuesText(kAllOpKinds, CollectiveName); }
bool IsFloatDType(DType t) {
  return t != DType::kI32 && t != DType::kI64 && t != DType::kU8;
}
bool IsValidReduceOp(int v) { return v >= 1 && v <= 6; }

absl::StatusOr<DType> ParseDType(absl::string_view name) {
  std::string n = absl::AsciiStrToLower(name);
  for (DType t : kAllDTypes) {
    if (n == DTypeName(t)) return t;
  }
  if (n == "float" || n == "float32") return DType::kF32;
  if (n == "double" || n == "float64") return DType::kF64;
  if (n == "half" || n == "float16") return DType::kF16;
  if (n == "bfloat16") return DType::kBF16;
  if (n == "float8_e4m3fn" || n == "e4m3") return DType::kF8E4M3;
  if (n == "float8_e5m2" || n == "e5m2") return DType::kF8E5M2;
  return absl::InvalidArgumentError(absl::StrCat(
      "unknown dtype '", name, "' (expected f32, f64, f16, bf16, i32, i64, u8, f8e4m3 or f8e5m2)"));
}

absl::StatusOr<ReduceOp> ParseReduceOp(absl::string_view name) {
  std::string n = absl::AsciiStrToLower(name);
  for (ReduceOp op : kAllOpReduceOps) {
    if (n == ReduceOpName(op)) return op;
  }
  return absl::InvalidArgumentError(absl::StrCat(
      "unknown reduce op '", name, "' (expected sum, avg, min, max, prod or premul_sum)"));
}

float HalfToFloat(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t exp = (h >> 10) & 0x1fu;
  uint32_t mant = h & 0x3ffu;
  uint32_t u;
  if (exp == 0) {
    if (mant == 0) {
      u = sign;
    } else {  // subnormal: normalize
      int e = -1;
      do {
        ++e;
        mant <<= 1;
      } while ((mant & 0x400u) == 0);
      u = sign | static_cast<uint32_t>(127 - 15 - e) << 23 | (mant & 0x3ffu) << 13;
    }
  } else if (exp == 0x1f) {
    u = sign | 0x7f800000u | (mant << 13);
  } else {
    u = sign | (exp + (127 - 15)) << 23 | (mant << 13);
  }
  float f;
  std::memcpy(&f, &u, sizeof(f));
  return f;
}

uint16_t FloatToHalf(float f) {
  uint32_t u;
  std::memcpy(&u, &f, sizeof(u));
  const uint16_t sign = static_cast<uint16_t>((u >> 16) & 0x8000u);
  const uint32_t abs = u & 0x7fffffffu;
  if (abs > 0x7f800000u) return sign | 0x7e00u;  // NaN
  if (abs >= 0x477ff000u) return sign | 0x7c00u;  // overflow (rounds to >= 65520) -> inf
  if (abs < 0x38800000u) {  // below the smallest normal half: subnormal or zero
    if (abs < 0x33000000u) return sign;  // < 2^-25 rounds to zero
    const uint32_t exp = abs >> 23;
    const uint32_t mant = (abs & 0x7fffffu) | 0x800000u;
    const uint32_t shift = 126 - exp;  // 14 + (112 - exp) + 1 - 1
    uint32_t half_mant = mant >> (shift);
    const uint32_t rem = mant & ((1u << shift) - 1);
    const uint32_t halfway = 1u << (shift - 1);
    if (rem > halfway || (rem == halfway && (half_mant & 1u))) ++half_mant;
    return sign | static_cast<uint16_t>(half_mant);
  }
  uint32_t r = abs - 0x38000000u;  // rebias exponent 127 -> 15
  r += 0xfffu + ((r >> 13) & 1u);  // round to nearest even
  return sign | static_cast<uint16_t>(r >> 13);
}

}  // namespace gradsync
