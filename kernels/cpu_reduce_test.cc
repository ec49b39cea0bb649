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
#include "kernels/cpu_reduce_testing.h"

namespace gradsync {
namespace {

using namespace cpu_reduce_testing;  // NOLINT(build/namespaces)

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

TEST(CpuReduceDeathTest, InvalidDTypeOrOpAborts) {
  float a[2] = {1, 2}, b[2] = {3, 4};
  EXPECT_DEATH(ReduceInto(static_cast<DType>(0), ReduceOp::kSum, a, b, 2), "invalid dtype");
  EXPECT_DEATH(ReduceInto(DType::kF32, static_cast<ReduceOp>(9), a, b, 2), "invalid dtype");
}

}  // namespace
}  // namespace gradsync
