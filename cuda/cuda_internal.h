// Internal bridge between the nvcc-compiled translation units (reduce_kernels.cu,
// convert_kernels.cu, codec_kernels.cu, cuda_runtime_shim.cu) and the host C++ code (cuda_reduce.cc).
//
// This header uses no CUDA types: host code compiled by the normal C++ toolchain
// never includes CUDA headers (they are outside Bazel's declared include dirs).
// Every function returns a cudaError_t value as an int (0 == cudaSuccess) and
// never throws or aborts. Streams are passed as `void*` (a cudaStream_t, nullptr =
// the legacy default stream). Not part of the public API: include cuda_reduce.h.
#ifndef GRADSYNC_CUDA_CUDA_INTERNAL_H_
#define GRADSYNC_CUDA_CUDA_INTERNAL_H_

#include <cstddef>
#include <cstdint>

namespace gradsync {
namespace cuda {
namespace internal {

// Codes as in common/types.h (DType / ReduceOp); passed as ints so the .cu files
// need not include Abseil through common/types.h.
enum DTypeCode : int {
  kF32 = 1, kF64 = 2, kF16 = 3, kBF16 = 4, kI32 = 5, kI64 = 6, kU8 = 7, kF8E4M3 = 8, kF8E5M2 = 9
};
enum ReduceOpCode : int { kSum = 1, kAvg = 2, kMin = 3, kMax = 4, kProd = 5 };

// --- reduce_kernels.cu -------------------------------------------------------
// Enqueues dst[i] = dst[i] OP src[i] for i < count on `stream` (kAvg reduces as
// kSum). Returns cudaErrorInvalidValue for an unknown dtype/op, otherwise the
// launch status (cudaGetLastError right after the launch). count == 0 launches
// nothing. The caller validates pointers and CUDA availability.
int LaunchReduce(int dtype, int op, void* dst, const void* src, size_t count, void* stream);
// Enqueues dst[i] = a[i] OP b[i] (any two may be the same pointer), as above.
int LaunchCombine(int dtype, int op, void* dst, const void* a, const void* b, size_t count,
                  void* stream);
// Enqueues data[i] = data[i] / divisor (floating types in their compute type,
// integers truncating toward zero, wrapping). For integer types divisor != 0
// (checked by the caller).
int LaunchDivide(int dtype, void* data, size_t count, int64_t divisor, void* stream);

// --- convert_kernels.cu ------------------------------------------------------
// Enqueues the scaled conversion of kernels/scaled_convert.h: n f32 values of
// `in` to `dtype` (kF16, kBF16, kF8E4M3, kF8E5M2) in `out`, one power-of-two
// scale per chunk of `chunk` elements written to `scales`; and back.
// cudaErrorInvalidValue for another dtype or chunk == 0.
int LaunchEncodeScaled(int dtype, const float* in, size_t n, size_t chunk, float* scales,
                       void* out, void* stream);
int LaunchDecodeScaled(int dtype, const void* in, size_t n, size_t chunk, const float* scales,
                       float* out, void* stream);

// --- codec_kernels.cu ----------------------------------------------------------
// Enqueues kernels/codec.h's Encode of codec `codec` (a CodecId: 1 bf16, 2
// fp16, 3 fp8e4m3, 4 fp8e5m2, 5 int8) of n f32 values with scale blocks of
// `block` elements into `out` (the codec's layout: scales, then payload), and
// its Decode (add: out[i] += the decoded value). cudaErrorInvalidValue for
// another codec or block 0.
int LaunchCodecEncode(int codec, const float* in, size_t n, size_t block, void* out,
                      void* stream);
int LaunchCodecDecode(int codec, const void* in, size_t n, size_t block, float* out, bool add,
                      void* stream);

// The toolkit's host-side fp8 conversion (cuda_fp8.h, __NV_SATFINITE) of n floats;
// cudaErrorInvalidValue for a non-fp8 dtype. Runs on the CPU, no GPU needed.
int HostFloatToFp8(int dtype, const float* in, uint8_t* out, size_t n);

// cudaError_t values host code needs to tell apart (static_assert'ed in the shim).
constexpr int kCudaSuccess = 0;
constexpr int kCudaErrorMemoryAllocation = 2;
constexpr int kCudaErrorNotReady = 600;

// --- cuda_runtime_shim.cu: thin wrappers over the CUDA runtime -------------
struct RtDeviceProps {
  char name[256];
  size_t total_memory;
  int cc_major;
  int cc_minor;
  int multiprocessor_count;
};

int RtGetDeviceCount(int* count);
int RtGetDeviceProperties(int device, RtDeviceProps* props);
int RtGetDevice(int* device);
// Returns and clears the last (non-sticky) error of the calling thread.
int RtGetLastError();
const char* RtErrorName(int code);
const char* RtErrorString(int code);
int RtMalloc(void** ptr, size_t bytes);
int RtFree(void* ptr);
int RtMemcpyHostToDevice(void* dst, const void* src, size_t bytes);
int RtMemcpyDeviceToHost(void* dst, const void* src, size_t bytes);
int RtMemset(void* dst, int value, size_t bytes);
int RtStreamCreate(void** stream);  // non-blocking stream
int RtStreamDestroy(void* stream);
int RtStreamSynchronize(void* stream);
// cudaPointerGetAttributes: *kind is the cudaMemoryType (0 unregistered host
// memory, 1 page-locked host, 2 device, 3 managed); *device its device (or -1).
int RtPointerKind(const void* ptr, int* kind, int* device);

// --- cuda_runtime_shim.cu: device memory, IPC, pinned memory, timing --------
int RtSetDevice(int device);
// Whether kernels on `device` can reach `peer`'s memory (cudaDeviceCanAccessPeer),
// and then turns that on for the current device (cudaDeviceEnablePeerAccess;
// already on is success).
int RtCanAccessPeer(int device, int peer, int* can);
int RtEnablePeerAccess(int peer);
// The device's 16-byte UUID (cudaDeviceProp::uuid).
int RtDeviceUuid(int device, unsigned char uuid[16]);
constexpr size_t kIpcHandleBytes = 64;  // sizeof(cudaIpcMemHandle_t)
// cudaIpcGetMemHandle of the allocation starting at `base`.
int RtIpcGetMemHandle(const void* base, unsigned char handle[kIpcHandleBytes]);
// cudaIpcOpenMemHandle (cudaIpcMemLazyEnablePeerAccess) on the current device.
int RtIpcOpenMemHandle(void** ptr, const unsigned char handle[kIpcHandleBytes]);
int RtIpcCloseMemHandle(void* ptr);
// The allocation holding `ptr` (cuMemGetAddressRange through the runtime's
// driver entry point, so nothing links libcuda).
int RtMemGetAddressRange(const void* ptr, void** base, size_t* size);
// A dma-buf file descriptor of [ptr, +size) (cuMemGetHandleForAddressRange,
// CU_MEM_RANGE_HANDLE_TYPE_DMA_BUF_FD; both page-aligned), for GPUDirect RDMA
// by ibv_reg_dmabuf_mr. The caller closes *fd.
int RtMemGetDmaBufFd(const void* ptr, size_t size, int* fd);
// CU_DEVICE_ATTRIBUTE_DMA_BUF_SUPPORTED of `device` (1: the driver and the
// kernel can export its memory as dma-bufs).
int RtDeviceDmaBufSupported(int device, int* supported);
int RtHostRegister(void* ptr, size_t bytes);  // cudaHostRegisterPortable
int RtHostUnregister(void* ptr);
int RtMallocHost(void** ptr, size_t bytes);
int RtFreeHost(void* ptr);
// cudaMemcpyAsync with cudaMemcpyDefault (unified addressing picks the direction).
int RtMemcpyAsync(void* dst, const void* src, size_t bytes, void* stream);
int RtDeviceSynchronize();
int RtDeviceReset();
int RtEventCreate(void** event);  // timing enabled
int RtEventCreateNoTiming(void** event);  // cudaEventDisableTiming (cheaper)
// cudaEventQuery: kCudaSuccess when done, kCudaErrorNotReady while pending.
int RtEventQuery(void* event);
int RtEventDestroy(void* event);
int RtEventRecord(void* event, void* stream);
int RtEventSynchronize(void* event);
int RtEventElapsedMs(float* ms, void* start, void* end);

}  // namespace internal
}  // namespace cuda
}  // namespace gradsync

#endif  // GRADSYNC_CUDA_CUDA_INTERNAL_H_
