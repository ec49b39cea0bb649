#include "cli/expected.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "common/fp8.h"

namespace gradsync {

int InputValue(int r, uint64_t i, DType t) {
  // fp8 holds every integer only up to 8 (E5M2) or 16 (E4M3): values in [-1, 1]
  // keep sums exact in any order up to 8 ranks (E5M2) or 16 (E4M3).
  if (t == DType::kF8E4M3 || t == DType::kF8E5M2) {
    return static_cast<int>((i * 7 + static_cast<uint64_t>(r) * 13) % 3) - 1;
  }
  const int v = static_cast<int>((i * 7 + static_cast<uint64_t>(r) * 13) % 17);
  return t == DType::kU8 ? v : v - 8;
}

void StoreValue(DType t, char* p, double v) {
  switch (t) {
    case DType::kF32: { float f = static_cast<float>(v); std::memcpy(p, &f, 4); break; }
    case DType::kF64: std::memcpy(p, &v, 8); break;
    case DType::kF16: { uint16_t h = FloatToHalf(static_cast<float>(v)); std::memcpy(p, &h, 2); break; }
    case DType::kBF16: { uint16_t h = FloatToBFloat16(static_cast<float>(v)); std::memcpy(p, &h, 2); break; }
    case DType::kI32: { int32_t x = static_cast<int32_t>(v); std::memcpy(p, &x, 4); break; }
    case DType::kI64: { int64_t x = static_cast<int64_t>(v); std::memcpy(p, &x, 8); break; }
    case DType::kU8: { uint8_t x = static_cast<uint8_t>(static_cast<int>(v)); std::memcpy(p, &x, 1); break; }
    case DType::kF8E4M3: *p = static_cast<char>(FloatToFp8E4M3(static_cast<float>(v))); break;
    case DType::kF8E5M2: *p = static_cast<char>(FloatToFp8E5M2(static_cast<float>(v))); break;
  }
}

void FillInput(CollectiveKind kind, DType t, int r, int n, uint64_t count, char* data) {
  const size_t es = DTypeSize(t);
  const uint64_t total = BufferElements(kind, n, count);
  for (uint64_t i = 0; i < total; ++i) StoreValue(t, data + i * es, InputValue(r, i, t));
}

namespace {

// The reduction over every rank of element i, with the kernels' avg rule
// (premul_sum: factor 1; the bench refuses it).
double Reduced(DType t, ReduceOp op, int n, uint64_t i) {
  double acc = InputValue(0, i, t);
  for (int r = 1; r < n; ++r) {
    const double v = InputValue(r, i, t);
    switch (op) {
      case ReduceOp::kSum: case ReduceOp::kAvg: case ReduceOp::kPremulSum: acc += v; break;
      case ReduceOp::kMin: acc = std::min(acc, v); break;
      case ReduceOp::kMax: acc = std::max(acc, v); break;
      case ReduceOp::kProd: acc *= v; break;
    }
  }
  if (op == ReduceOp::kAvg) {
    switch (t) {
      case DType::kF64: acc = acc / n; break;
      case DType::kF32: case DType::kF16: case DType::kBF16: case DType::kF8E4M3: case DType::kF8E5M2:
        acc = static_cast<float>(acc) / static_cast<float>(n);
        break;
      default: acc = std::trunc(acc / n); break;
    }
  }
  return acc;
}

}  // namespace

bool ExpectedValue(CollectiveKind kind, DType t, ReduceOp op, int root, int r, int n,
                   uint64_t count, uint64_t i, char* out) {
  double v = 0;
  switch (kind) {
    case CollectiveKind::kAllreduce: v = Reduced(t, op, n, i); break;
    case CollectiveKind::kReduceScatter:
      if (i / count != static_cast<uint64_t>(r)) return false;
      v = Reduced(t, op, n, i);
      break;
    case CollectiveKind::kAllgather: v = InputValue(static_cast<int>(i / count), i, t); break;
    case CollectiveKind::kBroadcast: v = InputValue(root, i, t); break;
    case CollectiveKind::kReduce: v = r == root ? Reduced(t, op, n, i) : InputValue(r, i, t); break;
    case CollectiveKind::kAlltoall: {
      const uint64_t b = i / count, e = i % count;
      v = InputValue(static_cast<int>(b), static_cast<uint64_t>(r) * count + e, t);
      break;
    }
    case CollectiveKind::kGather:  // the root collects; the others are left as they were
      v = InputValue(r == root ? static_cast<int>(i / count) : r, i, t);
      break;
    case CollectiveKind::kScatter:  // block r from the root; the rest left as it was
      v = InputValue(i / count == static_cast<uint64_t>(r) ? root : r, i, t);
      break;
    case CollectiveKind::kBarrier:
    case CollectiveKind::kSend:
    case CollectiveKind::kRecv: return false;  // the bench runs collectives only
  }
  StoreValue(t, out, v);
  return true;
}

uint64_t CountWrong(CollectiveKind kind, DType t, ReduceOp op, int root, int r, int n,
                    uint64_t count, const char* data, double tolerance) {
  const size_t es = DTypeSize(t);
  const uint64_t total = BufferElements(kind, n, count);
  char want[8];
  uint64_t wrong = 0;
  for (uint64_t i = 0; i < total; ++i) {
    if (!ExpectedValue(kind, t, op, root, r, n, count, i, want)) continue;
    if (tolerance > 0 && t == DType::kF32) {
      float got, expect;
      std::memcpy(&got, data + i * es, 4);
      std::memcpy(&expect, want, 4);
      if (!(std::fabs(static_cast<double>(got) - expect) <= tolerance)) ++wrong;
    } else if (std::memcmp(data + i * es, want, es) != 0) {
      ++wrong;
    }
  }
  return wrong;
}

}  // namespace gradsync
