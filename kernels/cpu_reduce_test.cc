// Tests for the CPU reduction kernels: every dtype x op x awkward count against
// an element-by-element reference written from the header's contract (using
// only common/types.h conversions), for the public entry points and for each
// instruction-set variant forced explicitly, so the AVX2 and portable kernels
// are each checked bit for bit.
#include "kernels/cpu_reduce.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <fstream>
#include <limits>
#include <optional>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "common/types.h"

namespace gradsync {
namespace {

using internal::Isa;

constexpr size_t kCounts[] = {0, 1, 7, 8, 31, 1000, 4099};
constexpr size_t kGuard = 16;  // elements after `count` that must stay untouched

// nullopt = the public functions (whatever ActiveIsa() picked).
std::vector<std::optional<Isa>> VariantsToTest() {
  std::vector<std::optional<Isa>> v = {std::nullopt, Isa::kPortable};
  if (internal::CpuSupportsAvx2()) v.push_back(Isa::kAvx2);
  return v;
}

std::string VariantName(std::optional<Isa> isa) {
  return isa ? internal::IsaName(*isa) : std::string("public");
}

void CallReduceInto(std::optional<Isa> isa, DType t, ReduceOp op, void* dst, const void* src,
                    size_t n) {
  if (isa) {
    internal::ReduceIntoWith(*isa, t, op, dst, src, n);
  } else {
    ReduceInto(t, op, dst, src, n);
  }
}

void CallReduceOutOfPlace(std::optional<Isa> isa, DType t, ReduceOp op, void* dst, const void* a,
                          const void* b, size_t n) {
  if (isa) {
    internal::ReduceOutOfPlaceWith(*isa, t, op, dst, a, b, n);
  } else {
    ReduceOutOfPlace(t, op, dst, a, b, n);
  }
}

void CallDivideBy(std::optional<Isa> isa, DType t, void* data, size_t n, int64_t divisor) {
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

void RefElement(DType t, ReduceOp op, uint8_t* out, const uint8_t* a, const uint8_t* b) {
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
  }
}

std::vector<uint8_t> RefReduce(DType t, ReduceOp op, const uint8_t* a, const uint8_t* b, size_t n) {
  const size_t sz = DTypeSize(t);
  std::vector<uint8_t> out(n * sz);
  for (size_t i = 0; i < n; ++i) RefElement(t, op, &out[i * sz], a + i * sz, b + i * sz);
  return out;
}

// Exact quotient truncated toward zero, wrapped to the element type.
void RefDivideElement(DType t, uint8_t* p, int64_t d) {
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
  }
}

// ---------------------------------------------------------------------------
// Comparison: bit-exact, except that any NaN matches any NaN (sign and payload
// are unspecified) -- but an f16 NaN must be FloatToHalf's 0x7e00 / 0xfe00 and
// a bf16 NaN must be quiet, as FloatToBFloat16 makes it.

bool IsNanElement(DType t, const uint8_t* p) {
  switch (t) {
    case DType::kF32: return std::isnan(Get<float>(p));
    case DType::kF64: return std::isnan(Get<double>(p));
    case DType::kF16: return (Get<uint16_t>(p) & 0x7fffu) > 0x7c00u;
    case DType::kBF16: return (Get<uint16_t>(p) & 0x7fffu) > 0x7f80u;
    default: return false;
  }
}

std::string ElementString(DType t, const uint8_t* p) {
  std::ostringstream s;
  switch (t) {
    case DType::kF32: s << Get<float>(p); break;
    case DType::kF64: s << Get<double>(p); break;
    case DType::kF16: s << HalfToFloat(Get<uint16_t>(p)); break;
    case DType::kBF16: s << BFloat16ToFloat(Get<uint16_t>(p)); break;
    case DType::kI32: return std::to_string(Get<int32_t>(p));
    case DType::kI64: return std::to_string(Get<int64_t>(p));
    case DType::kU8: return std::to_string(Get<uint8_t>(p));
  }
  s << " (0x" << std::hex;
  for (size_t i = DTypeSize(t); i-- > 0;) s << (p[i] >> 4) << (p[i] & 15);
  s << ")";
  return s.str();
}

// Returns an empty string when `got` matches `want` for n elements.
std::string Mismatch(DType t, const uint8_t* got, const uint8_t* want, size_t n,
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

std::vector<uint8_t> RandomData(DType t, size_t n, std::mt19937_64& rng) {
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
    }
  }
  return v;
}

