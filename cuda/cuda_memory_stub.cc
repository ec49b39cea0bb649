// Default (non-CUDA) build of cuda_memory.h: every call says CUDA was not
// compiled in. Nothing can be created, so the move-only types only move nulls.
#include <utility>

#include "cuda/cuda_memory.h"
#include "cuda/cuda_reduce.h"

namespace gradsync::cuda {

absl::StatusOr<std::string> DeviceUuid(int) { return CudaUsable(); }
absl::StatusOr<int> DeviceWithUuid(absl::string_view) { return CudaUsable(); }
absl::StatusOr<int> DeviceOfPointer(const void*) { return CudaUsable(); }
absl::Status SetDevice(int) { return CudaUsable(); }
absl::Status ResetDevice(int) { return CudaUsable(); }
absl::Status EnablePeerAccess(int, int) { return CudaUsable(); }
absl::StatusOr<IpcExport> ExportIpc(const void*) { return CudaUsable(); }
absl::StatusOr<DmaBufExport> ExportDmaBuf(const void*, size_t) { return CudaUsable(); }
bool DmaBufSupported(int, std::string* why) {
  *why = std::string(CudaUsable().message());
  return false;
}

absl::StatusOr<IpcMapping> IpcMapping::Open(int, absl::string_view) { return CudaUsable(); }
IpcMapping::IpcMapping(IpcMapping&& o) noexcept
    : base_(std::exchange(o.base_, nullptr)), device_(std::exchange(o.device_, -1)) {}
IpcMapping& IpcMapping::operator=(IpcMapping&& o) noexcept {
  base_ = std::exchange(o.base_, nullptr);
  device_ = std::exchange(o.device_, -1);
  return *this;
}
IpcMapping::~IpcMapping() = default;
void IpcMapping::Reset() {}

absl::StatusOr<PinnedHost> PinnedHost::Allocate(size_t) { return CudaUsable(); }
absl::StatusOr<PinnedHost> PinnedHost::Register(void*, size_t) { return CudaUsable(); }
PinnedHost::PinnedHost(PinnedHost&& o) noexcept
    : ptr_(std::exchange(o.ptr_, nullptr)), size_(std::exchange(o.size_, 0)), owned_(o.owned_) {}
PinnedHost& PinnedHost::operator=(PinnedHost&& o) noexcept {
  ptr_ = std::exchange(o.ptr_, nullptr);
  size_ = std::exchange(o.size_, 0);
  owned_ = o.owned_;
  return *this;
}
PinnedHost::~PinnedHost() = default;
void PinnedHost::Reset() {}

absl::Status CopyAsync(void*, const void*, size_t, void*) { return CudaUsable(); }

absl::StatusOr<Event> Event::Create() { return CudaUsable(); }
Event::Event(Event&& o) noexcept : event_(std::exchange(o.event_, nullptr)) {}
Event& Event::operator=(Event&& o) noexcept {
  event_ = std::exchange(o.event_, nullptr);
  return *this;
}
Event::~Event() = default;
void Event::Reset() {}
absl::Status Event::Record(void*) { return CudaUsable(); }
absl::StatusOr<bool> Event::Done() const { return CudaUsable(); }

absl::StatusOr<StreamTimer> StreamTimer::Create() { return CudaUsable(); }
StreamTimer::StreamTimer(StreamTimer&& o) noexcept
    : start_(std::exchange(o.start_, nullptr)), stop_(std::exchange(o.stop_, nullptr)) {}
StreamTimer& StreamTimer::operator=(StreamTimer&& o) noexcept {
  start_ = std::exchange(o.start_, nullptr);
  stop_ = std::exchange(o.stop_, nullptr);
  return *this;
}
StreamTimer::~StreamTimer() = default;
void StreamTimer::Reset() {}
absl::Status StreamTimer::Start(void*) { return CudaUsable(); }
absl::Status StreamTimer::Stop(void*) { return CudaUsable(); }
absl::StatusOr<double> StreamTimer::ElapsedMs() { return CudaUsable(); }

}  // namespace gradsync::cuda
