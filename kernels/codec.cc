#include "kernels/codec.h"

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <cstring>
#include <chrono>
#include <limits>
#include <mutex>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "common/fp8.h"
#include "common/types.h"
#include "kernels/cpu_reduce.h"
#include "kernels/scaled_convert.h"

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define GRADSYNC_CODEC_X86 1
#else
#define GRADSYNC_CODEC_X86 0
#endif

namespace gradsync {

const char* CodecName(CodecId id) {
  switch (id) {
    case CodecId::kNone: return "none";
    case CodecId::kBf16: return "bf16";
    case CodecId::kFp16: return "fp16";
    case CodecId::kFp8E4M3: return "fp8e4m3";
    case CodecId::kFp8E5M2: return "fp8e5m2";
    case CodecId::kInt8: return "int8";
  }
  return "?";
}

bool IsValidCodec(uint8_t id) { return id < kCodecCount; }

absl::StatusOr<CodecId> ParseCodec(absl::string_view name) {
  const std::string lower = absl::AsciiStrToLower(name);
  if (lower == "fp8") return CodecId::kFp8E4M3;
  for (CodecId id : kAllCodecs) {
    if (lower == CodecName(id)) return id;
  }
  return absl::InvalidArgumentError(absl::StrCat(
      "unknown codec '", name, "' (codecs: none, bf16, fp16, fp8e4m3 (or fp8), fp8e5m2, int8)"));
}

size_t Codec::ScaleBytes(size_t n) const {
  return scaled() ? ScaledChunks(n, kCodecBlockElements) * sizeof(float) : 0;
}

size_t Codec::EncodedBytes(size_t n) const {
  return (ScaleBytes(n) + n * element_bytes() + 7) & ~size_t{7};
}

double Codec::Ratio() const {
  return (static_cast<double>(element_bytes()) + (scaled() ? 4.0 / kCodecBlockElements : 0.0)) /
         sizeof(float);
}

double Codec::MeasuredMicrosPerByte() const {
  std::call_once(measured_once_, [this] {
    constexpr size_t kN = 1 << 18;  // 1 MiB of f32
    std::vector<float> in(kN), acc(kN, 0.0f);
    for (size_t i = 0; i < kN; ++i) in[i] = static_cast<float>((i * 2654435761u) % 1000) - 500;
    std::vector<char> out(EncodedBytes(kN));
    double best = 0;
    for (int run = 0; run < 3; ++run) {
      const auto start = std::chrono::steady_clock::now();
      Encode(in.data(), kN, out.data());
      DecodeAdd(out.data(), kN, acc.data());
      const double us = std::chrono::duration<double, std::micro>(
                            std::chrono::steady_clock::now() - start)
                            .count();
      if (run == 0 || us < best) best = us;
    }
    measured_us_per_byte_ = best / (kN * sizeof(float));
  });
  return measured_us_per_byte_;
}

namespace {

using internal::Isa;

#if GRADSYNC_CODEC_X86
#define GS_CODEC_AVX2 __attribute__((target("avx2,f16c")))
#endif
#define GS_CODEC_INLINE inline __attribute__((always_inline))

float LoadScale(const char* at) {
  float s;
  std::memcpy(&s, at, sizeof(s));
  return s;
}

// ---------------------------------------------------------------------------
// Portable loops (also what the AVX2 variants do for a block's tail). Written
// without branches in the element path so the compiler can vectorize them.

// The largest finite |x| of a block (NaN and ±inf skipped).
GS_CODEC_INLINE float AmaxPortable(const float* in, size_t n) {
  float m = 0;
  for (size_t i = 0; i < n; ++i) {
    const float a = std::fabs(in[i]);
    m = a <= FLT_MAX && a > m ? a : m;
  }
  return m;
}

// FloatToFp8E4M3 / E5M2 (common/fp8.h) without branches: every path is
// computed and the right one selected.
template <int kExp, int kMan>
GS_CODEC_INLINE uint8_t NarrowFp8(float f) {
  constexpr int kBias = (1 << (kExp - 1)) - 1;
  constexpr uint32_t kMinNormalBits = static_cast<uint32_t>(127 - kBias + 1) << 23;
  constexpr uint32_t kSaturateAbove = kExp == 4 ? 0x43e80000u : 0x476fffffu;
  constexpr uint32_t kMaxCode = kExp == 4 ? 0x7eu : 0x7bu;
  uint32_t u;
  std::memcpy(&u, &f, sizeof(u));
  const uint32_t sign = (u >> 24) & 0x80u;
  const uint32_t a = u & 0x7fffffffu;
  constexpr int kShift = 23 - kMan;
  const uint32_t normal =
      ((a + ((1u << (kShift - 1)) - 1) + ((a >> kShift) & 1u)) >> kShift) -
      (static_cast<uint32_t>(127 - kBias) << kMan);
  // Subnormal: the value in units of the smallest subnormal, rounded to an
  // integer by adding and removing 2^23 (clamped first: only small a use it).
  float units;
  const uint32_t unit_bits = static_cast<uint32_t>(127 + kBias - 1 + kMan) << 23;
  float unit;
  std::memcpy(&unit, &unit_bits, sizeof(unit));
  float fa;
  const uint32_t small = a < kMinNormalBits ? a : 0u;
  std::memcpy(&fa, &small, sizeof(fa));
  units = fa * unit;
  const float q = (units + 8388608.0f) - 8388608.0f;
  const uint32_t sub = static_cast<uint32_t>(static_cast<int32_t>(q));
  uint32_t code = a >= kMinNormalBits ? normal : sub;
  code = a > kSaturateAbove ? kMaxCode : code;
  code |= sign;
  code = a > 0x7f800000u ? 0x7fu : code;
  return static_cast<uint8_t>(code);
}

// Every fp8 value as f32 (the decode table).
template <float (*Widen)(uint8_t)>
const float* Fp8Table() {
  static const auto* table = [] {
    auto* t = new float[256];
    for (int b = 0; b < 256; ++b) t[b] = Widen(static_cast<uint8_t>(b));
    return t;
  }();
  return table;
}

// ---------------------------------------------------------------------------
// The codecs' block loops, one ISA each. `inv` is 1/scale, exact for the
// power-of-two scales (so x * inv == x / scale bit for bit).

// int8's multiplier: 1/step, or 0 where that overflows (a step below
// 1/FLT_MAX: the block's values are then divided by the step). Every kernel
// and every ISA uses the same rule, so they agree bit for bit.
GS_CODEC_INLINE float Int8Inverse(float step) {
  const float inv = 1.0f / step;
  return inv <= FLT_MAX ? inv : 0.0f;
}

struct PortableLoops {
  static GS_CODEC_INLINE float Amax(const float* in, size_t n) { return AmaxPortable(in, n); }
  template <int kExp, int kMan>
  static GS_CODEC_INLINE void EncodeFp8(const float* in, size_t n, float s, uint8_t* out) {
    for (size_t i = 0; i < n; ++i) out[i] = NarrowFp8<kExp, kMan>(in[i] * s);
  }
  template <int kExp>
  static GS_CODEC_INLINE void DecodeFp8(const uint8_t* in, size_t n, float inv, float* out,
                                        bool add) {
    const float* table =
        kExp == 4 ? Fp8Table<Fp8E4M3ToFloat>() : Fp8Table<Fp8E5M2ToFloat>();
    if (add) {
      for (size_t i = 0; i < n; ++i) out[i] += table[in[i]] * inv;
    } else {
      for (size_t i = 0; i < n; ++i) out[i] = table[in[i]] * inv;
    }
  }
  static GS_CODEC_INLINE void EncodeBf16(const float* in, size_t n, uint16_t* out) {
    for (size_t i = 0; i < n; ++i) {
      uint32_t u;
      std::memcpy(&u, &in[i], sizeof(u));
      const uint32_t rounded = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
      out[i] = static_cast<uint16_t>((u & 0x7fffffffu) > 0x7f800000u ? (u >> 16) | 0x40u : rounded);
    }
  }
  static GS_CODEC_INLINE void EncodeF16(const float* in, size_t n, float s, uint16_t* out) {
    for (size_t i = 0; i < n; ++i) out[i] = FloatToHalf(in[i] * s);
  }
  static GS_CODEC_INLINE void DecodeF16(const uint16_t* in, size_t n, float inv, float* out,
                                        bool add) {
    if (add) {
      for (size_t i = 0; i < n; ++i) out[i] += HalfToFloat(in[i]) * inv;
    } else {
      for (size_t i = 0; i < n; ++i) out[i] = HalfToFloat(in[i]) * inv;
    }
  }
  // q = rint(x * (1/step)): a multiplication, not a division per element;
  // a step so small that 1/step overflows divides instead (Int8Inverse).
  static GS_CODEC_INLINE void EncodeInt8(const float* in, size_t n, float step, int8_t* out) {
    const float inv = Int8Inverse(step);
    for (size_t i = 0; i < n; ++i) {
      const float x = in[i];
      const float scaled = inv != 0 ? x * inv : x / step;
      const float q = std::clamp(std::nearbyint(scaled), -127.0f, 127.0f);
      out[i] = std::fabs(x) <= FLT_MAX ? static_cast<int8_t>(q) : int8_t{-128};
    }
  }
  static GS_CODEC_INLINE void DecodeInt8(const int8_t* in, size_t n, float step, float* out,
                                         bool add) {
    for (size_t i = 0; i < n; ++i) {
      const float v = in[i] == -128 ? std::numeric_limits<float>::quiet_NaN()
                                    : static_cast<float>(in[i]) * step;
      out[i] = add ? out[i] + v : v;
    }
  }
};

#if GRADSYNC_CODEC_X86
struct Avx2Loops {
  GS_CODEC_AVX2 static float Amax(const float* in, size_t n) {
    const __m256 abs_mask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
    const __m256 max_finite = _mm256_set1_ps(FLT_MAX);
    __m256 m = _mm256_setzero_ps();
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {
      const __m256 a = _mm256_and_ps(_mm256_loadu_ps(in + i), abs_mask);
      // NaN and inf compare false: they leave zero in their lane.
      m = _mm256_max_ps(m, _mm256_and_ps(a, _mm256_cmp_ps(a, max_finite, _CMP_LE_OQ)));
    }
    alignas(32) float lanes[8];
    _mm256_store_ps(lanes, m);
    float r = AmaxPortable(in + i, n - i);
    for (float l : lanes) r = l > r ? l : r;
    return r;
  }
  GS_CODEC_AVX2 static void EncodeF16(const float* in, size_t n, float s, uint16_t* out) {
    const __m256 vs = _mm256_set1_ps(s);
    const __m256 sign = _mm256_castsi256_ps(_mm256_set1_epi32(static_cast<int>(0x80000000u)));
    const __m256 quiet = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fc00000));
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {
      __m256 x = _mm256_mul_ps(_mm256_loadu_ps(in + i), vs);
      // NaN as FloatToHalf writes it: the sign and the canonical quiet NaN.
      const __m256 nan = _mm256_cmp_ps(x, x, _CMP_UNORD_Q);
      x = _mm256_blendv_ps(x, _mm256_or_ps(_mm256_and_ps(x, sign), quiet), nan);
      _mm_storeu_si128(reinterpret_cast<__m128i*>(out + i),
                       _mm256_cvtps_ph(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
    }
    PortableLoops::EncodeF16(in + i, n - i, s, out + i);
  }
  GS_CODEC_AVX2 static void DecodeF16(const uint16_t* in, size_t n, float inv, float* out,
                                        bool add) {
    const __m256 vinv = _mm256_set1_ps(inv);
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {
      const __m256 v = _mm256_mul_ps(
          _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(in + i))), vinv);
      _mm256_storeu_ps(out + i, add ? _mm256_add_ps(_mm256_loadu_ps(out + i), v) : v);
    }
    PortableLoops::DecodeF16(in + i, n - i, inv, out + i, add);
  }
  GS_CODEC_AVX2 static void EncodeInt8(const float* in, size_t n, float step, int8_t* out) {
    const __m256 vstep = _mm256_set1_ps(step);
    const __m256 lo = _mm256_set1_ps(-127.0f), hi = _mm256_set1_ps(127.0f);
    const __m256 abs_mask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
    const __m256 max_finite = _mm256_set1_ps(FLT_MAX);
    const __m256i minus128 = _mm256_set1_epi32(-128);
    const __m256i order = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
    size_t i = 0;
    const float inv = Int8Inverse(step);
    const __m256 vinv = _mm256_set1_ps(inv);
    auto quantize = [&](const float* p) GS_CODEC_AVX2 {
      const __m256 x = _mm256_loadu_ps(p);
      const __m256 scaled = inv != 0 ? _mm256_mul_ps(x, vinv) : _mm256_div_ps(x, vstep);
      __m256 q = _mm256_round_ps(scaled, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
      q = _mm256_min_ps(_mm256_max_ps(q, lo), hi);
      const __m256 finite = _mm256_cmp_ps(_mm256_and_ps(x, abs_mask), max_finite, _CMP_LE_OQ);
      return _mm256_blendv_epi8(minus128, _mm256_cvtps_epi32(q), _mm256_castps_si256(finite));
    };
    for (; i + 32 <= n; i += 32) {
      const __m256i a = quantize(in + i), b = quantize(in + i + 8);
      const __m256i c = quantize(in + i + 16), d = quantize(in + i + 24);
      // Saturating packs keep -128..127; they interleave the 128-bit lanes,
      // which the permute puts back in order.
      const __m256i ab = _mm256_packs_epi32(a, b), cd = _mm256_packs_epi32(c, d);
      const __m256i bytes = _mm256_packs_epi16(ab, cd);
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + i),
                          _mm256_permutevar8x32_epi32(bytes, order));
    }
    PortableLoops::EncodeInt8(in + i, n - i, step, out + i);
  }
  GS_CODEC_AVX2 static void DecodeInt8(const int8_t* in, size_t n, float step, float* out,
                                         bool add) {
    const __m256 vstep = _mm256_set1_ps(step);
    const __m256i minus128 = _mm256_set1_epi32(-128);
    const __m256 nan = _mm256_set1_ps(std::numeric_limits<float>::quiet_NaN());
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {
      int64_t bytes;
      std::memcpy(&bytes, in + i, sizeof(bytes));
      const __m256i q = _mm256_cvtepi8_epi32(_mm_cvtsi64_si128(bytes));
      __m256 v = _mm256_mul_ps(_mm256_cvtepi32_ps(q), vstep);
      v = _mm256_blendv_ps(v, nan, _mm256_castsi256_ps(_mm256_cmpeq_epi32(q, minus128)));
      _mm256_storeu_ps(out + i, add ? _mm256_add_ps(_mm256_loadu_ps(out + i), v) : v);
    }
    PortableLoops::DecodeInt8(in + i, n - i, step, out + i, add);
  }
  // NarrowFp8, 8 lanes at a time. Normals round to nearest even in integer
  // arithmetic on the bits, the exponent rebiased in the same addition;
  // subnormals by one float addition of M, 2^23 of the fp8's smallest
  // subnormal (the hardware rounds |x| + M to a multiple of that unit, to
  // nearest even, as NarrowFp8's units + 2^23 does); saturation is a
  // minimum (every code past the largest, ±inf included, comes out larger);
  // then the sign, and NaN as 0x7f.
  template <int kExp, int kMan>
  GS_CODEC_AVX2 static __m256i Fp8Lanes(__m256 x) {
    constexpr int kBias = (1 << (kExp - 1)) - 1;
    constexpr int kShift = 23 - kMan;
    constexpr int32_t kMinNormalBits = (127 - kBias + 1) << 23;
    constexpr int32_t kMaxCode = kExp == 4 ? 0x7e : 0x7b;
    constexpr int32_t kRoundAndRebias = ((1 << (kShift - 1)) - 1) - ((127 - kBias) << 23);
    constexpr int32_t kMagicBits = (127 + 23 + 1 - kBias - kMan) << 23;
    const __m256i u = _mm256_castps_si256(x);
    const __m256i sign = _mm256_and_si256(_mm256_srli_epi32(u, 24), _mm256_set1_epi32(0x80));
    const __m256i a = _mm256_and_si256(u, _mm256_set1_epi32(0x7fffffff));
    const __m256i odd = _mm256_and_si256(_mm256_srli_epi32(a, kShift), _mm256_set1_epi32(1));
    const __m256i normal = _mm256_srli_epi32(
        _mm256_add_epi32(_mm256_add_epi32(a, odd), _mm256_set1_epi32(kRoundAndRebias)), kShift);
    const __m256i magic = _mm256_set1_epi32(kMagicBits);
    const __m256i sub = _mm256_sub_epi32(
        _mm256_castps_si256(_mm256_add_ps(_mm256_castsi256_ps(a), _mm256_castsi256_ps(magic))),
        magic);
    const __m256i is_normal = _mm256_cmpgt_epi32(a, _mm256_set1_epi32(kMinNormalBits - 1));
    __m256i code = _mm256_min_epi32(_mm256_blendv_epi8(sub, normal, is_normal),
                                    _mm256_set1_epi32(kMaxCode));
    code = _mm256_or_si256(code, sign);
    return _mm256_blendv_epi8(code, _mm256_set1_epi32(0x7f),
                              _mm256_cmpgt_epi32(a, _mm256_set1_epi32(0x7f800000)));
  }
  template <int kExp, int kMan>
  GS_CODEC_AVX2 static void EncodeFp8(const float* in, size_t n, float s, uint8_t* out) {
    const __m256 vs = _mm256_set1_ps(s);
    const __m256i order = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
    size_t i = 0;
    for (; i + 32 <= n; i += 32) {
      const __m256i a = Fp8Lanes<kExp, kMan>(_mm256_mul_ps(_mm256_loadu_ps(in + i), vs));
      const __m256i b = Fp8Lanes<kExp, kMan>(_mm256_mul_ps(_mm256_loadu_ps(in + i + 8), vs));
      const __m256i c = Fp8Lanes<kExp, kMan>(_mm256_mul_ps(_mm256_loadu_ps(in + i + 16), vs));
      const __m256i d = Fp8Lanes<kExp, kMan>(_mm256_mul_ps(_mm256_loadu_ps(in + i + 24), vs));
      // Codes are 0..255: unsigned saturating packs keep them.
      const __m256i bytes = _mm256_packus_epi16(_mm256_packus_epi32(a, b), _mm256_packus_epi32(c, d));
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + i),
                          _mm256_permutevar8x32_epi32(bytes, order));
    }
    PortableLoops::EncodeFp8<kExp, kMan>(in + i, n - i, s, out + i);
  }
  // Fp8E4M3ToFloat / Fp8E5M2ToFloat (common/fp8.h), 8 lanes at a time,
  // through F16C: an fp8 byte moved into f16's bit positions is an f16 of
  // the same value (E5M2: f16's top byte, NaN and inf included) or of the
  // value times 2^-8 (E4M3: its 4-bit exponent in f16's 5-bit field, bias 7
  // against 15; subnormals land on f16 subnormals), which the exact
  // multiplication by 256 restores. E4M3's 0x7f is NaN.
  template <int kExp>
  GS_CODEC_AVX2 static __m256 Fp8Widen(__m128i bytes8) {
    const __m128i b = _mm_cvtepu8_epi16(bytes8);
    if constexpr (kExp == 5) return _mm256_cvtph_ps(_mm_slli_epi16(b, 8));
    const __m128i sign = _mm_slli_epi16(_mm_and_si128(b, _mm_set1_epi16(0x80)), 8);
    const __m128i mag = _mm_and_si128(b, _mm_set1_epi16(0x7f));
    const __m256 v = _mm256_mul_ps(_mm256_cvtph_ps(_mm_or_si128(_mm_slli_epi16(mag, 7), sign)),
                                   _mm256_set1_ps(256.0f));
    const __m256i nan = _mm256_cvtepi16_epi32(_mm_cmpeq_epi16(mag, _mm_set1_epi16(0x7f)));
    const __m256 quiet = _mm256_or_ps(_mm256_castsi256_ps(_mm256_set1_epi32(0x7fc00000)),
                                      _mm256_and_ps(v, _mm256_set1_ps(-0.0f)));  // signed
    return _mm256_blendv_ps(v, quiet, _mm256_castsi256_ps(nan));
  }
  template <int kExp>
  GS_CODEC_AVX2 static void DecodeFp8(const uint8_t* in, size_t n, float inv, float* out,
                                      bool add) {
    const __m256 vinv = _mm256_set1_ps(inv);
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {
      int64_t bytes;
      std::memcpy(&bytes, in + i, sizeof(bytes));
      const __m256 v = _mm256_mul_ps(Fp8Widen<kExp>(_mm_cvtsi64_si128(bytes)), vinv);
      _mm256_storeu_ps(out + i, add ? _mm256_add_ps(_mm256_loadu_ps(out + i), v) : v);
    }
    PortableLoops::DecodeFp8<kExp>(in + i, n - i, inv, out + i, add);
  }
  GS_CODEC_AVX2 static void EncodeBf16(const float* in, size_t n, uint16_t* out) {
    auto lanes = [](const float* p) GS_CODEC_AVX2 {
      const __m256i u = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
      const __m256i odd = _mm256_and_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(1));
      const __m256i rounded = _mm256_srli_epi32(
          _mm256_add_epi32(_mm256_add_epi32(u, _mm256_set1_epi32(0x7fff)), odd), 16);
      const __m256i quiet = _mm256_or_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(0x40));
      const __m256i nan = _mm256_cmpgt_epi32(_mm256_and_si256(u, _mm256_set1_epi32(0x7fffffff)),
                                             _mm256_set1_epi32(0x7f800000));
      return _mm256_blendv_epi8(rounded, quiet, nan);
    };
    size_t i = 0;
    for (; i + 16 <= n; i += 16) {
      const __m256i packed = _mm256_packus_epi32(lanes(in + i), lanes(in + i + 8));
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + i),
                          _mm256_permute4x64_epi64(packed, 0xd8));
    }
    PortableLoops::EncodeBf16(in + i, n - i, out + i);
  }
};
#endif