// ---------------------------------------------------------------------------
// ReduceInto over every op, count, variant and a misaligned start.

void CheckReduceIntoMatchesReference(DType t) {
  const size_t sz = DTypeSize(t);
  std::mt19937_64 rng(1234 + static_cast<int>(t));
  for (std::optional<Isa> isa : VariantsToTest()) {
    for (ReduceOp op : kAllReduceOps) {
      for (size_t n : kCounts) {
        for (size_t offset : {0, 1}) {  // element offset: unaligned vector loads/stores
          SCOPED_TRACE(std::string(VariantName(isa)) + " " + DTypeName(t) + " " + ReduceOpName(op) +
                       " count=" + std::to_string(n) + " offset=" + std::to_string(offset));
          const std::vector<uint8_t> dst0 = RandomData(t, offset + n + kGuard, rng);
          const std::vector<uint8_t> src = RandomData(t, offset + n, rng);
          std::vector<uint8_t> dst = dst0;
          CallReduceInto(isa, t, op, dst.data() + offset * sz, src.data() + offset * sz, n);
          const std::vector<uint8_t> want =
              RefReduce(t, op, dst0.data() + offset * sz, src.data() + offset * sz, n);
          EXPECT_EQ(Mismatch(t, dst.data() + offset * sz, want.data(), n, dst0.data() + offset * sz,
                             src.data() + offset * sz),
                    "");
          EXPECT_EQ(std::memcmp(dst.data(), dst0.data(), offset * sz), 0) << "wrote before dst";
          EXPECT_EQ(std::memcmp(&dst[(offset + n) * sz], &dst0[(offset + n) * sz], kGuard * sz), 0)
              << "wrote past count";
        }
      }
    }
  }
}

TEST(CpuReduce, UsesAvx2KernelsExactlyWhenCpuInfoListsAvx2AndF16c) {
  std::ifstream cpuinfo("/proc/cpuinfo");
  if (!cpuinfo) GTEST_SKIP() << "no /proc/cpuinfo";
  std::string line;
  bool avx2 = false, f16c = false;
  while (std::getline(cpuinfo, line)) {
    if (line.rfind("flags", 0) != 0) continue;
    std::istringstream words(line);
    std::string w;
    while (words >> w) {
      avx2 |= w == "avx2";
      f16c |= w == "f16c";
    }
    break;
  }
  EXPECT_EQ(internal::CpuSupportsAvx2(), avx2 && f16c);
  EXPECT_EQ(internal::ActiveIsa(), avx2 && f16c ? Isa::kAvx2 : Isa::kPortable);
  std::cout << "[ INFO     ] active kernels: " << internal::IsaName(internal::ActiveIsa())
            << std::endl;
}

TEST(CpuReduce, F32MatchesScalarReferenceForEveryOpAndCount) {
  CheckReduceIntoMatchesReference(DType::kF32);
}
TEST(CpuReduce, F64MatchesScalarReferenceForEveryOpAndCount) {
  CheckReduceIntoMatchesReference(DType::kF64);
}
TEST(CpuReduce, F16MatchesScalarF32ReferenceForEveryOpAndCount) {
  CheckReduceIntoMatchesReference(DType::kF16);
}
TEST(CpuReduce, BF16MatchesScalarF32ReferenceForEveryOpAndCount) {
  CheckReduceIntoMatchesReference(DType::kBF16);
}
TEST(CpuReduce, I32MatchesWrappingReferenceForEveryOpAndCount) {
  CheckReduceIntoMatchesReference(DType::kI32);
}
TEST(CpuReduce, I64MatchesWrappingReferenceForEveryOpAndCount) {
  CheckReduceIntoMatchesReference(DType::kI64);
}
TEST(CpuReduce, U8MatchesWrappingReferenceForEveryOpAndCount) {
  CheckReduceIntoMatchesReference(DType::kU8);
}

TEST(CpuReduce, AvgCombinesAsSum) {
  for (std::optional<Isa> isa : VariantsToTest()) {
    for (DType t : kAllDTypes) {
      SCOPED_TRACE(VariantName(isa) + " " + DTypeName(t));
      std::mt19937_64 rng(7);
      const std::vector<uint8_t> src = RandomData(t, 100, rng);
      std::vector<uint8_t> sum = RandomData(t, 100, rng);
      std::vector<uint8_t> avg = sum;
      CallReduceInto(isa, t, ReduceOp::kSum, sum.data(), src.data(), 100);
      CallReduceInto(isa, t, ReduceOp::kAvg, avg.data(), src.data(), 100);
      EXPECT_EQ(Mismatch(t, avg.data(), sum.data(), 100), "");
    }
  }
}

