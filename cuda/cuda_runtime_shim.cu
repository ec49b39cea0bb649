// Thin wrappers over the CUDA runtime for cuda_reduce.cc (see cuda_internal.h).
// Compiled by nvcc (genrule //cuda:cuda_objs); contains no kernels.
#include <cuda_runtime.h>

#include <cstring>

#include "cuda/cuda_internal.h"

namespace gradsync {
namespace cuda {
namespace internal {
static_assert(kCudaErrorNotReady == static_cast<int>(cudaErrorNotReady), "cudaErrorNotReady");

static_assert(kCudaSuccess == static_cast<int>(cudaSuccess), "cudaSuccess");
static_assert(kCudaErrorMemoryAllocation == static_cast<int>(cudaErrorMemoryAllocation),
              "cudaErrorMemoryAllocation");

int RtGetDeviceCount(int* count) {
  *count = 0;
  const cudaError_t err = cudaGetDeviceCount(count);
  if (err != cudaSuccess) *count = 0;
  return static_cast<int>(err);
}

int RtGetDeviceProperties(int device, RtDeviceProps* props) {
  cudaDeviceProp p;
  const cudaError_t err = cudaGetDeviceProperties(&p, device);
  if (err != cudaSuccess) return static_cast<int>(err);
  static_assert(sizeof(props->name) == sizeof(p.name), "device name size");
  std::memcpy(props->name, p.name, sizeof(props->name));
  props->name[sizeof(props->name) - 1] = '\0';
  props->total_memory = p.totalGlobalMem;
  props->cc_major = p.major;
  props->cc_minor = p.minor;
  props->multiprocessor_count = p.multiProcessorCount;
  return 0;
}

int RtGetDevice(int* device) { return static_cast<int>(cudaGetDevice(device)); }
int RtGetLastError() { return static_cast<int>(cudaGetLastError()); }
const char* RtErrorName(int code) { return cudaGetErrorName(static_cast<cudaError_t>(code)); }
const char* RtErrorString(int code) { return cudaGetErrorString(static_cast<cudaError_t>(code)); }

int RtMalloc(void** ptr, size_t bytes) { return static_cast<int>(cudaMalloc(ptr, bytes)); }
int RtFree(void* ptr) { return static_cast<int>(cudaFree(ptr)); }

int RtMemcpyHostToDevice(void* dst, const void* src, size_t bytes) {
  return static_cast<int>(cudaMemcpy(dst, src, bytes, cudaMemcpyHostToDevice));
}
int RtMemcpyDeviceToHost(void* dst, const void* src, size_t bytes) {
  return static_cast<int>(cudaMemcpy(dst, src, bytes, cudaMemcpyDeviceToHost));
}
int RtMemset(void* dst, int value, size_t bytes) {
  return static_cast<int>(cudaMemset(dst, value, bytes));
}

int RtStreamCreate(void** stream) {
  cudaStream_t s = nullptr;
  const cudaError_t err = cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking);
  *stream = err == cudaSuccess ? static_cast<void*>(s) : nullptr;
  return static_cast<int>(err);
}
int RtStreamDestroy(void* stream) {
  return static_cast<int>(cudaStreamDestroy(static_cast<cudaStream_t>(stream)));
}
int RtStreamSynchronize(void* stream) {
  return static_cast<int>(cudaStreamSynchronize(static_cast<cudaStream_t>(stream)));
}

int RtPointerKind(const void* ptr, int* kind, int* device) {
  cudaPointerAttributes attr;
  std::memset(&attr, 0, sizeof(attr));
  const cudaError_t err = cudaPointerGetAttributes(&attr, ptr);
  if (err != cudaSuccess) {
    *kind = 0;
    *device = -1;
    return static_cast<int>(err);
  }
  *kind = static_cast<int>(attr.type);
  *device = attr.device;
  return 0;
}

int RtSetDevice(int device) { return static_cast<int>(cudaSetDevice(device)); }
int RtCanAccessPeer(int device, int peer, int* can) {
  return static_cast<int>(cudaDeviceCanAccessPeer(can, device, peer));
}
int RtEnablePeerAccess(int peer) {
  const cudaError_t e = cudaDeviceEnablePeerAccess(peer, 0);
  if (e == cudaErrorPeerAccessAlreadyEnabled) {
    cudaGetLastError();
    return static_cast<int>(cudaSuccess);
  }
  return static_cast<int>(e);
}

int RtDeviceUuid(int device, unsigned char uuid[16]) {
  cudaDeviceProp p;
  const cudaError_t err = cudaGetDeviceProperties(&p, device);
  if (err != cudaSuccess) return static_cast<int>(err);
  static_assert(sizeof(p.uuid) == 16, "uuid size");
  std::memcpy(uuid, &p.uuid, 16);
  return 0;
}

static_assert(sizeof(cudaIpcMemHandle_t) == kIpcHandleBytes, "cudaIpcMemHandle_t size");

int RtIpcGetMemHandle(const void* base, unsigned char handle[kIpcHandleBytes]) {
  cudaIpcMemHandle_t h;
  const cudaError_t err = cudaIpcGetMemHandle(&h, const_cast<void*>(base));
  if (err == cudaSuccess) std::memcpy(handle, &h, kIpcHandleBytes);
  return static_cast<int>(err);
}
int RtIpcOpenMemHandle(void** ptr, const unsigned char handle[kIpcHandleBytes]) {
  cudaIpcMemHandle_t h;
  std::memcpy(&h, handle, kIpcHandleBytes);
  return static_cast<int>(cudaIpcOpenMemHandle(ptr, h, cudaIpcMemLazyEnablePeerAccess));
}
int RtIpcCloseMemHandle(void* ptr) { return static_cast<int>(cudaIpcCloseMemHandle(ptr)); }

namespace {
// A driver function through the runtime's entry point (nothing links libcuda),
// looked up once; null with the error when this driver has none.
struct DriverFn {
  void* fn = nullptr;
  int error = 0;
};
DriverFn LookUpDriver(const char* name, int version) {
  DriverFn e;
  cudaDriverEntryPointQueryResult q;
  const cudaError_t err = cudaGetDriverEntryPointByVersion(name, &e.fn, version, cudaEnableDefault, &q);
  if (err != cudaSuccess) {
    e.error = static_cast<int>(err);
    e.fn = nullptr;
  } else if (q != cudaDriverEntryPointSuccess || e.fn == nullptr) {
    e.error = static_cast<int>(cudaErrorSymbolNotFound);
    e.fn = nullptr;
  }
  return e;
}
}  // namespace

int RtMemGetAddressRange(const void* ptr, void** base, size_t* size) {
  using Fn = int (*)(unsigned long long*, size_t*, unsigned long long);  // CUresult(CUdeviceptr*, ...)
  static const DriverFn entry = LookUpDriver("cuMemGetAddressRange", 12000);
  if (entry.fn == nullptr) return entry.error;
  unsigned long long b = 0;
  const int r = reinterpret_cast<Fn>(entry.fn)(&b, size, reinterpret_cast<unsigned long long>(ptr));
  if (r != 0) return static_cast<int>(cudaErrorInvalidValue);  // CUDA_ERROR_* has no cudaError_t
  *base = reinterpret_cast<void*>(b);
  return 0;
}

int RtMemGetDmaBufFd(const void* ptr, size_t size, int* fd) {
  // CUresult cuMemGetHandleForAddressRange(void*, CUdeviceptr, size_t, CUmemRangeHandleType, ull)
  using Fn = int (*)(void*, unsigned long long, size_t, int, unsigned long long);
  static const DriverFn entry = LookUpDriver("cuMemGetHandleForAddressRange", 11070);
  if (entry.fn == nullptr) return entry.error;
  constexpr int kDmaBufFd = 1;  // CU_MEM_RANGE_HANDLE_TYPE_DMA_BUF_FD
  const int r = reinterpret_cast<Fn>(entry.fn)(fd, reinterpret_cast<unsigned long long>(ptr), size,
                                               kDmaBufFd, 0);
  return r == 0 ? 0 : static_cast<int>(cudaErrorNotSupported);
}

int RtDeviceDmaBufSupported(int device, int* supported) {
  using Fn = int (*)(int*, int, int);  // CUresult cuDeviceGetAttribute(int*, CUdevice_attribute, CUdevice)
  static const DriverFn entry = LookUpDriver("cuDeviceGetAttribute", 12000);
  if (entry.fn == nullptr) return entry.error;
  constexpr int kDmaBufSupported = 124;  // CU_DEVICE_ATTRIBUTE_DMA_BUF_SUPPORTED
  const int r = reinterpret_cast<Fn>(entry.fn)(supported, kDmaBufSupported, device);
  return r == 0 ? 0 : static_cast<int>(cudaErrorInvalidDevice);
}

int RtHostRegister(void* ptr, size_t bytes) {
  return static_cast<int>(cudaHostRegister(ptr, bytes, cudaHostRegisterPortable));
}
int RtHostUnregister(void* ptr) { return static_cast<int>(cudaHostUnregister(ptr)); }
int RtMallocHost(void** ptr, size_t bytes) { return static_cast<int>(cudaMallocHost(ptr, bytes)); }
int RtFreeHost(void* ptr) { return static_cast<int>(cudaFreeHost(ptr)); }

int RtMemcpyAsync(void* dst, const void* src, size_t bytes, void* stream) {
  return static_cast<int>(
      cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, static_cast<cudaStream_t>(stream)));
}
int RtDeviceSynchronize() { return static_cast<int>(cudaDeviceSynchronize()); }
int RtDeviceReset() { return static_cast<int>(cudaDeviceReset()); }

int RtEventCreate(void** event) {
  cudaEvent_t e = nullptr;
  const cudaError_t err = cudaEventCreate(&e);
  *event = err == cudaSuccess ? static_cast<void*>(e) : nullptr;
  return static_cast<int>(err);
}
int RtEventDestroy(void* event) { return static_cast<int>(cudaEventDestroy(static_cast<cudaEvent_t>(event))); }
int RtEventCreateNoTiming(void** event) {
  cudaEvent_t e = nullptr;
  const cudaError_t err = cudaEventCreateWithFlags(&e, cudaEventDisableTiming);
  *event = err == cudaSuccess ? static_cast<void*>(e) : nullptr;
  return static_cast<int>(err);
}
int RtEventQuery(void* event) {
  return static_cast<int>(cudaEventQuery(static_cast<cudaEvent_t>(event)));
}
int RtEventRecord(void* event, void* stream) {
  return static_cast<int>(cudaEventRecord(static_cast<cudaEvent_t>(event), static_cast<cudaStream_t>(stream)));
}
int RtEventSynchronize(void* event) {
  return static_cast<int>(cudaEventSynchronize(static_cast<cudaEvent_t>(event)));
}
int RtEventElapsedMs(float* ms, void* start, void* end) {
  return static_cast<int>(
      cudaEventElapsedTime(ms, static_cast<cudaEvent_t>(start), static_cast<cudaEvent_t>(end)));
}

}  // namespace internal
}  // namespace cuda
}  // namespace gradsync
