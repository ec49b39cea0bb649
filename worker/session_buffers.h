// The buffers of one session: shared memory its client and the daemon both
// map, and the memory quotas they count against.
//
// Kinds of buffer, all in one id space (1, 2, ...):
//   - allocated, named: a POSIX shm segment the client opens by name;
//   - allocated, by descriptor: a sealed memfd whose descriptor the client
//     fetches once on the daemon's fd socket (TakeFd); until then the daemon
//     holds it, and at most kMaxUnfetchedBuffers may wait;
//   - registered: a range of the client's own file (its memfd), mapped here;
//   - device: GPU memory (worker/device_memory.h), allocated here or opened
//     from the client's IPC handle; its host twin is the buffer ops map.
// Every buffer is at most kMaxBufferBytes. The session's live buffers are
// bounded by Options::memory_limit_bytes, and charged to the account's share
// of the daemon (TenantMemory, optional); both refuse with ResourceExhausted
// naming the session, the size, the quota and what is in use.
//
// Ownership: the table holds each buffer by shared_ptr; Find hands out
// references, so an op keeps a buffer mapped after Free or Close.
//
// Thread-safety: thread-safe; the mutex is a leaf (TenantMemory's is taken
// under it). Allocation and mapping happen outside it.
#ifndef GRADSYNC_WORKER_SESSION_BUFFERS_H_
#define GRADSYNC_WORKER_SESSION_BUFFERS_H_

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "common/net.h"
#include "worker/device_memory.h"
#include "worker/shm_segment.h"
#include "worker/tenant_memory.h"

namespace gradsync {

// What the client learns of a new buffer.
struct BufferInfo {
  uint64_t id = 0;
  std::string shm_name;  // a named segment's name, else a description
  uint64_t size = 0;
  // The client fetches the segment's descriptor on the fd socket (a sealed
  // memfd) instead of opening shm_name.
  bool by_descriptor = false;
  // A device buffer: its GPU, and (allocated by the daemon) the IPC handle
  // the client opens.
  std::string gpu_uuid;
  std::string cuda_ipc_handle;
};

// A live buffer, as an op holds it.
struct BufferRef {
  std::shared_ptr<ShmSegment> segment;  // a device buffer's host twin
  std::shared_ptr<DeviceMemory> device;  // null unless a device buffer
};

class SessionBuffers {
 public:
  struct Options {
    // Named in errors: "session S (job 'J' rank R)".
    std::string session_id;
    std::string job_id;
    int rank = 0;
    // The most bytes of live buffers at once; 0: unlimited.
    uint64_t memory_limit_bytes = 0;
    // Owns named segments (ShmSegment::Create; -1: the daemon), and with
    // `tenant` names the TenantMemory account (MemoryAccount).
    int64_t owner_uid = -1;
    std::string tenant;
  };
  // The largest buffer a session may allocate or register.
  static constexpr uint64_t kMaxBufferBytes = 64ull << 30;
  // Buffers whose descriptor was never fetched hold one each in the daemon;
  // a session may have this many at once.
  static constexpr size_t kMaxUnfetchedBuffers = 16;

  // `tenant_memory` may be null (no per-account quota).
  SessionBuffers(Options options, std::shared_ptr<TenantMemory> tenant_memory);
  ~SessionBuffers();  // FreeAll()

  // `by_descriptor`: a sealed memfd (TakeFd); else a named POSIX segment.
  absl::StatusOr<BufferInfo> Allocate(uint64_t size, bool by_descriptor);
  // The descriptor of buffer `id`, once. NotFound for no such buffer;
  // FailedPrecondition once fetched, or for a buffer not handed out by
  // descriptor.
  absl::StatusOr<UniqueFd> TakeFd(uint64_t id);
  // [offset, offset+size) of the client's file `fd` (ShmSegment::MapFd says
  // what is checked).
  absl::StatusOr<BufferInfo> Register(int fd, uint64_t offset, uint64_t size,
                                      const std::string& description);
  // GPU memory on the GPU with `gpu_uuid`: allocated here (the client opens
  // BufferInfo::cuda_ipc_handle), or the client's behind `ipc_handle`.
  // FailedPrecondition naming why when this process cannot use GPUs.
  absl::StatusOr<BufferInfo> AllocateDevice(const std::string& gpu_uuid, uint64_t size);
  absl::StatusOr<BufferInfo> RegisterDevice(const std::string& gpu_uuid,
                                            const std::string& ipc_handle, uint64_t offset,
                                            uint64_t size, int64_t client_pid);
  // NotFound "buffer I does not exist in session S" for no such buffer.
  absl::Status Free(uint64_t id);
  absl::StatusOr<BufferRef> Find(uint64_t id) const;

  // Refuses new buffers from now on (FailedPrecondition "session is
  // closing"); the live ones stay until FreeAll.
  void Close();
  // Frees every buffer and returns their bytes to the account.
  void FreeAll();

  // Bytes of the live buffers.
  uint64_t bytes() const;

  // State the daemon keeps for the session's ops (error feedback,
  // worker/error_feedback_store.h), counted in the same quotas as buffers:
  // ResourceExhausted naming `what` and the quota when it does not fit.
  absl::Status ChargeState(uint64_t size, const std::string& what);
  void ReleaseState(uint64_t size);
  uint64_t state_bytes() const;

 private:
  // A new buffer of `size` bytes: within kMaxBufferBytes ("<noun><size>
  // bytes exceeds the limit ...") and the quotas (CheckQuotaLocked, `verb`).
  absl::Status CheckNew(uint64_t size, const char* noun, const char* verb) const;
  // ResourceExhausted when `size` more bytes (buffers and kept state
  // together) would exceed the session's quota, "<verb><noun><size> bytes
  // would exceed ..."; also checks (does not charge) the account's.
  absl::Status CheckQuotaLocked(uint64_t size, absl::string_view verb,
                                absl::string_view noun = " a buffer of ") const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Checks again, charges the account and enters the buffer.
  absl::StatusOr<uint64_t> AddLocked(std::shared_ptr<ShmSegment> segment,
                                     std::shared_ptr<DeviceMemory> device)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::StatusOr<BufferInfo> Add(std::unique_ptr<ShmSegment> segment);
  absl::StatusOr<BufferInfo> AddDevice(std::shared_ptr<DeviceMemory> device);

  const Options options_;
  const std::shared_ptr<TenantMemory> tenant_memory_;  // may be null
  const std::string account_;                           // MemoryAccount(tenant, owner uid)

  mutable absl::Mutex mu_;
  std::map<uint64_t, std::shared_ptr<ShmSegment>> buffers_ ABSL_GUARDED_BY(mu_);
  // Device buffers by id; their host twins are in buffers_.
  std::map<uint64_t, std::shared_ptr<DeviceMemory>> devices_ ABSL_GUARDED_BY(mu_);
  uint64_t bytes_ ABSL_GUARDED_BY(mu_) = 0;      // of buffers_
  uint64_t state_bytes_ ABSL_GUARDED_BY(mu_) = 0;  // ChargeState's
  size_t unfetched_ ABSL_GUARDED_BY(mu_) = 0;    // buffers still holding their descriptor
  uint64_t next_id_ ABSL_GUARDED_BY(mu_) = 1;
  bool closed_ ABSL_GUARDED_BY(mu_) = false;
};

}  // namespace gradsync

#endif  // GRADSYNC_WORKER_SESSION_BUFFERS_H_
