// Tests for DivideBy (avg's final step) and MultiplyBy (premul_sum's first)
// of the CPU kernels: every dtype and divisor against the reference, integer
// rounding toward zero, exhaustive u8 and i32 quotient boundaries, IEEE
// division by zero, the integer divide-by-zero abort; every float dtype and
// factor against the reference.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "common/types.h"
#include "kernels/cpu_reduce.h"
#include "kernels/cpu_reduce_testing.h"

namespace gradsync {
namespace {

using namespace cpu_reduce_testing;  // NOLINT(build/namespaces)

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

TEST(CpuReduce, MultiplyByMatchesReferenceForEveryFloatDTypeAndFactor) {
  const double kFactors[] = {1.0, 0.25, 1.0 / 3, -2.5, 0.0, 1e-3, 65504.0, 1e30, -1e-30};
  std::mt19937_64 rng(7);
  for (DType t : kAllDTypes) {
    if (!IsFloatDType(t)) continue;
    const size_t sz = DTypeSize(t);
    for (double factor : kFactors) {
      for (size_t n : kCounts) {
        SCOPED_TRACE(std::string(DTypeName(t)) + " * " + std::to_string(factor) +
                     " count=" + std::to_string(n));
        std::vector<uint8_t> d = RandomData(t, n + kGuard, rng);
        const std::vector<uint8_t> d0 = d;
        std::vector<uint8_t> want(d.begin(), d.begin() + n * sz);
        for (size_t i = 0; i < n; ++i) RefMultiplyElement(t, &want[i * sz], factor);
        MultiplyBy(t, d.data(), n, factor);
        EXPECT_EQ(Mismatch(t, d.data(), want.data(), n, d0.data()), "");
        EXPECT_EQ(std::memcmp(&d[n * sz], &d0[n * sz], kGuard * sz), 0) << "wrote past count";
      }
    }
  }
}

TEST(CpuReduceDeathTest, MultiplyByOnAnIntegerDTypeAborts) {
  int32_t v[4] = {1, 2, 3, 4};
  EXPECT_DEATH(MultiplyBy(DType::kI32, v, 4, 2.0), "float dtypes only");
}

TEST(CpuReduceDeathTest, IntegerDivideByZeroAborts) {
  int32_t v[4] = {1, 2, 3, 4};
  EXPECT_DEATH(DivideBy(DType::kI32, v, 4, 0), "by zero");
}

}  // namespace
}  // namespace gradsync
