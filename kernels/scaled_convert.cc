#include "kernels/scaled_convert.h"

#include <algorithm>
#include <cfloat>
#include <cmath>

#include "common/fp8.h"
#include "common/logging.h"

namespace gradsync {

bool IsScaledType(DType t) {
  return t == DType::kF16 || t == DType::kBF16 || t == DType::kF8E4M3 || t == DType::kF8E5M2;
}

float MaxFinite(DType t) {
  switch (t) {
    case DType::kF16:
      return 65504.0f;
    case DType::kBF16:
      return 3.38953139e38f;  // 0x7f7f
    case DType::kF8E4M3:
      return 448.0f;
    case DType::kF8E5M2:
      return 57344.0f;
    default:
      return 0;
  }
}

float ChunkScale(DType to, float amax) {
  if (!(amax > 0) || !(amax <= FLT_MAX)) return 1.0f;
  const float q = MaxFinite(to) / amax;  // overflows to inf for a tiny amax
  int e = 127;
  if (q <= FLT_MAX) std::frexp(q, &e);  // q in [2^(e-1), 2^e)
  return std::ldexp(1.0f, std::clamp(e - 1, -126, 126));
}

namespace {

float ChunkAmax(const float* in, size_t n) {
  float m = 0;
  for (size_t i = 0; i < n; ++i) {
    const float a = std::fabs(in[i]);
    if (a <= FLT_MAX && a > m) m = a;  // NaN and inf compare false / are skipped
  }
  return m;
}

template <class T, class Convert>
void EncodeAs(const float* in, size_t n, size_t chunk, T* out, float* scales, Convert convert) {
  for (size_t c = 0, begin = 0; begin < n; ++c, begin += chunk) {
    const size_t len = std::min(chunk, n - begin);
    const float s = scales[c];
    for (size_t i = 0; i < len; ++i) out[begin + i] = convert(in[begin + i] * s);
  }
}

template <class T, class Widen>
void DecodeAs(const T* in, size_t n, size_t chunk, const float* scales, float* out, Widen widen) {
  for (size_t c = 0, begin = 0; begin < n; ++c, begin += chunk) {
    const size_t len = std::min(chunk, n - begin);
    const float s = scales[c];
    for (size_t i = 0; i < len; ++i) out[begin + i] = widen(in[begin + i]) / s;
  }
}

}  // namespace

void EncodeScaled(DType to, const float* in, size_t n, size_t chunk, void* out, float* scales) {
  GS_CHECK(IsScaledType(to) && chunk > 0) << "EncodeScaled to " << DTypeName(to) << " in chunks of "
                                          << chunk;
  for (size_t c = 0, begin = 0; begin < n; ++c, begin += chunk) {
    scales[c] = ChunkScale(to, ChunkAmax(in + begin, std::min(chunk, n - begin)));
  }
  switch (to) {
    case DType::kF16:
      return EncodeAs(in, n, chunk, static_cast<uint16_t*>(out), scales, FloatToHalf);
    case DType::kBF16:
      return EncodeAs(in, n, chunk, static_cast<uint16_t*>(out), scales, FloatToBFloat16);
    case DType::kF8E4M3:
      return EncodeAs(in, n, chunk, static_cast<uint8_t*>(out), scales, FloatToFp8E4M3);
    default:
      return EncodeAs(in, n, chunk, static_cast<uint8_t*>(out), scales, FloatToFp8E5M2);
  }
}

void DecodeScaled(DType from, const void* in, size_t n, size_t chunk, const float* scales,
                  float* out) {
  GS_CHECK(IsScaledType(from) && chunk > 0) << "DecodeScaled from " << DTypeName(from)
                                            << " in chunks of " << chunk;
  switch (from) {
    case DType::kF16:
      return DecodeAs(static_cast<const uint16_t*>(in), n, chunk, scales, out, HalfToFloat);
    case DType::kBF16:
      return DecodeAs(static_cast<const uint16_t*>(in), n, chunk, scales, out, BFloat16ToFloat);
    case DType::kF8E4M3:
      return DecodeAs(static_cast<const uint8_t*>(in), n, chunk, scales, out, Fp8E4M3ToFloat);
    default:
      return DecodeAs(static_cast<const uint8_t*>(in), n, chunk, scales, out, Fp8E5M2ToFloat);
  }
}

}  // namespace gradsync
