// The wire codecs of kernels/codec.h on the GPU, bit for bit the CPU
// kernels' (NaN payloads aside): the same block layout
//   [scale of block 0 .. B-1][payload: n elements]
// (bf16: payload only), the same per-block scale (fp16/fp8: the scaled
// conversion's power of two; int8: step = amax/127), the same rounding, and
// every product and sum rounded on its own (__fmul_rn, __fadd_rn: never a
// fused multiply-add), as the CPU kernels do. Compiled by nvcc (genrule
// //cuda:cuda_objs).
//
// Layout: one CUDA block per codec block computes its scale; then one
// grid-stride pass encodes (or decodes), each element reading its block's
// scale.
#include <cuda_runtime.h>

#include <cfloat>
#include <cstdint>

#include "cuda/chunk_kernels.cuh"
#include "cuda/cuda_internal.h"
#include "cuda/kernel_traits.cuh"

namespace gradsync {
namespace cuda {
namespace internal {
namespace {

constexpr int kThreads = 256;

unsigned Grid(size_t n) { return GridStrideBlocks<kThreads>(n); }

#define GS_FOR_EACH(i, n)                                                               \
  for (size_t i = blockIdx.x * static_cast<size_t>(kThreads) + threadIdx.x; i < (n); \
       i += static_cast<size_t>(gridDim.x) * kThreads)

// --- int8: step = amax/127 per block, q = rint(x * (1/step)), -128 for a
// non-finite value.
__global__ void __launch_bounds__(kThreads)
    Int8Steps(const float* in, size_t n, size_t block, float* steps) {
  const size_t begin = static_cast<size_t>(blockIdx.x) * block;
  const size_t end = begin + block < n ? begin + block : n;
  const float amax = BlockAmax<kThreads>(in, begin, end);
  if (threadIdx.x == 0) {
    float step = __fdiv_rn(amax, 127.0f);
    if (!(step > 0)) step = amax > 0 ? __int_as_float(1) : 1.0f;  // denorm_min
    steps[blockIdx.x] = step;
  }
}

__global__ void __launch_bounds__(kThreads)
    Int8Encode(const float* in, size_t n, size_t block, const float* steps, int8_t* out) {
  GS_FOR_EACH(i, n) {
    const float x = in[i];
    const float step = steps[i / block];
    float inv = __fdiv_rn(1.0f, step);
    inv = inv <= FLT_MAX ? inv : 0.0f;  // 1/step overflows: divide instead
    const float scaled = inv != 0.0f ? __fmul_rn(x, inv) : __fdiv_rn(x, step);
    const float q = fminf(fmaxf(rintf(scaled), -127.0f), 127.0f);
    out[i] = fabsf(x) <= FLT_MAX ? static_cast<int8_t>(q) : int8_t{-128};
  }
}

__global__ void __launch_bounds__(kThreads)
    Int8Decode(const int8_t* in, size_t n, size_t block, const float* steps, float* out,
               bool add) {
  GS_FOR_EACH(i, n) {
    const int8_t q = in[i];
    const float v = q == -128 ? __int_as_float(0x7fc00000)
                              : __fmul_rn(static_cast<float>(q), steps[i / block]);
    out[i] = add ? __fadd_rn(out[i], v) : v;
  }
}

// --- bf16, unscaled: round to nearest even; NaN stays a quiet NaN.
__global__ void __launch_bounds__(kThreads) Bf16Encode(const float* in, size_t n, uint16_t* out) {
  GS_FOR_EACH(i, n) {
    const uint32_t u = __float_as_uint(in[i]);
    const uint32_t rounded = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
    out[i] = static_cast<uint16_t>((u & 0x7fffffffu) > 0x7f800000u ? (u >> 16) | 0x40u : rounded);
  }
}

__global__ void __launch_bounds__(kThreads)
    Bf16Decode(const uint16_t* in, size_t n, float* out, bool add) {
  GS_FOR_EACH(i, n) {
    const float v = __uint_as_float(static_cast<uint32_t>(in[i]) << 16);
    out[i] = add ? __fadd_rn(out[i], v) : v;
  }
}

// --- fp16 and fp8: decoded = element * (1/scale) (exact: a power of two).
// The encoding is the scaled conversion's (LaunchEncodeScaled).
template <typename Tr>
__global__ void __launch_bounds__(kThreads)
    Pow2Decode(const typename Tr::Storage* in, size_t n, size_t block, const float* scales,
               float* out, bool add) {
  GS_FOR_EACH(i, n) {
    const float v = __fmul_rn(Tr::Load(in[i]), __fdiv_rn(1.0f, scales[i / block]));
    out[i] = add ? __fadd_rn(out[i], v) : v;
  }
}

#undef GS_FOR_EACH

// kernels/codec.h's CodecId and its payload types.
enum CodecCode : int {
  kBf16Codec = 1,
  kFp16Codec = 2,
  kE4M3Codec = 3,
  kE5M2Codec = 4,
  kInt8Codec = 5,
};

int Pow2Type(int codec) {
  switch (codec) {
    case kFp16Codec: return kF16;
    case kE4M3Codec: return kF8E4M3;
    case kE5M2Codec: return kF8E5M2;
    default: return 0;
  }
}

template <typename Tr>
int Pow2DecodeTyped(const char* in, size_t n, size_t block, size_t scale_bytes, float* out,
                    bool add, cudaStream_t s) {
  Pow2Decode<Tr><<<Grid(n), kThreads, 0, s>>>(
      reinterpret_cast<const typename Tr::Storage*>(in + scale_bytes), n, block,
      reinterpret_cast<const float*>(in), out, add);
  return static_cast<int>(cudaGetLastError());
}

}  // namespace

int LaunchCodecEncode(int codec, const float* in, size_t n, size_t block, void* out,
                      void* stream) {
  if (n == 0) return 0;
  if (block == 0) return static_cast<int>(cudaErrorInvalidValue);
  cudaStream_t s = static_cast<cudaStream_t>(stream);
  char* bytes = static_cast<char*>(out);
  const size_t blocks = (n + block - 1) / block;
  if (blocks > 0x7fffffffu) return static_cast<int>(cudaErrorInvalidValue);
  const size_t scale_bytes = blocks * sizeof(float);
  if (codec == kBf16Codec) {
    Bf16Encode<<<Grid(n), kThreads, 0, s>>>(in, n, reinterpret_cast<uint16_t*>(bytes));
    return static_cast<int>(cudaGetLastError());
  }
  if (codec == kInt8Codec) {
    float* steps = reinterpret_cast<float*>(bytes);
    Int8Steps<<<static_cast<unsigned>(blocks), kThreads, 0, s>>>(in, n, block, steps);
    if (int e = static_cast<int>(cudaGetLastError()); e != 0) return e;
    Int8Encode<<<Grid(n), kThreads, 0, s>>>(in, n, block, steps,
                                            reinterpret_cast<int8_t*>(bytes + scale_bytes));
    return static_cast<int>(cudaGetLastError());
  }
  const int type = Pow2Type(codec);
  if (type == 0) return static_cast<int>(cudaErrorInvalidValue);
  return LaunchEncodeScaled(type, in, n, block, reinterpret_cast<float*>(bytes),
                            bytes + scale_bytes, stream);
}

int LaunchCodecDecode(int codec, const void* in, size_t n, size_t block, float* out, bool add,
                      void* stream) {
  if (n == 0) return 0;
  if (block == 0) return static_cast<int>(cudaErrorInvalidValue);
  cudaStream_t s = static_cast<cudaStream_t>(stream);
  const char* bytes = static_cast<const char*>(in);
  const size_t scale_bytes = (n + block - 1) / block * sizeof(float);
  switch (codec) {
    case kBf16Codec:
      Bf16Decode<<<Grid(n), kThreads, 0, s>>>(reinterpret_cast<const uint16_t*>(bytes), n, out,
                                              add);
      return static_cast<int>(cudaGetLastError());
    case kInt8Codec:
      Int8Decode<<<Grid(n), kThreads, 0, s>>>(reinterpret_cast<const int8_t*>(bytes + scale_bytes),
                                              n, block, reinterpret_cast<const float*>(bytes),
                                              out, add);
      return static_cast<int>(cudaGetLastError());
    case kFp16Codec: return Pow2DecodeTyped<HalfTraits>(bytes, n, block, scale_bytes, out, add, s);
    case kE4M3Codec:
      return Pow2DecodeTyped<Fp8Traits<__NV_E4M3>>(bytes, n, block, scale_bytes, out, add, s);
    case kE5M2Codec:
      return Pow2DecodeTyped<Fp8Traits<__NV_E5M2>>(bytes, n, block, scale_bytes, out, add, s);
    default: return static_cast<int>(cudaErrorInvalidValue);
  }
}

}  // namespace internal
}  // namespace cuda
}  // namespace gradsync