TEST(CpuReduce, CountZeroAcceptsNullPointers) {
  for (std::optional<Isa> isa : VariantsToTest()) {
    for (DType t : kAllDTypes) {
      for (ReduceOp op : kAllReduceOps) {
        CallReduceInto(isa, t, op, nullptr, nullptr, 0);
        CallReduceOutOfPlace(isa, t, op, nullptr, nullptr, nullptr, 0);
      }
      CallDivideBy(isa, t, nullptr, 0, 3);
    }
  }
}

// ---------------------------------------------------------------------------
// Exact values that document the semantics.

template <typename T>
std::vector<T> ReduceIntoTyped(std::optional<Isa> isa, DType t, ReduceOp op, std::vector<T> dst,
                               const std::vector<T>& src) {
  CallReduceInto(isa, t, op, dst.data(), src.data(), dst.size());
  return dst;
}

TEST(CpuReduce, FloatMinMaxPropagateNaNFromSrcButDropNaNInDst) {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  for (std::optional<Isa> isa : VariantsToTest()) {
    SCOPED_TRACE(VariantName(isa));
    // 9 elements so both the vector body and the scalar tail are exercised.
    const std::vector<float> dst = {nan, 1, -0.0f, 0.0f, nan, 2, nan, 1, -0.0f};
    const std::vector<float> src = {1, nan, 0.0f, -0.0f, nan, 3, 1, nan, 0.0f};
    const std::vector<float> mn = ReduceIntoTyped(isa, DType::kF32, ReduceOp::kMin, dst, src);
    const std::vector<float> mx = ReduceIntoTyped(isa, DType::kF32, ReduceOp::kMax, dst, src);
    EXPECT_EQ(mn[0], 1.0f);             // min(NaN, 1) = 1
    EXPECT_TRUE(std::isnan(mn[1]));     // min(1, NaN) = NaN
    EXPECT_FALSE(std::signbit(mn[2]));  // min(-0, +0) = +0 (src wins ties)
    EXPECT_TRUE(std::signbit(mn[3]));   // min(+0, -0) = -0
    EXPECT_TRUE(std::isnan(mn[4]));
    EXPECT_EQ(mn[5], 2.0f);
    EXPECT_EQ(mn[6], 1.0f);          // tail element
    EXPECT_TRUE(std::isnan(mn[7]));  // tail element
    EXPECT_FALSE(std::signbit(mn[8]));
    EXPECT_EQ(mx[0], 1.0f);
    EXPECT_TRUE(std::isnan(mx[1]));
    EXPECT_FALSE(std::signbit(mx[2]));
    EXPECT_TRUE(std::signbit(mx[3]));
    EXPECT_EQ(mx[5], 3.0f);
    EXPECT_EQ(mx[6], 1.0f);
    EXPECT_TRUE(std::isnan(mx[7]));
  }
}

TEST(CpuReduce, FloatInfinitiesFollowIeee) {
  const float inf = std::numeric_limits<float>::infinity();
  for (std::optional<Isa> isa : VariantsToTest()) {
    SCOPED_TRACE(VariantName(isa));
    const std::vector<float> dst = {inf, inf, -inf, 0, inf, 1e38f, -1e38f, 3, 5};
    const std::vector<float> src = {-inf, 1, -1, inf, 0, 1e38f, 1e38f, 4, -inf};
    const std::vector<float> sum = ReduceIntoTyped(isa, DType::kF32, ReduceOp::kSum, dst, src);
    const std::vector<float> prod = ReduceIntoTyped(isa, DType::kF32, ReduceOp::kProd, dst, src);
    EXPECT_TRUE(std::isnan(sum[0]));  // inf + -inf
    EXPECT_EQ(sum[1], inf);
    EXPECT_EQ(sum[2], -inf);
    EXPECT_EQ(sum[5], 2e38f);
    EXPECT_EQ(sum[6], 0.0f);
    EXPECT_EQ(sum[8], -inf);
    EXPECT_TRUE(std::isnan(prod[3]));  // 0 * inf
    EXPECT_TRUE(std::isnan(prod[4]));
    EXPECT_EQ(prod[5], inf);  // overflow
    EXPECT_EQ(prod[6], -inf);
    EXPECT_EQ(prod[7], 12.0f);
  }
}

