#include "kernels/codec.h"

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <cstring>
#include <chrono>
#include <limits>
#include <mutex>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "common/fp8.h"
#include "common/types.h"
#include "kernels/scaled_convert.h"

namespace gradsync {

const char* CodecName(CodecId id) {
  switch (id) {
    case CodecId::kNone: return "none";
    case CodecId::kBf16: return "bf16";
    case CodecId::kFp16: return "fp16";
    case CodecId::kFp8E4M3: return "fp8e4m3";
    case CodecId::kFp8E5M2: return "fp8e5m2";
    case CodecId::kInt8: return "int8";
  }
  return "?";
}

bool IsValidCodec(uint8_t id) { return id < kCodecCount; }

absl::StatusOr<CodecId> ParseCodec(absl::string_view name) {
  const std::string lower = absl::AsciiStrToLower(name);
  if (lower == "fp8") return CodecId::kFp8E4M3;
  for (CodecId id : kAllCodecs) {
    if (lower == CodecName(id)) return id;
  }
  return absl::InvalidArgumentError(absl::StrCat(
      "unknown codec '", name, "' (codecs: none, bf16, fp16, fp8e4m3 (or fp8), fp8e5m2, int8)"));
}

size_t Codec::ScaleBytes(size_t n) const {
  return scaled() ? ScaledChunks(n, kCodecBlockElements) * sizeof(float) : 0;
}

size_t Codec::EncodedBytes(size_t n) const {
  return (ScaleBytes(n) + n * element_bytes() + 7) & ~size_t{7};
}

double Codec::Ratio() const {
  return (static_cast<double>(element_bytes()) + (scaled() ? 4.0 / kCodecBlockElements : 0.0)) /
         sizeof(float);
}

double Codec::MeasuredMicrosPerByte() const {
  std::call_once(measured_once_, [this] {
    constexpr size_t kN = 1 << 18;  // 1 MiB of f32
    std::vector<float> in(kN), acc(kN, 0.0f);
    for (size_t i = 0; i < kN; ++i) in[i] = static_cast<float>((i * 2654435761u) % 1000) - 500;
    std::vector<char> out(EncodedBytes(kN));
    double best = 0;
    for (int run = 0; run < 3; ++run) {
      const auto start = std::chrono::steady_clock::now();
      Encode(in.data(), kN, out.data());
      DecodeAdd(out.data(), kN, acc.data());
      const double us = std::chrono::duration<double, std::micro>(
                            std::chrono::steady_clock::now() - start)
                            .count();
      if (run == 0 || us < best) best = us;
    }
    measured_us_per_byte_ = best / (kN * sizeof(float));
  });
  return measured_us_per_byte_;
}

namespace {

// The largest finite |x| of a block (NaN and ±inf skipped).
float BlockAmax(const float* in, size_t n) {
  float m = 0;
  for (size_t i = 0; i < n; ++i) {
    const float a = std::fabs(in[i]);
    m = a <= FLT_MAX && a > m ? a : m;
  }
  return m;
}

float LoadScale(const char* at) {
  float s;
  std::memcpy(&s, at, sizeof(s));
  return s;
}

// bf16 without scales: round to nearest even.
class Bf16Codec final : public Codec {
 public:
  CodecId id() const override { return CodecId::kBf16; }
  size_t element_bytes() const override { return 2; }
  bool scaled() const override { return false; }
  double RelativeBound() const override { return 1.0 / 256; }
  void Encode(const float* in, size_t n, char* out) const override {
    uint16_t* o = reinterpret_cast<uint16_t*>(out);
    for (size_t i = 0; i < n; ++i) o[i] = FloatToBFloat16(in[i]);
  }
  void Decode(const char* in, size_t n, float* out) const override {
    const uint16_t* p = reinterpret_cast<const uint16_t*>(in);
    for (size_t i = 0; i < n; ++i) out[i] = BFloat16ToFloat(p[i]);
  }
  void DecodeAdd(const char* in, size_t n, float* inout) const override {
    const uint16_t* p = reinterpret_cast<const uint16_t*>(in);
    for (size_t i = 0; i < n; ++i) inout[i] += BFloat16ToFloat(p[i]);
  }
};

// fp16 and fp8: a power-of-two scale per block (kernels/scaled_convert.h).
template <class T, DType kType, T (*Narrow)(float), float (*Widen)(T)>
class PowerOfTwoCodec final : public Codec {
 public:
  PowerOfTwoCodec(CodecId id, double bound) : id_(id), bound_(bound) {}
  CodecId id() const override { return id_; }
  double RelativeBound() const override { return bound_; }
  size_t element_bytes() const override { return sizeof(T); }
  bool scaled() const override { return true; }
  void Encode(const float* in, size_t n, char* out) const override {
    T* payload = reinterpret_cast<T*>(out + ScaleBytes(n));
    for (size_t b = 0, begin = 0; begin < n; ++b, begin += kCodecBlockElements) {
      const size_t len = std::min(kCodecBlockElements, n - begin);
      const float s = ChunkScale(kType, BlockAmax(in + begin, len));
      std::memcpy(out + b * sizeof(float), &s, sizeof(s));
      for (size_t i = 0; i < len; ++i) payload[begin + i] = Narrow(in[begin + i] * s);
    }
  }
  void Decode(const char* in, size_t n, float* out) const override {
    const T* payload = reinterpret_cast<const T*>(in + ScaleBytes(n));
    for (size_t b = 0, begin = 0; begin < n; ++b, begin += kCodecBlockElements) {
      const size_t len = std::min(kCodecBlockElements, n - begin);
      const float s = LoadScale(in + b * sizeof(float));
      for (size_t i = 0; i < len; ++i) out[begin + i] = Widen(payload[begin + i]) / s;
    }
  }
  void DecodeAdd(const char* in, size_t n, float* inout) const override {
    const T* payload = reinterpret_cast<const T*>(in + ScaleBytes(n));
    for (size_t b = 0, begin = 0; begin < n; ++b, begin += kCodecBlockElements) {
      const size_t len = std::min(kCodecBlockElements, n - begin);
      const float s = LoadScale(in + b * sizeof(float));
      for (size_t i = 0; i < len; ++i) inout[begin + i] += Widen(payload[begin + i]) / s;
    }
  }

