// The wire codecs' CUDA kernels (CudaCodecEncode / CudaCodecDecode) against
// the CPU codecs (kernels/codec.h), bit for bit: every encoded byte (a NaN's
// payload aside), every decoded value, and decode-add into an accumulator,
// for every codec, sizes around the 4096-element scale block, values over
// 40 binades with NaN, ±inf, subnormals and a block whose amax is tiny.
// Without a usable GPU they say why; the comparisons skip
// (GRADSYNC_REQUIRE_CUDA=1 fails instead).
#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "cuda/cuda_reduce.h"
#include "cuda/cuda_testing.h"
#include "gtest/gtest.h"
#include "kernels/codec.h"

namespace gradsync::cuda {
namespace {

constexpr CodecId kCodecs[] = {CodecId::kBf16, CodecId::kFp16, CodecId::kFp8E4M3,
                               CodecId::kFp8E5M2, CodecId::kInt8};

TEST(CudaCodec, WithoutAGpuSaysWhy) {
  if (CudaAvailable()) GTEST_SKIP() << "a CUDA device is usable on this host";
  ExpectNotUsable(CudaCodecEncode(CodecId::kInt8, nullptr, 1, nullptr, nullptr));
  ExpectNotUsable(CudaCodecDecode(CodecId::kInt8, nullptr, 1, nullptr, true, nullptr));
}

TEST(CudaCodec, RefusesWhatIsNotAWireCodec) {
  if (!BuiltWithCuda()) GTEST_SKIP() << "built without CUDA";
  absl::Status s = CudaCodecEncode(CodecId::kNone, nullptr, 1, nullptr, nullptr);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_EQ(s.message(), "codec 0 is not a wire codec");
}

using CudaCodecGpu = CudaGpuTest;

std::vector<float> Values(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0, 1);
  std::vector<float> in(n);
  for (size_t i = 0; i < n; ++i) {
    in[i] = normal(rng) * std::ldexp(1.0f, static_cast<int>(rng() % 40) - 20);
    if (i % 9973 == 5) in[i] = NAN;
    if (i % 12011 == 7) in[i] = -INFINITY;
    if (i % 7919 == 3) in[i] = 1e-42f;  // subnormal
  }
  // The second block (where there is one) of tiny values: fp16/fp8's
  // MaxFinite / amax overflows, int8's step is subnormal (1/step overflows).
  for (size_t i = 4096; i < 4096 + 64 && i < n; ++i) in[i] = (i % 2 ? 1e-39f : -3e-40f) * (i - 4095);
  return in;
}

TEST_F(CudaCodecGpu, MatchesTheCpuCodecsBitForBit) {
  for (size_t n : {size_t{1}, size_t{7}, size_t{4095}, size_t{4096}, size_t{4097},
                   size_t{3 * 4096 + 5}, (size_t{1} << 20) + 3}) {
    const std::vector<float> in = Values(n, static_cast<uint32_t>(n));
    const std::vector<float> acc0 = Values(n, static_cast<uint32_t>(n) + 1);
    auto din = DeviceBuffer::Allocate(n * 4);
    auto dacc = DeviceBuffer::Allocate(n * 4);
    ASSERT_TRUE(din.ok() && dacc.ok());
    ASSERT_TRUE(din->CopyFromHost(in.data(), n * 4).ok());
    for (CodecId id : kCodecs) {
      const Codec& codec = *CodecFor(id);
      SCOPED_TRACE(absl::StrCat(codec.name(), " n=", n));
      const size_t bytes = codec.EncodedBytes(n);
      std::vector<char> want(bytes, 0);
      codec.Encode(in.data(), n, want.data());
      std::vector<float> want_dec(n), want_acc = acc0;
      codec.Decode(want.data(), n, want_dec.data());
      codec.DecodeAdd(want.data(), n, want_acc.data());

      auto dout = DeviceBuffer::Allocate(bytes);
      auto ddec = DeviceBuffer::Allocate(n * 4);
      ASSERT_TRUE(dout.ok() && ddec.ok());
      ASSERT_TRUE(dout->Fill(0).ok());
      ASSERT_TRUE(dacc->CopyFromHost(acc0.data(), n * 4).ok());
      auto* dec = static_cast<float*>(ddec->data());
      auto* acc = static_cast<float*>(dacc->data());
      ASSERT_TRUE(
          CudaCodecEncode(id, static_cast<const float*>(din->data()), n, dout->data(), nullptr).ok());
      ASSERT_TRUE(CudaCodecDecode(id, dout->data(), n, dec, /*add=*/false, nullptr).ok());
      ASSERT_TRUE(CudaCodecDecode(id, dout->data(), n, acc, /*add=*/true, nullptr).ok());
      ASSERT_TRUE(CudaSynchronize(nullptr).ok());
      std::vector<char> got(bytes);
      std::vector<float> got_dec(n), got_acc(n);
      ASSERT_TRUE(dout->CopyToHost(got.data(), bytes).ok());
      ASSERT_TRUE(ddec->CopyToHost(got_dec.data(), n * 4).ok());
      ASSERT_TRUE(dacc->CopyToHost(got_acc.data(), n * 4).ok());
      // Scales (or bf16's payload) and payload: the bytes of every element
      // that is not NaN (a NaN's code may differ between the toolkit and the
      // CPU; both decode it as NaN).
      const size_t lead = codec.scaled() ? (n + kCodecBlockElements - 1) / kCodecBlockElements * 4 : 0;
      ASSERT_EQ(std::memcmp(got.data(), want.data(), lead), 0) << "the blocks' scales";
      size_t bad = 0;
      const size_t eb = codec.element_bytes();
      for (size_t i = 0; i < n; ++i) {
        if (!std::isnan(in[i]) &&
            std::memcmp(&got[lead + i * eb], &want[lead + i * eb], eb) != 0) {
          ++bad;
        }
        if (!SameFloat(got_dec[i], want_dec[i])) ++bad;
        if (!SameFloat(got_acc[i], want_acc[i])) ++bad;
      }
      EXPECT_EQ(bad, 0u);
    }
  }
}

}  // namespace
}  // namespace gradsync::cuda