// ---------------------------------------------------------------------------
// The codecs over a run of blocks, with one ISA's loops.

template <class L>
GS_CODEC_INLINE void EncodePow2Run(DType type, const float* in, size_t n, char* out,
                                   size_t scale_bytes) {
  for (size_t b = 0, begin = 0; begin < n; ++b, begin += kCodecBlockElements) {
    const size_t len = std::min(kCodecBlockElements, n - begin);
    const float s = ChunkScale(type, L::Amax(in + begin, len));
    std::memcpy(out + b * sizeof(float), &s, sizeof(s));
    char* payload = out + scale_bytes;
    if (type == DType::kF16) {
      L::EncodeF16(in + begin, len, s, reinterpret_cast<uint16_t*>(payload) + begin);
    } else {
      uint8_t* o = reinterpret_cast<uint8_t*>(payload) + begin;
      if (type == DType::kF8E4M3) {
        L::template EncodeFp8<4, 3>(in + begin, len, s, o);
      } else {
        L::template EncodeFp8<5, 2>(in + begin, len, s, o);
      }
    }
  }
}

template <class L>
GS_CODEC_INLINE void DecodePow2Run(DType type, const char* in, size_t n, float* out,
                                   size_t scale_bytes, bool add) {
  for (size_t b = 0, begin = 0; begin < n; ++b, begin += kCodecBlockElements) {
    const size_t len = std::min(kCodecBlockElements, n - begin);
    const float inv = 1.0f / LoadScale(in + b * sizeof(float));
    const char* payload = in + scale_bytes;
    if (type == DType::kF16) {
      L::DecodeF16(reinterpret_cast<const uint16_t*>(payload) + begin, len, inv, out + begin, add);
    } else {
      const uint8_t* p = reinterpret_cast<const uint8_t*>(payload) + begin;
      if (type == DType::kF8E4M3) {
        L::template DecodeFp8<4>(p, len, inv, out + begin, add);
      } else {
        L::template DecodeFp8<5>(p, len, inv, out + begin, add);
      }
    }
  }
}

