#include "transport/memory.h"

#include <sys/mman.h>

#include <algorithm>
#include <atomic>
#include <cstdlib>

#include "absl/strings/str_cat.h"

namespace gradsync::transport {

Context::Context() : id_([] {
  static std::atomic<uint64_t> next{1};
  return next.fetch_add(1, std::memory_order_relaxed);
}()) {}

absl::StatusOr<std::unique_ptr<MemoryRegion>> RegionFor(Context& ctx, const Buffer& buf,
                                                        const MemoryRegion* registered) {
  if (registered != nullptr && registered->kind() == buf.kind) {
    const Buffer whole{registered->data(), registered->size(), registered->kind()};
    if (whole.Contains(buf.ptr, buf.size)) {
      return std::unique_ptr<MemoryRegion>(
          new RegionView(*registered, static_cast<size_t>(buf.bytes() - whole.bytes()), buf.size));
    }
  }
  return ctx.RegisterMemory(buf.ptr, buf.size, buf.kind);
}

absl::StatusOr<const MemoryRegion*> RegistrationCache::Get(Context& ctx, const Buffer& whole,
                                                           const std::weak_ptr<const void>& owner) {
  DropStale();
  const Key key{reinterpret_cast<uintptr_t>(whole.ptr), whole.size,
                static_cast<int>(whole.kind.type), whole.kind.device};
  auto it = entries_.find(key);
  if (it != entries_.end() && it->second.context_id == ctx.id()) return it->second.region.get();
  absl::StatusOr<std::unique_ptr<MemoryRegion>> mr = ctx.RegisterMemory(whole.ptr, whole.size,
                                                                         whole.kind);
  if (!mr.ok()) return mr.status();
  ++registrations_;
  Entry& e = entries_[key];
  e.owner = owner;
  e.context_id = ctx.id();
  e.region = *std::move(mr);
  return e.region.get();
}

void RegistrationCache::Invalidate(const void* ptr) {
  for (auto it = entries_.begin(); it != entries_.end();) {
    it = std::get<0>(it->first) == reinterpret_cast<uintptr_t>(ptr) ? entries_.erase(it)
                                                                      : std::next(it);
  }
}

void RegistrationCache::DropStale() {
  for (auto it = entries_.begin(); it != entries_.end();) {
    it = it->second.owner.expired() ? entries_.erase(it) : std::next(it);
  }
}

namespace {

class HostMemoryAllocator : public MemoryAllocator {
 public:
  MemKind kind() const override { return MemKind::Host(); }
  absl::StatusOr<void*> Allocate(size_t bytes) const override {
    void* p = nullptr;
    if (posix_memalign(&p, 4096, bytes == 0 ? 1 : bytes) != 0) {
      return absl::ResourceExhaustedError(
          absl::StrCat("cannot allocate ", bytes, " bytes of host staging memory"));
    }
    return p;
  }
  void Free(void* ptr, size_t) const override { std::free(ptr); }
};

}  // namespace

const MemoryAllocator& HostAllocator() {
  static const HostMemoryAllocator allocator;
  return allocator;
}

Scratch::~Scratch() {
  region_.reset();
  if (ptr_ != nullptr) allocator_.Free(ptr_, size_);
}

absl::StatusOr<Buffer> Scratch::Reserve(size_t bytes) {
  if (bytes > size_ || ptr_ == nullptr) {
    // Grow by at least half again, so a slowly growing need reallocates rarely.
    const size_t want = std::max(bytes, size_ + size_ / 2);
    absl::StatusOr<void*> p = allocator_.Allocate(want);
    if (!p.ok()) return p.status();
    region_.reset();
    if (ptr_ != nullptr) allocator_.Free(ptr_, size_);
    ptr_ = *p;
    size_ = want;
  }
  return Buffer{ptr_, size_, allocator_.kind()};
}

absl::StatusOr<const MemoryRegion*> Scratch::ReserveRegistered(Context& ctx, size_t bytes) {
  absl::StatusOr<Buffer> buf = Reserve(bytes);
  if (!buf.ok()) return buf.status();
  if (region_ == nullptr || context_id_ != ctx.id()) {
    absl::StatusOr<std::unique_ptr<MemoryRegion>> mr = ctx.RegisterMemory(ptr_, size_, kind());
    if (!mr.ok()) return mr.status();
    region_ = *std::move(mr);
    context_id_ = ctx.id();
    ++registrations_;
  }
  return region_.get();
}

}  // namespace gradsync::transport
