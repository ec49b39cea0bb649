// Elementwise reduction kernels: dst[i] = dst[i] OP src[i], and in-place division
// (the second half of an average). Compiled by nvcc (genrule //cuda:cuda_objs).
//
// Semantics match the CPU kernels bit for bit:
//   - f32 / f64 compute in their own type; f16 / bf16 are widened to f32, combined,
//     and rounded back to nearest-even per element (no accumulation in f16);
//   - integers wrap around (computed in the unsigned type of the same width);
//   - min is (a < b ? a : b) and max is (a > b ? a : b), so a NaN in `src` is
//     kept only when the comparison says so, exactly like the scalar code;
//   - kAvg reduces as kSum; the caller divides once at the end (LaunchDivide);
//   - division: floats x / float(divisor) in the compute type (IEEE, so a zero
//     divisor gives inf/NaN), integers the exact quotient truncated toward zero
//     and wrapped (INT64_MIN / -1 == INT64_MIN).
// No fast-math: nvcc's defaults (-prec-div=true, -ftz=false) give IEEE results,
// and neither the ternaries nor + / * may be contracted or reassociated.
//
// Layout of one launch: a grid-stride loop over 16-byte packs (one uint4 load per
// operand per pack) in the aligned middle of the range, plus scalar grid-stride
// loops over the unaligned head and the tail. When dst and src differ in their
// offset modulo 16 the whole range is scalar (still coalesced).
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "cuda/cuda_internal.h"
#include "cuda/kernel_traits.cuh"

