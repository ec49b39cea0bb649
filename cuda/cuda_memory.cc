// CUDA build of cuda_memory.h (selected by --config=cuda); every runtime call
// goes through cuda_internal.h.
#include "cuda/cuda_memory.h"

#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/status_macros.h"
#include "cuda/cuda_errors.h"
#include "cuda/cuda_internal.h"
#include "cuda/cuda_reduce.h"

namespace gradsync::cuda {
namespace {

namespace rt = ::gradsync::cuda::internal;
using rt::CudaCallError;
using rt::CudaErrorText;

static_assert(kIpcHandleBytes == rt::kIpcHandleBytes, "IPC handle size");

std::string FormatUuid(const unsigned char u[16]) {
  char s[64];
  std::snprintf(s, sizeof(s),
                "GPU-%02x%02x%02x%02x-%02x%02x-%02x%02x-%02x%02x-%02x%02x%02x%02x%02x%02x", u[0],
                u[1], u[2], u[3], u[4], u[5], u[6], u[7], u[8], u[9], u[10], u[11], u[12], u[13],
                u[14], u[15]);
  return s;
}

}  // namespace

absl::StatusOr<std::string> DeviceUuid(int device) {
  RETURN_IF_ERROR(CudaUsable());
  unsigned char u[16];
  if (int e = rt::RtDeviceUuid(device, u); e != rt::kCudaSuccess) {
    return CudaCallError(absl::StrCat("cudaGetDeviceProperties(", device, ")"), e);
  }
  return FormatUuid(u);
}

absl::StatusOr<int> DeviceWithUuid(absl::string_view uuid) {
  RETURN_IF_ERROR(CudaUsable());
  int count = 0;
  if (int e = rt::RtGetDeviceCount(&count); e != rt::kCudaSuccess) {
    return CudaCallError("cudaGetDeviceCount", e);
  }
  std::vector<std::string> visible;
  for (int d = 0; d < count; ++d) {
    ASSIGN_OR_RETURN(std::string u, DeviceUuid(d));
    if (u == uuid) return d;
    visible.push_back(absl::StrCat(d, ": ", u));
  }
  return absl::NotFoundError(absl::StrCat("GPU ", uuid, " is not visible to this process (visible: ",
                                          absl::StrJoin(visible, ", "),
                                          "; check CUDA_VISIBLE_DEVICES)"));
}

absl::StatusOr<int> DeviceOfPointer(const void* ptr) {
  RETURN_IF_ERROR(CudaUsable());
  int kind = 0, device = -1;
  if (int e = rt::RtPointerKind(ptr, &kind, &device); e != rt::kCudaSuccess) {
    return CudaCallError("cudaPointerGetAttributes", e);
  }
  if (kind != 2) {  // cudaMemoryTypeDevice
    return absl::InvalidArgumentError(absl::StrCat("0x", absl::Hex(ptr), " is not device memory (",
                                                   kind == 3 ? "managed" : "host", " memory)"));
  }
  return device;
}

absl::Status SetDevice(int device) {
  RETURN_IF_ERROR(CudaUsable());
  if (int e = rt::RtSetDevice(device); e != rt::kCudaSuccess) {
    return CudaCallError(absl::StrCat("cudaSetDevice(", device, ")"), e);
  }
  return absl::OkStatus();
}

absl::Status EnablePeerAccess(int device, int peer) {
  if (device == peer) return absl::OkStatus();
  RETURN_IF_ERROR(SetDevice(device));
  int can = 0;
  if (int e = rt::RtCanAccessPeer(device, peer, &can); e != rt::kCudaSuccess) {
    return CudaCallError("cudaDeviceCanAccessPeer", e);
  }
  if (can == 0) {
    return absl::FailedPreconditionError(absl::StrCat(
        "GPU ", device, " cannot reach GPU ", peer, "'s memory (no peer access between them)"));
  }
  if (int e = rt::RtEnablePeerAccess(peer); e != rt::kCudaSuccess) {
    return CudaCallError(absl::StrCat("cudaDeviceEnablePeerAccess(", peer, ")"), e);
  }
  return absl::OkStatus();
}

absl::Status ResetDevice(int device) {
  RETURN_IF_ERROR(SetDevice(device));
  if (int e = rt::RtDeviceReset(); e != rt::kCudaSuccess) return CudaCallError("cudaDeviceReset", e);
  return absl::OkStatus();
}

absl::StatusOr<IpcExport> ExportIpc(const void* device_ptr) {
  RETURN_IF_ERROR(DeviceOfPointer(device_ptr).status());
  void* base = nullptr;
  IpcExport out;
  if (int e = rt::RtMemGetAddressRange(device_ptr, &base, &out.allocation_bytes); e != rt::kCudaSuccess) {
    return CudaCallError("cuMemGetAddressRange", e);
  }
  unsigned char h[kIpcHandleBytes];
  if (int e = rt::RtIpcGetMemHandle(base, h); e != rt::kCudaSuccess) {
    return CudaCallError("cudaIpcGetMemHandle (is it cudaMalloc memory?)", e);
  }
  out.handle.assign(reinterpret_cast<const char*>(h), kIpcHandleBytes);
  out.offset = static_cast<size_t>(static_cast<const char*>(device_ptr) - static_cast<const char*>(base));
  return out;
}

absl::StatusOr<DmaBufExport> ExportDmaBuf(const void* device_ptr, size_t size) {
  ASSIGN_OR_RETURN(const int device, DeviceOfPointer(device_ptr));
  void* base = nullptr;
  size_t allocation = 0;
  if (int e = rt::RtMemGetAddressRange(device_ptr, &base, &allocation); e != rt::kCudaSuccess) {
    return CudaCallError("cuMemGetAddressRange", e);
  }
  // The dma-buf covers whole pages of the allocation around the range.
  const uintptr_t page = static_cast<uintptr_t>(::sysconf(_SC_PAGESIZE));
  const uintptr_t start = reinterpret_cast<uintptr_t>(device_ptr) & ~(page - 1);
  const uintptr_t end = std::min(reinterpret_cast<uintptr_t>(base) + allocation,
                                 (reinterpret_cast<uintptr_t>(device_ptr) + size + page - 1) &
                                     ~(page - 1));
  DmaBufExport out;
  if (int e = rt::RtMemGetDmaBufFd(reinterpret_cast<void*>(start), end - start, &out.fd);
      e != rt::kCudaSuccess) {
    return CudaCallError(absl::StrCat("cuMemGetHandleForAddressRange (dma-buf) on GPU ", device), e);
  }
  out.offset = reinterpret_cast<uintptr_t>(device_ptr) - start;
  return out;
}

bool DmaBufSupported(int device, std::string* why) {
  if (absl::Status s = CudaUsable(); !s.ok()) {
    *why = std::string(s.message());
    return false;
  }
  int supported = 0;
  if (int e = rt::RtDeviceDmaBufSupported(device, &supported); e != rt::kCudaSuccess) {
    *why = std::string(CudaCallError("cuDeviceGetAttribute(DMA_BUF_SUPPORTED)", e).message());
    return false;
  }
  if (supported == 0) {
    *why = absl::StrCat("GPU ", device, " cannot export dma-bufs (driver or kernel too old)");
    return false;
  }
  return true;
}

absl::StatusOr<IpcMapping> IpcMapping::Open(int device, absl::string_view handle) {
  if (handle.size() != kIpcHandleBytes) {
    return absl::InvalidArgumentError(absl::StrCat("a CUDA IPC handle is ", kIpcHandleBytes,
                                                   " bytes, got ", handle.size()));
  }
  RETURN_IF_ERROR(SetDevice(device));
  IpcMapping m;
  if (int e = rt::RtIpcOpenMemHandle(&m.base_, reinterpret_cast<const unsigned char*>(handle.data()));
      e != rt::kCudaSuccess) {
    rt::RtGetLastError();
    return absl::FailedPreconditionError(absl::StrCat(
        "cudaIpcOpenMemHandle on device ", device, " failed: ", CudaErrorText(e),
        " (a stale handle: its allocation was freed or its process exited, or it is from this process)"));
  }
  m.device_ = device;
  return m;
}

IpcMapping::IpcMapping(IpcMapping&& o) noexcept
    : base_(std::exchange(o.base_, nullptr)), device_(std::exchange(o.device_, -1)) {}
IpcMapping& IpcMapping::operator=(IpcMapping&& o) noexcept {
  if (this != &o) {
    Reset();
    base_ = std::exchange(o.base_, nullptr);
    device_ = std::exchange(o.device_, -1);
  }
  return *this;
}
IpcMapping::~IpcMapping() { Reset(); }
void IpcMapping::Reset() {
  if (base_ == nullptr) return;
  rt::RtSetDevice(device_);
  rt::RtIpcCloseMemHandle(base_);
  rt::RtGetLastError();
  base_ = nullptr;
}

absl::StatusOr<PinnedHost> PinnedHost::Allocate(size_t bytes) {
  RETURN_IF_ERROR(CudaUsable());
  PinnedHost p;
  if (bytes == 0) return p;
  if (int e = rt::RtMallocHost(&p.ptr_, bytes); e != rt::kCudaSuccess) {
    return CudaCallError(absl::StrCat("cudaMallocHost(", bytes, ")"), e);
  }
  p.size_ = bytes;
  p.owned_ = true;
  return p;
}

absl::StatusOr<PinnedHost> PinnedHost::Register(void* ptr, size_t bytes) {
  RETURN_IF_ERROR(CudaUsable());
  PinnedHost p;
  if (bytes == 0) return p;
  if (int e = rt::RtHostRegister(ptr, bytes); e != rt::kCudaSuccess) {
    return CudaCallError(absl::StrCat("cudaHostRegister(", bytes, " bytes)"), e);
  }
  p.ptr_ = ptr;
  p.size_ = bytes;
  return p;
}

PinnedHost::PinnedHost(PinnedHost&& o) noexcept
    : ptr_(std::exchange(o.ptr_, nullptr)), size_(std::exchange(o.size_, 0)), owned_(o.owned_) {}
PinnedHost& PinnedHost::operator=(PinnedHost&& o) noexcept {
  if (this != &o) {
    Reset();
    ptr_ = std::exchange(o.ptr_, nullptr);
    size_ = std::exchange(o.size_, 0);
    owned_ = o.owned_;
  }
  return *this;
}
PinnedHost::~PinnedHost() { Reset(); }
void PinnedHost::Reset() {
  if (ptr_ == nullptr) return;
  owned_ ? rt::RtFreeHost(ptr_) : rt::RtHostUnregister(ptr_);
  rt::RtGetLastError();
  ptr_ = nullptr;
  size_ = 0;
}

absl::Status CopyAsync(void* dst, const void* src, size_t bytes, void* stream) {
  if (bytes == 0) return absl::OkStatus();
  if (int e = rt::RtMemcpyAsync(dst, src, bytes, stream); e != rt::kCudaSuccess) {
    return CudaCallError(absl::StrCat("cudaMemcpyAsync(", bytes, " bytes)"), e);
  }
  return absl::OkStatus();
}

absl::StatusOr<Event> Event::Create() {
  RETURN_IF_ERROR(CudaUsable());
  Event ev;
  if (int e = rt::RtEventCreateNoTiming(&ev.event_); e != rt::kCudaSuccess) {
    return CudaCallError("cudaEventCreateWithFlags", e);
  }
  return ev;
}
Event::Event(Event&& o) noexcept : event_(std::exchange(o.event_, nullptr)) {}
Event& Event::operator=(Event&& o) noexcept {
  if (this != &o) {
    Reset();
    event_ = std::exchange(o.event_, nullptr);
  }
  return *this;
}
Event::~Event() { Reset(); }
void Event::Reset() {
  if (event_ != nullptr) rt::RtEventDestroy(event_);
  event_ = nullptr;
}
absl::Status Event::Record(void* stream) {
  if (int e = rt::RtEventRecord(event_, stream); e != rt::kCudaSuccess) {
    return CudaCallError("cudaEventRecord", e);
  }
  return absl::OkStatus();
}
absl::StatusOr<bool> Event::Done() const {
  const int e = rt::RtEventQuery(event_);
  if (e == rt::kCudaSuccess) return true;
  if (e == rt::kCudaErrorNotReady) {
    rt::RtGetLastError();  // not an error: clear it
    return false;
  }
  return CudaCallError("cudaEventQuery", e);
}

absl::StatusOr<StreamTimer> StreamTimer::Create() {
  RETURN_IF_ERROR(CudaUsable());
  StreamTimer t;
  if (int e = rt::RtEventCreate(&t.start_); e != rt::kCudaSuccess) return CudaCallError("cudaEventCreate", e);
  if (int e = rt::RtEventCreate(&t.stop_); e != rt::kCudaSuccess) return CudaCallError("cudaEventCreate", e);
  return t;
}
StreamTimer::StreamTimer(StreamTimer&& o) noexcept
    : start_(std::exchange(o.start_, nullptr)), stop_(std::exchange(o.stop_, nullptr)) {}
StreamTimer& StreamTimer::operator=(StreamTimer&& o) noexcept {
  if (this != &o) {
    Reset();
    start_ = std::exchange(o.start_, nullptr);
    stop_ = std::exchange(o.stop_, nullptr);
  }
  return *this;
}
StreamTimer::~StreamTimer() { Reset(); }
void StreamTimer::Reset() {
  if (start_ != nullptr) rt::RtEventDestroy(start_);
  if (stop_ != nullptr) rt::RtEventDestroy(stop_);
  start_ = stop_ = nullptr;
}
absl::Status StreamTimer::Start(void* stream) {
  if (int e = rt::RtEventRecord(start_, stream); e != rt::kCudaSuccess) return CudaCallError("cudaEventRecord", e);
  return absl::OkStatus();
}
absl::Status StreamTimer::Stop(void* stream) {
  if (int e = rt::RtEventRecord(stop_, stream); e != rt::kCudaSuccess) return CudaCallError("cudaEventRecord", e);
  return absl::OkStatus();
}
absl::StatusOr<double> StreamTimer::ElapsedMs() {
  if (int e = rt::RtEventSynchronize(stop_); e != rt::kCudaSuccess) return CudaCallError("cudaEventSynchronize", e);
  float ms = 0;
  if (int e = rt::RtEventElapsedMs(&ms, start_, stop_); e != rt::kCudaSuccess) {
    return CudaCallError("cudaEventElapsedTime", e);
  }
  return static_cast<double>(ms);
}

}  // namespace gradsync::cuda