template <class L>
GS_CODEC_INLINE void EncodeInt8Run(const float* in, size_t n, char* out, size_t scale_bytes) {
  int8_t* payload = reinterpret_cast<int8_t*>(out + scale_bytes);
  for (size_t b = 0, begin = 0; begin < n; ++b, begin += kCodecBlockElements) {
    const size_t len = std::min(kCodecBlockElements, n - begin);
    const float amax = L::Amax(in + begin, len);
    float step = amax / 127.0f;
    if (!(step > 0)) step = amax > 0 ? std::numeric_limits<float>::denorm_min() : 1.0f;
    std::memcpy(out + b * sizeof(float), &step, sizeof(step));
    L::EncodeInt8(in + begin, len, step, payload + begin);
  }
}

template <class L>
GS_CODEC_INLINE void DecodeInt8Run(const char* in, size_t n, float* out, size_t scale_bytes,
                                   bool add) {
  const int8_t* payload = reinterpret_cast<const int8_t*>(in + scale_bytes);
  for (size_t b = 0, begin = 0; begin < n; ++b, begin += kCodecBlockElements) {
    const size_t len = std::min(kCodecBlockElements, n - begin);
    L::DecodeInt8(payload + begin, len, LoadScale(in + b * sizeof(float)), out + begin, add);
  }
}

