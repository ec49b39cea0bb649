#include "transport/memory.h"

#include <cstring>
#include <memory>
#include <vector>

#include "gtest/gtest.h"
#include "transport/inproc.h"

namespace gradsync::transport {
namespace {

// One context of a one-rank in-process device, with the device (whose
// registration count the tests read).
struct OneRank {
  InProcDevice device{1};
  std::unique_ptr<Context> ctx;
  OneRank() {
    ContextSpec spec;
    spec.world_size = 1;
    ctx = *device.CreateContext(spec);
  }
};

TEST(RegistrationCache, RegistersEachBufferOncePerContext) {
  OneRank a, b;
  auto owner = std::make_shared<std::vector<char>>(4096);
  const Buffer whole{owner->data(), owner->size()};
  RegistrationCache cache;
  auto first = cache.Get(*a.ctx, whole, owner);
  ASSERT_TRUE(first.ok()) << first.status();
  for (int i = 0; i < 100; ++i) {
    auto again = cache.Get(*a.ctx, whole, owner);
    ASSERT_TRUE(again.ok());
    EXPECT_EQ(*again, *first);
  }
  EXPECT_EQ(cache.registrations(), 1u);
  EXPECT_EQ(a.device.registrations(), 1u);
  // Another context registers it again (its keys are its own).
  auto on_b = cache.Get(*b.ctx, whole, owner);
  ASSERT_TRUE(on_b.ok());
  EXPECT_EQ(b.device.registrations(), 1u);
  EXPECT_EQ(cache.registrations(), 2u);
}

TEST(RegistrationCache, KeysAreRangeAndKindNotAddressAlone) {
  OneRank r;
  auto owner = std::make_shared<std::vector<char>>(8192);
  RegistrationCache cache;
  ASSERT_TRUE(cache.Get(*r.ctx, Buffer{owner->data(), 4096}, owner).ok());
  ASSERT_TRUE(cache.Get(*r.ctx, Buffer{owner->data(), 8192}, owner).ok());
  EXPECT_EQ(cache.size(), 2u);
  // The device refuses CUDA memory; the error comes back, nothing is cached.
  auto cuda = cache.Get(*r.ctx, Buffer{owner->data(), 4096, MemKind::Cuda(0)}, owner);
  EXPECT_TRUE(absl::IsFailedPrecondition(cuda.status())) << cuda.status();
  EXPECT_EQ(cache.size(), 2u);
}

TEST(RegistrationCache, AFreedBufferIsRegisteredAnewEvenAtTheSameAddress) {
  OneRank r;
  RegistrationCache cache;
  std::vector<char> memory(4096);
  const Buffer whole{memory.data(), memory.size()};
  auto owner = std::make_shared<int>(1);
  auto first = cache.Get(*r.ctx, whole, owner);
  ASSERT_TRUE(first.ok());
  owner.reset();  // the buffer is freed; new memory appears at the same address
  auto owner2 = std::make_shared<int>(2);
  auto second = cache.Get(*r.ctx, whole, owner2);
  ASSERT_TRUE(second.ok());
  EXPECT_EQ(cache.registrations(), 2u);
  EXPECT_EQ(cache.size(), 1u);  // the stale entry was dropped
  cache.Invalidate(memory.data());
  EXPECT_EQ(cache.size(), 0u);
}

TEST(RegionFor, ViewsACoveringRegistrationAndRegistersOtherwise) {
  OneRank r;
  std::vector<char> memory(1024);
  auto whole = r.ctx->RegisterMemory(memory.data(), memory.size());
  ASSERT_TRUE(whole.ok());
  const uint64_t before = r.device.registrations();
  auto view = RegionFor(*r.ctx, Buffer{memory.data() + 100, 200}, whole->get());
  ASSERT_TRUE(view.ok());
  EXPECT_EQ((*view)->data(), memory.data() + 100);
  EXPECT_EQ((*view)->size(), 200u);
  EXPECT_EQ(&(*view)->registered(), whole->get());
  EXPECT_EQ(r.device.registrations(), before);
  // Past the registration's end: registered on its own.
  std::vector<char> other(64);
  auto fresh = RegionFor(*r.ctx, Buffer{other.data(), other.size()}, whole->get());
  ASSERT_TRUE(fresh.ok());
  EXPECT_EQ(&(*fresh)->registered(), fresh->get());
  EXPECT_EQ(r.device.registrations(), before + 1);
}

TEST(Scratch, RegistersOncePerGrowthAndContext) {
  OneRank a, b;
  Scratch s;
  auto r1 = s.ReserveRegistered(*a.ctx, 1000);
  ASSERT_TRUE(r1.ok());
  EXPECT_GE((*r1)->size(), 1000u);
  auto r2 = s.ReserveRegistered(*a.ctx, 500);  // fits: same memory, same registration
  ASSERT_TRUE(r2.ok());
  EXPECT_EQ(*r1, *r2);
  EXPECT_EQ(s.registrations(), 1u);
  auto r3 = s.ReserveRegistered(*a.ctx, 1 << 20);  // grows
  ASSERT_TRUE(r3.ok());
  EXPECT_GE(s.size(), size_t{1} << 20);
  EXPECT_EQ(s.registrations(), 2u);
  auto r4 = s.ReserveRegistered(*b.ctx, 10);  // another context
  ASSERT_TRUE(r4.ok());
  EXPECT_EQ(s.registrations(), 3u);
  EXPECT_EQ(s.region(), *r4);
  // The memory is usable and page-aligned.
  EXPECT_EQ(reinterpret_cast<uintptr_t>(s.data()) % 4096, 0u);
  std::memset(s.data(), 0x5a, s.size());
}

TEST(InProcRegistrations, PostsOnUnregisteredOrReleasedMemoryFail) {
  InProcDevice device(2);
  ContextSpec spec;
  spec.world_size = 2;
  auto c0 = *device.CreateContext(spec);
  spec.rank = 1;
  auto c1 = *device.CreateContext(spec);
  std::vector<char> memory(64);
  MemoryRegion forged(memory.data(), memory.size());  // never registered
  Request req;
  absl::Status s = c0->PostSend(1, forged, 0, 8, MessageTag{1, 0, 0, 0}, &req);
  EXPECT_TRUE(absl::IsInvalidArgument(s)) << s;
  EXPECT_NE(s.message().find("not registered"), std::string::npos) << s;
  // Registered on the peer's context: not this one's.
  auto theirs = c1->RegisterMemory(memory.data(), memory.size());
  ASSERT_TRUE(theirs.ok());
  EXPECT_TRUE(absl::IsInvalidArgument(c0->PostSend(1, **theirs, 0, 8, MessageTag{1, 0, 0, 0}, &req)));
  auto mine = c0->RegisterMemory(memory.data(), memory.size());
  ASSERT_TRUE(mine.ok());
  const RegionView view(**mine, 8, 16);
  EXPECT_TRUE(c0->PostSend(1, view, 0, 16, MessageTag{1, 0, 0, 0}, &req).ok());
  mine->reset();  // released: the view's registration is gone
  EXPECT_TRUE(absl::IsInvalidArgument(c0->PostRecv(1, forged, 0, 8, true, MessageTag{1, 1, 0, 0}, &req)));
}

TEST(InProcRegistrations, PostingIsBounded) {
  InProcDevice device(2);
  ContextSpec spec;
  spec.world_size = 2;
  auto c0 = *device.CreateContext(spec);
  std::vector<char> memory(64);
  auto mr = c0->RegisterMemory(memory.data(), memory.size());
  ASSERT_TRUE(mr.ok());
  EXPECT_EQ(c0->max_in_flight(), InProcDevice::kMaxInFlight);
  std::vector<Request> reqs(InProcDevice::kMaxInFlight + 1);
  for (int i = 0; i < InProcDevice::kMaxInFlight; ++i) {
    ASSERT_TRUE(c0->PostRecv(1, **mr, 0, 8, true, MessageTag{1, static_cast<uint32_t>(i), 0, 0},
                             &reqs[i]).ok());
  }
  absl::Status s = c0->PostRecv(1, **mr, 0, 8, true, MessageTag{1, 99, 0, 0}, &reqs.back());
  EXPECT_TRUE(absl::IsResourceExhausted(s)) << s;
  EXPECT_NE(s.message().find("receives from rank 1 already posted"), std::string::npos) << s;
}

}  // namespace
}  // namespace gradsync::transport
