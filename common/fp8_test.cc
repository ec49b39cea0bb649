#include "common/fp8.h"

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "gtest/gtest.h"

namespace gradsync {
namespace {

using ToFloatFn = float (*)(uint8_t);
using FromFloatFn = uint8_t (*)(float);

struct Format {
  const char* name;
  ToFloatFn to_float;
  FromFloatFn from_float;
  float max_finite;
  float min_subnormal;
  bool has_inf;
};

const Format kE4M3{"e4m3", Fp8E4M3ToFloat, FloatToFp8E4M3, 448.0f, 0x1p-9f, false};
const Format kE5M2{"e5m2", Fp8E5M2ToFloat, FloatToFp8E5M2, 57344.0f, 0x1p-16f, true};

float FromBits(uint32_t u) {
  float f;
  std::memcpy(&f, &u, sizeof(f));
  return f;
}

// An independent reference: the nearest of the format's finite values by
// exhaustive search in double, ties to the even code, saturating at ±max.
uint8_t ReferenceEncode(const Format& fmt, float f) {
  if (std::isnan(f)) return 0x7f;
  const double x = f;
  const bool neg = std::signbit(f);
  if (std::fabs(x) > fmt.max_finite) return static_cast<uint8_t>((neg ? 0x80 : 0) | (fmt.has_inf ? 0x7b : 0x7e));
  uint8_t best = 0;
  double best_err = std::numeric_limits<double>::infinity();
  for (int c = 0; c < 0x80; ++c) {
    const double v = fmt.to_float(static_cast<uint8_t>(c));
    if (!std::isfinite(v)) continue;
    const double err = std::fabs(std::fabs(x) - v);
    if (err < best_err || (err == best_err && (c & 1) == 0)) {
      best = static_cast<uint8_t>(c);
      best_err = err;
    }
  }
  return static_cast<uint8_t>((neg ? 0x80 : 0) | best);
}

class Fp8Test : public ::testing::TestWithParam<Format> {};

TEST_P(Fp8Test, EveryCodeRoundTrips) {
  const Format& fmt = GetParam();
  for (int c = 0; c < 256; ++c) {
    const uint8_t b = static_cast<uint8_t>(c);
    const float f = fmt.to_float(b);
    if (std::isnan(f)) {
      EXPECT_EQ(fmt.from_float(f), 0x7f) << fmt.name << " code " << c;
    } else if (std::isinf(f)) {
      EXPECT_TRUE(fmt.has_inf);
      EXPECT_EQ(fmt.from_float(f), (c & 0x80) | 0x7b) << "inf saturates";
    } else {
      EXPECT_EQ(fmt.from_float(f), b) << fmt.name << " code " << c << " value " << f;
    }
  }
}

TEST_P(Fp8Test, DecodesTheFormatsValues) {
  const Format& fmt = GetParam();
  EXPECT_EQ(fmt.to_float(0x00), 0.0f);
  EXPECT_TRUE(std::signbit(fmt.to_float(0x80)));
  EXPECT_EQ(fmt.to_float(0x01), fmt.min_subnormal);
  EXPECT_EQ(fmt.to_float(fmt.has_inf ? 0x7b : 0x7e), fmt.max_finite);
  EXPECT_EQ(fmt.to_float(fmt.has_inf ? 0xfb : 0xfe), -fmt.max_finite);
  EXPECT_TRUE(std::isnan(fmt.to_float(0x7f)));
  EXPECT_TRUE(std::isnan(fmt.to_float(0xff)));
  if (fmt.has_inf) {
    EXPECT_EQ(fmt.to_float(0x7c), std::numeric_limits<float>::infinity());
    EXPECT_EQ(fmt.to_float(0xfc), -std::numeric_limits<float>::infinity());
  }
  // Strictly increasing over the positive finite codes.
  float prev = -1;
  for (int c = 0; c < 0x80; ++c) {
    const float v = fmt.to_float(static_cast<uint8_t>(c));
    if (!std::isfinite(v)) break;
    EXPECT_GT(v, prev) << c;
    prev = v;
  }
}

TEST_P(Fp8Test, SaturatesAndRoundsTiesToEven) {
  const Format& fmt = GetParam();
  const uint8_t max_code = fmt.has_inf ? 0x7b : 0x7e;
  EXPECT_EQ(fmt.from_float(std::numeric_limits<float>::infinity()), max_code);
  EXPECT_EQ(fmt.from_float(-std::numeric_limits<float>::infinity()), 0x80 | max_code);
  EXPECT_EQ(fmt.from_float(1e30f), max_code);
  EXPECT_EQ(fmt.from_float(std::numeric_limits<float>::quiet_NaN()), 0x7f);
  EXPECT_EQ(fmt.from_float(-std::numeric_limits<float>::quiet_NaN()), 0x7f);
  // Half the smallest subnormal is a tie between 0 and it: even, so zero.
  EXPECT_EQ(fmt.from_float(fmt.min_subnormal / 2), 0x00);
  EXPECT_EQ(fmt.from_float(-fmt.min_subnormal / 2), 0x80);
  EXPECT_EQ(fmt.from_float(fmt.min_subnormal * 1.5f), 0x02);  // tie between 1 and 2: 2
  if (!fmt.has_inf) {
    EXPECT_EQ(fmt.from_float(464.0f), 0x7e);  // the tie above 448 rounds to 448 (even)
    EXPECT_EQ(fmt.from_float(17.0f), fmt.from_float(16.0f));  // 17: tie of 16 and 18, even
    EXPECT_EQ(fmt.from_float(19.0f), fmt.from_float(20.0f));  // 19: tie of 18 and 20, even
  } else {
    EXPECT_EQ(fmt.from_float(61439.0f), 0x7b);
    EXPECT_EQ(fmt.from_float(61440.0f), 0x7b);  // the tie would round to inf: saturates
    EXPECT_EQ(fmt.from_float(9.0f), fmt.from_float(8.0f));    // tie of 8 and 10: 8
    EXPECT_EQ(fmt.from_float(11.0f), fmt.from_float(12.0f));  // tie of 10 and 12: 12
  }
}

TEST_P(Fp8Test, MatchesAnExhaustiveNearestValueSearch) {
  const Format& fmt = GetParam();
  // Every f32 sign and exponent with the top 8 mantissa bits (past the guard
  // bit of both formats) and four patterns of the low 15 (exact, a sticky bit,
  // all ones, random), plus random bit patterns.
  std::mt19937 rng(7);
  std::vector<uint32_t> inputs;
  for (uint32_t hi = 0; hi < (1u << 17); ++hi) {
    for (uint32_t lo : {0u, 1u, 0x7fffu, static_cast<uint32_t>(rng() & 0x7fffu)}) inputs.push_back((hi << 15) | lo);
  }
  for (int i = 0; i < 200000; ++i) inputs.push_back(static_cast<uint32_t>(rng()));
  size_t wrong = 0;
  for (uint32_t u : inputs) {
    const float f = FromBits(u);
    const uint8_t got = fmt.from_float(f), want = ReferenceEncode(fmt, f);
    if (got != want && wrong++ < 10) {
      ADD_FAILURE() << fmt.name << " " << f << " (0x" << std::hex << u << "): got 0x"
                    << int{got} << ", want 0x" << int{want};
    }
  }
  EXPECT_EQ(wrong, 0u);
}

INSTANTIATE_TEST_SUITE_P(Formats, Fp8Test, ::testing::Values(kE4M3, kE5M2),
                         [](const ::testing::TestParamInfo<Format>& info) {
                           return std::string(info.param.name);
                         });

}  // namespace
}  // namespace gradsync