 private:
  const CodecId id_;
  const double bound_;
};

// int8: the block's step is amax/127; -128 carries a non-finite value.
class Int8Codec final : public Codec {
 public:
  CodecId id() const override { return CodecId::kInt8; }
  size_t element_bytes() const override { return 1; }
  bool scaled() const override { return true; }
  double RelativeBound() const override { return 1.0 / 254 * (1 + 1.0 / 32768); }
  void Encode(const float* in, size_t n, char* out) const override {
    int8_t* payload = reinterpret_cast<int8_t*>(out + ScaleBytes(n));
    for (size_t b = 0, begin = 0; begin < n; ++b, begin += kCodecBlockElements) {
      const size_t len = std::min(kCodecBlockElements, n - begin);
      const float amax = BlockAmax(in + begin, len);
      float step = amax / 127.0f;
      if (!(step > 0)) step = amax > 0 ? std::numeric_limits<float>::denorm_min() : 1.0f;
      std::memcpy(out + b * sizeof(float), &step, sizeof(step));
      for (size_t i = 0; i < len; ++i) {
        const float x = in[begin + i];
        const float q = std::clamp(std::nearbyint(x / step), -127.0f, 127.0f);
        payload[begin + i] = std::fabs(x) <= FLT_MAX ? static_cast<int8_t>(q) : int8_t{-128};
      }
    }
  }
  void Decode(const char* in, size_t n, float* out) const override {
    const int8_t* payload = reinterpret_cast<const int8_t*>(in + ScaleBytes(n));
    for (size_t b = 0, begin = 0; begin < n; ++b, begin += kCodecBlockElements) {
      const size_t len = std::min(kCodecBlockElements, n - begin);
      const float step = LoadScale(in + b * sizeof(float));
      for (size_t i = 0; i < len; ++i) out[begin + i] = Widen(payload[begin + i], step);
    }
  }
  void DecodeAdd(const char* in, size_t n, float* inout) const override {
    const int8_t* payload = reinterpret_cast<const int8_t*>(in + ScaleBytes(n));
    for (size_t b = 0, begin = 0; begin < n; ++b, begin += kCodecBlockElements) {
      const size_t len = std::min(kCodecBlockElements, n - begin);
      const float step = LoadScale(in + b * sizeof(float));
      for (size_t i = 0; i < len; ++i) inout[begin + i] += Widen(payload[begin + i], step);
    }
  }

 private:
  static float Widen(int8_t q, float step) {
    return q == -128 ? std::numeric_limits<float>::quiet_NaN() : static_cast<float>(q) * step;
  }
};

}  // namespace

const Codec* CodecFor(CodecId id) {
  static const Bf16Codec bf16;
  static const PowerOfTwoCodec<uint16_t, DType::kF16, FloatToHalf, HalfToFloat> fp16(
      CodecId::kFp16, 1.0 / 2048 + std::ldexp(1.0, -40));
  static const PowerOfTwoCodec<uint8_t, DType::kF8E4M3, FloatToFp8E4M3, Fp8E4M3ToFloat> e4m3(
      CodecId::kFp8E4M3, 1.0 / 16 + std::ldexp(1.0, -17));
  static const PowerOfTwoCodec<uint8_t, DType::kF8E5M2, FloatToFp8E5M2, Fp8E5M2ToFloat> e5m2(
      CodecId::kFp8E5M2, 1.0 / 8 + std::ldexp(1.0, -32));
  static const Int8Codec int8;
  switch (id) {
    case CodecId::kBf16: return &bf16;
    case CodecId::kFp16: return &fp16;
    case CodecId::kFp8E4M3: return &e4m3;
    case CodecId::kFp8E5M2: return &e5m2;
    case CodecId::kInt8: return &int8;
    case CodecId::kNone: break;
  }
  return nullptr;
}

}  // namespace gradsync
