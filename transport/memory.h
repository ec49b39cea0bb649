// Buffers, their registrations and staging memory, for every memory kind.
//
// An op's memory is a Buffer (pointer, size, kind). The transport moves only
// registered memory (Context::RegisterMemory), and registering can be costly
// (ibv_reg_mr pins pages), so a buffer is registered once and reused:
//   * RegistrationCache keeps one registration per (buffer, context) for the
//     buffers a daemon hands out; an op uses a RegionView of it (RegionFor).
//     An entry dies with its buffer's owner (a weak pointer) or its context.
//   * Scratch is the staging memory the algorithms borrow: allocated through
//     a MemoryAllocator of one kind, grown on demand, kept between ops, and
//     registered again only when it grows or the context changes.
//
// Threading: a cache or a Scratch is used by one thread at a time (the
// executor's, which drives the context).
#ifndef GRADSYNC_TRANSPORT_MEMORY_H_
#define GRADSYNC_TRANSPORT_MEMORY_H_

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <tuple>

#include "absl/status/statusor.h"
#include "transport/transport.h"

namespace gradsync::transport {

// Memory an op reads or writes: [ptr, ptr+size) of `kind`.
struct Buffer {
  void* ptr = nullptr;
  size_t size = 0;
  MemKind kind = MemKind::Host();

  char* bytes() const { return static_cast<char*>(ptr); }
  // [offset, offset+len) of this buffer (the caller checks the range).
  Buffer Slice(size_t offset, size_t len) const { return Buffer{bytes() + offset, len, kind}; }
  bool Contains(const void* p, size_t len) const {
    const char* c = static_cast<const char*>(p);
    return c >= bytes() && len <= size && static_cast<size_t>(c - bytes()) <= size - len;
  }
};

// Part of a registered region; no registration of its own.
class RegionView : public MemoryRegion {
 public:
  // [offset, offset+size) of `parent`, which must outlive the view.
  RegionView(const MemoryRegion& parent, size_t offset, size_t size)
      : MemoryRegion(parent.data() + offset, size, parent.kind()), parent_(parent) {}
  const MemoryRegion& registered() const override { return parent_.registered(); }

 private:
  const MemoryRegion& parent_;
};

// The region of `buf` for one op: a view of `registered` when it covers `buf`
// with the same memory kind (nothing is registered), else a new registration
// on `ctx` (the context's error for a kind it cannot move).
absl::StatusOr<std::unique_ptr<MemoryRegion>> RegionFor(Context& ctx, const Buffer& buf,
                                                        const MemoryRegion* registered);

// One registration per buffer and context, made on first use.
class RegistrationCache {
 public:
  // The registration of `whole` on `ctx`. `owner` is what keeps the memory
  // alive (a shared memory segment); once it is gone the entry is stale and
  // the next Get of that range registers again, as does a Get on another
  // context. Stale entries are dropped on every Get.
  absl::StatusOr<const MemoryRegion*> Get(Context& ctx, const Buffer& whole,
                                          const std::weak_ptr<const void>& owner);
  // Drops the registration of the buffer starting at `ptr` (it is being freed).
  void Invalidate(const void* ptr);
  void Clear() { entries_.clear(); }

  size_t size() const { return entries_.size(); }
  // Registrations made since construction (what a test counts).
  uint64_t registrations() const { return registrations_; }

 private:
  // (address, size, kind, device): never the address alone, so a buffer of
  // another kind or size at a reused address is never taken for an old one.
  using Key = std::tuple<uintptr_t, size_t, int, int>;
  struct Entry {
    std::weak_ptr<const void> owner;
    uint64_t context_id = 0;
    std::unique_ptr<MemoryRegion> region;
  };
  void DropStale();
  std::map<Key, Entry> entries_;
  uint64_t registrations_ = 0;
};

// Allocates memory of one kind.
class MemoryAllocator {
 public:
  virtual ~MemoryAllocator() = default;
  virtual MemKind kind() const = 0;
  // At least `bytes` (64-byte aligned); ResourceExhausted when it cannot.
  virtual absl::StatusOr<void*> Allocate(size_t bytes) const = 0;
  virtual void Free(void* ptr, size_t bytes) const = 0;
};

// Host memory (page-aligned; a process-wide instance).
const MemoryAllocator& HostAllocator();

// Staging memory of one kind that an executor lends to its ops.
class Scratch {
 public:
  explicit Scratch(const MemoryAllocator& allocator = HostAllocator()) : allocator_(allocator) {}
  ~Scratch();
  Scratch(const Scratch&) = delete;
  Scratch& operator=(const Scratch&) = delete;

  // At least `bytes` of staging memory; growing replaces the memory (its
  // contents are not kept) and its registration. The memory stays valid
  // until the next Reserve that grows it.
  absl::StatusOr<Buffer> Reserve(size_t bytes);
  // Reserve(bytes) and the registration of the whole staging memory on
  // `ctx` (made once per growth and context).
  absl::StatusOr<const MemoryRegion*> ReserveRegistered(Context& ctx, size_t bytes);

  char* data() const { return static_cast<char*>(ptr_); }
  size_t size() const { return size_; }
  MemKind kind() const { return allocator_.kind(); }
  // The registration the last ReserveRegistered made or reused (null if none).
  const MemoryRegion* region() const { return region_.get(); }
  uint64_t registrations() const { return registrations_; }

 private:
  const MemoryAllocator& allocator_;
  void* ptr_ = nullptr;
  size_t size_ = 0;
  uint64_t context_id_ = 0;
  std::unique_ptr<MemoryRegion> region_;
  uint64_t registrations_ = 0;
};

}  // namespace gradsync::transport

#endif  // GRADSYNC_TRANSPORT_MEMORY_H_
