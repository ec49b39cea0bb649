// f32 <-> f16/bf16/fp8 with a power-of-two scale per chunk of elements, the
// CUDA twin of kernels/scaled_convert.h, bit for bit: the chunk's amax skips
// NaN and inf, scale = 2^(e-1) from frexpf(MaxFinite / amax) (e = 127 when the
// quotient overflows) clamped to [2^-126, 2^126] (1 for an empty amax),
// encode rounds in * scale to nearest
// even (fp8 saturating), decode divides by the scale. Compiled by nvcc
// (genrule //cuda:cuda_objs); nvcc's IEEE defaults (-prec-div=true,
// -ftz=false) keep the division and the products identical to the CPU's.
//
// Layout: one block per chunk finds its amax (a block-wide max) and writes the
// scale; then one grid-stride pass converts, each element reading its chunk's
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

__device__ __forceinline__ float MaxFiniteOf(int dtype) {
  switch (dtype) {
    case kF16: return 65504.0f;
    case kBF16: return 3.38953139e38f;
    case kF8E4M3: return 448.0f;
    default: return 57344.0f;  // kF8E5M2
  }
}

__global__ void __launch_bounds__(kThreads)
    ChunkScales(int dtype, const float* in, size_t n, size_t chunk, float* scales) {
  const size_t begin = static_cast<size_t>(blockIdx.x) * chunk;
  const size_t end = begin + chunk < n ? begin + chunk : n;
  const float amax = BlockAmax<kThreads>(in, begin, end);
  if (threadIdx.x == 0) scales[blockIdx.x] = Pow2Scale(MaxFiniteOf(dtype), amax);
}

template <typename Tr>
__global__ void __launch_bounds__(kThreads)
    Encode(const float* in, size_t n, size_t chunk, const float* scales,
           typename Tr::Storage* out) {
  for (size_t i = blockIdx.x * static_cast<size_t>(kThreads) + threadIdx.x; i < n;
       i += static_cast<size_t>(gridDim.x) * kThreads) {
    out[i] = Tr::Store(__fmul_rn(in[i], scales[i / chunk]));
  }
}

template <typename Tr>
__global__ void __launch_bounds__(kThreads)
    Decode(const typename Tr::Storage* in, size_t n, size_t chunk, const float* scales,
           float* out) {
  for (size_t i = blockIdx.x * static_cast<size_t>(kThreads) + threadIdx.x; i < n;
       i += static_cast<size_t>(gridDim.x) * kThreads) {
    out[i] = __fdiv_rn(Tr::Load(in[i]), scales[i / chunk]);
  }
}

unsigned Blocks(size_t n) { return GridStrideBlocks<kThreads>(n); }

template <typename Tr>
int EncodeTyped(const float* in, size_t n, size_t chunk, float* scales, void* out,
                cudaStream_t s) {
  Encode<Tr><<<Blocks(n), kThreads, 0, s>>>(in, n, chunk, scales,
                                               static_cast<typename Tr::Storage*>(out));
  return static_cast<int>(cudaGetLastError());
}

template <typename Tr>
int DecodeTyped(const void* in, size_t n, size_t chunk, const float* scales, float* out,
                cudaStream_t s) {
  Decode<Tr><<<Blocks(n), kThreads, 0, s>>>(static_cast<const typename Tr::Storage*>(in), n,
                                               chunk, scales, out);
  return static_cast<int>(cudaGetLastError());
}

}  // namespace

int LaunchEncodeScaled(int dtype, const float* in, size_t n, size_t chunk, float* scales,
                       void* out, void* stream) {
  if (n == 0) return 0;
  if (chunk == 0) return static_cast<int>(cudaErrorInvalidValue);
  const size_t chunks = (n + chunk - 1) / chunk;
  if (chunks > 0x7fffffffu) return static_cast<int>(cudaErrorInvalidValue);
  cudaStream_t s = static_cast<cudaStream_t>(stream);
  ChunkScales<<<static_cast<unsigned>(chunks), kThreads, 0, s>>>(dtype, in, n, chunk, scales);
  if (int e = static_cast<int>(cudaGetLastError()); e != 0) return e;
  switch (dtype) {
    case kF16: return EncodeTyped<HalfTraits>(in, n, chunk, scales, out, s);
    case kBF16: return EncodeTyped<BFloat16Traits>(in, n, chunk, scales, out, s);
    case kF8E4M3: return EncodeTyped<Fp8Traits<__NV_E4M3>>(in, n, chunk, scales, out, s);
    case kF8E5M2: return EncodeTyped<Fp8Traits<__NV_E5M2>>(in, n, chunk, scales, out, s);
    default: return static_cast<int>(cudaErrorInvalidValue);
  }
}

int LaunchDecodeScaled(int dtype, const void* in, size_t n, size_t chunk, const float* scales,
                       float* out, void* stream) {
  if (n == 0) return 0;
  if (chunk == 0) return static_cast<int>(cudaErrorInvalidValue);
  cudaStream_t s = static_cast<cudaStream_t>(stream);
  switch (dtype) {
    case kF16: return DecodeTyped<HalfTraits>(in, n, chunk, scales, out, s);
    case kBF16: return DecodeTyped<BFloat16Traits>(in, n, chunk, scales, out, s);
    case kF8E4M3: return DecodeTyped<Fp8Traits<__NV_E4M3>>(in, n, chunk, scales, out, s);
    case kF8E5M2: return DecodeTyped<Fp8Traits<__NV_E5M2>>(in, n, chunk, scales, out, s);
    default: return static_cast<int>(cudaErrorInvalidValue);
  }
}

}  // namespace internal
}  // namespace cuda
}  // namespace gradsync
