// Device buffers: GPU memory a session's ops run on.
//
// A device buffer is CUDA memory on one GPU, named by the GPU's UUID (ordinals
// differ between processes under CUDA_VISIBLE_DEVICES): either allocated by the
// daemon and exported to the client as a CUDA IPC handle, or the client's own
// cudaMalloc memory opened here from the IPC handle it sends. The data plane
// moves host memory, so each device buffer has a host twin (private to the
// daemon, page-locked for full-speed copies): an op copies its range of the
// device memory into the twin before it runs and the result back after it
// succeeded (StageIn / StageOut, on the buffer's own CUDA stream, one
// synchronization each). The twin is what the transport registers.
//
// GPU contexts are opened lazily, one per GPU, on the first device buffer
// there, and closed (cudaDeviceReset) with the last.
#ifndef GRADSYNC_WORKER_DEVICE_MEMORY_H_
#define GRADSYNC_WORKER_DEVICE_MEMORY_H_

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "cuda/cuda_memory.h"
#include "cuda/cuda_reduce.h"
#include "worker/shm_segment.h"

namespace gradsync {

class GpuContexts;

// This process's use of one GPU; alive while a device buffer on it is.
class GpuContext {
 public:
  GpuContext(GpuContexts* owner, int device, std::string uuid)
      : owner_(owner), device_(device), uuid_(std::move(uuid)) {}
  // cudaDeviceReset, unless a new context took its place or resets are off.
  ~GpuContext();
  int device() const { return device_; }
  const std::string& uuid() const { return uuid_; }

 private:
  GpuContexts* owner_;
  int device_;
  std::string uuid_;
};

// The process's GPU contexts, by GPU.
class GpuContexts {
 public:
  static GpuContexts& Process();
  // OK when this process can use device buffers, else why not ("gradsync was
  // built without CUDA ...", "CUDA driver not usable: ...", "no CUDA devices").
  static absl::Status Available();
  // One line for logs: "device buffers: 1 GPU (0: NVIDIA H200 GPU-…)" or
  // "device buffers unavailable: <why>".
  static std::string Describe();
  // The context of the GPU with `uuid`, opened on first use. NotFound when
  // the GPU is not visible to this process.
  absl::StatusOr<std::shared_ptr<GpuContext>> Acquire(const std::string& uuid);
  // GPUs with a context open now.
  size_t open() const;
  // Whether a GPU's context is reset when its last device buffer goes (the
  // default). A process that also uses CUDA itself (a bench) turns it off:
  // the reset would destroy its own streams and memory.
  void set_reset_when_unused(bool reset);

 private:
  friend class GpuContext;
  mutable absl::Mutex mu_;
  std::map<int, std::weak_ptr<GpuContext>> contexts_ ABSL_GUARDED_BY(mu_);
  bool reset_when_unused_ ABSL_GUARDED_BY(mu_) = true;
};

class DeviceMemory {
 public:
  // cudaMalloc of `size` bytes on the GPU, exported for the client.
  static absl::StatusOr<std::shared_ptr<DeviceMemory>> Allocate(const std::string& uuid, size_t size);
  // The client's allocation behind `ipc_handle`, [offset, offset+size) of it.
  // `client_pid` (> 0) must be alive: a handle of a process that is gone is
  // refused before CUDA is asked.
  static absl::StatusOr<std::shared_ptr<DeviceMemory>> Open(const std::string& uuid,
                                                            const std::string& ipc_handle,
                                                            uint64_t offset, uint64_t size,
                                                            int64_t client_pid);
  ~DeviceMemory();

  size_t size() const { return size_; }
  const std::string& uuid() const { return context_->uuid(); }
  int device() const { return context_->device(); }
  char* device_data() const { return device_data_; }
  // For a daemon-allocated buffer: what the client opens (else empty).
  const std::string& ipc_handle() const { return ipc_handle_; }
  // The host twin the data plane moves.
  const std::shared_ptr<ShmSegment>& host() const { return host_; }

  // host[offset, offset+bytes) = device[offset, offset+bytes), and back.
  absl::Status StageIn(size_t offset, size_t bytes);
  absl::Status StageOut(size_t offset, size_t bytes);

 private:
  DeviceMemory() = default;
  absl::Status Init(size_t size);  // the host twin and the stream
  absl::Status Copy(void* dst, const void* src, size_t bytes, const char* what);

  std::shared_ptr<GpuContext> context_;
  size_t size_ = 0;
  char* device_data_ = nullptr;
  cuda::DeviceBuffer allocated_;  // Allocate's memory
  cuda::IpcMapping mapping_;      // Open's memory
  std::string ipc_handle_;
  std::shared_ptr<ShmSegment> host_;
  cuda::PinnedHost pinned_;       // host_ page-locked; released before host_ unmaps
  cuda::Stream stream_;
};

}  // namespace gradsync

#endif  // GRADSYNC_WORKER_DEVICE_MEMORY_H_
