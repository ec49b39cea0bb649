// CPU reduction kernels: design.
//
// Dispatch. A call picks one kernel function pointer from
// (instruction set, operand form, dtype, op) with a few switches, then runs one
// tight loop over all `count` elements: nothing is decided per element. The
// instruction set is probed once (__builtin_cpu_supports, which also checks
// that the OS saves YMM state) and cached in a function-local static.
//
// Two instruction-set variants of every kernel are compiled from the same
// templates in this one file:
//   * portable: the build's baseline flags (x86-64 = SSE2; any other target);
//   * avx2: the same template instantiated inside functions marked
//     __attribute__((target("avx2,f16c"))). The loop bodies are
//     always_inline helpers without a target attribute, so after inlining GCC
//     vectorizes them with 256-bit AVX2 instructions. Only these functions (all
//     with internal linkage) carry the AVX2 target, so no AVX2 code can leak
//     into a COMDAT symbol that portable code might end up calling.
// We use explicit target() + our own dispatch instead of target_clones (ifunc)
// so tests can force either variant (internal::ReduceIntoWith) and check that
// they agree bit for bit.
//
// Vectorization. Loops are plain indexed loops over __restrict pointers with
// `#pragma GCC ivdep`, one template instance per (element traits, op, form), so
// GCC's auto-vectorizer emits e.g. vaddps / vminps / vpaddd / vpmulld with an
// SSE/scalar epilogue for the odd tail. No -ffast-math and no FMA: results are
// exactly those of the scalar C++ expression, whichever variant runs. The
// "forms" exist so aliasing never defeats vectorization:
//   kInto        d[i] = op(d[i], b[i])   (ReduceInto; ReduceOutOfPlace, dst==a)
//   kIntoSwapped d[i] = op(b[i], d[i])   (ReduceOutOfPlace with dst==b)
//   kOut         d[i] = op(a[i], b[i])   (ReduceOutOfPlace, dst distinct)
//   kSelf        d[i] = op(d[i], d[i])   (all operands are the same buffer)
// min/max are not commutative (NaN, signed zero), hence kIntoSwapped.
//
// Integers: sum/prod go through the unsigned type (defined wraparound); u8
// promotes to int, where 255 * 255 cannot overflow.
//
// bf16: widening is a 16-bit shift, narrowing is FloatToBFloat16's
// add-and-shift with a NaN select. The portable variant leaves that to the
// auto-vectorizer; the AVX2 variant spells it out for 16 elements at a time
// with shifts and masks only (even/odd words, no shuffles), about twice as
// fast as what GCC makes of the scalar code.
//
// f16: the portable variant calls HalfToFloat / FloatToHalf from common/types.h
// per element (scalar, slow, but the definition of the semantics). The AVX2
// variant uses F16C: _mm256_cvtph_ps (exact widening) and _mm256_cvtps_ph with
// _MM_FROUND_TO_NEAREST_INT (round to nearest even, overflow to inf, f16
// subnormals produced, independent of MXCSR), i.e. the same function as
// FloatToHalf for every non-NaN float (checked exhaustively over all 2^32
// floats when this was written). FloatToHalf maps every NaN to sign|0x7e00
// while VCVTPS2PH keeps the (truncated) payload, so NaN lanes are clamped to
// sign|0x7e00 with two 16-bit min instructions (see FloatToHalfX8). The <8
// element tail uses the scalar functions.
//
// Bit-identical, except NaNs: the compiler may commute a + b, so when both
// operands are NaN the variants may return different NaNs. Non-NaN results
// never depend on the variant.
//
// DivideBy: floats divide by the converted divisor (never multiply by a
// reciprocal, which would round differently). i32 and u8 divide in double /
// float and truncate, which is exact: for |x| < 2^31 and an integer divisor d
// with |d| >= 2, a non-integral x/d is at least 1/|d| away from any integer
// while the rounding error is below |x/d| * 2^-53 < 2^-22 / |d|, so truncation
// can never cross an integer (u8 in float: the error is below
// 255 * 2^-24 / |d| < 1 / |d|). d = 1 and d = -1 (which may overflow:
// INT32_MIN / -1) are handled first. i64 uses scalar
// integer division (x86 has no vector integer divide).
#include "kernels/cpu_reduce.h"

#include <cstring>
#include <type_traits>

