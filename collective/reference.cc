#include "collective/reference.h"

#include <cstring>
#include <random>

#include "common/fp8.h"
#include "kernels/cpu_reduce.h"

namespace gradsync::testing {
namespace {

void Store(DType t, double v, char* p) {
  switch (t) {
    case DType::kF32: { float f = static_cast<float>(v); std::memcpy(p, &f, 4); break; }
    case DType::kF64: std::memcpy(p, &v, 8); break;
    case DType::kF16: { uint16_t h = FloatToHalf(static_cast<float>(v)); std::memcpy(p, &h, 2); break; }
    case DType::kBF16: { uint16_t h = FloatToBFloat16(static_cast<float>(v)); std::memcpy(p, &h, 2); break; }
    case DType::kF8E4M3: *p = static_cast<char>(FloatToFp8E4M3(static_cast<float>(v))); break;
    case DType::kF8E5M2: *p = static_cast<char>(FloatToFp8E5M2(static_cast<float>(v))); break;
    default: break;
  }
}


}  // namespace

std::vector<char> RandomData(DType t, size_t count, int rank, uint32_t seed) {
  std::mt19937 rng(seed * 977 + rank);
  std::vector<char> out(count * DTypeSize(t));
  std::uniform_real_distribution<double> real(-3.0, 3.0);
  for (size_t i = 0; i < count; ++i) {
    char* p = out.data() + i * DTypeSize(t);
    const double v = real(rng);
    switch (t) {
      case DType::kI32: { int32_t x = static_cast<int32_t>(rng()); std::memcpy(p, &x, 4); break; }
      case DType::kI64: { int64_t x = (static_cast<int64_t>(rng()) << 32) | rng(); std::memcpy(p, &x, 8); break; }
      case DType::kU8: { uint8_t x = static_cast<uint8_t>(rng()); std::memcpy(p, &x, 1); break; }
      default: Store(t, v, p); break;
    }
  }
  return out;
}

std::vector<char> IntegerValuedData(DType t, size_t count, int rank, uint32_t seed, ReduceOp op) {
  if (!IsFloatDType(t)) return RandomData(t, count, rank, seed);
  // fp8 holds every integer only up to 8 (E5M2) or 16 (E4M3): sums of up to 8
  // values in [-1, 1] stay exact in any order.
  const bool fp8 = DTypeSize(t) == 1;
  std::mt19937 rng(seed * 7919 + rank);
  std::vector<char> out(count * DTypeSize(t));
  static constexpr int kProdValues[] = {-2, -1, 1, 2};
  for (size_t i = 0; i < count; ++i) {
    const int v = op == ReduceOp::kProd ? kProdValues[rng() % 4]
                  : fp8                    ? static_cast<int>(rng() % 3) - 1
                                           : static_cast<int>(rng() % 9) - 4;
    Store(t, v, out.data() + i * DTypeSize(t));
  }
  return out;
}

std::vector<char> RingOrderReduce(const std::vector<std::vector<char>>& in, DType t, ReduceOp op,
                                  size_t begin, size_t count, int first) {
  const int n = static_cast<int>(in.size());
  const size_t es = DTypeSize(t);
  std::vector<char> acc(in[first].begin() + begin * es, in[first].begin() + (begin + count) * es);
  for (int k = 1; k < n; ++k) {
    const int r = (first + k) % n;
    std::vector<char> local(in[r].begin() + begin * es, in[r].begin() + (begin + count) * es);
    ReduceInto(t, op, local.data(), acc.data(), count);
    acc.swap(local);
  }
  if (op == ReduceOp::kAvg && n > 1) DivideBy(t, acc.data(), count, n);
  return acc;
}

std::vector<char> RingOrderReference(const std::vector<std::vector<char>>& in, DType t,
                                     ReduceOp op, size_t count) {
  const int n = static_cast<int>(in.size());
  const size_t es = DTypeSize(t);
  if (n == 1) return in[0];
  std::vector<char> out(count * es);
  for (int c = 0; c < n; ++c) {
    const size_t b = count * c / n, e = count * (c + 1) / n;
    if (e == b) continue;
    const std::vector<char> chunk = RingOrderReduce(in, t, op, b, e - b, c);
    std::memcpy(out.data() + b * es, chunk.data(), chunk.size());
  }
  return out;
}

std::vector<char> SignaturePatternReference(SignaturePattern pattern,
                                            const std::vector<std::vector<char>>& in, DType t,
                                            ReduceOp op, size_t count) {
  const int n = static_cast<int>(in.size());
  std::vector<std::vector<char>> v = in;
  if (pattern == SignaturePattern::kAllToAll || n <= 2) {
    for (int r = 1; r < n; ++r) ReduceInto(t, op, v[0].data(), in[r].data(), count);
  } else {
    int p = 1;
    while (p * 2 <= n) p *= 2;
    for (int r = 0; r + p < n; ++r) ReduceInto(t, op, v[r].data(), v[r + p].data(), count);
    for (int bit = 1; bit < p; bit *= 2) {
      for (int r = 0; r < p; r += 2 * bit) ReduceInto(t, op, v[r].data(), v[r + bit].data(), count);
    }
  }
  if (op == ReduceOp::kAvg && n > 1) DivideBy(t, v[0].data(), count, n);
  return v[0];
}

}  // namespace gradsync::testing
