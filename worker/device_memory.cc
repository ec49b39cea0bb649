#include "worker/device_memory.h"

#include <signal.h>

#include <cerrno>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/status_macros.h"

namespace gradsync {

GpuContext::~GpuContext() {
  absl::MutexLock l(&owner_->mu_);
  auto it = owner_->contexts_.find(device_);
  // A context opened for this GPU after this one expired owns it now.
  if (it != owner_->contexts_.end() && it->second.lock() != nullptr) return;
  owner_->contexts_.erase(device_);
  if (owner_->reset_when_unused_) (void)cuda::ResetDevice(device_);
}

void GpuContexts::set_reset_when_unused(bool reset) {
  absl::MutexLock l(&mu_);
  reset_when_unused_ = reset;
}

GpuContexts& GpuContexts::Process() {
  static GpuContexts* const contexts = new GpuContexts;  // leaked: outlives every buffer
  return *contexts;
}

absl::Status GpuContexts::Available() { return cuda::CudaUsable(); }

std::string GpuContexts::Describe() {
  absl::StatusOr<std::vector<cuda::CudaDeviceInfo>> devices = cuda::ListCudaDevices();
  if (!devices.ok()) return absl::StrCat("device buffers unavailable: ", devices.status().message());
  std::vector<std::string> names;
  for (const cuda::CudaDeviceInfo& d : *devices) {
    absl::StatusOr<std::string> uuid = cuda::DeviceUuid(d.index);
    names.push_back(absl::StrCat(d.index, ": ", d.name, " ", uuid.ok() ? *uuid : "(no uuid)"));
  }
  return absl::StrCat("device buffers: ", devices->size(), " GPU", devices->size() == 1 ? "" : "s",
                      " (", absl::StrJoin(names, ", "), ")");
}

absl::StatusOr<std::shared_ptr<GpuContext>> GpuContexts::Acquire(const std::string& uuid) {
  if (absl::Status s = Available(); !s.ok()) {
    return absl::FailedPreconditionError(absl::StrCat("device buffers unavailable: ", s.message()));
  }
  ASSIGN_OR_RETURN(int device, cuda::DeviceWithUuid(uuid));
  absl::MutexLock l(&mu_);
  std::weak_ptr<GpuContext>& slot = contexts_[device];
  if (std::shared_ptr<GpuContext> live = slot.lock()) return live;
  RETURN_IF_ERROR(cuda::SetDevice(device));
  auto context = std::make_shared<GpuContext>(this, device, uuid);
  slot = context;
  return context;
}

size_t GpuContexts::open() const {
  absl::MutexLock l(&mu_);
  size_t n = 0;
  for (const auto& [device, weak] : contexts_) n += weak.expired() ? 0 : 1;
  return n;
}

absl::Status DeviceMemory::Init(size_t size) {
  size_ = size;
  ASSIGN_OR_RETURN(std::unique_ptr<ShmSegment> host,
                   ShmSegment::CreatePrivate(absl::StrCat("host twin of a device buffer on ", uuid()), size));
  host_ = std::move(host);
  ASSIGN_OR_RETURN(pinned_, cuda::PinnedHost::Register(host_->data(), size));
  ASSIGN_OR_RETURN(stream_, cuda::Stream::Create());
  return absl::OkStatus();
}

absl::StatusOr<std::shared_ptr<DeviceMemory>> DeviceMemory::Allocate(const std::string& uuid, size_t size) {
  if (size == 0) return absl::InvalidArgumentError("a device buffer must not be empty");
  std::shared_ptr<DeviceMemory> m(new DeviceMemory);
  ASSIGN_OR_RETURN(m->context_, GpuContexts::Process().Acquire(uuid));
  RETURN_IF_ERROR(cuda::SetDevice(m->device()));
  ASSIGN_OR_RETURN(m->allocated_, cuda::DeviceBuffer::Allocate(size));
  m->device_data_ = static_cast<char*>(m->allocated_.data());
  ASSIGN_OR_RETURN(cuda::IpcExport exported, cuda::ExportIpc(m->device_data_));
  m->ipc_handle_ = std::move(exported.handle);
  RETURN_IF_ERROR(m->Init(size));
  return m;
}

absl::StatusOr<std::shared_ptr<DeviceMemory>> DeviceMemory::Open(const std::string& uuid,
                                                                const std::string& ipc_handle,
                                                                uint64_t offset, uint64_t size,
                                                                int64_t client_pid) {
  if (size == 0) return absl::InvalidArgumentError("a registered device range must not be empty");
  if (client_pid <= 0) {
    return absl::InvalidArgumentError("registering device memory needs the client's pid");
  }
  if (::kill(static_cast<pid_t>(client_pid), 0) != 0 && errno == ESRCH) {
    return absl::FailedPreconditionError(absl::StrCat(
        "the client process ", client_pid, " that owns the device memory is gone"));
  }
  std::shared_ptr<DeviceMemory> m(new DeviceMemory);
  ASSIGN_OR_RETURN(m->context_, GpuContexts::Process().Acquire(uuid));
  ASSIGN_OR_RETURN(m->mapping_, cuda::IpcMapping::Open(m->device(), ipc_handle));
  m->device_data_ = m->mapping_.base() + offset;
  RETURN_IF_ERROR(m->Init(size));
  return m;
}

DeviceMemory::~DeviceMemory() {
  if (context_ != nullptr) (void)cuda::SetDevice(context_->device());
}

absl::Status DeviceMemory::Copy(void* dst, const void* src, size_t bytes, const char* what) {
  RETURN_IF_ERROR(cuda::SetDevice(device()));
  absl::Status s = cuda::CopyAsync(dst, src, bytes, stream_.get());
  if (s.ok()) s = stream_.Synchronize();
  if (!s.ok()) {
    return absl::Status(s.code(), absl::StrCat("staging ", bytes, " bytes ", what, " GPU ", uuid(),
                                               ": ", s.message()));
  }
  return absl::OkStatus();
}

absl::Status DeviceMemory::StageIn(size_t offset, size_t bytes) {
  if (offset > size_ || bytes > size_ - offset) {
    return absl::OutOfRangeError(absl::StrCat("[", offset, ", +", bytes, ") is outside the ", size_,
                                              "-byte device buffer"));
  }
  return Copy(host_->data() + offset, device_data_ + offset, bytes, "from");
}

absl::Status DeviceMemory::StageOut(size_t offset, size_t bytes) {
  if (offset > size_ || bytes > size_ - offset) {
    return absl::OutOfRangeError(absl::StrCat("[", offset, ", +", bytes, ") is outside the ", size_,
                                              "-byte device buffer"));
  }
  return Copy(device_data_ + offset, host_->data() + offset, bytes, "to");
}

}  // namespace gradsync
