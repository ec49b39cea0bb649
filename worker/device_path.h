// The device path of an op: a device buffer's collective runs in place on its
// GPU instead of on its host twin.
//   * The messages between daemons are staged through page-locked host blocks
//     (transport::StagingContext with a CudaCopier: one CUDA stream each way,
//     completion polled on events, no stream or device synchronization), so
//     the device-to-host copy of one segment, the network and the
//     host-to-device copy of others overlap; a node transport that moves
//     device memory itself (GPUDirect RDMA) is used directly, no staging.
//   * Received segments are reduced by the CUDA kernels (CudaReducer).
//   * The algorithms' scratch is device memory of the same GPU (CudaAllocator).
// Built in every build; without CUDA, Create says why and the executor keeps
// running device buffers on their host twins.
//
// Threading: a DevicePath is used by its executor's thread only.
#ifndef GRADSYNC_WORKER_DEVICE_PATH_H_
#define GRADSYNC_WORKER_DEVICE_PATH_H_

#include <cstdint>
#include <map>
#include <memory>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "collective/reducer.h"
#include "cuda/cuda_memory.h"
#include "cuda/cuda_reduce.h"
#include "transport/memory.h"
#include "transport/staging_context.h"

namespace gradsync {

// Copies between GPU `device` and page-locked host memory on two streams (one
// per direction, so copies in and out overlap), each copy marked by an event.
class CudaCopier final : public transport::DeviceCopier {
 public:
  static absl::StatusOr<std::unique_ptr<CudaCopier>> Create(int device);
  transport::MemKind kind() const override { return transport::MemKind::Cuda(device_); }
  absl::StatusOr<void*> AllocateHost(size_t bytes) override;
  void FreeHost(void* ptr, size_t bytes) override;
  absl::StatusOr<uint64_t> Copy(Direction direction, void* dst, const void* src,
                                size_t bytes) override;
  absl::StatusOr<bool> Done(uint64_t ticket) override;

 private:
  explicit CudaCopier(int device) : device_(device) {}
  const int device_;
  cuda::Stream to_host_, to_device_;
  uint64_t next_ = 0;
  std::map<uint64_t, cuda::Event> pending_;
  std::vector<cuda::Event> spare_;  // recorded and done: reused
  std::map<void*, cuda::PinnedHost> host_;
};

// cudaMalloc'd memory of GPU `device`, for the algorithms' scratch.
class CudaAllocator final : public transport::MemoryAllocator {
 public:
  explicit CudaAllocator(int device) : device_(device) {}
  transport::MemKind kind() const override { return transport::MemKind::Cuda(device_); }
  absl::StatusOr<void*> Allocate(size_t bytes) const override;
  void Free(void* ptr, size_t bytes) const override;

 private:
  const int device_;
  mutable absl::Mutex mu_;
  mutable std::map<void*, cuda::DeviceBuffer> buffers_ ABSL_GUARDED_BY(mu_);
};

// The collective Reducer for GPU `device`'s memory (and the wire codecs' CUDA
// kernels, for compressed ops on device buffers): the CUDA kernels on a
// stream of its own, each call waited for before it returns (the next send of
// the memory is a copy on another stream). The Reducer interface cannot fail:
// the first CUDA error is kept and TakeError() returns it (the executor fails
// the op with it).
class CudaReducer final : public Reducer {
 public:
  static absl::StatusOr<std::unique_ptr<CudaReducer>> Create(int device);
  transport::MemKind kind() const override { return transport::MemKind::Cuda(device_); }
  void Reduce(DType dtype, ReduceOp op, void* dst, const void* src, size_t count) const override;
  void Combine(DType dtype, ReduceOp op, void* dst, const void* a, const void* b,
               size_t count) const override;
  void Divide(DType dtype, void* data, size_t count, int64_t divisor) const override;
  void Copy(void* dst, const void* src, size_t bytes) const override;
  void Encode(CodecId codec, const float* in, size_t n, void* out) const override;
  void Decode(CodecId codec, const void* in, size_t n, float* out, bool add) const override;
  absl::Status TakeError() const;

 private:
  explicit CudaReducer(int device) : device_(device) {}
  void Keep(const absl::Status& s) const;
  const int device_;
  cuda::Stream stream_;
  mutable absl::Status error_;
};

// One GPU's device path on one node context (null: every rank of the job is
// on this daemon; the ops are memory copies and reductions on the GPU).
class DevicePath {
 public:
  // `direct`: the node context moves this GPU's memory itself (GPUDirect RDMA).
  static absl::StatusOr<std::unique_ptr<DevicePath>> Create(int device,
                                                            transport::Context* node_ctx,
                                                            bool direct);
  int device() const { return device_; }
  // The node context to run the op on (null without one).
  transport::Context* context() {
    return staging_ != nullptr ? staging_.get() : node_ctx_;
  }
  const CudaReducer& reducer() const { return *reducer_; }
  // GPU scratch: for the in-memory stages and for the algorithms.
  transport::Scratch& scratch() { return scratch_; }
  transport::Scratch& algo_scratch() { return algo_scratch_; }
  // Staging counters (null when direct or without a node context).
  const transport::StagingContext* staging() const { return staging_.get(); }

 private:
  DevicePath(int device, transport::Context* node_ctx)
      : device_(device),
        node_ctx_(node_ctx),
        allocator_(device),
        scratch_(allocator_),
        algo_scratch_(allocator_) {}
  const int device_;
  transport::Context* node_ctx_;
  CudaAllocator allocator_;
  transport::Scratch scratch_, algo_scratch_;
  std::unique_ptr<CudaReducer> reducer_;
  std::unique_ptr<CudaCopier> copier_;
  std::unique_ptr<transport::StagingContext> staging_;  // destroyed before the copier
};

}  // namespace gradsync

#endif  // GRADSYNC_WORKER_DEVICE_PATH_H_
