// CUDA reduction kernels and a few RAII helpers, behind a plain C++ API.
//
// No CUDA header is needed to use this file: streams are passed as `void*`
// (a cudaStream_t; nullptr means the legacy default stream) and device memory as
// plain pointers. The library is built in one of two ways:
//   - default build: a stub. Every call reports kUnavailable / kFailedPrecondition
//     with "gradsync was built without CUDA (build with --config=cuda)".
//   - `bazel build --config=cuda`: the nvcc kernels in reduce_kernels.cu, linked
//     against the static CUDA runtime. On a host without a usable GPU or driver
//     (cudaErrorInsufficientDriver, cudaErrorNoDevice, ...) the calls report that
//     reason instead of crashing, and callers fall back to the CPU kernels.
//
// Semantics are those of the CPU kernels (kernels/cpu_reduce.h), bit for bit:
// dst = dst OP src per element; kAvg reduces as kSum (divide once at the end with
// CudaDivideBy); f16/bf16 are computed in f32 and rounded to nearest even per
// element; integers wrap around; min is (a < b ? a : b), max is (a > b ? a : b)
// with a = the dst element (so min(NaN, b) = b, min(a, NaN) = NaN). As on the CPU,
// a NaN result is a quiet NaN whose sign and payload are unspecified (CUDA makes
// canonical NaNs, x86 keeps payloads).
//
// Thread-safety: all functions may be called from any thread. Kernels run on the
// calling thread's current device (cudaSetDevice); pointers must be usable there.
// Error codes:
//   kUnavailable        ListCudaDevices: no CUDA (stub build, no driver, no device).
//   kFailedPrecondition reduce/divide/allocation calls when CUDA is not usable.
//   kInvalidArgument    bad dtype/op, null or misaligned pointer, unregistered
//                       host memory, integer division by zero.
//   kInternal           a CUDA call failed (the message names the call and the
//                       cudaError_t); after a sticky error the CUDA context is
//                       unusable for the rest of the process.
#ifndef GRADSYNC_CUDA_CUDA_REDUCE_H_
#define GRADSYNC_CUDA_CUDA_REDUCE_H_

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/types.h"
#include "kernels/codec.h"

