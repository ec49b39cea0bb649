// Tests of the device-memory staging path without a GPU: "device memory" that
// is host memory labelled cuda:0, and a copier that emulates a GPU's copy
// engines — copies of each direction finish in order, only when polled, at
// the earliest `delay` after they were made (so several are in flight at
// once), and a chosen copy can fail. It checks the protocol (what is copied
// when, in which order, overlap, errors); only a GPU shows the real thing.
#ifndef GRADSYNC_TRANSPORT_STAGING_TESTING_H_
#define GRADSYNC_TRANSPORT_STAGING_TESTING_H_

#include <cstdlib>
#include <cstring>
#include <deque>
#include <map>

#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "transport/memory.h"
#include "transport/staging_context.h"

namespace gradsync::transport::testing {

inline MemKind EmulatedDevice() { return MemKind::Cuda(0); }

// Host memory labelled cuda:0 (scratch of the emulated device).
class EmulatedDeviceAllocator final : public MemoryAllocator {
 public:
  MemKind kind() const override { return EmulatedDevice(); }
  absl::StatusOr<void*> Allocate(size_t bytes) const override {
    void* p = std::aligned_alloc(64, (bytes + 63) / 64 * 64 + 64);
    if (p == nullptr) return absl::ResourceExhaustedError("emulated device memory");
    return p;
  }
  void Free(void* ptr, size_t) const override { std::free(ptr); }
};

class EmulatedCopier final : public DeviceCopier {
 public:
  explicit EmulatedCopier(absl::Duration delay = absl::ZeroDuration()) : delay_(delay) {}
  MemKind kind() const override { return EmulatedDevice(); }
  absl::StatusOr<void*> AllocateHost(size_t bytes) override {
    return EmulatedDeviceAllocator().Allocate(bytes);
  }
  void FreeHost(void* ptr, size_t) override { std::free(ptr); }
  absl::StatusOr<uint64_t> Copy(Direction d, void* dst, const void* src, size_t bytes) override {
    absl::MutexLock l(&mu_);
    const uint64_t ticket = ++made_;
    if (ticket == fail_at_) return absl::InternalError("emulated copy engine: injected failure");
    queues_[d].push_back({ticket, dst, src, bytes, absl::Now() + delay_});
    direction_[ticket] = d;
    return ticket;
  }
  absl::StatusOr<bool> Done(uint64_t ticket) override {
    absl::MutexLock l(&mu_);
    auto it = direction_.find(ticket);
    if (it == direction_.end()) return true;  // finished and forgotten
    // Copies of a direction finish in order: everything due before it first.
    std::deque<Pending>& q = queues_[it->second];
    const absl::Time now = absl::Now();
    while (!q.empty() && q.front().due <= now) {
      const Pending& p = q.front();
      if (p.bytes > 0) std::memcpy(p.dst, p.src, p.bytes);
      direction_.erase(p.ticket);
      ++finished_;
      q.pop_front();
    }
    return direction_.count(ticket) == 0;
  }
  // Copy number `n` (from 1) fails when it is made.
  void FailCopy(uint64_t n) {
    absl::MutexLock l(&mu_);
    fail_at_ = n;
  }
  uint64_t finished() const {
    absl::MutexLock l(&mu_);
    return finished_;
  }

 private:
  struct Pending {
    uint64_t ticket;
    void* dst;
    const void* src;
    size_t bytes;
    absl::Time due;
  };
  const absl::Duration delay_;
  mutable absl::Mutex mu_;
  uint64_t made_ = 0, finished_ = 0, fail_at_ = 0;
  std::map<Direction, std::deque<Pending>> queues_;
  std::map<uint64_t, Direction> direction_;
};

}  // namespace gradsync::transport::testing

#endif  // GRADSYNC_TRANSPORT_STAGING_TESTING_H_
