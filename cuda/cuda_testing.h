// For CUDA tests: a float comparison, and a fixture whose tests need a
// usable GPU. Without one they skip, saying why; with GRADSYNC_REQUIRE_CUDA=1
// (on a GPU host) they fail instead, so a missing device or a too-old driver
// cannot pass as a skip.
#ifndef GRADSYNC_CUDA_CUDA_TESTING_H_
#define GRADSYNC_CUDA_CUDA_TESTING_H_

#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <string>

#include "absl/status/status.h"
#include "cuda/cuda_reduce.h"
#include "gtest/gtest.h"

namespace gradsync::cuda {

class CudaGpuTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (CudaAvailable()) return;
    const std::string reason(ListCudaDevices().status().message());
    const char* require = std::getenv("GRADSYNC_REQUIRE_CUDA");
    if (require != nullptr && std::string(require) == "1") {
      FAIL() << "GRADSYNC_REQUIRE_CUDA=1 but CUDA is not usable: " << reason;
    }
    GTEST_SKIP() << "no usable CUDA device: " << reason;
  }
};

// What a CUDA call says on a host where CUDA is not usable: FailedPrecondition
// naming why (the stub build, or no usable device).
inline void ExpectNotUsable(const absl::Status& s) {
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
  EXPECT_NE(s.message().find(BuiltWithCuda() ? "CUDA is not usable" : "built without CUDA"),
            std::string::npos)
      << s;
}

// The same bits, or both NaN (CUDA makes canonical NaNs; x86 keeps payloads).
inline bool SameFloat(float a, float b) {
  uint32_t x, y;
  std::memcpy(&x, &a, 4);
  std::memcpy(&y, &b, 4);
  return x == y || (std::isnan(a) && std::isnan(b));
}

}  // namespace gradsync::cuda

#endif  // GRADSYNC_CUDA_CUDA_TESTING_H_