void EncodePow2Portable(DType t, const float* in, size_t n, char* out, size_t sb) {
  EncodePow2Run<PortableLoops>(t, in, n, out, sb);
}
void DecodePow2Portable(DType t, const char* in, size_t n, float* out, size_t sb, bool add) {
  DecodePow2Run<PortableLoops>(t, in, n, out, sb, add);
}
void EncodeInt8Portable(const float* in, size_t n, char* out, size_t sb) {
  EncodeInt8Run<PortableLoops>(in, n, out, sb);
}
void DecodeInt8Portable(const char* in, size_t n, float* out, size_t sb, bool add) {
  DecodeInt8Run<PortableLoops>(in, n, out, sb, add);
}
#if GRADSYNC_CODEC_X86
GS_CODEC_AVX2 void EncodePow2Avx2(DType t, const float* in, size_t n, char* out, size_t sb) {
  EncodePow2Run<Avx2Loops>(t, in, n, out, sb);
}
GS_CODEC_AVX2 void DecodePow2Avx2(DType t, const char* in, size_t n, float* out, size_t sb,
                                  bool add) {
  DecodePow2Run<Avx2Loops>(t, in, n, out, sb, add);
}
GS_CODEC_AVX2 void EncodeInt8Avx2(const float* in, size_t n, char* out, size_t sb) {
  EncodeInt8Run<Avx2Loops>(in, n, out, sb);
}
GS_CODEC_AVX2 void DecodeInt8Avx2(const char* in, size_t n, float* out, size_t sb, bool add) {
  DecodeInt8Run<Avx2Loops>(in, n, out, sb, add);
}
#endif

