// The scaled conversion kernels (CudaEncodeScaled / CudaDecodeScaled) against
// the CPU reference (kernels/scaled_convert.h), bit for bit: every chunk's
// scale, every encoded element, every decoded element (NaN as NaN). Without a
// usable GPU they say why; the comparisons skip (GRADSYNC_REQUIRE_CUDA=1 fails
// instead).
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "cuda/cuda_reduce.h"
#include "cuda/cuda_testing.h"
#include "gtest/gtest.h"
#include "kernels/scaled_convert.h"

namespace gradsync::cuda {
namespace {

constexpr DType kTypes[] = {DType::kF16, DType::kBF16, DType::kF8E4M3, DType::kF8E5M2};

size_t Bytes(DType t) { return t == DType::kF16 || t == DType::kBF16 ? 2 : 1; }

TEST(CudaScaledConvert, WithoutAGpuSaysWhy) {
  if (CudaAvailable()) GTEST_SKIP() << "a CUDA device is usable on this host";
  ExpectNotUsable(CudaEncodeScaled(DType::kF8E4M3, nullptr, 1, 1, nullptr, nullptr, nullptr));
}

TEST(CudaScaledConvert, RefusesTypesItDoesNotConvertTo) {
  if (!BuiltWithCuda()) GTEST_SKIP() << "built without CUDA";
  absl::Status s = CudaEncodeScaled(DType::kI32, nullptr, 1, 1, nullptr, nullptr, nullptr);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  s = CudaDecodeScaled(DType::kF16, nullptr, 1, 0, nullptr, nullptr, nullptr);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
}

using CudaScaledConvertGpu = CudaGpuTest;

TEST_F(CudaScaledConvertGpu, MatchesTheCpuReferenceBitForBit) {
  std::mt19937 rng(11);
  std::normal_distribution<float> normal(0, 1);
  for (size_t n : {size_t{1}, size_t{7}, size_t{1000}, (size_t{1} << 20) + 3}) {
    std::vector<float> in(n);
    for (size_t i = 0; i < n; ++i) {
      in[i] = normal(rng) * std::ldexp(1.0f, static_cast<int>(rng() % 40) - 20);
      if (i % 9973 == 5) in[i] = NAN;
      if (i % 12011 == 7) in[i] = -INFINITY;
      if (i % 7919 == 3) in[i] = 1e-42f;  // subnormal
    }
    // A first chunk (of 64) of tiny values: MaxFinite / amax overflows f32.
    for (size_t i = 0; i < 64 && n >= 1000; ++i) in[i] = (i % 2 ? 1e-39f : -3e-40f) * (i + 1);
    auto din = DeviceBuffer::Allocate(n * 4);
    ASSERT_TRUE(din.ok()) << din.status();
    ASSERT_TRUE(din->CopyFromHost(in.data(), n * 4).ok());
    for (DType t : kTypes) {
      for (size_t chunk : {size_t{1}, size_t{64}, size_t{1000}, size_t{4096}}) {
        SCOPED_TRACE(absl::StrCat(DTypeName(t), " n=", n, " chunk=", chunk));
        const size_t chunks = ScaledChunks(n, chunk);
        std::vector<uint8_t> want(n * Bytes(t));
        std::vector<float> want_scales(chunks), want_dec(n);
        EncodeScaled(t, in.data(), n, chunk, want.data(), want_scales.data());
        DecodeScaled(t, want.data(), n, chunk, want_scales.data(), want_dec.data());
        auto dout = DeviceBuffer::Allocate(n * Bytes(t));
        auto dscales = DeviceBuffer::Allocate(chunks * 4);
        auto ddec = DeviceBuffer::Allocate(n * 4);
        ASSERT_TRUE(dout.ok() && dscales.ok() && ddec.ok());
        auto* scales = static_cast<float*>(dscales->data());
        ASSERT_TRUE(CudaEncodeScaled(t, static_cast<const float*>(din->data()), n, chunk,
                                     dout->data(), scales, nullptr)
                        .ok());
        ASSERT_TRUE(CudaDecodeScaled(t, dout->data(), n, chunk, scales,
                                     static_cast<float*>(ddec->data()), nullptr)
                        .ok());
        ASSERT_TRUE(CudaSynchronize(nullptr).ok());
        std::vector<uint8_t> got(n * Bytes(t));
        std::vector<float> got_scales(chunks), got_dec(n);
        ASSERT_TRUE(dout->CopyToHost(got.data(), got.size()).ok());
        ASSERT_TRUE(dscales->CopyToHost(got_scales.data(), chunks * 4).ok());
        ASSERT_TRUE(ddec->CopyToHost(got_dec.data(), n * 4).ok());
        for (size_t c = 0; c < chunks; ++c) ASSERT_EQ(got_scales[c], want_scales[c]) << "chunk " << c;
        size_t bad = 0;
        for (size_t i = 0; i < n; ++i) {
          const bool nan = std::isnan(in[i]);
          if (!nan && std::memcmp(&got[i * Bytes(t)], &want[i * Bytes(t)], Bytes(t)) != 0) ++bad;
          if (!SameFloat(got_dec[i], want_dec[i])) ++bad;
        }
        EXPECT_EQ(bad, 0u);
      }
    }
  }
}

}  // namespace
}  // namespace gradsync::cuda
