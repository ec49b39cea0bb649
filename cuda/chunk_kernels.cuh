// What the per-chunk kernels of the scaled conversions (convert_kernels.cu)
// and the wire codecs (codec_kernels.cu) share: a chunk's largest finite
// magnitude computed by one CUDA block, its power-of-two scale, and the grid
// of their grid-stride passes. nvcc only.
#ifndef GRADSYNC_CUDA_CHUNK_KERNELS_CUH_
#define GRADSYNC_CUDA_CHUNK_KERNELS_CUH_

#include <cfloat>
#include <cstddef>

namespace gradsync {
namespace cuda {
namespace internal {

// max |in[i]| over finite in[begin, end), 0 if none. Every thread of the
// block calls it and gets the result; kThreads is the block size (a power of
// two).
template <int kThreads>
__device__ __forceinline__ float BlockAmax(const float* in, size_t begin, size_t end) {
  __shared__ float partial[kThreads];
  float m = 0;
  for (size_t i = begin + threadIdx.x; i < end; i += kThreads) {
    const float a = fabsf(in[i]);
    if (a <= FLT_MAX && a > m) m = a;
  }
  partial[threadIdx.x] = m;
  __syncthreads();
  for (int w = kThreads / 2; w > 0; w /= 2) {
    if (threadIdx.x < w && partial[threadIdx.x + w] > partial[threadIdx.x]) {
      partial[threadIdx.x] = partial[threadIdx.x + w];
    }
    __syncthreads();
  }
  const float amax = partial[0];
  __syncthreads();  // partial may be reused by the caller's next call
  return amax;
}

// kernels/scaled_convert.h's ChunkScale: 2^(e-1) from frexpf(max_finite /
// amax) (e = 127 when the quotient overflows), clamped to [2^-126, 2^126];
// 1 for an amax of 0.
__device__ __forceinline__ float Pow2Scale(float max_finite, float amax) {
  if (!(amax > 0)) return 1.0f;
  const float q = __fdiv_rn(max_finite, amax);  // inf for a tiny amax
  int e = 127;
  if (q <= FLT_MAX) frexpf(q, &e);
  e = e - 1 < -126 ? -126 : (e - 1 > 126 ? 126 : e - 1);
  return ldexpf(1.0f, e);
}

// Blocks of kThreads for a grid-stride pass over n elements: one per
// kThreads elements, at least one, at most 65535 * 32.
template <int kThreads>
unsigned GridStrideBlocks(size_t n) {
  const size_t b = (n + kThreads - 1) / kThreads;
  return static_cast<unsigned>(b < 65535u * 32 ? (b == 0 ? 1 : b) : 65535u * 32);
}

}  // namespace internal
}  // namespace cuda
}  // namespace gradsync

#endif  // GRADSYNC_CUDA_CHUNK_KERNELS_CUH_
