// GPU identity, CUDA IPC, pinned host memory, asynchronous copies and event
// timing, behind a plain C++ API (no CUDA headers; streams and events are
// `void*`). What device buffers are made of: the daemon opens a client's
// allocation by its IPC handle on the GPU named by UUID, and stages it through
// pinned host memory.
//
// Built as cuda_reduce.h is: in the default build every call says "gradsync
// was built without CUDA"; under --config=cuda a host without a usable GPU or
// driver gets CudaUsable()'s reason (kFailedPrecondition).
#ifndef GRADSYNC_CUDA_CUDA_MEMORY_H_
#define GRADSYNC_CUDA_CUDA_MEMORY_H_

#include <cstddef>
#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace gradsync::cuda {

// Bytes of a CUDA IPC memory handle (cudaIpcMemHandle_t).
constexpr size_t kIpcHandleBytes = 64;

// The UUID of device `device` as nvidia-smi -L prints it:
// "GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx". A GPU keeps its UUID whatever
// ordinal CUDA_VISIBLE_DEVICES gives it in a process.
absl::StatusOr<std::string> DeviceUuid(int device);
// The ordinal of the visible device with that UUID. NotFound naming the
// visible ones when this process cannot see it.
absl::StatusOr<int> DeviceWithUuid(absl::string_view uuid);
// The device `ptr` (device memory) lives on; InvalidArgument for host memory.
absl::StatusOr<int> DeviceOfPointer(const void* ptr);
// cudaSetDevice for the calling thread.
absl::Status SetDevice(int device);
// Lets kernels on `device` read and write `peer`'s memory (peer access over
// NVLink or PCIe); FailedPrecondition when the two cannot reach each other.
// The same device is OK at once.
absl::Status EnablePeerAccess(int device, int peer);
// Destroys this process's primary context on `device` (cudaDeviceReset):
// every allocation, stream and mapping made there must be gone.
absl::Status ResetDevice(int device);

// What another process needs to open the allocation that holds a device
// pointer: its IPC handle, and the pointer's offset in it.
struct IpcExport {
  std::string handle;  // kIpcHandleBytes bytes
  size_t offset = 0;
  size_t allocation_bytes = 0;
};
// `device_ptr` must be memory from cudaMalloc (not the VMM or async pools,
// which CUDA IPC handles do not cover) on the calling thread's device.
absl::StatusOr<IpcExport> ExportIpc(const void* device_ptr);

// GPUDirect RDMA by dma-buf: a dma-buf of the allocation holding a device
// range, which ibv_reg_dmabuf_mr registers with the NIC (no peer-memory
// module needed). `fd` is the caller's to close; the range starts `offset`
// bytes into it.
struct DmaBufExport {
  int fd = -1;
  uint64_t offset = 0;
};
// The page-aligned span of the allocation around [ptr, +size) is exported.
absl::StatusOr<DmaBufExport> ExportDmaBuf(const void* device_ptr, size_t size);
// Whether `device`'s memory can be exported as dma-bufs, and if not why.
bool DmaBufSupported(int device, std::string* why);

// Another process's allocation, opened in this one. Move-only; the destructor
// closes it (cudaIpcCloseMemHandle, on its device).
class IpcMapping {
 public:
  // Opens `handle` on `device`. FailedPrecondition when the handle is stale
  // (its allocation was freed or its process exited), names the CUDA error.
  static absl::StatusOr<IpcMapping> Open(int device, absl::string_view handle);

  IpcMapping() = default;
  IpcMapping(IpcMapping&& o) noexcept;
  IpcMapping& operator=(IpcMapping&& o) noexcept;
  IpcMapping(const IpcMapping&) = delete;
  IpcMapping& operator=(const IpcMapping&) = delete;
  ~IpcMapping();

  char* base() const { return static_cast<char*>(base_); }
  int device() const { return device_; }

 private:
  void Reset();
  void* base_ = nullptr;
  int device_ = -1;
};

// Host memory the GPU copies to and from at full speed: either allocated
// pinned (Allocate) or existing memory page-locked in place (Register, e.g. a
// shared-memory segment). Move-only; the destructor frees or unregisters it.
class PinnedHost {
 public:
  static absl::StatusOr<PinnedHost> Allocate(size_t bytes);
  static absl::StatusOr<PinnedHost> Register(void* ptr, size_t bytes);

  PinnedHost() = default;
  PinnedHost(PinnedHost&& o) noexcept;
  PinnedHost& operator=(PinnedHost&& o) noexcept;
  PinnedHost(const PinnedHost&) = delete;
  PinnedHost& operator=(const PinnedHost&) = delete;
  ~PinnedHost();

  char* data() const { return static_cast<char*>(ptr_); }
  size_t size() const { return size_; }

 private:
  void Reset();
  void* ptr_ = nullptr;
  size_t size_ = 0;
  bool owned_ = false;  // cudaMallocHost'd (else cudaHostRegister'ed)
};

// Enqueues a copy of `bytes` between any two of device memory and pinned
// host memory on `stream` (the direction follows from the pointers).
absl::Status CopyAsync(void* dst, const void* src, size_t bytes, void* stream);

// A completion marker on a stream (no timing), polled without blocking: what
// a copy pipeline waits on instead of synchronizing a stream or the device.
// Move-only.
class Event {
 public:
  static absl::StatusOr<Event> Create();
  Event() = default;
  Event(Event&& o) noexcept;
  Event& operator=(Event&& o) noexcept;
  Event(const Event&) = delete;
  Event& operator=(const Event&) = delete;
  ~Event();

  // Marks the point of `stream` reached by the work enqueued so far.
  absl::Status Record(void* stream);
  // Whether everything before the mark has finished; the CUDA error if it failed.
  absl::StatusOr<bool> Done() const;

 private:
  void Reset();
  void* event_ = nullptr;
};

// A pair of timing events on one stream. Move-only.
class StreamTimer {
 public:
  static absl::StatusOr<StreamTimer> Create();
  StreamTimer() = default;
  StreamTimer(StreamTimer&& o) noexcept;
  StreamTimer& operator=(StreamTimer&& o) noexcept;
  StreamTimer(const StreamTimer&) = delete;
  StreamTimer& operator=(const StreamTimer&) = delete;
  ~StreamTimer();

  absl::Status Start(void* stream);
  absl::Status Stop(void* stream);
  // Waits for the stop event; milliseconds between the two.
  absl::StatusOr<double> ElapsedMs();

 private:
  void Reset();
  void* start_ = nullptr;
  void* stop_ = nullptr;
};

}  // namespace gradsync::cuda

#endif  // GRADSYNC_CUDA_CUDA_MEMORY_H_