#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>
#include <immintrin.h>
#define GRADSYNC_KERNELS_X86 1
#else
#define GRADSYNC_KERNELS_X86 0
#endif

#include "common/logging.h"
#include "kernels/element_traits.h"

namespace gradsync {
namespace {

using namespace kernels_internal;  // NOLINT: the element traits

#if GRADSYNC_KERNELS_X86
#define GS_TARGET_AVX2 __attribute__((target("avx2,f16c")))
#endif

// ---------------------------------------------------------------------------
// Element traits (S, C, Load, Store): kernels/element_traits.h.

// ---------------------------------------------------------------------------
// The combine step, in the compute type. kAvg is mapped to kSum before here.

template <ReduceOp op, typename C>
GS_ALWAYS_INLINE C Combine(C a, C b) {
  if constexpr (op == ReduceOp::kSum) {
    if constexpr (std::is_integral_v<C>) {
      using U = std::make_unsigned_t<C>;
      return static_cast<C>(static_cast<U>(a) + static_cast<U>(b));
    } else {
      return a + b;
    }
  } else if constexpr (op == ReduceOp::kProd) {
    if constexpr (std::is_integral_v<C>) {
      using U = std::make_unsigned_t<C>;
      return static_cast<C>(static_cast<U>(a) * static_cast<U>(b));
    } else {
      return a * b;
    }
  } else if constexpr (op == ReduceOp::kMin) {
    return a < b ? a : b;
  } else {
    static_assert(op == ReduceOp::kMax, "unexpected op");
    return a > b ? a : b;
  }
}

// ---------------------------------------------------------------------------
// Generic loops (instantiated once per instruction-set variant).

enum class Form { kInto, kIntoSwapped, kOut, kSelf };

using ReduceFn = void (*)(void* d, const void* a, const void* b, size_t n);
using DivideFn = void (*)(void* d, size_t n, int64_t divisor);

template <class Tr, ReduceOp op>
GS_ALWAYS_INLINE void LoopInto(typename Tr::S* __restrict d, const typename Tr::S* __restrict b,
                               size_t n) {
#pragma GCC ivdep
  for (size_t i = 0; i < n; ++i) d[i] = Tr::Store(Combine<op>(Tr::Load(d[i]), Tr::Load(b[i])));
}

template <class Tr, ReduceOp op>
GS_ALWAYS_INLINE void LoopIntoSwapped(typename Tr::S* __restrict d,
                                      const typename Tr::S* __restrict b, size_t n) {
#pragma GCC ivdep
  for (size_t i = 0; i < n; ++i) d[i] = Tr::Store(Combine<op>(Tr::Load(b[i]), Tr::Load(d[i])));
}

template <class Tr, ReduceOp op>
GS_ALWAYS_INLINE void LoopOut(typename Tr::S* __restrict d, const typename Tr::S* __restrict a,
                              const typename Tr::S* __restrict b, size_t n) {
#pragma GCC ivdep
  for (size_t i = 0; i < n; ++i) d[i] = Tr::Store(Combine<op>(Tr::Load(a[i]), Tr::Load(b[i])));
}

template <class Tr, ReduceOp op>
GS_ALWAYS_INLINE void LoopSelf(typename Tr::S* __restrict d, size_t n) {
  for (size_t i = 0; i < n; ++i) {
    const typename Tr::C x = Tr::Load(d[i]);
    d[i] = Tr::Store(Combine<op>(x, x));
  }
}

template <class Tr, ReduceOp op, Form f>
GS_ALWAYS_INLINE void GenericReduce(void* dv, const void* av, const void* bv, size_t n) {
  using S = typename Tr::S;
  S* d = static_cast<S*>(dv);
  if constexpr (f == Form::kInto) {
    LoopInto<Tr, op>(d, static_cast<const S*>(bv), n);
  } else if constexpr (f == Form::kIntoSwapped) {
    LoopIntoSwapped<Tr, op>(d, static_cast<const S*>(bv), n);
  } else if constexpr (f == Form::kOut) {
    LoopOut<Tr, op>(d, static_cast<const S*>(av), static_cast<const S*>(bv), n);
  } else {
    LoopSelf<Tr, op>(d, n);
  }
}

template <class Tr>
GS_ALWAYS_INLINE void FloatDivide(typename Tr::S* __restrict d, size_t n, float divisor) {
  for (size_t i = 0; i < n; ++i) d[i] = Tr::Store(Tr::Load(d[i]) / divisor);
}

template <class Tr>
void FloatMultiply(typename Tr::S* __restrict d, size_t n, float factor) {
  for (size_t i = 0; i < n; ++i) d[i] = Tr::Store(Tr::Load(d[i]) * factor);
}

template <typename T>
GS_ALWAYS_INLINE void NegateWrapping(T* __restrict d, size_t n) {
  using U = std::make_unsigned_t<T>;
  for (size_t i = 0; i < n; ++i) d[i] = static_cast<T>(static_cast<U>(0) - static_cast<U>(d[i]));
}

// Precondition: divisor != 0 for integer types (checked by the caller).
template <DType t>
GS_ALWAYS_INLINE void GenericDivide(void* dv, size_t n, int64_t divisor) {
  if constexpr (t == DType::kF32) {
    float* __restrict d = static_cast<float*>(dv);
    const float v = static_cast<float>(divisor);
    for (size_t i = 0; i < n; ++i) d[i] = d[i] / v;
  } else if constexpr (t == DType::kF64) {
    double* __restrict d = static_cast<double*>(dv);
    const double v = static_cast<double>(divisor);
    for (size_t i = 0; i < n; ++i) d[i] = d[i] / v;
  } else if constexpr (t == DType::kBF16) {
    FloatDivide<Bf16Traits>(static_cast<uint16_t*>(dv), n, static_cast<float>(divisor));
  } else if constexpr (t == DType::kF16) {
    FloatDivide<F16Traits>(static_cast<uint16_t*>(dv), n, static_cast<float>(divisor));
  } else if constexpr (t == DType::kF8E4M3) {
    FloatDivide<F8E4M3Traits>(static_cast<uint8_t*>(dv), n, static_cast<float>(divisor));
  } else if constexpr (t == DType::kF8E5M2) {
    FloatDivide<F8E5M2Traits>(static_cast<uint8_t*>(dv), n, static_cast<float>(divisor));
  } else if constexpr (t == DType::kI32) {
    int32_t* __restrict d = static_cast<int32_t*>(dv);
    if (divisor == 1) return;
    if (divisor == -1) return NegateWrapping(d, n);
    const double v = static_cast<double>(divisor);  // exact quotient, see top of file
    for (size_t i = 0; i < n; ++i) d[i] = static_cast<int32_t>(static_cast<double>(d[i]) / v);
  } else if constexpr (t == DType::kI64) {
    int64_t* __restrict d = static_cast<int64_t*>(dv);
    if (divisor == 1) return;
    if (divisor == -1) return NegateWrapping(d, n);
    for (size_t i = 0; i < n; ++i) d[i] = d[i] / divisor;
  } else {
    static_assert(t == DType::kU8, "unexpected dtype");
    uint8_t* __restrict d = static_cast<uint8_t*>(dv);
    if (divisor == 1) return;
    const float v = static_cast<float>(divisor);  // exact quotient, see top of file
    // A negative quotient (negative divisor) wraps modulo 256 via int32_t.
    for (size_t i = 0; i < n; ++i) {
      d[i] = static_cast<uint8_t>(static_cast<int32_t>(static_cast<float>(d[i]) / v));
    }
  }
}

// ---------------------------------------------------------------------------
// Instruction-set variants. Each provides Reduce<Traits, op, form> and
// Divide<dtype> with the ReduceFn / DivideFn signatures.

struct PortableIsa {
  template <class Tr, ReduceOp op, Form f>
  static void Reduce(void* d, const void* a, const void* b, size_t n) {
    GenericReduce<Tr, op, f>(d, a, b, n);
  }
  template <DType t>
  static void Divide(void* d, size_t n, int64_t divisor) {
    GenericDivide<t>(d, n, divisor);
  }
};

#if GRADSYNC_KERNELS_X86

template <ReduceOp op>
GS_TARGET_AVX2 GS_ALWAYS_INLINE __m256 CombineF32x8(__m256 a, __m256 b) {
  if constexpr (op == ReduceOp::kSum) {
    return _mm256_add_ps(a, b);
  } else if constexpr (op == ReduceOp::kProd) {
    return _mm256_mul_ps(a, b);
  } else if constexpr (op == ReduceOp::kMin) {
    return _mm256_min_ps(a, b);  // a < b ? a : b, exactly like Combine<kMin>
  } else {
    return _mm256_max_ps(a, b);  // a > b ? a : b
  }
}

// 8 floats -> 8 halves, bit-identical to FloatToHalf for every input.
GS_TARGET_AVX2 GS_ALWAYS_INLINE __m128i FloatToHalfX8(__m256 f) {
  const __m128i h = _mm256_cvtps_ph(f, _MM_FROUND_TO_NEAREST_INT);
  // VCVTPS2PH turns a NaN into sign | 0x7e00 | (payload >> 13): the quiet bit
  // is always set, so NaN results are exactly [0x7e00, 0x7fff] and
  // [0xfe00, 0xffff]. FloatToHalf returns sign | 0x7e00 instead. An unsigned
  // min with 0xfe00 clamps the negative NaNs and changes nothing else; a
  // signed min with 0x7e00 then clamps the positive NaNs (every half with the
  // sign bit set is a negative int16, so those are untouched).
  return _mm_min_epi16(_mm_min_epu16(h, _mm_set1_epi16(static_cast<int16_t>(0xfe00))),
                       _mm_set1_epi16(0x7e00));
}

GS_TARGET_AVX2 GS_ALWAYS_INLINE __m256 LoadHalfX8(const uint16_t* p) {
  return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
}

GS_TARGET_AVX2 GS_ALWAYS_INLINE void StoreHalfX8(uint16_t* p, __m256 f) {
  _mm_storeu_si128(reinterpret_cast<__m128i*>(p), FloatToHalfX8(f));
}

// d[i] = op(x[i], y[i]); d may equal x and/or y (each block is loaded before
// it is stored).
template <ReduceOp op>
struct F16ReduceAvx2 {
  GS_TARGET_AVX2 static GS_ALWAYS_INLINE void Run(uint16_t* d, const uint16_t* x, const uint16_t* y,
                                                  size_t n) {
    size_t i = 0;
    for (; i + 16 <= n; i += 16) {
      const __m256 r0 = CombineF32x8<op>(LoadHalfX8(x + i), LoadHalfX8(y + i));
      const __m256 r1 = CombineF32x8<op>(LoadHalfX8(x + i + 8), LoadHalfX8(y + i + 8));
      StoreHalfX8(d + i, r0);
      StoreHalfX8(d + i + 8, r1);
    }
    for (; i + 8 <= n; i += 8) {
      StoreHalfX8(d + i, CombineF32x8<op>(LoadHalfX8(x + i), LoadHalfX8(y + i)));
    }
    for (; i < n; ++i) d[i] = FloatToHalf(Combine<op>(HalfToFloat(x[i]), HalfToFloat(y[i])));
  }
};

// bf16 <-> f32 for 16 elements without shuffles: each 32-bit lane of a
// 256-bit load holds an even element in its low word and an odd one in its
// high word. Shifting left by 16 gives the f32 bits of the even elements,
// clearing the low word those of the odd ones; narrowing rounds each in place
// (result in the high word) and merges the two halves back.
struct Bf16x16 {
  __m256 even, odd;
};

GS_TARGET_AVX2 GS_ALWAYS_INLINE Bf16x16 LoadBf16x16(const uint16_t* p) {
  const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
  return {_mm256_castsi256_ps(_mm256_slli_epi32(v, 16)),
          _mm256_castsi256_ps(_mm256_and_si256(v, _mm256_set1_epi32(0xffff0000u)))};
}

// FloatToBFloat16 on 8 lanes; the result is in the high 16 bits of each lane
// (the low 16 bits are garbage).
GS_TARGET_AVX2 GS_ALWAYS_INLINE __m256i FloatToBf16High(__m256 f) {
  const __m256i u = _mm256_castps_si256(f);
  const __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(1));
  const __m256i rounded = _mm256_add_epi32(_mm256_add_epi32(u, _mm256_set1_epi32(0x7fff)), lsb);
  const __m256i quiet_nan = _mm256_or_si256(u, _mm256_set1_epi32(0x00400000));
  const __m256i is_nan = _mm256_castps_si256(_mm256_cmp_ps(f, f, _CMP_UNORD_Q));
  return _mm256_blendv_epi8(rounded, quiet_nan, is_nan);
}

GS_TARGET_AVX2 GS_ALWAYS_INLINE void StoreBf16x16(uint16_t* p, Bf16x16 v) {
  const __m256i even = _mm256_srli_epi32(FloatToBf16High(v.even), 16);
  const __m256i odd = _mm256_and_si256(FloatToBf16High(v.odd), _mm256_set1_epi32(0xffff0000u));
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(p), _mm256_or_si256(even, odd));
}

