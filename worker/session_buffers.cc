#include "worker/session_buffers.h"

#include <unistd.h>

#include <atomic>
#include <random>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"

namespace gradsync {
namespace {
std::atomic<uint64_t> g_segment_counter{0};

// Per-process random part: pids repeat across containers and sandboxes that
// share /dev/shm.
const std::string& ProcessNonce() {
  static const std::string* nonce = [] {
    std::random_device rd;
    return new std::string(absl::StrCat(absl::Hex(rd(), absl::kZeroPad8)));
  }();
  return *nonce;
}
}  // namespace

SessionBuffers::SessionBuffers(Options options, std::shared_ptr<TenantMemory> tenant_memory)
    : options_(std::move(options)),
      tenant_memory_(std::move(tenant_memory)),
      account_(MemoryAccount(options_.tenant, options_.owner_uid)) {}

SessionBuffers::~SessionBuffers() { FreeAll(); }

absl::StatusOr<BufferInfo> SessionBuffers::Allocate(uint64_t size, bool by_descriptor) {
  RETURN_IF_ERROR(CheckNew(size, "buffer of ", "allocating"));
  {
    absl::MutexLock l(&mu_);
    if (by_descriptor && unfetched_ >= kMaxUnfetchedBuffers) {
      return absl::ResourceExhaustedError(absl::StrCat(
          "session ", options_.session_id, ": ", unfetched_,
          " buffers were allocated and their descriptors never fetched on the fd socket; at most ",
          kMaxUnfetchedBuffers, " may wait"));
    }
  }
  const uint64_t n = ++g_segment_counter;
  auto seg = by_descriptor
                 ? ShmSegment::CreateSealed(absl::StrCat("gradsync-buffer-", n), size)
                 : ShmSegment::Create(absl::StrCat("/gradsync.", ::getpid(), ".", ProcessNonce(),
                                                   "-", n),
                                      size, options_.owner_uid);
  if (!seg.ok()) return seg.status();
  return Add(std::move(*seg));
}

absl::StatusOr<UniqueFd> SessionBuffers::TakeFd(uint64_t id) {
  absl::MutexLock l(&mu_);
  auto it = buffers_.find(id);
  if (it == buffers_.end()) {
    return absl::NotFoundError(
        absl::StrCat("session ", options_.session_id, " has no buffer ", id));
  }
  if (!it->second->by_descriptor()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "buffer ", id, " of session ", options_.session_id, " is not handed out by descriptor"));
  }
  UniqueFd fd = it->second->TakeFd();
  if (!fd.valid()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "the descriptor of buffer ", id, " of session ", options_.session_id,
        " was already fetched (each is handed out once)"));
  }
  --unfetched_;
  return fd;
}

absl::StatusOr<BufferInfo> SessionBuffers::Register(int fd, uint64_t offset, uint64_t size,
                                                    const std::string& description) {
  RETURN_IF_ERROR(CheckNew(size, "a registered range of ", "registering"));
  auto seg = ShmSegment::MapFd(fd, offset, size, description);
  if (!seg.ok()) return seg.status();
  return Add(std::move(*seg));
}

absl::StatusOr<BufferInfo> SessionBuffers::AllocateDevice(const std::string& gpu_uuid,
                                                          uint64_t size) {
  RETURN_IF_ERROR(CheckNew(size, "device buffer of ", "allocating"));
  ASSIGN_OR_RETURN(std::shared_ptr<DeviceMemory> device, DeviceMemory::Allocate(gpu_uuid, size));
  return AddDevice(std::move(device));
}

absl::StatusOr<BufferInfo> SessionBuffers::RegisterDevice(const std::string& gpu_uuid,
                                                          const std::string& ipc_handle,
                                                          uint64_t offset, uint64_t size,
                                                          int64_t client_pid) {
  RETURN_IF_ERROR(CheckNew(size, "a registered device range of ", "registering"));
  ASSIGN_OR_RETURN(std::shared_ptr<DeviceMemory> device,
                   DeviceMemory::Open(gpu_uuid, ipc_handle, offset, size, client_pid));
  return AddDevice(std::move(device));
}

absl::Status SessionBuffers::CheckNew(uint64_t size, const char* noun, const char* verb) const {
  if (size > kMaxBufferBytes) {
    return absl::InvalidArgumentError(absl::StrCat(noun, size, " bytes exceeds the limit of ",
                                                   kMaxBufferBytes, " bytes"));
  }
  absl::MutexLock l(&mu_);
  return CheckQuotaLocked(size, verb);
}

