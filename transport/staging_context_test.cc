// StagingContext on the emulated GPU copier (staging_testing.h) over the
// in-process device: device memory arrives bit-exact through pooled host
// blocks, several copies in flight at once, host memory passes through, a
// failed copy fails the context on both sides naming the cause.
#include "transport/staging_context.h"

#include <cstring>
#include <thread>
#include <vector>

#include "absl/time/clock.h"
#include "gtest/gtest.h"
#include "transport/inproc.h"
#include "transport/staging_testing.h"

namespace gradsync::transport {
namespace {

using testing::EmulatedCopier;
using testing::EmulatedDevice;

MessageTag Tag(uint64_t op, uint32_t slot) {
  MessageTag t;
  t.op_seq = op;
  t.slot = slot;
  return t;
}

struct Pair {
  std::vector<std::unique_ptr<Context>> inner;
  std::vector<std::unique_ptr<EmulatedCopier>> copiers;
  std::vector<std::unique_ptr<StagingContext>> staged;
};

Pair Connect(absl::Duration copy_delay) {
  Pair p;
  InProcDevice dev(2);
  for (int r = 0; r < 2; ++r) {
    ContextSpec s;
    s.job_id = "staging";
    s.epoch = 1;
    s.rank = r;
    s.world_size = 2;
    s.deadline = absl::Now() + absl::Seconds(5);
    auto ctx = dev.CreateContext(s);
    EXPECT_TRUE(ctx.ok()) << ctx.status();
    p.inner.push_back(std::move(*ctx));
    p.copiers.push_back(std::make_unique<EmulatedCopier>(copy_delay));
    p.staged.push_back(std::make_unique<StagingContext>(*p.inner[r], *p.copiers[r]));
  }
  return p;
}

absl::Status WaitAll(Context& c, std::vector<Request>& reqs) {
  const absl::Time deadline = absl::Now() + absl::Seconds(10);
  for (Request& r : reqs) {
    while (!r.done) {
      absl::Status s = c.Progress(deadline);
      if (!s.ok()) return s;
    }
  }
  return absl::OkStatus();
}

TEST(StagingContext, DeviceMemoryArrivesBitExactWithCopiesOverlapping) {
  Pair p = Connect(absl::Milliseconds(1));
  // At most 4 in flight per peer (the in-process device's bound).
  const std::vector<size_t> sizes = {0, 4093, (1 << 20) + 3, 7};
  size_t total = 0;
  for (size_t n : sizes) total += n;
  std::vector<char> src(total), dst(total + 100, 0);
  for (size_t i = 0; i < total; ++i) src[i] = static_cast<char>(i * 131 + 7);
  for (int round = 0; round < 2; ++round) {
    std::fill(dst.begin(), dst.end(), 0);
    auto smr = *p.staged[0]->RegisterMemory(src.data(), src.size(), EmulatedDevice());
    auto dmr = *p.staged[1]->RegisterMemory(dst.data(), dst.size(), EmulatedDevice());
    std::vector<Request> sends(sizes.size()), recvs(sizes.size());
    size_t off = 0;
    for (size_t i = 0; i < sizes.size(); ++i) {
      const bool exact = i != 1;  // one receive takes more than it gets
      ASSERT_TRUE(p.staged[1]
                      ->PostRecv(0, *dmr, off, sizes[i] + (exact ? 0 : 100), exact,
                                 Tag(round, i), &recvs[i])
                      .ok());
      off += sizes[i];
    }
    off = 0;
    for (size_t i = 0; i < sizes.size(); ++i) {
      ASSERT_TRUE(p.staged[0]->PostSend(1, *smr, off, sizes[i], Tag(round, i), &sends[i]).ok());
      off += sizes[i];
    }
    std::thread receiver([&] { EXPECT_TRUE(WaitAll(*p.staged[1], recvs).ok()); });
    EXPECT_TRUE(WaitAll(*p.staged[0], sends).ok());
    receiver.join();
    for (size_t i = 0; i < sizes.size(); ++i) EXPECT_EQ(recvs[i].bytes, sizes[i]) << i;
    EXPECT_EQ(std::memcmp(src.data(), dst.data(), total), 0) << "round " << round;
  }
  const StagingContext::Counters& sender = p.staged[0]->counters();
  EXPECT_EQ(sender.staged_sends, 2 * sizes.size());
  EXPECT_GE(sender.max_copies_in_flight, 2);  // the copies overlapped
  EXPECT_EQ(p.staged[1]->counters().staged_recvs, 2 * sizes.size());
  // The second round reused the first round's blocks.
  const uint64_t blocks = sender.blocks_allocated;
  EXPECT_LE(blocks, sizes.size());
  EXPECT_GT(p.copiers[0]->finished(), 0u);
}

// A peer's messages leave in posting order even when a later one needs no
// copy (empty) or is host memory: the receiver here posts each receive only
// after the previous one completed, so a message that overtook would find no
// receive and fail the context.
TEST(StagingContext, MessagesToAPeerKeepTheirPostingOrder) {
  Pair p = Connect(absl::Milliseconds(20));  // the first message's copy is slow
  std::vector<char> dev(4096, 'd'), host(64, 'h'), in_dev(4096, 0), in_host(64, 0);
  auto dmr = *p.staged[0]->RegisterMemory(dev.data(), dev.size(), EmulatedDevice());
  auto hmr = *p.staged[0]->RegisterMemory(host.data(), host.size());
  auto in_dmr = *p.staged[1]->RegisterMemory(in_dev.data(), in_dev.size(), EmulatedDevice());
  auto in_hmr = *p.staged[1]->RegisterMemory(in_host.data(), in_host.size());
  std::vector<Request> sends(3);
  ASSERT_TRUE(p.staged[0]->PostSend(1, *dmr, 0, 4096, Tag(1, 0), &sends[0]).ok());
  ASSERT_TRUE(p.staged[0]->PostSend(1, *dmr, 0, 0, Tag(1, 1), &sends[1]).ok());
  ASSERT_TRUE(p.staged[0]->PostSend(1, *hmr, 0, 64, Tag(1, 2), &sends[2]).ok());
  absl::Status receiver;
  std::thread t([&] {
    for (uint32_t slot = 0; slot < 3 && receiver.ok(); ++slot) {
      std::vector<Request> r(1);
      const MemoryRegion& into = slot == 2 ? *in_hmr : *in_dmr;
      receiver = p.staged[1]->PostRecv(0, into, 0, slot == 0 ? 4096 : slot == 1 ? 0 : 64, true,
                                       Tag(1, slot), &r[0]);
      if (receiver.ok()) receiver = WaitAll(*p.staged[1], r);
    }
  });
  const absl::Status sender = WaitAll(*p.staged[0], sends);
  t.join();
  EXPECT_TRUE(sender.ok()) << sender;
  EXPECT_TRUE(receiver.ok()) << receiver;
  EXPECT_EQ(in_dev, dev);
  EXPECT_EQ(in_host, host);
}

TEST(StagingContext, HostMemoryPassesStraightThrough) {
  Pair p = Connect(absl::ZeroDuration());
  std::vector<char> src(1000, 'h'), dst(1000, 0);
  auto smr = *p.staged[0]->RegisterMemory(src.data(), src.size());
  auto dmr = *p.staged[1]->RegisterMemory(dst.data(), dst.size());
  std::vector<Request> send(1), recv(1);
  ASSERT_TRUE(p.staged[1]->PostRecv(0, *dmr, 0, 1000, true, Tag(1, 0), &recv[0]).ok());
  ASSERT_TRUE(p.staged[0]->PostSend(1, *smr, 0, 1000, Tag(1, 0), &send[0]).ok());
  std::thread receiver([&] { EXPECT_TRUE(WaitAll(*p.staged[1], recv).ok()); });
  EXPECT_TRUE(WaitAll(*p.staged[0], send).ok());
  receiver.join();
  EXPECT_EQ(src, dst);
  EXPECT_EQ(p.staged[0]->counters().staged_sends, 0u);
  EXPECT_EQ(p.copiers[0]->finished(), 0u);
}

TEST(StagingContext, AnotherDevicesMemoryIsRefused) {
  Pair p = Connect(absl::ZeroDuration());
  char x[16];
  auto r = p.staged[0]->RegisterMemory(x, sizeof(x), MemKind::Cuda(1));
  EXPECT_EQ(r.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(r.status().message(), "this context stages cuda:0 memory, not cuda:1");
}

TEST(StagingContext, AFailedCopyFailsTheContextOnBothSidesNamingIt) {
  Pair p = Connect(absl::ZeroDuration());
  p.copiers[1]->FailCopy(1);  // the receiver's first copy (to the device)
  std::vector<char> src(5000, 's'), dst(5000, 0);
  auto smr = *p.staged[0]->RegisterMemory(src.data(), src.size(), EmulatedDevice());
  auto dmr = *p.staged[1]->RegisterMemory(dst.data(), dst.size(), EmulatedDevice());
  std::vector<Request> send(1), recv(1);
  ASSERT_TRUE(p.staged[1]->PostRecv(0, *dmr, 0, 5000, true, Tag(1, 0), &recv[0]).ok());
  ASSERT_TRUE(p.staged[0]->PostSend(1, *smr, 0, 5000, Tag(1, 0), &send[0]).ok());
  absl::Status receiver;
  std::thread t([&] { receiver = WaitAll(*p.staged[1], recv); });
  (void)WaitAll(*p.staged[0], send);
  t.join();
  EXPECT_EQ(receiver.code(), absl::StatusCode::kInternal) << receiver;
  EXPECT_EQ(receiver.message(), "staging cuda:0 memory: emulated copy engine: injected failure");
  EXPECT_FALSE(p.staged[1]->health().ok());
  // The sender learns it at its next wait on the peer.
  std::vector<Request> again(1);
  absl::Status s = p.staged[0]->PostRecv(1, *smr, 0, 10, true, Tag(2, 0), &again[0]);
  if (s.ok()) s = WaitAll(*p.staged[0], again);
  EXPECT_FALSE(s.ok());
}

}  // namespace
}  // namespace gradsync::transport
