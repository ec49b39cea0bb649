// Every codec against a plain reference of its documented layout and
// rounding (kernels/codec.h), bit for bit; its stated error bound on values
// spread over many magnitudes; non-finite values; DecodeAdd as Decode then
// one addition.
#include "kernels/codec.h"

#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "common/fp8.h"
#include "common/types.h"
#include "gtest/gtest.h"

namespace gradsync {
namespace {

constexpr CodecId kCodecs[] = {CodecId::kBf16, CodecId::kFp16, CodecId::kFp8E4M3,
                               CodecId::kFp8E5M2, CodecId::kInt8};
constexpr size_t kSizes[] = {0, 1, 7, 4095, 4096, 4097, 10000, 3 * 4096 + 5};

// Every kernel variant this CPU runs: each must give the reference's bits.
std::vector<internal::Isa> Isas() {
  std::vector<internal::Isa> v = {internal::Isa::kPortable};
  if (internal::CpuSupportsAvx2()) v.push_back(internal::Isa::kAvx2);
  return v;
}

std::vector<float> Values(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::uniform_int_distribution<int> exponent(-30, 20);
  std::vector<float> v(n);
  for (size_t i = 0; i < n; ++i) {
    // Blocks of different magnitudes, and a spread inside each.
    const int block_exp = static_cast<int>((i / kCodecBlockElements) * 7 % 40) - 20;
    v[i] = std::ldexp(normal(rng), block_exp + exponent(rng) / 8);
  }
  if (n > 3) v[n / 2] = 0.0f;
  if (n > 5) v[n / 3] = -0.0f;
  return v;
}

// The reference scale of a power-of-two codec: 2^(e-1) where
// max/amax in [2^(e-1), 2^e), clamped to 2^±126; 1 when amax is 0.
float RefPow2Scale(float max_finite, float amax) {
  if (amax == 0) return 1.0f;
  const double q = static_cast<double>(static_cast<float>(max_finite / amax));
  int e = 0;
  if (std::isinf(static_cast<float>(max_finite / amax))) return std::ldexp(1.0f, 126);
  std::frexp(q, &e);
  e = std::max(-126, std::min(126, e - 1));
  return std::ldexp(1.0f, e);
}

float RefAmax(const float* x, size_t n) {
  float m = 0;
  for (size_t i = 0; i < n; ++i) {
    if (std::isfinite(x[i])) m = std::max(m, std::fabs(x[i]));
  }
  return m;
}

// The documented encoding, written out element by element.
std::string Reference(CodecId id, const std::vector<float>& x) {
  const size_t n = x.size();
  const Codec& c = *CodecFor(id);
  std::string out(c.EncodedBytes(n), '\0');
  const size_t blocks = (n + kCodecBlockElements - 1) / kCodecBlockElements;
  const size_t scale_bytes = c.scaled() ? blocks * 4 : 0;
  for (size_t b = 0; b < blocks; ++b) {
    const size_t begin = b * kCodecBlockElements;
    const size_t len = std::min(kCodecBlockElements, n - begin);
    const float amax = RefAmax(&x[begin], len);
    float scale = 1.0f;
    switch (id) {
      case CodecId::kFp16: scale = RefPow2Scale(65504.0f, amax); break;
      case CodecId::kFp8E4M3: scale = RefPow2Scale(448.0f, amax); break;
      case CodecId::kFp8E5M2: scale = RefPow2Scale(57344.0f, amax); break;
      case CodecId::kInt8: {
        scale = amax / 127.0f;
        if (scale == 0) scale = amax > 0 ? std::numeric_limits<float>::denorm_min() : 1.0f;
        break;
      }
      default: break;
    }
    if (c.scaled()) std::memcpy(&out[b * 4], &scale, 4);
    for (size_t i = begin; i < begin + len; ++i) {
      char* p = &out[scale_bytes + i * c.element_bytes()];
      uint16_t h = 0;
      uint8_t q = 0;
      switch (id) {
        case CodecId::kBf16: h = FloatToBFloat16(x[i]); break;
        case CodecId::kFp16: h = FloatToHalf(x[i] * scale); break;
        case CodecId::kFp8E4M3: q = FloatToFp8E4M3(x[i] * scale); break;
        case CodecId::kFp8E5M2: q = FloatToFp8E5M2(x[i] * scale); break;
        case CodecId::kInt8: {
          if (!std::isfinite(x[i])) {
            q = 0x80;
          } else {
            // x times 1/step, or x / step where 1/step overflows.
            const float inv = 1.0f / scale;
            float r = std::nearbyint(inv <= FLT_MAX ? x[i] * inv : x[i] / scale);
            r = std::max(-127.0f, std::min(127.0f, r));
            q = static_cast<uint8_t>(static_cast<int8_t>(r));
          }
          break;
        }
        default: break;
      }
      if (c.element_bytes() == 2) std::memcpy(p, &h, 2); else *p = static_cast<char>(q);
    }
  }
  return out;
}

// The codec's stated bound on |decoded - x| (kernels/codec.h).
double Bound(CodecId id, double x, double amax) {
  switch (id) {
    case CodecId::kBf16: return std::ldexp(std::fabs(x), -8);
    case CodecId::kFp16: return std::ldexp(std::fabs(x), -11) + std::ldexp(amax, -40);
    case CodecId::kFp8E4M3: return std::ldexp(std::fabs(x), -4) + std::ldexp(amax, -17);
    case CodecId::kFp8E5M2: return std::ldexp(std::fabs(x), -3) + std::ldexp(amax, -32);
    case CodecId::kInt8: return amax / 254 * (1 + std::ldexp(1.0, -14));
    default: return 0;
  }
}

TEST(Codec, EncodesAsTheReferenceBitForBit) {
  for (internal::Isa isa : Isas())
  for (CodecId id : kCodecs) {
    const Codec& c = *internal::CodecFor(id, isa);
    for (size_t n : kSizes) {
      const std::vector<float> x = Values(n, 17 + static_cast<uint32_t>(n));
      std::string got(c.EncodedBytes(n), '\0');
      c.Encode(x.data(), n, got.data());
      EXPECT_EQ(got, Reference(id, x)) << c.name() << " n=" << n << " " << IsaName(isa);
    }
  }
}

// fp8's vectorizable conversion against common/fp8.h's over the whole f32
// range: each block leads with the format's largest value, so its scale is 1
// and the payload is the plain conversion of every other value.
TEST(Codec, Fp8ConvertsEveryMagnitudeAsCommonFp8Does) {
  struct Case {
    CodecId id;
    float max;
    uint8_t (*convert)(float);
  };
  for (const Case& k : {Case{CodecId::kFp8E4M3, 448.0f, FloatToFp8E4M3},
                        Case{CodecId::kFp8E5M2, 57344.0f, FloatToFp8E5M2}}) {
    std::vector<float> x;
    for (uint64_t u = 0; u < (uint64_t{1} << 32); u += 977) {
      if (x.size() % kCodecBlockElements == 0) x.push_back(k.max);
      float f;
      const uint32_t bits = static_cast<uint32_t>(u);
      std::memcpy(&f, &bits, 4);
      if (std::fabs(f) <= k.max || std::isnan(f)) x.push_back(f);
    }
    for (internal::Isa isa : Isas()) {
      const Codec& c = *internal::CodecFor(k.id, isa);
      std::string enc(c.EncodedBytes(x.size()), '\0');
      c.Encode(x.data(), x.size(), enc.data());
      const size_t scales = (x.size() + kCodecBlockElements - 1) / kCodecBlockElements * 4;
      size_t wrong = 0;
      for (size_t i = 0; i < x.size(); ++i) {
        if (static_cast<uint8_t>(enc[scales + i]) != k.convert(x[i]) && wrong++ < 5) {
          ADD_FAILURE() << c.name() << " " << IsaName(isa) << ": " << x[i] << " -> "
                        << int(static_cast<uint8_t>(enc[scales + i])) << ", common/fp8.h "
                        << int(k.convert(x[i]));
        }
      }
      EXPECT_EQ(wrong, 0u) << c.name() << " " << IsaName(isa) << " of " << x.size();
    }
  }
}

// The values where rounding is decided: every midpoint between two
// neighbouring fp8 values (a tie), one f32 ulp either side of it, the
// values themselves, both signs, and the non-finite ones (±inf saturate);
// every variant against common/fp8.h. The largest value leads the block, so
// its scale is 1 (a larger finite value would scale the block down).
TEST(Codec, Fp8RoundsEveryTieAsCommonFp8Does) {
  struct Case {
    CodecId id;
    float (*widen)(uint8_t);
    uint8_t (*convert)(float);
    uint8_t max_code;
  };
  for (const Case& k : {Case{CodecId::kFp8E4M3, Fp8E4M3ToFloat, FloatToFp8E4M3, 0x7e},
                        Case{CodecId::kFp8E5M2, Fp8E5M2ToFloat, FloatToFp8E5M2, 0x7b}}) {
    const float max = k.widen(k.max_code);
    std::vector<float> x = {max};  // the first block's amax: scale 1
    for (int c = 0; c < k.max_code; ++c) {
      const float v = k.widen(static_cast<uint8_t>(c));
      const float next = k.widen(static_cast<uint8_t>(c + 1));
      const float mid = v + (next - v) / 2;  // exact: one bit more than the fp8's
      for (float f : {v, mid, std::nextafter(mid, 0.0f), std::nextafter(mid, INFINITY), next}) {
        x.push_back(f);
        x.push_back(-f);
      }
    }
    for (float f : {INFINITY, NAN, 1e-45f, 0.0f}) {
      x.push_back(f);
      x.push_back(-f);
    }
    for (internal::Isa isa : Isas()) {
      const Codec& c = *internal::CodecFor(k.id, isa);
      std::string enc(c.EncodedBytes(x.size()), '\0');
      c.Encode(x.data(), x.size(), enc.data());
      const size_t scales = (x.size() + kCodecBlockElements - 1) / kCodecBlockElements * 4;
      for (size_t i = 0; i < x.size(); ++i) {
        ASSERT_EQ(static_cast<uint8_t>(enc[scales + i]), k.convert(x[i]))
            << c.name() << " " << IsaName(isa) << ": " << x[i];
      }
    }
  }
}

// Every fp8 byte decodes as common/fp8.h widens it, in every variant (a
// block of scale 1: the payload after one f32 scale of 1).
TEST(Codec, Fp8DecodesEveryByteAsCommonFp8Does) {
  for (CodecId id : {CodecId::kFp8E4M3, CodecId::kFp8E5M2}) {
    std::string enc(4 + 256 + 4, '\0');
    const float one = 1.0f;
    std::memcpy(enc.data(), &one, 4);
    for (int b = 0; b < 256; ++b) enc[4 + b] = static_cast<char>(b);
    for (internal::Isa isa : Isas()) {
      const Codec& c = *internal::CodecFor(id, isa);
      std::vector<float> d(256);
      c.Decode(enc.data(), 256, d.data());
      for (int b = 0; b < 256; ++b) {
        const float want = id == CodecId::kFp8E4M3 ? Fp8E4M3ToFloat(static_cast<uint8_t>(b))
                                                   : Fp8E5M2ToFloat(static_cast<uint8_t>(b));
        EXPECT_EQ(std::memcmp(&d[b], &want, 4), 0)
            << c.name() << " " << IsaName(isa) << " byte " << b << ": " << d[b] << " vs " << want;
      }
    }
  }
}

TEST(Codec, EncodedSizeIsTheLayout) {
  EXPECT_EQ(CodecFor(CodecId::kBf16)->EncodedBytes(3), 8u);
  EXPECT_EQ(CodecFor(CodecId::kBf16)->EncodedBytes(4096), 8192u);
  EXPECT_EQ(CodecFor(CodecId::kFp16)->EncodedBytes(4097), 8u + 8194u + 6u);
  EXPECT_EQ(CodecFor(CodecId::kInt8)->EncodedBytes(4096), 4u + 4096u + 4u);
  EXPECT_EQ(CodecFor(CodecId::kFp8E4M3)->EncodedBytes(0), 0u);
  EXPECT_EQ(CodecFor(CodecId::kNone), nullptr);
  EXPECT_NEAR(CodecFor(CodecId::kInt8)->Ratio(), 0.25, 1e-3);
}

TEST(Codec, DecodedValuesAreWithinTheStatedBound) {
  for (internal::Isa isa : Isas())
  for (CodecId id : kCodecs) {
    const Codec& c = *internal::CodecFor(id, isa);
    for (size_t n : kSizes) {
      const std::vector<float> x = Values(n, 5 + static_cast<uint32_t>(n));
      std::string enc(c.EncodedBytes(n), '\0');
      c.Encode(x.data(), n, enc.data());
      std::vector<float> d(n);
      c.Decode(enc.data(), n, d.data());
      for (size_t i = 0; i < n; ++i) {
        const size_t begin = i / kCodecBlockElements * kCodecBlockElements;
        const float amax = RefAmax(&x[begin], std::min(kCodecBlockElements, n - begin));
        ASSERT_LE(std::fabs(static_cast<double>(d[i]) - x[i]), Bound(id, x[i], amax))
            << c.name() << " n=" << n << " element " << i << ": " << x[i] << " -> " << d[i];
      }
    }
  }
}

TEST(Codec, DecodeAddIsDecodeThenOneAddition) {
  for (internal::Isa isa : Isas())
  for (CodecId id : kCodecs) {
    const Codec& c = *internal::CodecFor(id, isa);
    const size_t n = 10000;
    const std::vector<float> x = Values(n, 3), acc = Values(n, 4);
    std::string enc(c.EncodedBytes(n), '\0');
    c.Encode(x.data(), n, enc.data());
    std::vector<float> d(n), got = acc;
    c.Decode(enc.data(), n, d.data());
    c.DecodeAdd(enc.data(), n, got.data());
    for (size_t i = 0; i < n; ++i) {
      const float want = acc[i] + d[i];
      ASSERT_EQ(std::memcmp(&got[i], &want, 4), 0) << c.name() << " element " << i;
    }
  }
}

TEST(Codec, NonFiniteValues) {
  const float inf = std::numeric_limits<float>::infinity();
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const std::vector<float> x = {1.0f, -inf, inf, nan, -2.0f, 0.5f, 0.25f, 3.0f,
                                 -nan, 1e-3f, inf, 7.0f, nan, -1.0f, 2.0f, 4.0f, -inf};
  for (internal::Isa isa : Isas())
  for (CodecId id : kCodecs) {
    const Codec& c = *internal::CodecFor(id, isa);
    std::string enc(c.EncodedBytes(x.size()), '\0');
    c.Encode(x.data(), x.size(), enc.data());
    std::vector<float> d(x.size());
    c.Decode(enc.data(), x.size(), d.data());
    // The scale ignored the non-finite values: the finite ones survive.
    EXPECT_NEAR(d[0], 1.0f, 0.01f) << c.name();
    EXPECT_NEAR(d[4], -2.0f, 0.02f) << c.name();
    EXPECT_TRUE(std::isnan(d[3]) && std::isnan(d[8]) && std::isnan(d[12])) << c.name();
    // Every variant writes the same bytes, non-finite values included.
    std::string portable(enc.size(), '\0');
    internal::CodecFor(id, internal::Isa::kPortable)->Encode(x.data(), x.size(), portable.data());
    EXPECT_EQ(enc, portable) << c.name() << " " << IsaName(isa);
    switch (id) {
      case CodecId::kBf16:
      case CodecId::kFp16:
        EXPECT_EQ(d[1], -inf) << c.name();
        EXPECT_EQ(d[2], inf) << c.name();
        break;
      case CodecId::kInt8:
        EXPECT_TRUE(std::isnan(d[1]) && std::isnan(d[2]));
        break;
      default:  // fp8 saturates
        EXPECT_TRUE(std::isfinite(d[1]) && d[1] < -2.0f) << c.name() << " " << d[1];
        EXPECT_TRUE(std::isfinite(d[2]) && d[2] > 2.0f) << c.name() << " " << d[2];
    }
  }
}

TEST(Codec, Names) {
  for (CodecId id : kAllCodecs) {
    auto parsed = ParseCodec(CodecName(id));
    ASSERT_TRUE(parsed.ok()) << parsed.status();
    EXPECT_EQ(*parsed, id);
  }
  EXPECT_EQ(*ParseCodec("FP8"), CodecId::kFp8E4M3);
  EXPECT_EQ(ParseCodec("zip").status().message(),
            "unknown codec 'zip' (codecs: none, bf16, fp16, fp8e4m3 (or fp8), fp8e5m2, int8)");
}

}  // namespace
}  // namespace gradsync