void EncodeBf16With(Isa isa, const float* in, size_t n, uint16_t* out) {
#if GRADSYNC_CODEC_X86
  if (isa == Isa::kAvx2) return Avx2Loops::EncodeBf16(in, n, out);
#endif
  PortableLoops::EncodeBf16(in, n, out);
}

// bf16 without scales: round to nearest even (the decoding vectorizes as it is).
class Bf16Codec final : public Codec {
 public:
  explicit Bf16Codec(Isa isa) : isa_(isa) {}
  CodecId id() const override { return CodecId::kBf16; }
  size_t element_bytes() const override { return 2; }
  bool scaled() const override { return false; }
  double RelativeBound() const override { return 1.0 / 256; }
  void Encode(const float* in, size_t n, char* out) const override {
    EncodeBf16With(isa_, in, n, reinterpret_cast<uint16_t*>(out));
  }
  void Decode(const char* in, size_t n, float* out) const override {
    const uint16_t* p = reinterpret_cast<const uint16_t*>(in);
    for (size_t i = 0; i < n; ++i) out[i] = BFloat16ToFloat(p[i]);
  }
  void DecodeAdd(const char* in, size_t n, float* inout) const override {
    const uint16_t* p = reinterpret_cast<const uint16_t*>(in);
    for (size_t i = 0; i < n; ++i) inout[i] += BFloat16ToFloat(p[i]);
  }