// d[i] = op(x[i], y[i]); d may equal x and/or y.
template <ReduceOp op>
struct Bf16ReduceAvx2 {
  GS_TARGET_AVX2 static GS_ALWAYS_INLINE void Run(uint16_t* d, const uint16_t* x, const uint16_t* y,
                                                  size_t n) {
    size_t i = 0;
    for (; i + 16 <= n; i += 16) {
      const Bf16x16 a = LoadBf16x16(x + i);
      const Bf16x16 b = LoadBf16x16(y + i);
      StoreBf16x16(d + i, {CombineF32x8<op>(a.even, b.even), CombineF32x8<op>(a.odd, b.odd)});
    }
    for (; i < n; ++i) {
      d[i] = Bf16Traits::Store(Combine<op>(Bf16Traits::Load(x[i]), Bf16Traits::Load(y[i])));
    }
  }
};

// Maps a form onto (dst, first operand, second operand) for the explicit
// 16-bit float loops, which tolerate exact aliasing.
template <class Loop, Form f>
GS_TARGET_AVX2 GS_ALWAYS_INLINE void RunForm(void* dv, const void* av, const void* bv, size_t n) {
  uint16_t* d = static_cast<uint16_t*>(dv);
  const uint16_t* a = static_cast<const uint16_t*>(av);
  const uint16_t* b = static_cast<const uint16_t*>(bv);
  if constexpr (f == Form::kInto) {
    Loop::Run(d, d, b, n);
  } else if constexpr (f == Form::kIntoSwapped) {
    Loop::Run(d, b, d, n);
  } else if constexpr (f == Form::kOut) {
    Loop::Run(d, a, b, n);
  } else {
    Loop::Run(d, d, d, n);
  }
}

