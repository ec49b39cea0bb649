// 8-bit floats of the OCP OFP8 formats, as raw bytes, and their f32 conversions.
//
//   E4M3 (DType::kF8E4M3): 1 sign, 4 exponent (bias 7), 3 mantissa bits; no
//     infinities; S.1111.111 is NaN; largest finite 448, smallest subnormal 2^-9.
//   E5M2 (DType::kF8E5M2): 1 sign, 5 exponent (bias 15), 2 mantissa bits; IEEE
//     infinities and NaNs; largest finite 57344, smallest subnormal 2^-16.
//
// Widening to f32 is exact. Narrowing rounds to nearest even and saturates: a
// finite value beyond the largest finite one (after rounding) and an infinity
// become the largest finite value of that sign, as CUDA's
// __nv_cvt_float_to_fp8(x, __NV_SATFINITE, ...) does (CudaFp8.CpuConversionMatchesTheToolkitBitForBit
// in cuda/cuda_reduce_test.cc checks it bit for bit). Gradients overflowing to ±max rather than to inf/NaN is
// what mixed-precision training expects. Every NaN becomes the canonical 0x7f
// (positive, all ones; a quiet NaN in E5M2), as CUDA makes it.
// Values that round to zero keep their sign.
#ifndef GRADSYNC_COMMON_FP8_H_
#define GRADSYNC_COMMON_FP8_H_

#include <cstdint>
#include <cstring>

namespace gradsync {
namespace fp8_internal {

inline uint32_t Bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, sizeof(u));
  return u;
}
inline float FromBits(uint32_t u) {
  float f;
  std::memcpy(&f, &u, sizeof(f));
  return f;
}

// kExp exponent bits, kMan mantissa bits, bias 2^(kExp-1)-1.
template <int kExp, int kMan>
struct Format {
  static constexpr int kBias = (1 << (kExp - 1)) - 1;
  // |x| with an f32 exponent field at or above this is normal in the format.
  static constexpr uint32_t kMinNormalBits = static_cast<uint32_t>(127 - kBias + 1) << 23;
};

// The rounding step shared by both formats, for a finite |x| (bits `a`) below the
// saturation threshold: the format's magnitude code.
template <int kExp, int kMan>
inline uint8_t RoundMagnitude(uint32_t a) {
  using F = Format<kExp, kMan>;
  if (a >= F::kMinNormalBits) {
    // Round the f32 mantissa to kMan bits, nearest even; a carry moves into the
    // exponent, which is what rounding up to the next binade means.
    constexpr int kShift = 23 - kMan;
    const uint32_t rounded = (a + ((1u << (kShift - 1)) - 1) + ((a >> kShift) & 1u)) >> kShift;
    return static_cast<uint8_t>(rounded - (static_cast<uint32_t>(127 - F::kBias) << kMan));
  }
  // Subnormal in the format: the value in units of its smallest subnormal,
  // 2^(1 - bias - kMan). Scaling by a power of two is exact; adding and removing
  // 2^23 rounds to the nearest integer, ties to even (the default rounding mode).
  const float units = FromBits(a) * FromBits(static_cast<uint32_t>(127 + F::kBias - 1 + kMan) << 23);
  const float biased = units + 8388608.0f;  // no fast-math: not folded away
  const float q = biased - 8388608.0f;
  return static_cast<uint8_t>(q);  // 0 .. 2^kMan; 2^kMan is the smallest normal's code
}

}  // namespace fp8_internal

inline float Fp8E4M3ToFloat(uint8_t b) {
  const uint32_t sign = static_cast<uint32_t>(b & 0x80u) << 24;
  const uint32_t exp = (b >> 3) & 0xfu, man = b & 0x7u;
  if (exp == 0xf && man == 0x7) return fp8_internal::FromBits(sign | 0x7fc00000u);
  if (exp == 0) {
    const float v = static_cast<float>(man) * (1.0f / 512.0f);  // man * 2^-9, exact
    return sign ? -v : v;
  }
  return fp8_internal::FromBits(sign | ((exp - 7 + 127) << 23) | (man << 20));
}

inline float Fp8E5M2ToFloat(uint8_t b) {
  const uint32_t sign = static_cast<uint32_t>(b & 0x80u) << 24;
  const uint32_t exp = (b >> 2) & 0x1fu, man = b & 0x3u;
  if (exp == 0x1f) {
    return fp8_internal::FromBits(sign | 0x7f800000u | (man ? 0x400000u | (man << 21) : 0u));
  }
  if (exp == 0) {
    const float v = static_cast<float>(man) * (1.0f / 65536.0f);  // man * 2^-16, exact
    return sign ? -v : v;
  }
  return fp8_internal::FromBits(sign | ((exp - 15 + 127) << 23) | (man << 21));
}

inline uint8_t FloatToFp8E4M3(float f) {
  const uint32_t u = fp8_internal::Bits(f);
  const uint8_t sign = static_cast<uint8_t>((u >> 24) & 0x80u);
  const uint32_t a = u & 0x7fffffffu;
  if (a > 0x7f800000u) return 0x7fu;                     // NaN: the canonical one
  if (a > 0x43e80000u) return sign | 0x7eu;              // > 464 = 448 + ulp/2: saturate
  return sign | fp8_internal::RoundMagnitude<4, 3>(a);  // 464 itself rounds to even, 448
}

inline uint8_t FloatToFp8E5M2(float f) {
  const uint32_t u = fp8_internal::Bits(f);
  const uint8_t sign = static_cast<uint8_t>((u >> 24) & 0x80u);
  const uint32_t a = u & 0x7fffffffu;
  if (a > 0x7f800000u) return 0x7fu;          // NaN: the canonical one
  if (a >= 0x47700000u) return sign | 0x7bu;  // >= 61440 = 57344 + ulp/2 (would round to inf)
  return sign | fp8_internal::RoundMagnitude<5, 2>(a);
}

}  // namespace gradsync

#endif  // GRADSYNC_COMMON_FP8_H_
