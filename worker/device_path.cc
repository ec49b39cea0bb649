#include "worker/device_path.h"

#include "absl/strings/str_cat.h"
#include "common/logging.h"
#include "common/status_macros.h"

namespace gradsync {

// --- CudaCopier ---------------------------------------------------------------

absl::StatusOr<std::unique_ptr<CudaCopier>> CudaCopier::Create(int device) {
  RETURN_IF_ERROR(cuda::SetDevice(device));
  std::unique_ptr<CudaCopier> c(new CudaCopier(device));
  ASSIGN_OR_RETURN(c->to_host_, cuda::Stream::Create());
  ASSIGN_OR_RETURN(c->to_device_, cuda::Stream::Create());
  return c;
}

absl::StatusOr<void*> CudaCopier::AllocateHost(size_t bytes) {
  RETURN_IF_ERROR(cuda::SetDevice(device_));
  ASSIGN_OR_RETURN(cuda::PinnedHost host, cuda::PinnedHost::Allocate(bytes));
  void* p = host.data();
  host_.emplace(p, std::move(host));
  return p;
}

void CudaCopier::FreeHost(void* ptr, size_t) { host_.erase(ptr); }

absl::StatusOr<uint64_t> CudaCopier::Copy(Direction direction, void* dst, const void* src,
                                          size_t bytes) {
  RETURN_IF_ERROR(cuda::SetDevice(device_));
  void* stream = direction == Direction::kToHost ? to_host_.get() : to_device_.get();
  RETURN_IF_ERROR(cuda::CopyAsync(dst, src, bytes, stream));
  cuda::Event event;
  if (!spare_.empty()) {
    event = std::move(spare_.back());
    spare_.pop_back();
  } else {
    ASSIGN_OR_RETURN(event, cuda::Event::Create());
  }
  RETURN_IF_ERROR(event.Record(stream));
  const uint64_t ticket = ++next_;
  pending_.emplace(ticket, std::move(event));
  return ticket;
}

absl::StatusOr<bool> CudaCopier::Done(uint64_t ticket) {
  auto it = pending_.find(ticket);
  if (it == pending_.end()) return true;
  ASSIGN_OR_RETURN(const bool done, it->second.Done());
  if (!done) return false;
  spare_.push_back(std::move(it->second));
  pending_.erase(it);
  return true;
}

// --- CudaAllocator -------------------------------------------------------------

absl::StatusOr<void*> CudaAllocator::Allocate(size_t bytes) const {
  RETURN_IF_ERROR(cuda::SetDevice(device_));
  absl::StatusOr<cuda::DeviceBuffer> b = cuda::DeviceBuffer::Allocate(bytes);
  if (!b.ok()) {
    return absl::ResourceExhaustedError(absl::StrCat("scratch of ", bytes, " bytes on GPU ",
                                                     device_, ": ", b.status().message()));
  }
  void* p = b->data();
  absl::MutexLock l(&mu_);
  buffers_.emplace(p, *std::move(b));
  return p;
}

void CudaAllocator::Free(void* ptr, size_t) const {
  absl::MutexLock l(&mu_);
  buffers_.erase(ptr);
}

// --- CudaReducer ----------------------------------------------------------------

absl::StatusOr<std::unique_ptr<CudaReducer>> CudaReducer::Create(int device) {
  RETURN_IF_ERROR(cuda::SetDevice(device));
  std::unique_ptr<CudaReducer> r(new CudaReducer(device));
  ASSIGN_OR_RETURN(r->stream_, cuda::Stream::Create());
  return r;
}

void CudaReducer::Keep(const absl::Status& s) const {
  if (s.ok() || !error_.ok()) return;
  error_ = s;
  GS_LOG(ERROR) << "CUDA reduction on GPU " << device_ << ": " << s.message();
}

absl::Status CudaReducer::TakeError() const {
  absl::Status s = error_;
  error_ = absl::OkStatus();
  return s;
}

void CudaReducer::Reduce(DType dtype, ReduceOp op, void* dst, const void* src,
                         size_t count) const {
  absl::Status s = cuda::SetDevice(device_);
  if (s.ok()) s = cuda::CudaReduceInto(dtype, op, dst, src, count, stream_.get());
  if (s.ok()) s = stream_.Synchronize();
  Keep(s);
}

void CudaReducer::Combine(DType dtype, ReduceOp op, void* dst, const void* a, const void* b,
                          size_t count) const {
  absl::Status s = cuda::SetDevice(device_);
  if (s.ok()) s = cuda::CudaCombineInto(dtype, op, dst, a, b, count, stream_.get());
  if (s.ok()) s = stream_.Synchronize();
  Keep(s);
}

void CudaReducer::Divide(DType dtype, void* data, size_t count, int64_t divisor) const {
  absl::Status s = cuda::SetDevice(device_);
  if (s.ok()) s = cuda::CudaDivideBy(dtype, data, count, divisor, stream_.get());
  if (s.ok()) s = stream_.Synchronize();
  Keep(s);
}

void CudaReducer::Copy(void* dst, const void* src, size_t bytes) const {
  if (bytes == 0) return;
  absl::Status s = cuda::SetDevice(device_);
  if (s.ok()) s = cuda::CopyAsync(dst, src, bytes, stream_.get());
  if (s.ok()) s = stream_.Synchronize();
  Keep(s);
}

void CudaReducer::Encode(CodecId codec, const float* in, size_t n, void* out) const {
  absl::Status s = cuda::SetDevice(device_);
  if (s.ok()) s = cuda::CudaCodecEncode(codec, in, n, out, stream_.get());
  if (s.ok()) s = stream_.Synchronize();
  Keep(s);
}

void CudaReducer::Decode(CodecId codec, const void* in, size_t n, float* out, bool add) const {
  absl::Status s = cuda::SetDevice(device_);
  if (s.ok()) s = cuda::CudaCodecDecode(codec, in, n, out, add, stream_.get());
  if (s.ok()) s = stream_.Synchronize();
  Keep(s);
}

// --- DevicePath ------------------------------------------------------------------

absl::StatusOr<std::unique_ptr<DevicePath>> DevicePath::Create(int device,
                                                               transport::Context* node_ctx,
                                                               bool direct) {
  std::unique_ptr<DevicePath> p(new DevicePath(device, node_ctx));
  ASSIGN_OR_RETURN(p->reducer_, CudaReducer::Create(device));
  if (node_ctx != nullptr && !direct) {
    ASSIGN_OR_RETURN(p->copier_, CudaCopier::Create(device));
    p->staging_ = std::make_unique<transport::StagingContext>(*node_ctx, *p->copier_);
  }
  return p;
}

}  // namespace gradsync