struct Avx2Isa {
  template <class Tr, ReduceOp op, Form f>
  GS_TARGET_AVX2 static void Reduce(void* dv, const void* av, const void* bv, size_t n) {
    if constexpr (std::is_same_v<Tr, F16Traits>) {
      RunForm<F16ReduceAvx2<op>, f>(dv, av, bv, n);
    } else if constexpr (std::is_same_v<Tr, Bf16Traits>) {
      RunForm<Bf16ReduceAvx2<op>, f>(dv, av, bv, n);
    } else {
      GenericReduce<Tr, op, f>(dv, av, bv, n);
    }
  }

  template <DType t>
  GS_TARGET_AVX2 static void Divide(void* dv, size_t n, int64_t divisor) {
    if constexpr (t == DType::kF16) {
      uint16_t* d = static_cast<uint16_t*>(dv);
      const float v = static_cast<float>(divisor);
      const __m256 vv = _mm256_set1_ps(v);
      size_t i = 0;
      for (; i + 8 <= n; i += 8) StoreHalfX8(d + i, _mm256_div_ps(LoadHalfX8(d + i), vv));
      for (; i < n; ++i) d[i] = FloatToHalf(HalfToFloat(d[i]) / v);
    } else if constexpr (t == DType::kBF16) {
      uint16_t* d = static_cast<uint16_t*>(dv);
      const float v = static_cast<float>(divisor);
      const __m256 vv = _mm256_set1_ps(v);
      size_t i = 0;
      for (; i + 16 <= n; i += 16) {
        const Bf16x16 x = LoadBf16x16(d + i);
        StoreBf16x16(d + i, {_mm256_div_ps(x.even, vv), _mm256_div_ps(x.odd, vv)});
      }
      for (; i < n; ++i) d[i] = Bf16Traits::Store(Bf16Traits::Load(d[i]) / v);
    } else {
      GenericDivide<t>(dv, n, divisor);
    }
  }
};

