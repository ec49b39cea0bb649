// Default (non-CUDA) build of cuda_reduce.h: every call reports that CUDA was
// not compiled in, so callers take the CPU path. Selected unless --config=cuda.
#include <utility>

#include "absl/strings/str_cat.h"
#include "cuda/cuda_reduce.h"

namespace gradsync {
namespace cuda {
namespace {

constexpr char kNotBuilt[] = "gradsync was built without CUDA (build with --config=cuda)";

absl::Status NotUsable() {
  return absl::FailedPreconditionError(absl::StrCat("CUDA is not usable: ", kNotBuilt));
}

}  // namespace

bool BuiltWithCuda() { return false; }

absl::StatusOr<std::vector<CudaDeviceInfo>> ListCudaDevices() {
  return absl::UnavailableError(kNotBuilt);
}

bool CudaAvailable() { return false; }
absl::Status CudaUsable() { return NotUsable(); }

absl::Status CudaReduceInto(DType, ReduceOp, void*, const void*, size_t, void*) {
  return NotUsable();
}

absl::Status CudaDivideBy(DType, void*, size_t, int64_t, void*) { return NotUsable(); }
absl::Status CudaCombineInto(DType, ReduceOp, void*, const void*, const void*, size_t, void*) {
  return NotUsable();
}
absl::Status CudaEncodeScaled(DType, const float*, size_t, size_t, void*, float*, void*) {
  return NotUsable();
}
absl::Status CudaDecodeScaled(DType, const void*, size_t, size_t, const float*, float*, void*) {
  return NotUsable();
}

absl::Status CudaCodecEncode(CodecId, const float*, size_t, void*, void*) { return NotUsable(); }
absl::Status CudaCodecDecode(CodecId, const void*, size_t, float*, bool, void*) {
  return NotUsable();
}

absl::Status CudaSynchronize(void*) { return NotUsable(); }

absl::Status ToolkitFloatToFp8(DType, const float*, uint8_t*, size_t) { return NotUsable(); }

// No buffer or stream can ever be created, so these only move empty objects.
absl::StatusOr<DeviceBuffer> DeviceBuffer::Allocate(size_t) { return NotUsable(); }
DeviceBuffer::DeviceBuffer(DeviceBuffer&& other) noexcept
    : data_(std::exchange(other.data_, nullptr)), size_(std::exchange(other.size_, 0)) {}
DeviceBuffer& DeviceBuffer::operator=(DeviceBuffer&& other) noexcept {
  data_ = std::exchange(other.data_, nullptr);
  size_ = std::exchange(other.size_, 0);
  return *this;
}
DeviceBuffer::~DeviceBuffer() = default;
void DeviceBuffer::Reset() {}
absl::Status DeviceBuffer::CopyFromHost(const void*, size_t, size_t) { return NotUsable(); }
absl::Status DeviceBuffer::CopyToHost(void*, size_t, size_t) const { return NotUsable(); }
absl::Status DeviceBuffer::Fill(uint8_t) { return NotUsable(); }

absl::StatusOr<Stream> Stream::Create() { return NotUsable(); }
Stream::Stream(Stream&& other) noexcept : stream_(std::exchange(other.stream_, nullptr)) {}
Stream& Stream::operator=(Stream&& other) noexcept {
  stream_ = std::exchange(other.stream_, nullptr);
  return *this;
}
Stream::~Stream() = default;
void Stream::Reset() {}

}  // namespace cuda
}  // namespace gradsync
