// Helpers for the CPU kernel tests: the instruction-set variants to test, an
// element-by-element reference written from cpu_reduce.h's contract (using only
// common/types.h conversions), random data with the awkward values of each
// dtype, and a mismatch report naming the element.
#ifndef GRADSYNC_KERNELS_CPU_REDUCE_TESTING_H_
#define GRADSYNC_KERNELS_CPU_REDUCE_TESTING_H_

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <optional>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "common/fp8.h"
#include "common/types.h"
#include "kernels/cpu_reduce.h"

namespace gradsync::cpu_reduce_testing {

using internal::Isa;

inline constexpr size_t kCounts[] = {0, 1, 7, 8, 31, 1000, 4099};
inline constexpr size_t kGuard = 16;  // elements after `count` that must stay untouched

// nullopt = the public functions (whatever ActiveIsa() picked).
inline std::vector<std::optional<Isa>> VariantsToTest() {
  std::vector<std::optional<Isa>> v = {std::nullopt, Isa::kPortable};
  if (internal::CpuSupportsAvx2()) v.push_back(Isa::kAvx2);
  return v;
}

inline std::string VariantName(std::optional<Isa> isa) {
  return isa ? internal::IsaName(*isa) : std::string("public");
}

inline void CallReduceInto(std::optional<Isa> isa, DType t, ReduceOp op, void* dst, const void* src,
                    size_t n) {
  if (isa) {
    internal::ReduceIntoWith(*isa, t, op, dst, src, n);
  } else {
    ReduceInto(t, op, dst, src, n);
  }
}

inline void CallReduceOutOfPlace(std::optional<Isa> isa, DType t, ReduceOp op, void* dst, const void* a,
                          const void* b, size_t n) {
  if (isa) {
    internal::ReduceOutOfPlaceWith(*isa, t, op, dst, a, b, n);
  } else {
    ReduceOutOfPlace(t, op, dst, a, b, n);
  }
}

inline void CallDivideBy(std::optional<Isa> isa, DType t, void* data, size_t n, int64_t divisor) {
  if (isa) {
    internal::DivideByWith(*isa, t, data, n, divisor);
  } else {
    DivideBy(t, data, n, divisor);
  }
}

template <typename T>
T Get(const uint8_t* p) {
  T v;
  std::memcpy(&v, p, sizeof(v));
  return v;
}

template <typename T>
void Put(uint8_t* p, T v) {
  std::memcpy(p, &v, sizeof(v));
}

// ---------------------------------------------------------------------------
// Reference semantics, one element at a time.

// min/max as documented: `a OP b` with a NaN in b propagating, a NaN in a
// dropped, and b winning ties (so signed zeros come from b).
template <typename F>
F RefFloat(ReduceOp op, F a, F b) {
  switch (op) {
    case ReduceOp::kSum:
    case ReduceOp::kAvg: return a + b;
    case ReduceOp::kProd: return a * b;
    case ReduceOp::kMin:
      if (std::isnan(a) || std::isnan(b) || a == b) return b;
      return a < b ? a : b;
    case ReduceOp::kMax:
      if (std::isnan(a) || std::isnan(b) || a == b) return b;
      return a > b ? a : b;
  }
  ADD_FAILURE() << "bad op";
  return 0;
}

// Sum and product modulo 2^bits, computed in uint64_t (for signed T the
// conversion sign-extends, which is congruent mod 2^64).
template <typename T>
T RefInt(ReduceOp op, T a, T b) {
  const uint64_t ua = static_cast<uint64_t>(a);
  const uint64_t ub = static_cast<uint64_t>(b);
  switch (op) {
    case ReduceOp::kSum:
    case ReduceOp::kAvg: return static_cast<T>(ua + ub);
    case ReduceOp::kProd: return static_cast<T>(ua * ub);
    case ReduceOp::kMin: return a < b ? a : b;
    case ReduceOp::kMax: return a > b ? a : b;
  }
  ADD_FAILURE() << "bad op";
  return 0;
}

inline void RefElement(DType t, ReduceOp op, uint8_t* out, const uint8_t* a, const uint8_t* b) {
  switch (t) {
    case DType::kF32: return Put(out, RefFloat(op, Get<float>(a), Get<float>(b)));
    case DType::kF64: return Put(out, RefFloat(op, Get<double>(a), Get<double>(b)));
    case DType::kF16:
      return Put(out, FloatToHalf(RefFloat(op, HalfToFloat(Get<uint16_t>(a)),
                                           HalfToFloat(Get<uint16_t>(b)))));
    case DType::kBF16:
      return Put(out, FloatToBFloat16(RefFloat(op, BFloat16ToFloat(Get<uint16_t>(a)),
                                               BFloat16ToFloat(Get<uint16_t>(b)))));
    case DType::kI32: return Put(out, RefInt(op, Get<int32_t>(a), Get<int32_t>(b)));
    case DType::kI64: return Put(out, RefInt(op, Get<int64_t>(a), Get<int64_t>(b)));
    case DType::kU8: return Put(out, RefInt(op, Get<uint8_t>(a), Get<uint8_t>(b)));
    case DType::kF8E4M3:
      return Put(out, FloatToFp8E4M3(RefFloat(op, Fp8E4M3ToFloat(Get<uint8_t>(a)),
                                              Fp8E4M3ToFloat(Get<uint8_t>(b)))));
    case DType::kF8E5M2:
      return Put(out, FloatToFp8E5M2(RefFloat(op, Fp8E5M2ToFloat(Get<uint8_t>(a)),
                                              Fp8E5M2ToFloat(Get<uint8_t>(b)))));
  }
}

inline std::vector<uint8_t> RefReduce(DType t, ReduceOp op, const uint8_t* a, const uint8_t* b, size_t n) {
  const size_t sz = DTypeSize(t);
  std::vector<uint8_t> out(n * sz);
  for (size_t i = 0; i < n; ++i) RefElement(t, op, &out[i * sz], a + i * sz, b + i * sz);
  return out;
}

// Exact quotient truncated toward zero, wrapped to the element type.
inline void RefDivideElement(DType t, uint8_t* p, int64_t d) {
  switch (t) {
    case DType::kF32: return Put(p, Get<float>(p) / static_cast<float>(d));
    case DType::kF64: return Put(p, Get<double>(p) / static_cast<double>(d));
    case DType::kF16:
      return Put(p, FloatToHalf(HalfToFloat(Get<uint16_t>(p)) / static_cast<float>(d)));
    case DType::kBF16:
      return Put(p, FloatToBFloat16(BFloat16ToFloat(Get<uint16_t>(p)) / static_cast<float>(d)));
    case DType::kI32:
      return Put(p, static_cast<int32_t>(static_cast<int64_t>(Get<int32_t>(p)) / d));
    case DType::kI64: {
      const int64_t x = Get<int64_t>(p);
      if (x == std::numeric_limits<int64_t>::min() && d == -1) return Put(p, x);  // wraps
      return Put(p, x / d);
    }
    case DType::kU8: return Put(p, static_cast<uint8_t>(static_cast<int64_t>(Get<uint8_t>(p)) / d));
    case DType::kF8E4M3:
      return Put(p, FloatToFp8E4M3(Fp8E4M3ToFloat(Get<uint8_t>(p)) / static_cast<float>(d)));
    case DType::kF8E5M2:
      return Put(p, FloatToFp8E5M2(Fp8E5M2ToFloat(Get<uint8_t>(p)) / static_cast<float>(d)));
  }
}

// x * factor for the float dtypes (MultiplyBy: premul_sum's first step).
inline void RefMultiplyElement(DType t, uint8_t* p, double factor) {
  const float f = static_cast<float>(factor);
  switch (t) {
    case DType::kF32: return Put(p, Get<float>(p) * f);
    case DType::kF64: return Put(p, Get<double>(p) * factor);
    case DType::kF16: return Put(p, FloatToHalf(HalfToFloat(Get<uint16_t>(p)) * f));
    case DType::kBF16: return Put(p, FloatToBFloat16(BFloat16ToFloat(Get<uint16_t>(p)) * f));
    case DType::kF8E4M3: return Put(p, FloatToFp8E4M3(Fp8E4M3ToFloat(Get<uint8_t>(p)) * f));
    case DType::kF8E5M2: return Put(p, FloatToFp8E5M2(Fp8E5M2ToFloat(Get<uint8_t>(p)) * f));
    default: return;
  }
}

// ---------------------------------------------------------------------------
// Comparison: bit-exact, except that any NaN matches any NaN (sign and payload
// are unspecified) -- but an f16 NaN must be FloatToHalf's 0x7e00 / 0xfe00 and
// a bf16 NaN must be quiet, as FloatToBFloat16 makes it.

inline bool IsNanElement(DType t, const uint8_t* p) {
  switch (t) {
    case DType::kF32: return std::isnan(Get<float>(p));
    case DType::kF64: return std::isnan(Get<double>(p));
    case DType::kF16: return (Get<uint16_t>(p) & 0x7fffu) > 0x7c00u;
    case DType::kBF16: return (Get<uint16_t>(p) & 0x7fffu) > 0x7f80u;
    case DType::kF8E4M3: return (Get<uint8_t>(p) & 0x7fu) == 0x7fu;
    case DType::kF8E5M2: return (Get<uint8_t>(p) & 0x7fu) > 0x7cu;
    default: return false;
  }
}

inline std::string ElementString(DType t, const uint8_t* p) {
  std::ostringstream s;
  switch (t) {
    case DType::kF32: s << Get<float>(p); break;
    case DType::kF64: s << Get<double>(p); break;
    case DType::kF16: s << HalfToFloat(Get<uint16_t>(p)); break;
    case DType::kBF16: s << BFloat16ToFloat(Get<uint16_t>(p)); break;
    case DType::kI32: return std::to_string(Get<int32_t>(p));
    case DType::kI64: return std::to_string(Get<int64_t>(p));
    case DType::kU8: return std::to_string(Get<uint8_t>(p));
    case DType::kF8E4M3: s << Fp8E4M3ToFloat(Get<uint8_t>(p)); break;
    case DType::kF8E5M2: s << Fp8E5M2ToFloat(Get<uint8_t>(p)); break;
  }
  s << " (0x" << std::hex;
  for (size_t i = DTypeSize(t); i-- > 0;) s << (p[i] >> 4) << (p[i] & 15);
  s << ")";
  return s.str();
}

// Returns an empty string when `got` matches `want` for n elements.
inline std::string Mismatch(DType t, const uint8_t* got, const uint8_t* want, size_t n,
                     const uint8_t* in_a = nullptr, const uint8_t* in_b = nullptr) {
  const size_t sz = DTypeSize(t);
  for (size_t i = 0; i < n; ++i) {
    const uint8_t* g = got + i * sz;
    const uint8_t* w = want + i * sz;
    bool ok;
    if (IsNanElement(t, w)) {
      ok = IsNanElement(t, g);
      if (t == DType::kF16) ok = ok && (Get<uint16_t>(g) & 0x7fffu) == 0x7e00u;
      if (t == DType::kBF16) ok = ok && (Get<uint16_t>(g) & 0x40u) != 0;  // quiet
      if (t == DType::kF8E4M3 || t == DType::kF8E5M2) ok = Get<uint8_t>(g) == 0x7fu;  // canonical
    } else {
      ok = std::memcmp(g, w, sz) == 0;
    }
    if (!ok) {
      std::ostringstream s;
      s << "element " << i << ": got " << ElementString(t, g) << ", want " << ElementString(t, w);
      if (in_a) s << ", inputs " << ElementString(t, in_a + i * sz);
      if (in_b) s << " and " << ElementString(t, in_b + i * sz);
      return s.str();
    }
  }
  return "";
}

// ---------------------------------------------------------------------------
// Test data: ordinary values of both signs, plus the awkward ones.

template <typename F>
F RandomFloatLike(std::mt19937_64& rng) {
  std::uniform_int_distribution<int> pick(0, 99);
  std::uniform_real_distribution<double> unit(-1.0, 1.0);
  const int k = pick(rng);
  if (k < 60) {
    return static_cast<F>(unit(rng) *
                          std::ldexp(1.0, std::uniform_int_distribution<int>(-12, 12)(rng)));
  }
  if (k < 75) return static_cast<F>(std::uniform_int_distribution<int>(-8, 8)(rng));
  if (k < 80) return k % 2 ? F(0) : -F(0);
  if (k < 90) {
    const F specials[] = {std::numeric_limits<F>::quiet_NaN(),
                          -std::numeric_limits<F>::quiet_NaN(),
                          std::numeric_limits<F>::infinity(),
                          -std::numeric_limits<F>::infinity(),
                          std::numeric_limits<F>::max(),
                          std::numeric_limits<F>::lowest(),
                          std::numeric_limits<F>::denorm_min(),
                          -std::numeric_limits<F>::min() / 3,
                          F(65504),
                          F(65520),
                          F(1) + std::numeric_limits<F>::epsilon()};
    return specials[std::uniform_int_distribution<size_t>(0, std::size(specials) - 1)(rng)];
  }
  // Any bit pattern (NaN payloads, subnormals, huge values).
  if constexpr (sizeof(F) == 4) {
    const uint32_t u = static_cast<uint32_t>(rng());
    F f;
    std::memcpy(&f, &u, sizeof(f));
    return f;
  } else {
    const uint64_t u = rng();
    F f;
    std::memcpy(&f, &u, sizeof(f));
    return f;
  }
}

template <typename T>
T RandomInt(std::mt19937_64& rng) {
  std::uniform_int_distribution<int> pick(0, 99);
  const int k = pick(rng);
  if (k < 40) return static_cast<T>(rng());  // full range: sums and products wrap
  if (k < 70) return static_cast<T>(std::uniform_int_distribution<int>(-100, 100)(rng));
  if (k < 85) {
    const T specials[] = {std::numeric_limits<T>::min(),
                          std::numeric_limits<T>::max(),
                          static_cast<T>(-1),
                          T(0),
                          T(1),
                          static_cast<T>(1ull << (4 * sizeof(T)))};
    return specials[std::uniform_int_distribution<size_t>(0, std::size(specials) - 1)(rng)];
  }
  return static_cast<T>(std::uniform_int_distribution<int64_t>(-70000, 70000)(rng));
}

inline std::vector<uint8_t> RandomData(DType t, size_t n, std::mt19937_64& rng) {
  const size_t sz = DTypeSize(t);
  std::vector<uint8_t> v(n * sz);
  for (size_t i = 0; i < n; ++i) {
    uint8_t* p = &v[i * sz];
    switch (t) {
      case DType::kF32: Put(p, RandomFloatLike<float>(rng)); break;
      case DType::kF64: Put(p, RandomFloatLike<double>(rng)); break;
      case DType::kF16:
        Put(p, rng() % 2 ? static_cast<uint16_t>(rng()) : FloatToHalf(RandomFloatLike<float>(rng)));
        break;
      case DType::kBF16:
        Put(p, rng() % 2 ? static_cast<uint16_t>(rng())
                         : FloatToBFloat16(RandomFloatLike<float>(rng)));
        break;
      case DType::kI32: Put(p, RandomInt<int32_t>(rng)); break;
      case DType::kI64: Put(p, RandomInt<int64_t>(rng)); break;
      case DType::kU8: Put(p, RandomInt<uint8_t>(rng)); break;
      case DType::kF8E4M3:
        Put(p, rng() % 2 ? static_cast<uint8_t>(rng()) : FloatToFp8E4M3(RandomFloatLike<float>(rng)));
        break;
      case DType::kF8E5M2:
        Put(p, rng() % 2 ? static_cast<uint8_t>(rng()) : FloatToFp8E5M2(RandomFloatLike<float>(rng)));
        break;
    }
  }
  return v;
}

}  // namespace gradsync::cpu_reduce_testing

#endif  // GRADSYNC_KERNELS_CPU_REDUCE_TESTING_H_