TEST(CpuReduce, F16RoundsEachResultToNearestEven) {
  for (std::optional<Isa> isa : VariantsToTest()) {
    SCOPED_TRACE(VariantName(isa));
    auto h = [](float f) { return FloatToHalf(f); };
    // 2048 + 1 = 2049 is a tie between 2048 and 2050: even mantissa wins.
    // 2048 + 3 = 2051: tie between 2050 and 2052 -> 2052.
    // 65504 + 16 = 65520: tie between 65504 and 65536 (inf) -> inf.
    // 65504 + 8 rounds back down to 65504.
    const std::vector<uint16_t> dst = {h(2048), h(2048),  h(65504), h(65504), h(-65504),
                                       h(0.5f), h(-2048), h(1),     h(2048)};
    const std::vector<uint16_t> src = {h(1),     h(3),  h(16), h(8), h(-16),
                                       h(0.25f), h(-1), h(-1), h(1)};
    const std::vector<uint16_t> sum = ReduceIntoTyped(isa, DType::kF16, ReduceOp::kSum, dst, src);
    EXPECT_EQ(HalfToFloat(sum[0]), 2048.0f);
    EXPECT_EQ(HalfToFloat(sum[1]), 2052.0f);
    EXPECT_EQ(sum[2], 0x7c00);
    EXPECT_EQ(HalfToFloat(sum[3]), 65504.0f);
    EXPECT_EQ(sum[4], 0xfc00);
    EXPECT_EQ(HalfToFloat(sum[5]), 0.75f);
    EXPECT_EQ(HalfToFloat(sum[6]), -2048.0f);
    EXPECT_EQ(sum[7], 0x0000);                // +0
    EXPECT_EQ(HalfToFloat(sum[8]), 2048.0f);  // same tie in the scalar tail
    // Products land in the f16 subnormal range (1 ulp = 2^-24): exact values,
    // ties to even, and underflow to (signed) zero.
    const std::vector<uint16_t> a = {h(0x1p-10f),   h(0x1p-14f),  h(0x1p-13f), h(-0x1p-20f),
                                     h(0x1.8p-12f), h(0x1p-12f),  h(0x1p-12f), h(0x1p-12f),
                                     h(0x1.4p-11f), h(0x1.cp-11f)};
    const std::vector<uint16_t> b = {h(0x1p-10f), h(0x1p-11f), h(0x1.8p-12f), h(0x1p-5f),
                                     h(0x1p-12f), h(0x1p-12f), h(0x1p-13f),   h(0x1.8p-13f),
                                     h(0x1p-12f), h(0x1p-12f)};
    const std::vector<uint16_t> prod = ReduceIntoTyped(isa, DType::kF16, ReduceOp::kProd, a, b);
    EXPECT_EQ(prod[0], 0x0010);  // 2^-20 = 16 ulp
    EXPECT_EQ(prod[1], 0x0000);  // 0.5 ulp: tie between 0 and 1 ulp -> 0
    EXPECT_EQ(prod[2], 0x0001);  // 0.75 ulp -> 1 ulp
    EXPECT_EQ(prod[3], 0x8000);  // -0.5 ulp -> -0
    EXPECT_EQ(prod[4], 0x0002);  // 1.5 ulp: tie -> 2 (even)
    EXPECT_EQ(prod[5], 0x0001);  // exactly 1 ulp
    EXPECT_EQ(prod[6], 0x0000);  // 0.5 ulp -> 0
    EXPECT_EQ(prod[7], 0x0001);  // 0.75 ulp -> 1
    EXPECT_EQ(prod[8], 0x0002);  // 2.5 ulp: tie -> 2 (scalar tail)
    EXPECT_EQ(prod[9], 0x0004);  // 3.5 ulp: tie -> 4 (scalar tail)
  }
}

