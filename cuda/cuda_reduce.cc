// CUDA build of cuda_reduce.h (selected by --config=cuda). All CUDA runtime calls
// go through cuda_internal.h, so this file needs no CUDA headers.
#include "cuda/cuda_reduce.h"

#include <cstdint>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "cuda/cuda_errors.h"
#include "cuda/cuda_internal.h"

namespace gradsync {
namespace cuda {
namespace internal {

std::string CudaErrorText(int code) {
  return absl::StrCat(RtErrorString(code), " (", RtErrorName(code), ")");
}

absl::Status CudaCallError(absl::string_view call, int code) {
  RtGetLastError();
  std::string msg = absl::StrCat(call, " failed: ", CudaErrorText(code));
  if (code == kCudaErrorMemoryAllocation) return absl::ResourceExhaustedError(msg);
  return absl::InternalError(msg);
}

}  // namespace internal

namespace {

namespace rt = ::gradsync::cuda::internal;
using rt::CudaCallError;
using rt::CudaErrorText;

// kUnavailable naming why no device can be used, or OK.
absl::Status ProbeDevices(int* count) {
  *count = 0;
  const int err = rt::RtGetDeviceCount(count);
  if (err != rt::kCudaSuccess) {
    rt::RtGetLastError();  // the failed init leaves an error behind; clear it
    *count = 0;
    return absl::UnavailableError(absl::StrCat("CUDA driver not usable: ", CudaErrorText(err)));
  }
  if (*count <= 0) return absl::UnavailableError("no CUDA devices");
  return absl::OkStatus();
}

const absl::Status& CachedProbe() {
  // The runtime caches a failed driver initialisation for the life of the process,
  // so probing once is exact. Leaked on purpose (no destruction-order issues).
  static const absl::Status* const status = [] {
    int count = 0;
    return new absl::Status(ProbeDevices(&count));
  }();
  return *status;
}

absl::Status ValidateDType(DType dtype) {
  if (!IsValidDType(static_cast<int>(dtype))) {
    return absl::InvalidArgumentError(absl::StrCat("invalid dtype ", static_cast<int>(dtype)));
  }
  return absl::OkStatus();
}

// Checks that `ptr` is element-aligned memory a kernel can address.
absl::Status ValidateDevicePointer(const char* what, const void* ptr, DType dtype) {
  if (ptr == nullptr) return absl::InvalidArgumentError(absl::StrCat(what, " is null"));
  const size_t elem = DTypeSize(dtype);
  if (reinterpret_cast<uintptr_t>(ptr) % elem != 0) {
    return absl::InvalidArgumentError(absl::StrCat(what, " pointer 0x", absl::Hex(ptr),
                                                   " is not aligned to the ", elem, "-byte ",
                                                   DTypeName(dtype), " element"));
  }
  int kind = 0;
  int device = -1;
  const int err = rt::RtPointerKind(ptr, &kind, &device);
  if (err != rt::kCudaSuccess) {
    rt::RtGetLastError();
    return absl::InvalidArgumentError(absl::StrCat(what, " pointer 0x", absl::Hex(ptr),
                                                   " is not usable by CUDA: ", CudaErrorText(err)));
  }
  if (kind == 0) {  // cudaMemoryTypeUnregistered
    return absl::InvalidArgumentError(
        absl::StrCat(what, " pointer 0x", absl::Hex(ptr),
                     " is host memory not registered with CUDA (need device memory)"));
  }
  return absl::OkStatus();
}

}  // namespace

bool BuiltWithCuda() { return true; }

absl::StatusOr<std::vector<CudaDeviceInfo>> ListCudaDevices() {
  int count = 0;
  RETURN_IF_ERROR(ProbeDevices(&count));
  std::vector<CudaDeviceInfo> devices;
  devices.reserve(count);
  for (int i = 0; i < count; ++i) {
    rt::RtDeviceProps props;
    const int err = rt::RtGetDeviceProperties(i, &props);
    if (err != rt::kCudaSuccess) {
      rt::RtGetLastError();
      return absl::UnavailableError(absl::StrCat(
          "CUDA device ", i, " not usable: cudaGetDeviceProperties failed: ", CudaErrorText(err)));
    }
    CudaDeviceInfo info;
    info.index = i;
    info.name = props.name;
    info.total_memory = props.total_memory;
    info.cc_major = props.cc_major;
    info.cc_minor = props.cc_minor;
    devices.push_back(std::move(info));
  }
  return devices;
}

bool CudaAvailable() { return CachedProbe().ok(); }

absl::Status CudaUsable() {
  const absl::Status& probe = CachedProbe();
  if (probe.ok()) return absl::OkStatus();
  return absl::FailedPreconditionError(absl::StrCat("CUDA is not usable: ", probe.message()));
}

namespace {
// What every reduce kernel launch needs: a dtype and op it has, and a GPU.
absl::Status CheckReduceLaunch(DType dtype, ReduceOp op) {
  RETURN_IF_ERROR(ValidateDType(dtype));
  if (!IsValidReduceOp(static_cast<int>(op))) {
    return absl::InvalidArgumentError(absl::StrCat("invalid reduce op ", static_cast<int>(op)));
  }
  return CudaUsable();
}
}  // namespace

absl::Status CudaReduceInto(DType dtype, ReduceOp op, void* dst_device, const void* src_device,
                            size_t count, void* stream) {
  RETURN_IF_ERROR(CheckReduceLaunch(dtype, op));
  if (count == 0) return absl::OkStatus();
  RETURN_IF_ERROR(ValidateDevicePointer("dst", dst_device, dtype));
  RETURN_IF_ERROR(ValidateDevicePointer("src", src_device, dtype));
  const int err = rt::LaunchReduce(static_cast<int>(dtype), static_cast<int>(CombineOp(op)), dst_device,
                                   src_device, count, stream);
  if (err != rt::kCudaSuccess) {
    return CudaCallError(absl::StrCat("CUDA reduce kernel launch (", DTypeName(dtype), " ",
                                      ReduceOpName(op), ", count ", count, ")"),
                         err);
  }
  return absl::OkStatus();
}

absl::Status CudaCombineInto(DType dtype, ReduceOp op, void* dst_device, const void* a_device,
                             const void* b_device, size_t count, void* stream) {
  RETURN_IF_ERROR(CheckReduceLaunch(dtype, op));
  if (count == 0) return absl::OkStatus();
  RETURN_IF_ERROR(ValidateDevicePointer("dst", dst_device, dtype));
  RETURN_IF_ERROR(ValidateDevicePointer("a", a_device, dtype));
  RETURN_IF_ERROR(ValidateDevicePointer("b", b_device, dtype));
  const int err = rt::LaunchCombine(static_cast<int>(dtype), static_cast<int>(CombineOp(op)), dst_device,
                                    a_device, b_device, count, stream);
  if (err != rt::kCudaSuccess) {
    return CudaCallError(absl::StrCat("CUDA combine kernel launch (", DTypeName(dtype), " ",
                                      ReduceOpName(op), ", count ", count, ")"),
                         err);
  }
  return absl::OkStatus();
}

namespace {
absl::Status CheckScaled(DType t, size_t chunk) {
  if (t != DType::kF16 && t != DType::kBF16 && t != DType::kF8E4M3 && t != DType::kF8E5M2) {
    return absl::InvalidArgumentError(absl::StrCat("scaled conversion to ", DTypeName(t),
                                                   ": expected f16, bf16, f8e4m3 or f8e5m2"));
  }
  if (chunk == 0) return absl::InvalidArgumentError("scaled conversion in chunks of 0 elements");
  return CudaUsable();
}
}  // namespace

absl::Status CudaEncodeScaled(DType to, const float* in_device, size_t n, size_t chunk,
                              void* out_device, float* scales_device, void* stream) {
  RETURN_IF_ERROR(CheckScaled(to, chunk));
  if (n == 0) return absl::OkStatus();
  RETURN_IF_ERROR(ValidateDevicePointer("in", in_device, DType::kF32));
  RETURN_IF_ERROR(ValidateDevicePointer("out", out_device, to));
  RETURN_IF_ERROR(ValidateDevicePointer("scales", scales_device, DType::kF32));
  const int err = rt::LaunchEncodeScaled(static_cast<int>(to), in_device, n, chunk, scales_device,
                                         out_device, stream);
  if (err != rt::kCudaSuccess) {
    return CudaCallError(absl::StrCat("scaled encode to ", DTypeName(to), " (", n, " elements)"),
                         err);
  }
  return absl::OkStatus();
}

absl::Status CudaDecodeScaled(DType from, const void* in_device, size_t n, size_t chunk,
                              const float* scales_device, float* out_device, void* stream) {
  RETURN_IF_ERROR(CheckScaled(from, chunk));
  if (n == 0) return absl::OkStatus();
  RETURN_IF_ERROR(ValidateDevicePointer("in", in_device, from));
  RETURN_IF_ERROR(ValidateDevicePointer("out", out_device, DType::kF32));
  RETURN_IF_ERROR(ValidateDevicePointer("scales", scales_device, DType::kF32));
  const int err = rt::LaunchDecodeScaled(static_cast<int>(from), in_device, n, chunk,
                                         scales_device, out_device, stream);
  if (err != rt::kCudaSuccess) {
    return CudaCallError(absl::StrCat("scaled decode from ", DTypeName(from), " (", n,
                                      " elements)"),
                         err);
  }
  return absl::OkStatus();
}

namespace {
absl::Status CheckCodec(CodecId codec, const void* encoded) {
  if (CodecFor(codec) == nullptr) {
    return absl::InvalidArgumentError(
        absl::StrCat("codec ", static_cast<int>(codec), " is not a wire codec"));
  }
  if (reinterpret_cast<uintptr_t>(encoded) % 8 != 0) {
    return absl::InvalidArgumentError(absl::StrCat("encoded ", CodecName(codec), " bytes at 0x",
                                                   absl::Hex(encoded), " are not 8-byte aligned"));
  }
  return CudaUsable();
}
}  // namespace

absl::Status CudaCodecEncode(CodecId codec, const float* in_device, size_t n, void* out_device,
                             void* stream) {
  RETURN_IF_ERROR(CheckCodec(codec, out_device));
  if (n == 0) return absl::OkStatus();
  RETURN_IF_ERROR(ValidateDevicePointer("in", in_device, DType::kF32));
  RETURN_IF_ERROR(ValidateDevicePointer("out", out_device, DType::kF32));
  const int err = rt::LaunchCodecEncode(static_cast<int>(codec), in_device, n,
                                        kCodecBlockElements, out_device, stream);
  if (err != rt::kCudaSuccess) {
    return CudaCallError(absl::StrCat(CodecName(codec), " encode (", n, " elements)"), err);
  }
  return absl::OkStatus();
}

absl::Status CudaCodecDecode(CodecId codec, const void* in_device, size_t n, float* out_device,
                             bool add, void* stream) {
  RETURN_IF_ERROR(CheckCodec(codec, in_device));
  if (n == 0) return absl::OkStatus();
  RETURN_IF_ERROR(ValidateDevicePointer("in", in_device, DType::kF32));
  RETURN_IF_ERROR(ValidateDevicePointer("out", out_device, DType::kF32));
  const int err = rt::LaunchCodecDecode(static_cast<int>(codec), in_device, n,
                                        kCodecBlockElements, out_device, add, stream);
  if (err != rt::kCudaSuccess) {
    return CudaCallError(absl::StrCat(CodecName(codec), add ? " decode-add (" : " decode (", n,
                                      " elements)"),
                         err);
  }
  return absl::OkStatus();
}

absl::Status CudaDivideBy(DType dtype, void* data_device, size_t count, int64_t divisor,
                          void* stream) {
  RETURN_IF_ERROR(ValidateDType(dtype));
  if (divisor == 0 && !IsFloatDType(dtype)) {
    return absl::InvalidArgumentError(
        absl::StrCat("integer division by zero (", DTypeName(dtype), ")"));
  }
  RETURN_IF_ERROR(CudaUsable());
  if (count == 0) return absl::OkStatus();
  RETURN_IF_ERROR(ValidateDevicePointer("data", data_device, dtype));
  const int err = rt::LaunchDivide(static_cast<int>(dtype), data_device, count, divisor, stream);
  if (err != rt::kCudaSuccess) {
    return CudaCallError(absl::StrCat("CUDA divide kernel launch (", DTypeName(dtype), ", count ",
                                      count, ", divisor ", divisor, ")"),
                         err);
  }
  return absl::OkStatus();
}

absl::Status CudaSynchronize(void* stream) {
  RETURN_IF_ERROR(CudaUsable());
  const int err = rt::RtStreamSynchronize(stream);
  if (err != rt::kCudaSuccess) return CudaCallError("cudaStreamSynchronize", err);
  return absl::OkStatus();
}

absl::Status ToolkitFloatToFp8(DType dtype, const float* in, uint8_t* out, size_t n) {
  if (dtype != DType::kF8E4M3 && dtype != DType::kF8E5M2) {
    return absl::InvalidArgumentError(
        absl::StrCat("ToolkitFloatToFp8: ", DTypeName(dtype), " is not an fp8 type"));
  }
  rt::HostFloatToFp8(static_cast<int>(dtype), in, out, n);
  return absl::OkStatus();
}

// --- DeviceBuffer -----------------------------------------------------------

absl::StatusOr<DeviceBuffer> DeviceBuffer::Allocate(size_t bytes) {
  RETURN_IF_ERROR(CudaUsable());
  if (bytes == 0) return DeviceBuffer();
  void* ptr = nullptr;
  const int err = rt::RtMalloc(&ptr, bytes);
  if (err != rt::kCudaSuccess) {
    return CudaCallError(absl::StrCat("cudaMalloc of ", bytes, " bytes"), err);
  }
  return DeviceBuffer(ptr, bytes);
}

DeviceBuffer::DeviceBuffer(DeviceBuffer&& other) noexcept
    : data_(std::exchange(other.data_, nullptr)), size_(std::exchange(other.size_, 0)) {}

DeviceBuffer& DeviceBuffer::operator=(DeviceBuffer&& other) noexcept {
  if (this != &other) {
    Reset();
    data_ = std::exchange(other.data_, nullptr);
    size_ = std::exchange(other.size_, 0);
  }
  return *this;
}

DeviceBuffer::~DeviceBuffer() { Reset(); }

void DeviceBuffer::Reset() {
  if (data_ != nullptr) {
    if (rt::RtFree(data_) != rt::kCudaSuccess) rt::RtGetLastError();
  }
  data_ = nullptr;
  size_ = 0;
}

namespace {
absl::Status CheckRange(size_t size, size_t offset, size_t bytes) {
  if (offset > size || bytes > size - offset) {
    return absl::OutOfRangeError(absl::StrCat("copy of ", bytes, " bytes at offset ", offset,
                                              " exceeds the ", size, "-byte device buffer"));
  }
  return absl::OkStatus();
}
}  // namespace

absl::Status DeviceBuffer::CopyFromHost(const void* host, size_t bytes, size_t offset) {
  RETURN_IF_ERROR(CheckRange(size_, offset, bytes));
  if (bytes == 0) return absl::OkStatus();
  if (host == nullptr) return absl::InvalidArgumentError("host source is null");
  const int err = rt::RtMemcpyHostToDevice(static_cast<char*>(data_) + offset, host, bytes);
  if (err != rt::kCudaSuccess) return CudaCallError("cudaMemcpy host-to-device", err);
  return absl::OkStatus();
}

absl::Status DeviceBuffer::CopyToHost(void* host, size_t bytes, size_t offset) const {
  RETURN_IF_ERROR(CheckRange(size_, offset, bytes));
  if (bytes == 0) return absl::OkStatus();
  if (host == nullptr) return absl::InvalidArgumentError("host destination is null");
  const int err = rt::RtMemcpyDeviceToHost(host, static_cast<const char*>(data_) + offset, bytes);
  if (err != rt::kCudaSuccess) return CudaCallError("cudaMemcpy device-to-host", err);
  return absl::OkStatus();
}

absl::Status DeviceBuffer::Fill(uint8_t value) {
  if (size_ == 0) return absl::OkStatus();
  int err = rt::RtMemset(data_, value, size_);
  if (err == rt::kCudaSuccess) err = rt::RtStreamSynchronize(nullptr);
  if (err != rt::kCudaSuccess) return CudaCallError("cudaMemset", err);
  return absl::OkStatus();
}

// --- Stream -------------------------------------------------------------------

absl::StatusOr<Stream> Stream::Create() {
  RETURN_IF_ERROR(CudaUsable());
  void* s = nullptr;
  const int err = rt::RtStreamCreate(&s);
  if (err != rt::kCudaSuccess) return CudaCallError("cudaStreamCreateWithFlags", err);
  return Stream(s);
}

Stream::Stream(Stream&& other) noexcept : stream_(std::exchange(other.stream_, nullptr)) {}

Stream& Stream::operator=(Stream&& other) noexcept {
  if (this != &other) {
    Reset();
    stream_ = std::exchange(other.stream_, nullptr);
  }
  return *this;
}

Stream::~Stream() { Reset(); }

void Stream::Reset() {
  if (stream_ != nullptr) {
    if (rt::RtStreamDestroy(stream_) != rt::kCudaSuccess) rt::RtGetLastError();
  }
  stream_ = nullptr;
}

}  // namespace cuda
}  // namespace gradsync
