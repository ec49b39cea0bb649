#include "collective/reference.h"

#include <cstring>
#include <random>

#include "kernels/cpu_reduce.h"

namespace gradsync::testing {

std::vector<char> RandomData(DType t, size_t count, int rank, uint32_t seed) {
  std::mt19937 rng(seed * 977 + rank);
  std::vector<char> out(count * DTypeSize(t));
  std::uniform_real_distribution<double> real(-3.0, 3.0);
  for (size_t i = 0; i < count; ++i) {
    char* p = out.data() + i * DTypeSize(t);
    const double v = real(rng);
    switch (t) {
      case DType::kF32: { float f = static_cast<float>(v); std::memcpy(p, &f, 4); break; }
      case DType::kF64: std::memcpy(p, &v, 8); break;
      case DType::kF16: { uint16_t h = FloatToHalf(static_cast<float>(v)); std::memcpy(p, &h, 2); break; }
      case DType::kBF16: { uint16_t h = FloatToBFloat16(static_cast<float>(v)); std::memcpy(p, &h, 2); break; }
      case DType::kI32: { int32_t x = static_cast<int32_t>(rng()); std::memcpy(p, &x, 4); break; }
      case DType::kI64: { int64_t x = (static_cast<int64_t>(rng()) << 32) | rng(); std::memcpy(p, &x, 8); break; }
      case DType::kU8: { uint8_t x = static_cast<uint8_t>(rng()); std::memcpy(p, &x, 1); break; }
    }
  }
  return out;
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
    std::vector<char> acc(in[c].begin() + b * es, in[c].begin() + e * es);
    for (int k = 1; k < n; ++k) {
      const int r = (c + k) % n;
      std::vector<char> local(in[r].begin() + b * es, in[r].begin() + e * es);
      ReduceInto(t, op, local.data(), acc.data(), e - b);
      acc.swap(local);
    }
    if (op == ReduceOp::kAvg) DivideBy(t, acc.data(), e - b, n);
    std::memcpy(out.data() + b * es, acc.data(), acc.size());
  }
  return out;
}

}  // namespace gradsync::testing