#endif  // GRADSYNC_KERNELS_X86

// ---------------------------------------------------------------------------
// Kernel selection: a handful of switches per call.

template <class IsaT, Form f, class Tr>
ReduceFn PickOp(ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum:
    case ReduceOp::kAvg:  // averaging sums; DivideBy runs at the end
    case ReduceOp::kPremulSum:  // MultiplyBy ran on each input first
      return &IsaT::template Reduce<Tr, ReduceOp::kSum, f>;
    case ReduceOp::kProd: return &IsaT::template Reduce<Tr, ReduceOp::kProd, f>;
    case ReduceOp::kMin: return &IsaT::template Reduce<Tr, ReduceOp::kMin, f>;
    case ReduceOp::kMax: return &IsaT::template Reduce<Tr, ReduceOp::kMax, f>;
  }
  return nullptr;
}

template <class IsaT, Form f>
ReduceFn PickType(DType t, ReduceOp op) {
  switch (t) {
    case DType::kF32: return PickOp<IsaT, f, F32Traits>(op);
    case DType::kF64: return PickOp<IsaT, f, F64Traits>(op);
    case DType::kF16: return PickOp<IsaT, f, F16Traits>(op);
    case DType::kBF16: return PickOp<IsaT, f, Bf16Traits>(op);
    case DType::kI32: return PickOp<IsaT, f, I32Traits>(op);
    case DType::kI64: return PickOp<IsaT, f, I64Traits>(op);
    case DType::kU8: return PickOp<IsaT, f, U8Traits>(op);
    case DType::kF8E4M3: return PickOp<IsaT, f, F8E4M3Traits>(op);
    case DType::kF8E5M2: return PickOp<IsaT, f, F8E5M2Traits>(op);
  }
  return nullptr;
}