namespace gradsync {
namespace cuda {
namespace internal {
namespace {

constexpr int kThreadsPerBlock = 256;
constexpr int kBlocksPerSm = 8;  // 8 x 256 = 2048 resident threads per SM (sm_80/sm_90)
constexpr size_t kPackBytes = 16;

// --- the per-element operations ---------------------------------------------

template <typename Tr, int Op>
__device__ __forceinline__ typename Tr::Storage ApplyOp(typename Tr::Storage a,
                                                        typename Tr::Storage b) {
  using S = typename Tr::Storage;
  if constexpr (Tr::kIsFloat) {
    using C = typename Tr::Compute;
    const C x = Tr::Load(a);
    const C y = Tr::Load(b);
    C r;
    if constexpr (Op == kSum) {
      r = x + y;
    } else if constexpr (Op == kProd) {
      r = x * y;
    } else if constexpr (Op == kMin) {
      r = x < y ? x : y;
    } else {
      static_assert(Op == kMax, "unknown op");
      r = x > y ? x : y;
    }
    return Tr::Store(r);
  } else {
    using U = typename Tr::Unsigned;
    if constexpr (Op == kSum) {
      return static_cast<S>(static_cast<U>(static_cast<U>(a) + static_cast<U>(b)));
    } else if constexpr (Op == kProd) {
      return static_cast<S>(static_cast<U>(static_cast<U>(a) * static_cast<U>(b)));
    } else if constexpr (Op == kMin) {
      return a < b ? a : b;
    } else {
      static_assert(Op == kMax, "unknown op");
      return a > b ? a : b;
    }
  }
}

template <typename Tr>
__device__ __forceinline__ typename Tr::Storage DivideOp(typename Tr::Storage a, int64_t divisor,
                                                         double divisor_f64, float divisor_f32) {
  using S = typename Tr::Storage;
  if constexpr (Tr::kIsFloat) {
    using C = typename Tr::Compute;
    if constexpr (sizeof(C) == sizeof(double)) {
      return Tr::Store(Tr::Load(a) / divisor_f64);
    } else {
      return Tr::Store(Tr::Load(a) / divisor_f32);
    }
  } else {
    // The exact quotient truncated toward zero, wrapped to S. divisor != 0 (checked
    // by the caller); INT64_MIN / -1 is the one int64 overflow, so -1 negates in
    // the unsigned type. Narrower types cannot overflow the int64 division.
    using U = typename Tr::Unsigned;
    if constexpr (sizeof(S) == sizeof(int64_t)) {
      if (divisor == -1) return static_cast<S>(U{0} - static_cast<U>(a));
    }
    return static_cast<S>(static_cast<int64_t>(a) / divisor);
  }
}

// A 16-byte pack, loaded and stored with one 128-bit access.
template <typename S>
union Pack {
  static constexpr int kLanes = static_cast<int>(kPackBytes / sizeof(S));
  uint4 raw;
  S lane[kLanes];
};

// --- kernels ----------------------------------------------------------------

// Elements [0, head) and [head + npacks * kLanes, count) are handled one by one;
// packs cover [head, head + npacks * kLanes), where dst + head and src + head are
// 16-byte aligned.
template <typename Tr, int Op>
__global__ void __launch_bounds__(kThreadsPerBlock)
    ReduceKernel(typename Tr::Storage* dst, const typename Tr::Storage* src, size_t head,
                 size_t npacks, size_t count) {
  using S = typename Tr::Storage;
  constexpr int kLanes = Pack<S>::kLanes;
  const size_t tid = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const size_t stride = static_cast<size_t>(gridDim.x) * blockDim.x;

  uint4* dst_packs = reinterpret_cast<uint4*>(dst + head);
  const uint4* src_packs = reinterpret_cast<const uint4*>(src + head);
  for (size_t i = tid; i < npacks; i += stride) {
    Pack<S> a;
    Pack<S> b;
    a.raw = dst_packs[i];
    b.raw = src_packs[i];
#pragma unroll
    for (int j = 0; j < kLanes; ++j) a.lane[j] = ApplyOp<Tr, Op>(a.lane[j], b.lane[j]);
    dst_packs[i] = a.raw;
  }
  for (size_t i = tid; i < head; i += stride) dst[i] = ApplyOp<Tr, Op>(dst[i], src[i]);
  for (size_t i = head + npacks * kLanes + tid; i < count; i += stride) {
    dst[i] = ApplyOp<Tr, Op>(dst[i], src[i]);
  }
}

template <typename Tr>
__global__ void __launch_bounds__(kThreadsPerBlock)
    DivideKernel(typename Tr::Storage* data, size_t head, size_t npacks, size_t count,
                 int64_t divisor, double divisor_f64, float divisor_f32) {
  using S = typename Tr::Storage;
  constexpr int kLanes = Pack<S>::kLanes;
  const size_t tid = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const size_t stride = static_cast<size_t>(gridDim.x) * blockDim.x;

  uint4* packs = reinterpret_cast<uint4*>(data + head);
  for (size_t i = tid; i < npacks; i += stride) {
    Pack<S> a;
    a.raw = packs[i];
#pragma unroll
    for (int j = 0; j < kLanes; ++j) {
      a.lane[j] = DivideOp<Tr>(a.lane[j], divisor, divisor_f64, divisor_f32);
    }
    packs[i] = a.raw;
  }
  for (size_t i = tid; i < head; i += stride) {
    data[i] = DivideOp<Tr>(data[i], divisor, divisor_f64, divisor_f32);
  }
  for (size_t i = head + npacks * kLanes + tid; i < count; i += stride) {
    data[i] = DivideOp<Tr>(data[i], divisor, divisor_f64, divisor_f32);
  }
}

// --- launch helpers -----------------------------------------------------------

struct Split {
  size_t head;    // scalar elements before the first pack
  size_t npacks;  // 16-byte packs
};

// Splits [0, count) so that the packs start 16-byte aligned in every pointer.
// Falls back to all-scalar when the pointers disagree modulo 16.
template <typename S>
Split SplitRange(const void* const* ptrs, int nptrs, size_t count) {
  constexpr size_t kLanes = kPackBytes / sizeof(S);
  const uintptr_t mis = reinterpret_cast<uintptr_t>(ptrs[0]) % kPackBytes;
  for (int i = 1; i < nptrs; ++i) {
    if (reinterpret_cast<uintptr_t>(ptrs[i]) % kPackBytes != mis) return {count, 0};
  }
  // Pointers are element-aligned (checked by the caller), so this is exact.
  const size_t head = mis == 0 ? 0 : (kPackBytes - mis) / sizeof(S);
  if (head >= count) return {count, 0};
  return {head, (count - head) / kLanes};
}

unsigned int GridSize(size_t work_items) {
  int device = 0;
  int sms = 0;
  if (cudaGetDevice(&device) != cudaSuccess ||
      cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device) != cudaSuccess ||
      sms <= 0) {
    cudaGetLastError();  // clear; a conservative grid still covers everything
    sms = 16;
  }
  const size_t max_blocks = static_cast<size_t>(sms) * kBlocksPerSm;
  size_t blocks = (work_items + kThreadsPerBlock - 1) / kThreadsPerBlock;
  if (blocks < 1) blocks = 1;
  if (blocks > max_blocks) blocks = max_blocks;
  return static_cast<unsigned int>(blocks);
}

size_t MaxWork(const Split& split, size_t count, size_t lanes) {
  const size_t tail = count - split.head - split.npacks * lanes;
  size_t work = split.npacks;
  if (split.head > work) work = split.head;
  if (tail > work) work = tail;
  return work;
}

template <typename Tr, int Op>
int LaunchReduceTyped(void* dst, const void* src, size_t count, cudaStream_t stream) {
  using S = typename Tr::Storage;
  const void* ptrs[2] = {dst, src};
  const Split split = SplitRange<S>(ptrs, 2, count);
  const unsigned int blocks = GridSize(MaxWork(split, count, Pack<S>::kLanes));
  ReduceKernel<Tr, Op><<<blocks, kThreadsPerBlock, 0, stream>>>(
      static_cast<S*>(dst), static_cast<const S*>(src), split.head, split.npacks, count);
  return static_cast<int>(cudaGetLastError());
}

template <typename Tr>
int LaunchReduceForType(int op, void* dst, const void* src, size_t count, cudaStream_t stream) {
  switch (op) {
    case kSum:
    case kAvg: return LaunchReduceTyped<Tr, kSum>(dst, src, count, stream);
    case kMin: return LaunchReduceTyped<Tr, kMin>(dst, src, count, stream);
    case kMax: return LaunchReduceTyped<Tr, kMax>(dst, src, count, stream);
    case kProd: return LaunchReduceTyped<Tr, kProd>(dst, src, count, stream);
    default: return static_cast<int>(cudaErrorInvalidValue);
  }
}

template <typename Tr, int Op>
__global__ void __launch_bounds__(kThreadsPerBlock)
    CombineKernel(typename Tr::Storage* dst, const typename Tr::Storage* a,
                  const typename Tr::Storage* b, size_t count) {
  const size_t stride = static_cast<size_t>(gridDim.x) * blockDim.x;
  for (size_t i = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < count;
       i += stride) {
    dst[i] = ApplyOp<Tr, Op>(a[i], b[i]);  // per element: aliasing dst with a or b is fine
  }
}

template <typename Tr>
int LaunchCombineForType(int op, void* dst, const void* a, const void* b, size_t count,
                         cudaStream_t stream) {
  using S = typename Tr::Storage;
  const unsigned int blocks = GridSize(count);
  S* d = static_cast<S*>(dst);
  const S* x = static_cast<const S*>(a);
  const S* y = static_cast<const S*>(b);
  switch (op) {
    case kSum:
    case kAvg: CombineKernel<Tr, kSum><<<blocks, kThreadsPerBlock, 0, stream>>>(d, x, y, count); break;
    case kMin: CombineKernel<Tr, kMin><<<blocks, kThreadsPerBlock, 0, stream>>>(d, x, y, count); break;
    case kMax: CombineKernel<Tr, kMax><<<blocks, kThreadsPerBlock, 0, stream>>>(d, x, y, count); break;
    case kProd: CombineKernel<Tr, kProd><<<blocks, kThreadsPerBlock, 0, stream>>>(d, x, y, count); break;
    default: return static_cast<int>(cudaErrorInvalidValue);
  }
  return static_cast<int>(cudaGetLastError());
}

template <typename Tr>
int LaunchDivideTyped(void* data, size_t count, int64_t divisor, cudaStream_t stream) {
  using S = typename Tr::Storage;
  const void* ptrs[1] = {data};
  const Split split = SplitRange<S>(ptrs, 1, count);
  const unsigned int blocks = GridSize(MaxWork(split, count, Pack<S>::kLanes));
  DivideKernel<Tr><<<blocks, kThreadsPerBlock, 0, stream>>>(
      static_cast<S*>(data), split.head, split.npacks, count, divisor, static_cast<double>(divisor),
      static_cast<float>(divisor));
  return static_cast<int>(cudaGetLastError());
}

}  // namespace

int LaunchReduce(int dtype, int op, void* dst, const void* src, size_t count, void* stream) {
  if (count == 0) return static_cast<int>(cudaSuccess);
  cudaStream_t s = static_cast<cudaStream_t>(stream);
  switch (dtype) {
    case kF32: return LaunchReduceForType<F32Traits>(op, dst, src, count, s);
    case kF64: return LaunchReduceForType<F64Traits>(op, dst, src, count, s);
    case kF16: return LaunchReduceForType<HalfTraits>(op, dst, src, count, s);
    case kBF16: return LaunchReduceForType<BFloat16Traits>(op, dst, src, count, s);
    case kI32: return LaunchReduceForType<I32Traits>(op, dst, src, count, s);
    case kI64: return LaunchReduceForType<I64Traits>(op, dst, src, count, s);
    case kU8: return LaunchReduceForType<U8Traits>(op, dst, src, count, s);
    case kF8E4M3: return LaunchReduceForType<Fp8Traits<__NV_E4M3>>(op, dst, src, count, s);
    case kF8E5M2: return LaunchReduceForType<Fp8Traits<__NV_E5M2>>(op, dst, src, count, s);
    default: return static_cast<int>(cudaErrorInvalidValue);
  }
}

int LaunchCombine(int dtype, int op, void* dst, const void* a, const void* b, size_t count,
                  void* stream) {
  if (count == 0) return static_cast<int>(cudaSuccess);
  cudaStream_t s = static_cast<cudaStream_t>(stream);
  switch (dtype) {
    case kF32: return LaunchCombineForType<F32Traits>(op, dst, a, b, count, s);
    case kF64: return LaunchCombineForType<F64Traits>(op, dst, a, b, count, s);
    case kF16: return LaunchCombineForType<HalfTraits>(op, dst, a, b, count, s);
    case kBF16: return LaunchCombineForType<BFloat16Traits>(op, dst, a, b, count, s);
    case kI32: return LaunchCombineForType<I32Traits>(op, dst, a, b, count, s);
    case kI64: return LaunchCombineForType<I64Traits>(op, dst, a, b, count, s);
    case kU8: return LaunchCombineForType<U8Traits>(op, dst, a, b, count, s);
    case kF8E4M3: return LaunchCombineForType<Fp8Traits<__NV_E4M3>>(op, dst, a, b, count, s);
    case kF8E5M2: return LaunchCombineForType<Fp8Traits<__NV_E5M2>>(op, dst, a, b, count, s);
    default: return static_cast<int>(cudaErrorInvalidValue);
  }
}

int LaunchDivide(int dtype, void* data, size_t count, int64_t divisor, void* stream) {
  if (count == 0) return static_cast<int>(cudaSuccess);
  cudaStream_t s = static_cast<cudaStream_t>(stream);
  switch (dtype) {
    case kF32: return LaunchDivideTyped<F32Traits>(data, count, divisor, s);
    case kF64: return LaunchDivideTyped<F64Traits>(data, count, divisor, s);
    case kF16: return LaunchDivideTyped<HalfTraits>(data, count, divisor, s);
    case kBF16: return LaunchDivideTyped<BFloat16Traits>(data, count, divisor, s);
    case kI32: return LaunchDivideTyped<I32Traits>(data, count, divisor, s);
    case kI64: return LaunchDivideTyped<I64Traits>(data, count, divisor, s);
    case kU8: return LaunchDivideTyped<U8Traits>(data, count, divisor, s);
    case kF8E4M3: return LaunchDivideTyped<Fp8Traits<__NV_E4M3>>(data, count, divisor, s);
    case kF8E5M2: return LaunchDivideTyped<Fp8Traits<__NV_E5M2>>(data, count, divisor, s);
    default: return static_cast<int>(cudaErrorInvalidValue);
  }
}

int HostFloatToFp8(int dtype, const float* in, uint8_t* out, size_t n) {
  if (dtype != kF8E4M3 && dtype != kF8E5M2) return static_cast<int>(cudaErrorInvalidValue);
  const __nv_fp8_interpretation_t format = dtype == kF8E4M3 ? __NV_E4M3 : __NV_E5M2;
  for (size_t i = 0; i < n; ++i) out[i] = __nv_cvt_float_to_fp8(in[i], __NV_SATFINITE, format);
  return static_cast<int>(cudaSuccess);
}

}  // namespace internal
}  // namespace cuda
}  // namespace gradsync
