// Thin wrappers over the CUDA runtime for cuda_reduce.cc (see cuda_internal.h).
// Compiled by nvcc (genrule //cuda:cuda_objs); contains no kernels.
#include <cuda_runtime.h>

#include <cstring>

#include "cuda/cuda_internal.h"

namespace gradsync {
namespace cuda {
namespace internal {

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

}  // namespace internal
}  // namespace cuda
}  // namespace gradsync