template <class IsaT>
ReduceFn PickForm(Form f, DType t, ReduceOp op) {
  switch (f) {
    case Form::kInto: return PickType<IsaT, Form::kInto>(t, op);
    case Form::kIntoSwapped: return PickType<IsaT, Form::kIntoSwapped>(t, op);
    case Form::kOut: return PickType<IsaT, Form::kOut>(t, op);
    case Form::kSelf: return PickType<IsaT, Form::kSelf>(t, op);
  }
  return nullptr;
}

template <class IsaT>
DivideFn PickDivide(DType t) {
  switch (t) {
    case DType::kF32: return &IsaT::template Divide<DType::kF32>;
    case DType::kF64: return &IsaT::template Divide<DType::kF64>;
    case DType::kF16: return &IsaT::template Divide<DType::kF16>;
    case DType::kBF16: return &IsaT::template Divide<DType::kBF16>;
    case DType::kI32: return &IsaT::template Divide<DType::kI32>;
    case DType::kI64: return &IsaT::template Divide<DType::kI64>;
    case DType::kU8: return &IsaT::template Divide<DType::kU8>;
    case DType::kF8E4M3: return &IsaT::template Divide<DType::kF8E4M3>;
    case DType::kF8E5M2: return &IsaT::template Divide<DType::kF8E5M2>;
  }
  return nullptr;
}

void CheckIsa(internal::Isa isa) {
  GS_CHECK(isa == internal::Isa::kPortable || internal::CpuSupportsAvx2())
      << "cpu_reduce: " << internal::IsaName(isa) << " kernels requested on a CPU without it";
}

ReduceFn PickReduce(internal::Isa isa, Form f, DType t, ReduceOp op) {
  CheckIsa(isa);
  ReduceFn fn = nullptr;
#if GRADSYNC_KERNELS_X86
  if (isa == internal::Isa::kAvx2) {
    fn = PickForm<Avx2Isa>(f, t, op);
  } else {
    fn = PickForm<PortableIsa>(f, t, op);
  }
#else
  fn = PickForm<PortableIsa>(f, t, op);
#endif
  GS_CHECK(fn != nullptr) << "cpu_reduce: invalid dtype " << static_cast<int>(t) << " or op "
                          << static_cast<int>(op);
  return fn;
}

}  // namespace