absl::Status SessionBuffers::CheckQuotaLocked(uint64_t size, absl::string_view verb,
                                              absl::string_view noun) const {
  const uint64_t limit = options_.memory_limit_bytes;
  const uint64_t held = bytes_ + state_bytes_;
  if (limit == 0 || (size <= limit && held <= limit - size)) {
    if (tenant_memory_ == nullptr) return absl::OkStatus();
    return tenant_memory_->Check(account_, size,
                                 absl::StrCat("session ", options_.session_id, ": ", verb));
  }
  return absl::ResourceExhaustedError(absl::StrCat(
      "session ", options_.session_id, " (job '", options_.job_id, "' rank ", options_.rank,
      "): ", verb, noun, size, " bytes would exceed the session's buffer quota of ",
      limit, " bytes (", held, " in use; gradsyncd --session_memory_limit_mb)"));
}

absl::StatusOr<uint64_t> SessionBuffers::AddLocked(std::shared_ptr<ShmSegment> segment,
                                                   std::shared_ptr<DeviceMemory> device) {
  if (closed_) return absl::FailedPreconditionError("session is closing");
  const uint64_t size = segment->size();
  RETURN_IF_ERROR(CheckQuotaLocked(size, "adding"));
  if (tenant_memory_ != nullptr) {
    RETURN_IF_ERROR(tenant_memory_->Charge(
        account_, size, absl::StrCat("session ", options_.session_id, ": adding")));
  }
  const uint64_t id = next_id_++;
  bytes_ += size;
  if (segment->by_descriptor()) ++unfetched_;
  buffers_[id] = std::move(segment);
  if (device != nullptr) devices_[id] = std::move(device);
  return id;
}

absl::StatusOr<BufferInfo> SessionBuffers::Add(std::unique_ptr<ShmSegment> segment) {
  BufferInfo info;
  info.shm_name = segment->name();
  info.size = segment->size();
  info.by_descriptor = segment->by_descriptor();
  absl::MutexLock l(&mu_);
  ASSIGN_OR_RETURN(info.id, AddLocked(std::shared_ptr<ShmSegment>(std::move(segment)), nullptr));
  return info;
}

absl::StatusOr<BufferInfo> SessionBuffers::AddDevice(std::shared_ptr<DeviceMemory> device) {
  BufferInfo info{0, absl::StrCat("device buffer on ", device->uuid()), device->size(), false,
                  device->uuid(), device->ipc_handle()};
  std::shared_ptr<ShmSegment> host = device->host();
  absl::MutexLock l(&mu_);
  ASSIGN_OR_RETURN(info.id, AddLocked(std::move(host), std::move(device)));
  return info;
}

absl::Status SessionBuffers::Free(uint64_t id) {
  absl::MutexLock l(&mu_);
  auto it = buffers_.find(id);
  if (it == buffers_.end()) {
    return absl::NotFoundError(absl::StrCat("buffer ", id, " does not exist in session ",
                                            options_.session_id));
  }
  const uint64_t size = it->second->size();
  bytes_ -= size;
  if (tenant_memory_ != nullptr && size > 0) tenant_memory_->Release(account_, size);
  if (it->second->holds_fd()) --unfetched_;
  buffers_.erase(it);
  devices_.erase(id);
  return absl::OkStatus();  // an op still using it keeps the mapping alive
}

absl::StatusOr<BufferRef> SessionBuffers::Find(uint64_t id) const {
  absl::MutexLock l(&mu_);
  auto it = buffers_.find(id);
  if (it == buffers_.end()) {
    return absl::NotFoundError(absl::StrCat("buffer ", id, " does not exist in session ",
                                            options_.session_id));
  }
  BufferRef ref{it->second, nullptr};
  if (auto d = devices_.find(id); d != devices_.end()) ref.device = d->second;
  return ref;
}

void SessionBuffers::Close() {
  absl::MutexLock l(&mu_);
  closed_ = true;
}

void SessionBuffers::FreeAll() {
  absl::MutexLock l(&mu_);
  buffers_.clear();
  devices_.clear();
  if (tenant_memory_ != nullptr && bytes_ > 0) tenant_memory_->Release(account_, bytes_);
  bytes_ = 0;
  unfetched_ = 0;
}

absl::Status SessionBuffers::ChargeState(uint64_t size, const std::string& what) {
  absl::MutexLock l(&mu_);
  RETURN_IF_ERROR(CheckQuotaLocked(size, what, ": "));
  if (tenant_memory_ != nullptr) {
    RETURN_IF_ERROR(tenant_memory_->Charge(
        account_, size, absl::StrCat("session ", options_.session_id, ": ", what)));
  }
  state_bytes_ += size;
  return absl::OkStatus();
}

void SessionBuffers::ReleaseState(uint64_t size) {
  absl::MutexLock l(&mu_);
  size = std::min(size, state_bytes_);
  state_bytes_ -= size;
  if (tenant_memory_ != nullptr && size > 0) tenant_memory_->Release(account_, size);
}

uint64_t SessionBuffers::state_bytes() const {
  absl::MutexLock l(&mu_);
  return state_bytes_;
}

uint64_t SessionBuffers::bytes() const {
  absl::MutexLock l(&mu_);
  return bytes_;
}

}  // namespace gradsync
