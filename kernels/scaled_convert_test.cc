#include "kernels/scaled_convert.h"

#include <cfloat>
#include <cmath>
#include <limits>
#include <random>
#include <vector>

#include "common/fp8.h"
#include "gtest/gtest.h"

namespace gradsync {
namespace {

constexpr DType kTypes[] = {DType::kF16, DType::kBF16, DType::kF8E4M3, DType::kF8E5M2};

size_t Bytes(DType t) { return t == DType::kF16 || t == DType::kBF16 ? 2 : 1; }

TEST(ScaledConvert, ScalesArePowersOfTwoThatBringTheChunkMaximumUnderTheTypesMaximum) {
  EXPECT_EQ(ChunkScale(DType::kF8E4M3, 1.0f), 256.0f);  // 448/1 in [256, 512)
  EXPECT_EQ(ChunkScale(DType::kF8E4M3, 448.0f), 1.0f);
  EXPECT_EQ(ChunkScale(DType::kF8E4M3, 449.0f), 0.5f);
  EXPECT_EQ(ChunkScale(DType::kF8E5M2, 1e-3f), 33554432.0f);  // 57344e3 in [2^25, 2^26)
  EXPECT_EQ(ChunkScale(DType::kF16, 65504.0f), 1.0f);
  EXPECT_EQ(ChunkScale(DType::kBF16, 1.0f), std::ldexp(1.0f, 126));  // clamped at 2^126
  EXPECT_EQ(ChunkScale(DType::kF8E4M3, 1e-38f), std::ldexp(1.0f, 126));
  EXPECT_EQ(ChunkScale(DType::kF8E4M3, 0.0f), 1.0f);  // nothing to scale
  EXPECT_EQ(ChunkScale(DType::kF8E4M3, INFINITY), 1.0f);
  EXPECT_EQ(ChunkScale(DType::kF8E4M3, NAN), 1.0f);
  for (DType t : kTypes) {
    for (float amax : {1e-30f, 3e-5f, 0.7f, 1.0f, 5.0f, 1000.0f, 3e20f}) {
      const float s = ChunkScale(t, amax);
      int e;
      EXPECT_EQ(std::frexp(s, &e), 0.5f) << "not a power of two";
      if (s < std::ldexp(1.0f, 126)) {
        EXPECT_LE(amax * s, MaxFinite(t)) << DTypeName(t) << " " << amax;
        EXPECT_GT(amax * s * 2, MaxFinite(t)) << DTypeName(t) << " " << amax;  // the largest such
      }
    }
  }
}

TEST(ScaledConvert, EncodeIsTheTypesRoundingOfTheScaledValueAndDecodeUndoesTheScaleExactly) {
  std::mt19937 rng(7);
  std::normal_distribution<float> normal(0, 1);
  const size_t n = 10007, chunk = 1000;  // a short last chunk
  std::vector<float> in(n);
  for (size_t i = 0; i < n; ++i) in[i] = normal(rng) * std::ldexp(1.0f, static_cast<int>(i / chunk) * 3 - 15);
  for (DType t : kTypes) {
    std::vector<uint8_t> enc(n * Bytes(t));
    std::vector<float> scales(ScaledChunks(n, chunk)), dec(n);
    EncodeScaled(t, in.data(), n, chunk, enc.data(), scales.data());
    DecodeScaled(t, enc.data(), n, chunk, scales.data(), dec.data());
    ASSERT_EQ(scales.size(), 11u);
    for (size_t c = 0; c < scales.size(); ++c) {
      float amax = 0;
      for (size_t i = c * chunk; i < std::min(n, (c + 1) * chunk); ++i) amax = std::max(amax, std::fabs(in[i]));
      ASSERT_EQ(scales[c], ChunkScale(t, amax)) << DTypeName(t) << " chunk " << c;
    }
    for (size_t i = 0; i < n; ++i) {
      const float scaled = in[i] * scales[i / chunk];
      float want;
      switch (t) {
        case DType::kF16: want = HalfToFloat(FloatToHalf(scaled)); break;
        case DType::kBF16: want = BFloat16ToFloat(FloatToBFloat16(scaled)); break;
        case DType::kF8E4M3: want = Fp8E4M3ToFloat(FloatToFp8E4M3(scaled)); break;
        default: want = Fp8E5M2ToFloat(FloatToFp8E5M2(scaled)); break;
      }
      ASSERT_EQ(dec[i], want / scales[i / chunk]) << DTypeName(t) << " element " << i;
      // The relative error is the type's: half an ulp at its precision.
      const double ulp = t == DType::kF16 ? 0x1p-11 : t == DType::kBF16 ? 0x1p-8
                         : t == DType::kF8E4M3 ? 0x1p-4 : 0x1p-3;
      if (std::fabs(scaled) >= 1.0f) ASSERT_LE(std::fabs(dec[i] - in[i]), std::fabs(in[i]) * ulp) << i;
    }
  }
}

TEST(ScaledConvert, FarBetterThanUnscaledFp8ForSmallGradients) {
  // Values around 1e-4 are mostly subnormal or zero in unscaled e4m3
  // (smallest subnormal 2^-9); scaled, they keep 3 mantissa bits.
  std::vector<float> in(256);
  for (size_t i = 0; i < in.size(); ++i) in[i] = 1e-4f * (1.0f + static_cast<float>(i) / 256);
  std::vector<uint8_t> enc(in.size());
  std::vector<float> scale(1), dec(in.size());
  EncodeScaled(DType::kF8E4M3, in.data(), in.size(), in.size(), enc.data(), scale.data());
  DecodeScaled(DType::kF8E4M3, enc.data(), in.size(), in.size(), scale.data(), dec.data());
  for (size_t i = 0; i < in.size(); ++i) {
    EXPECT_NEAR(dec[i], in[i], in[i] / 16) << i;
    EXPECT_EQ(Fp8E4M3ToFloat(FloatToFp8E4M3(in[i])), 0.0f) << "unscaled e4m3 keeps " << i;
  }
}

TEST(ScaledConvert, NonFiniteValuesDoNotSetTheScaleAndConvertAsTheTypeSays) {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  std::vector<float> in = {1.0f, -2.0f, nan, INFINITY, -INFINITY, 0.5f};
  for (DType t : kTypes) {
    std::vector<uint8_t> enc(in.size() * Bytes(t));
    std::vector<float> scale(1), dec(in.size());
    EncodeScaled(t, in.data(), in.size(), 64, enc.data(), scale.data());
    DecodeScaled(t, enc.data(), in.size(), 64, scale.data(), dec.data());
    EXPECT_EQ(scale[0], ChunkScale(t, 2.0f)) << DTypeName(t);
    EXPECT_EQ(dec[0], 1.0f) << DTypeName(t);
    EXPECT_EQ(dec[1], -2.0f) << DTypeName(t);
    EXPECT_TRUE(std::isnan(dec[2])) << DTypeName(t);
    if (t == DType::kF8E4M3 || t == DType::kF8E5M2) {  // saturating
      EXPECT_EQ(dec[3], MaxFinite(t) / scale[0]) << DTypeName(t);
      EXPECT_EQ(dec[4], -MaxFinite(t) / scale[0]) << DTypeName(t);
    } else {
      EXPECT_EQ(dec[3], INFINITY) << DTypeName(t);
      EXPECT_EQ(dec[4], -INFINITY) << DTypeName(t);
    }
  }
  // A chunk of zeros (or with nothing finite) keeps scale 1.
  std::vector<float> zeros(8, 0.0f), scale(1);
  std::vector<uint8_t> enc(8);
  EncodeScaled(DType::kF8E5M2, zeros.data(), 8, 8, enc.data(), scale.data());
  EXPECT_EQ(scale[0], 1.0f);
}

}  // namespace
}  // namespace gradsync