namespace internal {

bool CpuSupportsAvx2() {
#if GRADSYNC_KERNELS_X86
  static const bool supported = [] {
    __builtin_cpu_init();
    // F16C from CPUID leaf 1 (ECX bit 29): clang's __builtin_cpu_supports
    // does not know "f16c".
    unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
    const bool f16c = __get_cpuid(1, &eax, &ebx, &ecx, &edx) != 0 && (ecx & bit_F16C) != 0;
    return __builtin_cpu_supports("avx2") && f16c;
  }();
  return supported;
#else
  return false;
#endif
}

Isa ActiveIsa() {
  static const Isa isa = CpuSupportsAvx2() ? Isa::kAvx2 : Isa::kPortable;
  return isa;
}

const char* IsaName(Isa isa) {
  switch (isa) {
    case Isa::kPortable: return "portable";
    case Isa::kAvx2: return "avx2+f16c";
  }
  return "invalid-isa";
}

void ReduceIntoWith(Isa isa, DType t, ReduceOp op, void* dst, const void* src, size_t count) {
  if (count == 0) return;
  const Form f = dst == src ? Form::kSelf : Form::kInto;
  PickReduce(isa, f, t, op)(dst, nullptr, src, count);
}

void ReduceOutOfPlaceWith(Isa isa, DType t, ReduceOp op, void* dst, const void* a, const void* b,
                          size_t count) {
  if (count == 0) return;
  if (dst == a && dst == b) {
    PickReduce(isa, Form::kSelf, t, op)(dst, nullptr, nullptr, count);
  } else if (dst == a) {
    PickReduce(isa, Form::kInto, t, op)(dst, nullptr, b, count);
  } else if (dst == b) {
    PickReduce(isa, Form::kIntoSwapped, t, op)(dst, nullptr, a, count);
  } else {
    // a == b is fine here: both are only read.
    PickReduce(isa, Form::kOut, t, op)(dst, a, b, count);
  }
}

void DivideByWith(Isa isa, DType t, void* data, size_t count, int64_t divisor) {
  if (count == 0) return;
  CheckIsa(isa);
  GS_CHECK(IsFloatDType(t) || divisor != 0)
      << "cpu_reduce: integer DivideBy(" << DTypeName(t) << ") by zero";
  DivideFn fn = nullptr;
#if GRADSYNC_KERNELS_X86
  fn = isa == Isa::kAvx2 ? PickDivide<Avx2Isa>(t) : PickDivide<PortableIsa>(t);
#else
  fn = PickDivide<PortableIsa>(t);
#endif
  GS_CHECK(fn != nullptr) << "cpu_reduce: invalid dtype " << static_cast<int>(t);
  fn(data, count, divisor);
}

}  // namespace internal

void ReduceInto(DType t, ReduceOp op, void* dst, const void* src, size_t count) {
  internal::ReduceIntoWith(internal::ActiveIsa(), t, op, dst, src, count);
}

void ReduceOutOfPlace(DType t, ReduceOp op, void* dst, const void* a, const void* b, size_t count) {
  internal::ReduceOutOfPlaceWith(internal::ActiveIsa(), t, op, dst, a, b, count);
}

void DivideBy(DType t, void* data, size_t count, int64_t divisor) {
  internal::DivideByWith(internal::ActiveIsa(), t, data, count, divisor);
}

void MultiplyBy(DType t, void* data, size_t count, double factor) {
  if (count == 0) return;
  switch (t) {
    case DType::kF32: {
      float* __restrict d = static_cast<float*>(data);
      const float f = static_cast<float>(factor);
      for (size_t i = 0; i < count; ++i) d[i] = d[i] * f;
      return;
    }
    case DType::kF64: {
      double* __restrict d = static_cast<double*>(data);
      for (size_t i = 0; i < count; ++i) d[i] = d[i] * factor;
      return;
    }
    case DType::kF16:
      return FloatMultiply<F16Traits>(static_cast<uint16_t*>(data), count, static_cast<float>(factor));
    case DType::kBF16:
      return FloatMultiply<Bf16Traits>(static_cast<uint16_t*>(data), count,
                                       static_cast<float>(factor));
    case DType::kF8E4M3:
      return FloatMultiply<F8E4M3Traits>(static_cast<uint8_t*>(data), count,
                                         static_cast<float>(factor));
    case DType::kF8E5M2:
      return FloatMultiply<F8E5M2Traits>(static_cast<uint8_t*>(data), count,
                                         static_cast<float>(factor));
    case DType::kI32:
    case DType::kI64:
    case DType::kU8:
      break;
  }
  GS_CHECK(false) << "cpu_reduce: MultiplyBy on " << DTypeName(t) << " (float dtypes only)";
}

}  // namespace gradsync