TEST(CpuReduce, IntegersWrapAroundOnOverflow) {
  constexpr int32_t kI32Max = std::numeric_limits<int32_t>::max();
  constexpr int32_t kI32Min = std::numeric_limits<int32_t>::min();
  constexpr int64_t kI64Max = std::numeric_limits<int64_t>::max();
  constexpr int64_t kI64Min = std::numeric_limits<int64_t>::min();
  for (std::optional<Isa> isa : VariantsToTest()) {
    SCOPED_TRACE(VariantName(isa));
    const std::vector<int32_t> d32 = {kI32Max, kI32Min, 65536, -1, kI32Min, 46341, 3, -7, kI32Max};
    const std::vector<int32_t> s32 = {1, -1, 65536, kI32Min, -1, 46341, -5, -7, kI32Max};
    const auto sum32 = ReduceIntoTyped(isa, DType::kI32, ReduceOp::kSum, d32, s32);
    const auto prod32 = ReduceIntoTyped(isa, DType::kI32, ReduceOp::kProd, d32, s32);
    EXPECT_EQ(sum32[0], kI32Min);
    EXPECT_EQ(sum32[1], kI32Max);
    EXPECT_EQ(sum32[3], kI32Max);
    EXPECT_EQ(sum32[8], -2);
    EXPECT_EQ(prod32[2], 0);  // 2^32 wraps to 0
    EXPECT_EQ(prod32[3], kI32Min);
    EXPECT_EQ(prod32[4], kI32Min);      // INT_MIN * -1 wraps to INT_MIN
    EXPECT_EQ(prod32[5], -2147479015);  // 46341^2 = 2147488281 - 2^32
    EXPECT_EQ(prod32[6], -15);
    EXPECT_EQ(prod32[7], 49);
    EXPECT_EQ(prod32[8], 1);  // (2^31-1)^2 = 2^62 - 2^32 + 1

    const std::vector<int64_t> d64 = {kI64Max, kI64Min, int64_t{1} << 32, kI64Min, -3};
    const std::vector<int64_t> s64 = {1, -1, int64_t{1} << 32, -1, 4};
    const auto sum64 = ReduceIntoTyped(isa, DType::kI64, ReduceOp::kSum, d64, s64);
    const auto prod64 = ReduceIntoTyped(isa, DType::kI64, ReduceOp::kProd, d64, s64);
    EXPECT_EQ(sum64[0], kI64Min);
    EXPECT_EQ(sum64[1], kI64Max);
    EXPECT_EQ(prod64[2], 0);
    EXPECT_EQ(prod64[3], kI64Min);
    EXPECT_EQ(prod64[4], -12);

    const std::vector<uint8_t> d8 = {200, 255, 16, 0, 17, 255, 3, 128, 100};
    const std::vector<uint8_t> s8 = {100, 1, 16, 255, 15, 255, 4, 2, 3};
    const auto sum8 = ReduceIntoTyped(isa, DType::kU8, ReduceOp::kSum, d8, s8);
    const auto prod8 = ReduceIntoTyped(isa, DType::kU8, ReduceOp::kProd, d8, s8);
    const auto min8 = ReduceIntoTyped(isa, DType::kU8, ReduceOp::kMin, d8, s8);
    EXPECT_EQ(sum8[0], 44);
    EXPECT_EQ(sum8[1], 0);
    EXPECT_EQ(prod8[2], 0);  // 256
    EXPECT_EQ(prod8[4], 255);
    EXPECT_EQ(prod8[5], 1);  // 65025 mod 256
    EXPECT_EQ(prod8[7], 0);
    EXPECT_EQ(prod8[8], 44);  // tail: 300 mod 256
    EXPECT_EQ(min8[3], 0);
    EXPECT_EQ(min8[0], 100);  // unsigned compare
  }
}

// ---------------------------------------------------------------------------
// ReduceOutOfPlace, including every aliasing pattern the header allows.