 private:
  const Isa isa_;
};

// fp16 and fp8: a power-of-two scale per block (kernels/scaled_convert.h).
class PowerOfTwoCodec final : public Codec {
 public:
  PowerOfTwoCodec(CodecId id, DType type, double bound, Isa isa)
      : id_(id), type_(type), bound_(bound), isa_(isa) {}
  CodecId id() const override { return id_; }
  size_t element_bytes() const override { return DTypeSize(type_); }
  bool scaled() const override { return true; }
  double RelativeBound() const override { return bound_; }
  void Encode(const float* in, size_t n, char* out) const override {
#if GRADSYNC_CODEC_X86
    if (isa_ == Isa::kAvx2) return EncodePow2Avx2(type_, in, n, out, ScaleBytes(n));
#endif
    EncodePow2Portable(type_, in, n, out, ScaleBytes(n));
  }
  void Decode(const char* in, size_t n, float* out) const override { Run(in, n, out, false); }
  void DecodeAdd(const char* in, size_t n, float* inout) const override {
    Run(in, n, inout, true);
  }

 private:
  void Run(const char* in, size_t n, float* out, bool add) const {
#if GRADSYNC_CODEC_X86
    if (isa_ == Isa::kAvx2) return DecodePow2Avx2(type_, in, n, out, ScaleBytes(n), add);
#endif
    DecodePow2Portable(type_, in, n, out, ScaleBytes(n), add);
  }
  const CodecId id_;
  const DType type_;
  const double bound_;
  const Isa isa_;
};

