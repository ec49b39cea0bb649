// f32 to and from a narrower float type (f16, bf16, f8e4m3, f8e5m2) with a
// scale per chunk of elements: the payload of compressed and fp8 transfers.
// This is the CPU implementation and the reference the CUDA kernels
// (cuda/cuda_reduce.h: CudaEncodeScaled, CudaDecodeScaled) match bit for bit.
//
// The scale of a chunk is a power of two, so scaling and unscaling are exact
// and only the conversion rounds:
//   amax_c  = the largest |x| of the chunk's finite values (NaN and ±inf skipped)
//   scale_c = 2^e, e = floor(log2(MaxFinite(to) / amax_c)) clamped to [-126, 126]
//             (computed as frexp of the f32 quotient, minus one; 126 when the
//             quotient overflows); 1 when amax_c is 0 or the chunk has no
//             finite value.
//   encode:  out[i] = Convert_to(in[i] * scale_c), round to nearest even; fp8
//            saturates to ±max (NaN stays NaN), f16/bf16 keep ±inf and NaN.
//   decode:  out[i] = ToFloat(in[i]) / scale_c.
// The quotient can round up across a power of two, making the scaled amax a
// hair above the type's maximum; fp8 then saturates it to the maximum.
#ifndef GRADSYNC_KERNELS_SCALED_CONVERT_H_
#define GRADSYNC_KERNELS_SCALED_CONVERT_H_

#include <cstddef>
#include <cstdint>

#include "common/types.h"

namespace gradsync {

// Whether `t` is a type EncodeScaled converts to (f16, bf16, f8e4m3, f8e5m2).
bool IsScaledType(DType t);
// The largest finite value of `t` (one of the IsScaledType types).
float MaxFinite(DType t);
// Chunks of `n` elements in chunks of `chunk` (the last may be shorter).
inline size_t ScaledChunks(size_t n, size_t chunk) { return chunk == 0 ? 0 : (n + chunk - 1) / chunk; }
// The scale of a chunk whose largest finite magnitude is `amax` (above).
float ChunkScale(DType to, float amax);

// `out` holds n elements of `to`, `scales` ScaledChunks(n, chunk) floats.
// `to` must be an IsScaledType type and chunk > 0 (checked: aborts).
void EncodeScaled(DType to, const float* in, size_t n, size_t chunk, void* out, float* scales);
void DecodeScaled(DType from, const void* in, size_t n, size_t chunk, const float* scales,
                  float* out);

}  // namespace gradsync

#endif  // GRADSYNC_KERNELS_SCALED_CONVERT_H_
