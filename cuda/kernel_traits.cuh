// Element traits of the CUDA kernels (reduce_kernels.cu, convert_kernels.cu):
// each storage type, the type it is computed in, and the conversions between
// them (f16/bf16/fp8 round to nearest even; fp8 saturates, as common/fp8.h).
// nvcc only.
#ifndef GRADSYNC_CUDA_KERNEL_TRAITS_CUH_
#define GRADSYNC_CUDA_KERNEL_TRAITS_CUH_

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include <cstdint>

namespace gradsync {
namespace cuda {
namespace internal {

template <typename S, typename U>
struct IntTraits {
  using Storage = S;
  using Unsigned = U;  // wraparound arithmetic is done here
  static constexpr bool kIsFloat = false;
};

template <typename S>
struct NativeFloatTraits {
  using Storage = S;
  using Compute = S;
  static constexpr bool kIsFloat = true;
  __device__ __forceinline__ static Compute Load(Storage x) { return x; }
  __device__ __forceinline__ static Storage Store(Compute x) { return x; }
};

struct HalfTraits {
  using Storage = uint16_t;  // raw IEEE binary16 bits
  using Compute = float;
  static constexpr bool kIsFloat = true;
  __device__ __forceinline__ static float Load(uint16_t x) {
    return __half2float(__ushort_as_half(x));
  }
  __device__ __forceinline__ static uint16_t Store(float x) {
    return __half_as_ushort(__float2half_rn(x));
  }
};

struct BFloat16Traits {
  using Storage = uint16_t;  // raw bfloat16 bits
  using Compute = float;
  static constexpr bool kIsFloat = true;
  __device__ __forceinline__ static float Load(uint16_t x) {
    return __bfloat162float(__ushort_as_bfloat16(x));
  }
  __device__ __forceinline__ static uint16_t Store(float x) {
    return __bfloat16_as_ushort(__float2bfloat16_rn(x));
  }
};

// OCP fp8, computed in f32: widening goes through f16 (exact for both formats),
// narrowing rounds to nearest even and saturates (common/fp8.h has the same rule
// for the CPU; cuda_reduce_test checks it against this toolkit's host path).
template <__nv_fp8_interpretation_t kFormat>
struct Fp8Traits {
  using Storage = uint8_t;
  using Compute = float;
  static constexpr bool kIsFloat = true;
  __device__ __forceinline__ static float Load(uint8_t x) {
    return __half2float(__half(__nv_cvt_fp8_to_halfraw(x, kFormat)));
  }
  __device__ __forceinline__ static uint8_t Store(float x) {
    return __nv_cvt_float_to_fp8(x, __NV_SATFINITE, kFormat);
  }
};

using F32Traits = NativeFloatTraits<float>;
using F64Traits = NativeFloatTraits<double>;
using I32Traits = IntTraits<int32_t, uint32_t>;
using I64Traits = IntTraits<int64_t, uint64_t>;
using U8Traits = IntTraits<uint8_t, uint8_t>;

}  // namespace internal
}  // namespace cuda
}  // namespace gradsync

#endif  // GRADSYNC_CUDA_KERNEL_TRAITS_CUH_