// int8: the block's step is amax/127; -128 carries a non-finite value.
class Int8Codec final : public Codec {
 public:
  explicit Int8Codec(Isa isa) : isa_(isa) {}
  CodecId id() const override { return CodecId::kInt8; }
  size_t element_bytes() const override { return 1; }
  bool scaled() const override { return true; }
  double RelativeBound() const override { return 1.0 / 254 * (1 + 1.0 / 16384); }
  void Encode(const float* in, size_t n, char* out) const override {
#if GRADSYNC_CODEC_X86
    if (isa_ == Isa::kAvx2) return EncodeInt8Avx2(in, n, out, ScaleBytes(n));
#endif
    EncodeInt8Portable(in, n, out, ScaleBytes(n));
  }
  void Decode(const char* in, size_t n, float* out) const override { Run(in, n, out, false); }
  void DecodeAdd(const char* in, size_t n, float* inout) const override {
    Run(in, n, inout, true);
  }

 private:
  void Run(const char* in, size_t n, float* out, bool add) const {
#if GRADSYNC_CODEC_X86
    if (isa_ == Isa::kAvx2) return DecodeInt8Avx2(in, n, out, ScaleBytes(n), add);
#endif
    DecodeInt8Portable(in, n, out, ScaleBytes(n), add);
  }
  const Isa isa_;
};

