// Wire codecs: how a run of f32 gradient values travels in fewer bytes.
//
// A codec encodes n f32 values into EncodedBytes(n) bytes and decodes them
// back (or adds them, decoded, into f32 memory: the reduce step of a
// compressed ring, which accumulates in f32 at every hop). The values are
// cut into blocks of kCodecBlockElements from the start of the run; a scaled
// codec stores one f32 scale per block in front of the payload:
//
//   [scale of block 0 .. scale of block B-1][payload: n elements][pad to 8]
//
//   codec     payload        per element, decoded d of x (block amax a)
//   bf16      bfloat16       round to nearest even, no scale: |d-x| <= 2^-8 |x|
//   fp16      float16        scale 2^k (kernels/scaled_convert.h), round to
//                            nearest even: |d-x| <= 2^-11 |x| + 2^-40 a
//   fp8e4m3   FP8 E4M3       scale 2^k, saturating: |d-x| <= 2^-4 |x| + 2^-17 a
//   fp8e5m2   FP8 E5M2       scale 2^k, saturating: |d-x| <= 2^-3 |x| + 2^-32 a
//   int8      int8, -127..127  step s = a/127 (f32), q = rint(x * (1/s)) (one
//                            multiplication; x/s where 1/s overflows),
//                            d = q*s: |d-x| <= a/254 * (1 + 2^-14)
//
// Non-finite values: bf16 and fp16 keep ±inf and NaN; fp8 keeps NaN and
// saturates ±inf to the largest value; int8 sends every non-finite value
// as the code -128, decoded NaN, so a loss scaler still sees the overflow.
// A block's scale ignores non-finite values.
//
// Every codec is deterministic: the same input gives the same bytes on
// every machine (the kernels never fuse multiply and add), so every rank
// that decodes the same bytes gets the same bits. Encoding depends only on
// the run's values and where it starts its blocks; callers that must agree
// (the compressed ring) cut runs at the same places on every rank.
#ifndef GRADSYNC_KERNELS_CODEC_H_
#define GRADSYNC_KERNELS_CODEC_H_

#include <cstddef>
#include <cstdint>
#include <mutex>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "kernels/cpu_reduce.h"

namespace gradsync {

enum class CodecId : uint8_t {
  kNone = 0,  // the values as they are
  kBf16 = 1,
  kFp16 = 2,
  kFp8E4M3 = 3,
  kFp8E5M2 = 4,
  kInt8 = 5,
};
inline constexpr int kCodecCount = 6;  // ids 0 .. kCodecCount-1
inline constexpr CodecId kAllCodecs[] = {CodecId::kNone,    CodecId::kBf16,
                                         CodecId::kFp16,    CodecId::kFp8E4M3,
                                         CodecId::kFp8E5M2, CodecId::kInt8};

// f32 elements per scale block (16 KiB of input).
inline constexpr size_t kCodecBlockElements = 4096;

// "none", "bf16", "fp16", "fp8e4m3", "fp8e5m2", "int8".
const char* CodecName(CodecId id);
// The names above (case-insensitive; "fp8" is fp8e4m3); InvalidArgument
// listing the choices.
absl::StatusOr<CodecId> ParseCodec(absl::string_view name);
bool IsValidCodec(uint8_t id);

class Codec {
 public:
  virtual ~Codec() = default;
  virtual CodecId id() const = 0;
  const char* name() const { return CodecName(id()); }
  // Payload bytes per element, and whether a scale leads each block.
  virtual size_t element_bytes() const = 0;
  virtual bool scaled() const = 0;
  // Bytes of n encoded elements (the layout above), a multiple of 8.
  size_t EncodedBytes(size_t n) const;
  // The encoded size over the f32 size, for large n.
  double Ratio() const;
  // A bound on |decoded - x| of one quantization, as a fraction of the
  // block's largest finite magnitude (the table above, over every x).
  virtual double RelativeBound() const = 0;

  // `out` holds EncodedBytes(n) bytes; in and out do not overlap.
  virtual void Encode(const float* in, size_t n, char* out) const = 0;
  virtual void Decode(const char* in, size_t n, float* out) const = 0;
  // inout[i] += decoded element i (one f32 addition each).
  virtual void DecodeAdd(const char* in, size_t n, float* inout) const = 0;

  // Microseconds per f32 byte of one Encode plus one DecodeAdd on this
  // machine's CPU, measured on first use (1 MiB, the best of 3 runs).
  double MeasuredMicrosPerByte() const;

 protected:
  size_t ScaleBytes(size_t n) const;

 private:
  mutable std::once_flag measured_once_;
  mutable double measured_us_per_byte_ = 0;
};

// The codec of `id`; null for kNone (and an invalid id). Its kernels use
// AVX2 and F16C where the CPU has them, with results bit-identical to the
// portable ones.
const Codec* CodecFor(CodecId id);

namespace internal {
// The codec of `id` with the kernels of `isa` (kernels/cpu_reduce.h), for
// tests and benchmarks. Precondition: isa is kPortable or the CPU has AVX2.
const Codec* CodecFor(CodecId id, Isa isa);
}  // namespace internal

}  // namespace gradsync

#endif  // GRADSYNC_KERNELS_CODEC_H_
