// Element traits of the CPU reduction kernels: storage type S, compute type C, an
// exact Load (S -> C) and a rounding Store (C -> S) per DType.
// Internal to kernels/ (cpu_reduce.cc); not part of its API.
#ifndef GRADSYNC_KERNELS_ELEMENT_TRAITS_H_
#define GRADSYNC_KERNELS_ELEMENT_TRAITS_H_

#include <cstdint>
#include <cstring>

#include "common/fp8.h"
#include "common/types.h"

#define GS_ALWAYS_INLINE inline __attribute__((always_inline))

namespace gradsync {
namespace kernels_internal {

template <typename T>
struct PlainTraits {
  using S = T;
  using C = T;
  static GS_ALWAYS_INLINE C Load(S x) { return x; }
  static GS_ALWAYS_INLINE S Store(C x) { return x; }
};
using F32Traits = PlainTraits<float>;
using F64Traits = PlainTraits<double>;
using I32Traits = PlainTraits<int32_t>;
using I64Traits = PlainTraits<int64_t>;
using U8Traits = PlainTraits<uint8_t>;

// Same arithmetic as BFloat16ToFloat / FloatToBFloat16 in common/types.h,
// spelled out here so it is always inlined into the vectorized loops.
struct Bf16Traits {
  using S = uint16_t;
  using C = float;
  static GS_ALWAYS_INLINE float Load(uint16_t b) {
    const uint32_t u = static_cast<uint32_t>(b) << 16;
    float f;
    std::memcpy(&f, &u, sizeof(f));
    return f;
  }
  static GS_ALWAYS_INLINE uint16_t Store(float f) {
    uint32_t u;
    std::memcpy(&u, &f, sizeof(u));
    const uint32_t rounded = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
    const uint32_t quiet_nan = (u >> 16) | 0x40u;
    return static_cast<uint16_t>((u & 0x7fffffffu) > 0x7f800000u ? quiet_nan : rounded);
  }
};

struct F16Traits {
  using S = uint16_t;
  using C = float;
  static GS_ALWAYS_INLINE float Load(uint16_t h) { return HalfToFloat(h); }
  static GS_ALWAYS_INLINE uint16_t Store(float f) { return FloatToHalf(f); }
};

// fp8: widened to f32 (exact), rounded back with saturation (common/fp8.h).
struct F8E4M3Traits {
  using S = uint8_t;
  using C = float;
  static GS_ALWAYS_INLINE float Load(uint8_t b) { return Fp8E4M3ToFloat(b); }
  static GS_ALWAYS_INLINE uint8_t Store(float f) { return FloatToFp8E4M3(f); }
};

struct F8E5M2Traits {
  using S = uint8_t;
  using C = float;
  static GS_ALWAYS_INLINE float Load(uint8_t b) { return Fp8E5M2ToFloat(b); }
  static GS_ALWAYS_INLINE uint8_t Store(float f) { return FloatToFp8E5M2(f); }
};

}  // namespace kernels_internal
}  // namespace gradsync

#endif  // GRADSYNC_KERNELS_ELEMENT_TRAITS_H_