// Every codec for one ISA.
struct CodecSet {
  explicit CodecSet(Isa isa)
      : bf16(isa),
        fp16(CodecId::kFp16, DType::kF16, 1.0 / 2048 + std::ldexp(1.0, -40), isa),
        e4m3(CodecId::kFp8E4M3, DType::kF8E4M3, 1.0 / 16 + std::ldexp(1.0, -17), isa),
        e5m2(CodecId::kFp8E5M2, DType::kF8E5M2, 1.0 / 8 + std::ldexp(1.0, -32), isa),
        int8(isa) {}
  const Codec* Get(CodecId id) const {
    switch (id) {
      case CodecId::kBf16: return &bf16;
      case CodecId::kFp16: return &fp16;
      case CodecId::kFp8E4M3: return &e4m3;
      case CodecId::kFp8E5M2: return &e5m2;
      case CodecId::kInt8: return &int8;
      case CodecId::kNone: break;
    }
    return nullptr;
  }
  Bf16Codec bf16;
  PowerOfTwoCodec fp16, e4m3, e5m2;
  Int8Codec int8;
};

}  // namespace

namespace internal {

const Codec* CodecFor(CodecId id, Isa isa) {
  static const CodecSet portable(Isa::kPortable);
#if GRADSYNC_CODEC_X86
  static const CodecSet avx2(Isa::kAvx2);
  if (isa == Isa::kAvx2) return avx2.Get(id);
#endif
  return portable.Get(id);
}

}  // namespace internal

const Codec* CodecFor(CodecId id) { return internal::CodecFor(id, internal::ActiveIsa()); }

}  // namespace gradsync
