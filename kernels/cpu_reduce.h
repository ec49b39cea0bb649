// Element-wise reduction kernels for host memory: the arithmetic at the heart of
// every CPU allreduce / reduce-scatter step.
//
// Semantics (the same on every CPU: the AVX2 and portable implementations give
// bit-identical results, up to the sign/payload of NaNs; see cpu_reduce.cc):
//   * f32/f64: IEEE arithmetic in the element type (no fast-math, no FMA).
//   * f16/bf16: each element is widened to f32 (exact), combined in f32 and
//     rounded back to f16/bf16 with round-to-nearest-even once per call, i.e.
//     FloatToHalf(op(HalfToFloat(a), HalfToFloat(b))) from common/types.h.
//   * i32/i64/u8: two's-complement wraparound for sum and prod (no UB).
//   * ReduceOp::kAvg combines as a SUM; divide once at the end with DivideBy.
//     ReduceOp::kPremulSum combines as a SUM; multiply each input first with
//     MultiplyBy.
//   * min is `a < b ? a : b`, max is `a > b ? a : b`, where `a` is the first
//     operand (the dst element for ReduceInto). Consequences for floats:
//       - a NaN in b (src) propagates: min(a, NaN) = NaN;
//       - a NaN in a (dst) is dropped:  min(NaN, b) = b;
//       - on equal values b wins, so min(-0, +0) = +0 and min(+0, -0) = -0.
//     This is exactly x86 MINPS/MAXPS(a, b). It is not commutative for NaN and
//     signed zero; a collective that always reduces in the same order still
//     gives every rank the same bits.
//   * A NaN result is a NaN, but its sign and payload are unspecified: for
//     f16 it is 0x7e00 or 0xfe00 (what FloatToHalf returns), for bf16 a quiet
//     NaN; f32/f64 min/max may return a signalling NaN from an input as is.
//
// Thread-safety: the functions are pure and may run concurrently on disjoint
// buffers. Buffers need no particular alignment. count == 0 is a no-op (null
// pointers are then allowed). Invalid DType/ReduceOp values are programming
// errors and abort (validate wire values with IsValidDType/IsValidReduceOp).
#ifndef GRADSYNC_KERNELS_CPU_REDUCE_H_
#define GRADSYNC_KERNELS_CPU_REDUCE_H_

#include <cstddef>
#include <cstdint>

#include "common/types.h"

namespace gradsync {

// dst[i] = dst[i] OP src[i] for i < count. dst and src must not overlap, except
// that dst == src is allowed (dst[i] = dst[i] OP dst[i]).
void ReduceInto(DType t, ReduceOp op, void* dst, const void* src, size_t count);

// dst[i] = a[i] OP b[i] for i < count. Any of dst, a, b may be the same
// pointer (dst == a, dst == b, a == b, all three); partial overlap is not
// allowed.
void ReduceOutOfPlace(DType t, ReduceOp op, void* dst, const void* a, const void* b, size_t count);

// data[i] = data[i] / divisor (used once at the end of an average).
//   f32: x / (float)divisor in f32;  f64: x / (double)divisor in f64;
//   f16/bf16: widen to f32, x / (float)divisor, round back (nearest even);
//   i32/i64/u8: the mathematically exact quotient truncated toward zero, then
//   wrapped to the element type (only INT_MIN / -1, and u8 with a negative
//   divisor, actually wrap). Float division by 0 follows IEEE (inf/NaN);
//   integer division by 0 is a programming error and aborts.
void DivideBy(DType t, void* data, size_t count, int64_t divisor);

// data[i] = data[i] * factor (a premul_sum's input, before the sum), for the
// float dtypes:
//   f32: x * (float)factor in f32;  f64: x * factor in f64;
//   f16/bf16/f8e4m3/f8e5m2: widen to f32, x * (float)factor, round back
//   (nearest even; fp8 saturates as its conversion does).
// An integer dtype is a programming error and aborts (ValidateOp refuses
// premul_sum on them).
void MultiplyBy(DType t, void* data, size_t count, double factor);

namespace internal {

// Instruction-set variants of the kernels. kAvx2 also requires F16C.
enum class Isa { kPortable, kAvx2 };

// True when this CPU (and OS) supports the kAvx2 variant.
bool CpuSupportsAvx2();
// The variant the public functions above use on this machine (chosen once).
Isa ActiveIsa();
const char* IsaName(Isa isa);

// The public functions with the variant forced: for tests and benchmarks.
// Precondition: isa == kPortable or CpuSupportsAvx2().
void ReduceIntoWith(Isa isa, DType t, ReduceOp op, void* dst, const void* src, size_t count);
void ReduceOutOfPlaceWith(Isa isa, DType t, ReduceOp op, void* dst, const void* a, const void* b,
                          size_t count);
void DivideByWith(Isa isa, DType t, void* data, size_t count, int64_t divisor);

}  // namespace internal
}  // namespace gradsync

#endif  // GRADSYNC_KERNELS_CPU_REDUCE_H_