namespace gradsync {
namespace cuda {

struct CudaDeviceInfo {
  int index = 0;
  std::string name;
  size_t total_memory = 0;  // bytes
  int cc_major = 0;         // compute capability, e.g. 9.0 for H100/H200
  int cc_minor = 0;
};

// True when this binary was compiled with --config=cuda (the kernels exist).
bool BuiltWithCuda();

// Lists the visible CUDA devices. kUnavailable with the reason when there are
// none: "gradsync was built without CUDA (build with --config=cuda)",
// "CUDA driver not usable: <cudaGetErrorString> (<cudaError name>)" or
// "no CUDA devices". Clears the (non-sticky) CUDA error it may leave behind.
absl::StatusOr<std::vector<CudaDeviceInfo>> ListCudaDevices();

// True when ListCudaDevices() would succeed. Probed once per process and cached.
bool CudaAvailable();
// OK, or kFailedPrecondition naming why CUDA cannot be used (cached, as above).
absl::Status CudaUsable();

// dst[i] = dst[i] OP src[i] for i < count, enqueued on `stream` (nullptr = legacy
// default stream). Returns once the kernel is launched, not when it finishes:
// use CudaSynchronize(stream) or a later operation on the same stream. dst and src
// must be device (or managed, or mapped pinned host) memory aligned to the element
// size; they may be equal but must not partially overlap. count == 0 is a no-op
// (null pointers allowed). Blocking: no (beyond the launch).
absl::Status CudaReduceInto(DType dtype, ReduceOp op, void* dst_device, const void* src_device,
                            size_t count, void* stream);

// dst[i] = a[i] OP b[i] (operands in that order: it matters for min/max with
// NaN or signed zeros), as CudaReduceInto; dst may be a or b.
absl::Status CudaCombineInto(DType dtype, ReduceOp op, void* dst_device, const void* a_device,
                             const void* b_device, size_t count, void* stream);

// data[i] = data[i] / divisor, enqueued on `stream`, as the CPU DivideBy: floats
// divide by the converted divisor in their compute type (f16/bf16 in f32, then
// round to nearest even; a zero divisor gives inf/NaN as IEEE says); integers
// give the exact quotient truncated toward zero, wrapped to the type (only
// INT_MIN / -1 and u8 with a negative divisor wrap). An integer divisor of 0 is
// kInvalidArgument (the CPU kernel aborts). The second half of ReduceOp::kAvg.
absl::Status CudaDivideBy(DType dtype, void* data_device, size_t count, int64_t divisor,
                          void* stream);

// kernels/scaled_convert.h on the device, bit for bit: encodes n f32 values
// into `to` (f16, bf16, f8e4m3, f8e5m2) with a power-of-two scale per chunk
// of `chunk` elements (ScaledChunks(n, chunk) floats in `scales_device`),
// and decodes them back, enqueued on `stream`. kInvalidArgument for another
// type, chunk 0 or a pointer CUDA cannot use.
absl::Status CudaEncodeScaled(DType to, const float* in_device, size_t n, size_t chunk,
                              void* out_device, float* scales_device, void* stream);
absl::Status CudaDecodeScaled(DType from, const void* in_device, size_t n, size_t chunk,
                              const float* scales_device, float* out_device, void* stream);

// The wire codecs of kernels/codec.h on the device, bit for bit the CPU
// codec's (a NaN decodes as a NaN, its payload unspecified): encodes n f32
// values into CodecFor(codec)->EncodedBytes(n) bytes at `out_device` (8-byte
// aligned), and decodes them (add: out[i] += the decoded value, one f32
// addition each), enqueued on `stream`. kInvalidArgument for kNone or an
// invalid id, or a pointer CUDA cannot use.
absl::Status CudaCodecEncode(CodecId codec, const float* in_device, size_t n, void* out_device,
                             void* stream);
absl::Status CudaCodecDecode(CodecId codec, const void* in_device, size_t n, float* out_device,
                             bool add, void* stream);

// The CUDA toolkit's own float -> fp8 conversion (cuda_fp8.h's host path of
// __nv_cvt_float_to_fp8 with __NV_SATFINITE, which the kernels use on the GPU),
// for n floats; runs on the CPU and needs no GPU. The reference common/fp8.h is
// checked against. kInvalidArgument for a non-fp8 dtype; kFailedPrecondition in
// the stub build.
absl::Status ToolkitFloatToFp8(DType dtype, const float* in, uint8_t* out, size_t n);

// Waits for all work on `stream` (nullptr = legacy default stream).
absl::Status CudaSynchronize(void* stream);

// Owns a cudaMalloc'd allocation on the current device. Move-only.
class DeviceBuffer {
 public:
  // bytes == 0 gives an empty buffer with data() == nullptr.
  static absl::StatusOr<DeviceBuffer> Allocate(size_t bytes);

  DeviceBuffer() = default;
  DeviceBuffer(DeviceBuffer&& other) noexcept;
  DeviceBuffer& operator=(DeviceBuffer&& other) noexcept;
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  ~DeviceBuffer();  // cudaFree; errors are ignored

  void* data() const { return data_; }
  size_t size() const { return size_; }

  // Synchronous copies of `bytes` bytes at byte `offset` of this buffer.
  // kOutOfRange when offset + bytes exceeds size().
  absl::Status CopyFromHost(const void* host, size_t bytes, size_t offset = 0);
  absl::Status CopyToHost(void* host, size_t bytes, size_t offset = 0) const;
  // Sets every byte to `value` (synchronous with respect to the host).
  absl::Status Fill(uint8_t value);

 private:
  DeviceBuffer(void* data, size_t size) : data_(data), size_(size) {}
  void Reset();

  void* data_ = nullptr;
  size_t size_ = 0;
};

// Owns a non-blocking cudaStream_t on the current device. Move-only.
class Stream {
 public:
  static absl::StatusOr<Stream> Create();

  Stream() = default;
  Stream(Stream&& other) noexcept;
  Stream& operator=(Stream&& other) noexcept;
  Stream(const Stream&) = delete;
  Stream& operator=(const Stream&) = delete;
  ~Stream();  // cudaStreamDestroy; errors are ignored

  // The cudaStream_t, for the `stream` parameters above.
  void* get() const { return stream_; }
  absl::Status Synchronize() const { return CudaSynchronize(stream_); }

 private:
  explicit Stream(void* stream) : stream_(stream) {}
  void Reset();

  void* stream_ = nullptr;
};

}  // namespace cuda
}  // namespace gradsync

#endif  // GRADSYNC_CUDA_CUDA_REDUCE_H_
