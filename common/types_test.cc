// Tests for common/types: dtype/op names and parsing, and the f16/bf16
// conversions checked against references computed independently (double
// arithmetic for FloatToHalf, explicit tie analysis for bf16).
#include "common/types.h"

#include <gtest/gtest.h>

#include <cctype>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <string>

namespace gradsync {
namespace {

float FloatFromBits(uint32_t u) {
  float f;
  std::memcpy(&f, &u, sizeof(f));
  return f;
}

uint32_t BitsFromFloat(float f) {
  uint32_t u;
  std::memcpy(&u, &f, sizeof(u));
  return u;
}

bool IsHalfNan(uint16_t h) { return (h & 0x7fffu) > 0x7c00u; }
bool IsBf16Nan(uint16_t b) { return (b & 0x7fffu) > 0x7f80u; }

// The value of a half, from the IEEE 754 definition, in double.
double HalfValue(uint16_t h) {
  const int sign = h >> 15;
  const int exp = (h >> 10) & 0x1f;
  const int mant = h & 0x3ff;
  double v;
  if (exp == 0) {
    v = std::ldexp(mant, -24);
  } else if (exp == 31) {
    v = mant == 0 ? std::numeric_limits<double>::infinity()
                  : std::numeric_limits<double>::quiet_NaN();
  } else {
    v = std::ldexp(1024 + mant, exp - 25);
  }
  return sign ? -v : v;
}

// Round-to-nearest-even float -> half, computed in double: scale |f| by the
// half quantum at its magnitude (a power of two, so exact), round the
// integer with nearbyint (ties to even), and re-encode.
uint16_t RefFloatToHalf(float f) {
  const uint16_t sign = std::signbit(f) ? 0x8000 : 0;
  if (std::isnan(f)) return sign | 0x7e00;
  const double a = std::fabs(static_cast<double>(f));
  if (a >= 65520.0) return sign | 0x7c00;  // 65520 is the tie between 65504 and 2^16
  if (a < std::ldexp(1.0, -14)) {          // subnormal quantum 2^-24
    const double r = std::nearbyint(a * std::ldexp(1.0, 24));  // 1024 -> smallest normal
    return sign | static_cast<uint16_t>(r);
  }
  int e;
  std::frexp(a, &e);  // a = m * 2^e with m in [0.5, 1): 2^(e-1) <= a < 2^e
  const double quantum = std::ldexp(1.0, e - 1 - 10);
  double r = std::nearbyint(a / quantum);  // in [1024, 2048]
  int biased = e - 1 + 15;
  if (r == 2048) {
    r = 1024;
    ++biased;
  }
  return sign | static_cast<uint16_t>(biased << 10) | static_cast<uint16_t>(r - 1024);
}

// ---------------------------------------------------------------------------
// Names and parsing.

TEST(Types, DTypeSizesAndNames) {
  EXPECT_EQ(DTypeSize(DType::kF32), 4u);
  EXPECT_EQ(DTypeSize(DType::kF64), 8u);
  EXPECT_EQ(DTypeSize(DType::kF16), 2u);
  EXPECT_EQ(DTypeSize(DType::kBF16), 2u);
  EXPECT_EQ(DTypeSize(DType::kI32), 4u);
  EXPECT_EQ(DTypeSize(DType::kI64), 8u);
  EXPECT_EQ(DTypeSize(DType::kU8), 1u);
  EXPECT_EQ(DTypeSize(static_cast<DType>(0)), 0u);
  EXPECT_STREQ(DTypeName(DType::kBF16), "bf16");
  EXPECT_STREQ(DTypeName(static_cast<DType>(99)), "invalid-dtype");
  EXPECT_STREQ(ReduceOpName(ReduceOp::kAvg), "avg");
  EXPECT_STREQ(ReduceOpName(static_cast<ReduceOp>(0)), "invalid-op");
}

TEST(Types, IsValidAcceptsExactlyTheEnumerators) {
  for (int v = -1; v <= 10; ++v) {
    bool dtype = false, op = false;
    for (DType t : kAllDTypes) dtype |= static_cast<int>(t) == v;
    for (ReduceOp o : kAllOpReduceOps) op |= static_cast<int>(o) == v;
    EXPECT_EQ(IsValidDType(v), dtype) << v;
    EXPECT_EQ(IsValidReduceOp(v), op) << v;
  }
}

// The text every dtype error quotes follows the enum (it said 1..7 after the
// fp8 types were added).
TEST(Types, ValidDTypesTextListsEveryEnumerator) {
  EXPECT_EQ(ValidDTypesText(), "1..9: f32 f64 f16 bf16 i32 i64 u8 f8e4m3 f8e5m2");
  EXPECT_EQ(ValidReduceOpsText(), "1..6: sum avg min max prod premul_sum");
  EXPECT_EQ(ValidCollectivesText(),
            "1..11: allreduce reduce_scatter allgather broadcast reduce alltoall barrier gather scatter "
            "send recv");
}

TEST(Types, ParseDTypeAcceptsEveryNameAnyCaseAndAliases) {
  for (DType t : kAllDTypes) {
    EXPECT_EQ(ParseDType(DTypeName(t)).value(), t);
    std::string upper = DTypeName(t);
    for (char& c : upper) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
    EXPECT_EQ(ParseDType(upper).value(), t) << upper;
  }
  EXPECT_EQ(ParseDType("float").value(), DType::kF32);
  EXPECT_EQ(ParseDType("Float32").value(), DType::kF32);
  EXPECT_EQ(ParseDType("double").value(), DType::kF64);
  EXPECT_EQ(ParseDType("float64").value(), DType::kF64);
  EXPECT_EQ(ParseDType("half").value(), DType::kF16);
  EXPECT_EQ(ParseDType("float16").value(), DType::kF16);
  EXPECT_EQ(ParseDType("BFloat16").value(), DType::kBF16);
  EXPECT_EQ(ParseDType("float8_e4m3fn").value(), DType::kF8E4M3);  // torch's names
  EXPECT_EQ(ParseDType("float8_e5m2").value(), DType::kF8E5M2);
}

TEST(Types, ParseDTypeRejectsUnknownNamesListingTheChoices) {
  for (const char* bad : {"", "f8", "int32", " f32", "f32 ", "bf"}) {
    const absl::StatusOr<DType> r = ParseDType(bad);
    ASSERT_FALSE(r.ok()) << "'" << bad << "'";
    EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_EQ(r.status().message(), std::string("unknown dtype '") + bad +
                                        "' (expected f32, f64, f16, bf16, i32, i64, u8, f8e4m3 or f8e5m2)");
  }
}

TEST(Types, ParseReduceOpAcceptsEveryNameAnyCase) {
  for (ReduceOp op : kAllOpReduceOps) {
    EXPECT_EQ(ParseReduceOp(ReduceOpName(op)).value(), op);
    std::string upper = ReduceOpName(op);
    for (char& c : upper) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
    EXPECT_EQ(ParseReduceOp(upper).value(), op) << upper;
  }
  EXPECT_EQ(ParseReduceOp("Max").value(), ReduceOp::kMax);
}

TEST(Types, ParseReduceOpRejectsUnknownNamesListingTheChoices) {
  for (const char* bad : {"", "mean", "average", "sum ", "product"}) {
    const absl::StatusOr<ReduceOp> r = ParseReduceOp(bad);
    ASSERT_FALSE(r.ok()) << "'" << bad << "'";
    EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_EQ(r.status().message(),
              std::string("unknown reduce op '") + bad + "' (expected sum, avg, min, max, prod or premul_sum)");
  }
}

// ---------------------------------------------------------------------------
// f16.

TEST(Types, HalfToFloatIsExactForAllHalfBitPatterns) {
  for (uint32_t i = 0; i < 65536; ++i) {
    const uint16_t h = static_cast<uint16_t>(i);
    const float f = HalfToFloat(h);
    if (IsHalfNan(h)) {
      EXPECT_TRUE(std::isnan(f)) << std::hex << h;
      EXPECT_EQ(std::signbit(f), (h & 0x8000) != 0) << std::hex << h;
    } else {
      ASSERT_EQ(static_cast<double>(f), HalfValue(h)) << std::hex << h;
      ASSERT_EQ(std::signbit(f), (h & 0x8000) != 0) << std::hex << h;  // -0 stays -0
    }
  }
}

TEST(Types, FloatToHalfRoundTripsAllHalfBitPatternsAndKeepsNaNsNaN) {
  for (uint32_t i = 0; i < 65536; ++i) {
    const uint16_t h = static_cast<uint16_t>(i);
    const uint16_t back = FloatToHalf(HalfToFloat(h));
    if (IsHalfNan(h)) {
      ASSERT_EQ(back, (h & 0x8000) | 0x7e00) << std::hex << h;  // quiet NaN, sign kept
    } else {
      ASSERT_EQ(back, h) << std::hex << h;
    }
  }
}

TEST(Types, FloatToHalfRoundsHalfwayCasesToEven) {
  // Every pair of adjacent finite halves of either sign: the exact midpoint
  // (representable in f32) goes to the even one, one f32 ulp either side goes
  // to the nearer one.
  for (uint16_t sign : {uint16_t{0}, uint16_t{0x8000}}) {
    for (uint32_t h = 0; h < 0x7c00; ++h) {
      const uint16_t lo = static_cast<uint16_t>(h) | sign;
      const uint16_t hi = static_cast<uint16_t>(h + 1) | sign;  // 0x7bff + 1 = inf
      const double vlo = HalfValue(lo);
      // Rounding treats inf as the value 2^16 (the next exponent step).
      const double vhi = h + 1 == 0x7c00 ? (sign ? -65536.0 : 65536.0) : HalfValue(hi);
      const float mid = static_cast<float>((vlo + vhi) / 2);
      ASSERT_EQ(static_cast<double>(mid) * 2, vlo + vhi) << "midpoint not exact";
      const uint16_t even = (h & 1) ? hi : lo;
      ASSERT_EQ(FloatToHalf(mid), even) << std::hex << "tie between " << lo << " and " << hi;
      const float toward_lo = std::nextafter(mid, 0.0f);
      const float toward_hi = std::nextafter(mid, sign ? -INFINITY : INFINITY);
      ASSERT_EQ(FloatToHalf(toward_lo), lo) << std::hex << "just below tie " << lo << "/" << hi;
      ASSERT_EQ(FloatToHalf(toward_hi), hi) << std::hex << "just above tie " << lo << "/" << hi;
    }
  }
}

TEST(Types, FloatToHalfHandlesEdgeValues) {
  struct Case {
    float in;
    uint16_t want;
  };
  const Case cases[] = {
      {0.0f, 0x0000},
      {-0.0f, 0x8000},
      {1.0f, 0x3c00},
      {-2.0f, 0xc000},
      {65504.0f, 0x7bff},    // largest finite half
      {65519.996f, 0x7bff},  // just below the tie with 2^16
      {65520.0f, 0x7c00},    // tie -> even -> overflows to inf
      {-65520.0f, 0xfc00},
      {1e10f, 0x7c00},
      {std::numeric_limits<float>::max(), 0x7c00},
      {INFINITY, 0x7c00},
      {-INFINITY, 0xfc00},
      {0x1p-14f, 0x0400},      // smallest normal half
      {0x1.ffcp-15f, 0x0400},  // rounds up from the subnormal range into the normals
      {0x1p-24f, 0x0001},      // smallest subnormal half
      {0x1p-25f, 0x0000},      // tie between 0 and 2^-24 -> 0
      {0x1.000002p-25f, 0x0001},
      {-0x1p-25f, 0x8000},
      {0x1.8p-24f, 0x0002},  // 1.5 ulp: tie -> 2
      {0x1p-26f, 0x0000},
      {std::numeric_limits<float>::denorm_min(), 0x0000},
      {-std::numeric_limits<float>::denorm_min(), 0x8000},
      {std::numeric_limits<float>::min(), 0x0000},
      {0.1f, 0x2e66},
      {1.0f / 3, 0x3555},
  };
  for (const Case& c : cases) {
    EXPECT_EQ(FloatToHalf(c.in), c.want) << std::hexfloat << c.in;
    EXPECT_EQ(RefFloatToHalf(c.in), c.want) << "reference disagrees: " << std::hexfloat << c.in;
  }
  EXPECT_EQ(FloatToHalf(std::numeric_limits<float>::quiet_NaN()) & 0x7fff, 0x7e00);
  EXPECT_EQ(FloatToHalf(FloatFromBits(0x7f800001)), 0x7e00);  // signalling NaN -> quiet NaN
  EXPECT_EQ(FloatToHalf(FloatFromBits(0xffc00000)), 0xfe00);
}

TEST(Types, FloatToHalfMatchesDoubleReferenceOnSampledAndRandomFloats) {
  // A prime stride through all 2^32 bit patterns (~44M floats, every
  // exponent), then random floats concentrated in the half range.
  uint64_t checked = 0;
  for (uint64_t u = 0; u < (uint64_t{1} << 32); u += 97) {
    const float f = FloatFromBits(static_cast<uint32_t>(u));
    const uint16_t got = FloatToHalf(f);
    const uint16_t want = RefFloatToHalf(f);
    if (got != want) {
      FAIL() << std::hex << "float bits 0x" << u << ": got 0x" << got << " want 0x" << want;
    }
    ++checked;
  }
  std::mt19937_64 rng(123);
  std::uniform_int_distribution<uint32_t> in_range(0x33000000u - 0x1000u, 0x47800000u + 0x1000u);
  for (int i = 0; i < 4000000; ++i) {
    const uint32_t u = in_range(rng) | (rng() % 2 ? 0x80000000u : 0u);
    const float f = FloatFromBits(u);
    ASSERT_EQ(FloatToHalf(f), RefFloatToHalf(f)) << std::hex << "float bits 0x" << u;
  }
  EXPECT_GT(checked, 44000000u);
}

// ---------------------------------------------------------------------------
// bf16.

TEST(Types, BFloat16RoundTripsAllBitPatternsAndQuietsNaNs) {
  for (uint32_t i = 0; i < 65536; ++i) {
    const uint16_t b = static_cast<uint16_t>(i);
    const float f = BFloat16ToFloat(b);
    ASSERT_EQ(BitsFromFloat(f), i << 16);  // widening is exact
    if (IsBf16Nan(b)) {
      const uint16_t back = FloatToBFloat16(f);
      ASSERT_TRUE(IsBf16Nan(back)) << std::hex << b;
      ASSERT_EQ(back, b | 0x40) << std::hex << b;  // quiet bit set, sign and payload kept
    } else {
      ASSERT_EQ(FloatToBFloat16(f), b) << std::hex << b;
    }
  }
}

TEST(Types, FloatToBFloat16RoundsToNearestEven) {
  // For every finite bf16 b, the f32 values between b and the next bf16 up
  // (in magnitude) are b's bits followed by 16 more: below 0x8000 round down,
  // above round up, exactly 0x8000 is a tie that goes to the even one.
  for (uint32_t i = 0; i < 65536; ++i) {
    const uint16_t b = static_cast<uint16_t>(i);
    if ((b & 0x7f80) == 0x7f80) continue;                // inf / NaN
    const uint16_t next = static_cast<uint16_t>(b + 1);  // 0x7f7f + 1 = inf: overflow
    const uint16_t even = (b & 1) ? next : b;
    for (uint32_t low : {0x0001u, 0x7fffu, 0x8000u, 0x8001u, 0xffffu}) {
      const float f = FloatFromBits((i << 16) | low);
      const uint16_t want = low < 0x8000 ? b : low > 0x8000 ? next : even;
      ASSERT_EQ(FloatToBFloat16(f), want) << std::hex << "float bits 0x" << ((i << 16) | low);
    }
  }
  EXPECT_EQ(FloatToBFloat16(std::numeric_limits<float>::max()), 0x7f80);  // rounds to inf
  EXPECT_EQ(FloatToBFloat16(-INFINITY), 0xff80);
  EXPECT_EQ(FloatToBFloat16(FloatFromBits(0x7f800001)), 0x7fc0);  // NaN with low payload only
  EXPECT_EQ(FloatToBFloat16(1.0f), 0x3f80);
  EXPECT_EQ(FloatToBFloat16(-0.0f), 0x8000);
}

}  // namespace
}  // namespace gradsync