TEST(CpuReduce, ReduceOutOfPlaceMatchesReferenceWithAndWithoutAliasing) {
  enum class Alias { kNone, kDstIsA, kDstIsB, kAIsB, kAllSame };
  const Alias kAliases[] = {Alias::kNone, Alias::kDstIsA, Alias::kDstIsB, Alias::kAIsB,
                            Alias::kAllSame};
  const char* kAliasNames[] = {"distinct", "dst==a", "dst==b", "a==b", "dst==a==b"};
  std::mt19937_64 rng(99);
  for (std::optional<Isa> isa : VariantsToTest()) {
    for (DType t : kAllDTypes) {
      const size_t sz = DTypeSize(t);
      for (ReduceOp op : kAllReduceOps) {
        for (size_t n : kCounts) {
          for (Alias alias : kAliases) {
            SCOPED_TRACE(VariantName(isa) + " " + DTypeName(t) + " " + ReduceOpName(op) +
                         " count=" + std::to_string(n) + " " +
                         kAliasNames[static_cast<int>(alias)]);
            std::vector<uint8_t> a = RandomData(t, n + kGuard, rng);
            std::vector<uint8_t> b = RandomData(t, n + kGuard, rng);
            std::vector<uint8_t> d = RandomData(t, n + kGuard, rng);
            const std::vector<uint8_t> a0 = a, b0 = b;
            std::vector<uint8_t> want;
            uint8_t* dst = d.data();
            const uint8_t* pa = a.data();
            const uint8_t* pb = b.data();
            std::vector<uint8_t> guard = d;
            switch (alias) {
              case Alias::kNone: want = RefReduce(t, op, a0.data(), b0.data(), n); break;
              case Alias::kDstIsA:
                dst = a.data(), guard = a0;
                want = RefReduce(t, op, a0.data(), b0.data(), n);
                break;
              case Alias::kDstIsB:
                dst = b.data(), guard = b0;
                want = RefReduce(t, op, a0.data(), b0.data(), n);
                break;
              case Alias::kAIsB:
                pb = a.data();
                want = RefReduce(t, op, a0.data(), a0.data(), n);
                break;
              case Alias::kAllSame:
                dst = a.data(), pb = a.data(), guard = a0;
                want = RefReduce(t, op, a0.data(), a0.data(), n);
                break;
            }
            CallReduceOutOfPlace(isa, t, op, dst, pa, pb, n);
            EXPECT_EQ(Mismatch(t, dst, want.data(), n), "");
            EXPECT_EQ(std::memcmp(dst + n * sz, &guard[n * sz], kGuard * sz), 0)
                << "wrote past count";
            if (alias == Alias::kNone || alias == Alias::kAIsB) {
              EXPECT_EQ(a, a0) << "modified an input";
              EXPECT_EQ(b, b0) << "modified an input";
            }
          }
        }
      }
    }
  }
}

TEST(CpuReduce, ReduceIntoWithSrcEqualToDstCombinesEachElementWithItself) {
  std::mt19937_64 rng(5);
  for (std::optional<Isa> isa : VariantsToTest()) {
    for (DType t : kAllDTypes) {
      for (ReduceOp op : kAllReduceOps) {
        SCOPED_TRACE(VariantName(isa) + " " + DTypeName(t) + " " + ReduceOpName(op));
        std::vector<uint8_t> d = RandomData(t, 1000, rng);
        const std::vector<uint8_t> want = RefReduce(t, op, d.data(), d.data(), 1000);
        CallReduceInto(isa, t, op, d.data(), d.data(), 1000);
        EXPECT_EQ(Mismatch(t, d.data(), want.data(), 1000), "");
      }
    }
  }
}

// ---------------------------------------------------------------------------
// f16: the F16C conversions must agree with FloatToHalf/HalfToFloat on every
// input, not just on typical ones.

TEST(CpuReduce, F16KernelsPassEveryHalfBitPatternThroughUnchanged) {
  std::vector<uint16_t> all(65536);
  for (size_t i = 0; i < all.size(); ++i) all[i] = static_cast<uint16_t>(i);
  const std::vector<uint16_t> minus_zero(all.size(), 0x8000);  // x + -0 == x, also for -0
  for (std::optional<Isa> isa : VariantsToTest()) {
    SCOPED_TRACE(VariantName(isa));
    std::vector<uint16_t> d = all;
    CallReduceInto(isa, DType::kF16, ReduceOp::kSum, d.data(), minus_zero.data(), d.size());
    for (size_t i = 0; i < all.size(); ++i) {
      const bool nan = (all[i] & 0x7fff) > 0x7c00;
      const uint16_t want = nan ? static_cast<uint16_t>((all[i] & 0x8000) | 0x7e00) : all[i];
      ASSERT_EQ(d[i], want) << "half 0x" << std::hex << all[i];
    }
  }
}

// Products of two halves are exact in f32 (11 + 11 significant bits), so this
// compares the f32 -> f16 rounding of each variant with FloatToHalf on 4M
// values covering ties, subnormal results, underflow and overflow.
TEST(CpuReduce, F16ProductsOfAllHalvesRoundLikeFloatToHalf) {
  std::vector<uint16_t> all(65536);
  for (size_t i = 0; i < all.size(); ++i) all[i] = static_cast<uint16_t>(i);
  std::mt19937_64 rng(2024);
  std::vector<uint16_t> multipliers = {0x3c00, 0x3800, 0x3e00, 0x0001, 0x03ff, 0x7bff,
                                       0x1400, 0x2c01, 0xbc01, 0x3555, 0x0200, 0x5bff};
  while (multipliers.size() < 64) multipliers.push_back(static_cast<uint16_t>(rng()));
  for (std::optional<Isa> isa : VariantsToTest()) {
    SCOPED_TRACE(VariantName(isa));
    for (uint16_t m : multipliers) {
      for (ReduceOp op : {ReduceOp::kProd, ReduceOp::kSum}) {
        std::vector<uint16_t> d = all;
        const std::vector<uint16_t> src(all.size(), m);
        CallReduceInto(isa, DType::kF16, op, d.data(), src.data(), d.size());
        for (size_t i = 0; i < all.size(); ++i) {
          const float exact = op == ReduceOp::kProd ? HalfToFloat(all[i]) * HalfToFloat(m)
                                                    : HalfToFloat(all[i]) + HalfToFloat(m);
          const uint16_t want = FloatToHalf(exact);
          // NaN results: sign unspecified (NaN * NaN), but always 0x7e00 / 0xfe00.
          const uint16_t mask = std::isnan(exact) ? 0x7fff : 0xffff;
          ASSERT_EQ(d[i] & mask, want & mask)
              << ReduceOpName(op) << " 0x" << std::hex << all[i] << " by 0x" << m;
        }
      }
    }
  }
}

// ---------------------------------------------------------------------------
// DivideBy.

TEST(CpuReduce, DivideByMatchesReferenceForEveryDTypeAndDivisor) {
  const int64_t kDivisors[] = {1,
                               3,
                               -1,
                               2,
                               -3,
                               7,
                               8,
                               255,
                               256,
                               -300,
                               1000003,
                               int64_t{1} << 31,
                               -(int64_t{1} << 31),
                               (int64_t{1} << 31) - 1,
                               (int64_t{1} << 53) + 1,
                               std::numeric_limits<int64_t>::max(),
                               std::numeric_limits<int64_t>::min()};
  std::mt19937_64 rng(42);
  for (std::optional<Isa> isa : VariantsToTest()) {
    for (DType t : kAllDTypes) {
      const size_t sz = DTypeSize(t);
      for (int64_t divisor : kDivisors) {
        for (size_t n : kCounts) {
          SCOPED_TRACE(VariantName(isa) + " " + DTypeName(t) + " / " + std::to_string(divisor) +
                       " count=" + std::to_string(n));
          std::vector<uint8_t> d = RandomData(t, n + kGuard, rng);
          const std::vector<uint8_t> d0 = d;
          std::vector<uint8_t> want(d.begin(), d.begin() + n * sz);
          for (size_t i = 0; i < n; ++i) RefDivideElement(t, &want[i * sz], divisor);
          CallDivideBy(isa, t, d.data(), n, divisor);
          EXPECT_EQ(Mismatch(t, d.data(), want.data(), n, d0.data()), "");
          EXPECT_EQ(std::memcmp(&d[n * sz], &d0[n * sz], kGuard * sz), 0) << "wrote past count";
        }
      }
    }
  }
}

TEST(CpuReduce, DivideByTruncatesNegativeIntegersTowardZero) {
  for (std::optional<Isa> isa : VariantsToTest()) {
    SCOPED_TRACE(VariantName(isa));
    std::vector<int32_t> i32 = {
        -7, 7, -1, -2, -3, std::numeric_limits<int32_t>::min(), std::numeric_limits<int32_t>::max(),
        0,  -9};
    CallDivideBy(isa, DType::kI32, i32.data(), i32.size(), 3);
    EXPECT_EQ(i32, (std::vector<int32_t>{-2, 2, 0, 0, -1, -715827882, 715827882, 0, -3}));
    std::vector<int32_t> m = {std::numeric_limits<int32_t>::min(), 5, -5};
    CallDivideBy(isa, DType::kI32, m.data(), m.size(), -1);
    EXPECT_EQ(m, (std::vector<int32_t>{std::numeric_limits<int32_t>::min(), -5, 5}));  // wraps
    std::vector<int64_t> i64 = {-7, 7, -1, std::numeric_limits<int64_t>::min(), -9};
    CallDivideBy(isa, DType::kI64, i64.data(), i64.size(), 3);
    EXPECT_EQ(i64, (std::vector<int64_t>{-2, 2, 0, -3074457345618258602, -3}));
    std::vector<int64_t> m64 = {std::numeric_limits<int64_t>::min(), 5};
    CallDivideBy(isa, DType::kI64, m64.data(), m64.size(), -1);
    EXPECT_EQ(m64, (std::vector<int64_t>{std::numeric_limits<int64_t>::min(), -5}));
    std::vector<uint8_t> u8 = {255, 7, 2, 0, 200};
    CallDivideBy(isa, DType::kU8, u8.data(), u8.size(), 3);
    EXPECT_EQ(u8, (std::vector<uint8_t>{85, 2, 0, 0, 66}));
    std::vector<int32_t> same = {-5, 5, 123};
    CallDivideBy(isa, DType::kI32, same.data(), same.size(), 1);
    EXPECT_EQ(same, (std::vector<int32_t>{-5, 5, 123}));
  }
}

TEST(CpuReduce, DivideByIsExactForEveryU8ValueAndManyDivisors) {
  std::vector<uint8_t> all(256);
  for (int i = 0; i < 256; ++i) all[i] = static_cast<uint8_t>(i);
  for (std::optional<Isa> isa : VariantsToTest()) {
    for (int64_t divisor = -300; divisor <= 300; ++divisor) {
      if (divisor == 0) continue;
      std::vector<uint8_t> d = all;
      CallDivideBy(isa, DType::kU8, d.data(), d.size(), divisor);
      for (int i = 0; i < 256; ++i) {
        ASSERT_EQ(d[i], static_cast<uint8_t>(i / divisor))
            << VariantName(isa) << " " << i << " / " << divisor;
      }
    }
  }
}

TEST(CpuReduce, DivideByIsExactForI32NearQuotientBoundaries) {
  // x = q * d + r with r in {-1, 0, 1}: where inexact division would break.
  std::mt19937_64 rng(11);
  std::vector<int32_t> x;
  std::vector<int64_t> divisor;
  for (int i = 0; i < 20000; ++i) {
    const int64_t d =
        std::uniform_int_distribution<int64_t>(2, int64_t{1} << 31)(rng) * (rng() % 2 ? 1 : -1);
    const int64_t limit = (int64_t{1} << 31) / (d < 0 ? -d : d);
    const int64_t q = std::uniform_int_distribution<int64_t>(-limit, limit)(rng);
    for (int r = -1; r <= 1; ++r) {
      const int64_t v = q * d + r;
      if (v < std::numeric_limits<int32_t>::min() || v > std::numeric_limits<int32_t>::max()) {
        continue;
      }
      x.push_back(static_cast<int32_t>(v));
      divisor.push_back(d);
    }
  }
  for (std::optional<Isa> isa : VariantsToTest()) {
    for (size_t i = 0; i < x.size(); ++i) {
      int32_t v[9];
      for (int32_t& e : v) e = x[i];  // vector body and tail
      CallDivideBy(isa, DType::kI32, v, 9, divisor[i]);
      ASSERT_EQ(v[0], static_cast<int32_t>(x[i] / divisor[i]))
          << VariantName(isa) << " " << x[i] << " / " << divisor[i];
      ASSERT_EQ(v[8], v[0]);
    }
  }
}

TEST(CpuReduce, DivideByZeroFollowsIeeeForFloats) {
  for (std::optional<Isa> isa : VariantsToTest()) {
    std::vector<float> f = {1, -1, 0, 2, 3, 4, 5, 6, -7};
    CallDivideBy(isa, DType::kF32, f.data(), f.size(), 0);
    EXPECT_EQ(f[0], std::numeric_limits<float>::infinity());
    EXPECT_EQ(f[1], -std::numeric_limits<float>::infinity());
    EXPECT_TRUE(std::isnan(f[2]));
    EXPECT_EQ(f[8], -std::numeric_limits<float>::infinity());
  }
}

TEST(CpuReduceDeathTest, IntegerDivideByZeroAborts) {
  int32_t v[4] = {1, 2, 3, 4};
  EXPECT_DEATH(DivideBy(DType::kI32, v, 4, 0), "by zero");
}

TEST(CpuReduceDeathTest, InvalidDTypeOrOpAborts) {
  float a[2] = {1, 2}, b[2] = {3, 4};
  EXPECT_DEATH(ReduceInto(static_cast<DType>(0), ReduceOp::kSum, a, b, 2), "invalid dtype");
  EXPECT_DEATH(ReduceInto(DType::kF32, static_cast<ReduceOp>(9), a, b, 2), "invalid dtype");
}

}  // namespace
}  // namespace gradsync
