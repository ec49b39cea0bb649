#include "ipc/arena.h"

#include <sys/wait.h>
#include <unistd.h>

#include <cstring>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "ipc/shared_memory.h"

namespace gradsync {
namespace ipc {
namespace {

struct Mapped {
  std::unique_ptr<SharedMemory> mem;
  ArenaView view;
};

Mapped Make(ArenaGeometry g) {
  auto bytes = ArenaBytes(g);
  EXPECT_TRUE(bytes.ok()) << bytes.status();
  auto mem = SharedMemory::Anonymous(*bytes);
  EXPECT_TRUE(mem.ok()) << mem.status();
  auto view = ArenaView::Format((*mem)->data(), (*mem)->size(), g, 42, 7);
  EXPECT_TRUE(view.ok()) << view.status();
  return Mapped{std::move(*mem), *view};
}

TEST(Arena, GeometryOutOfRangeIsRefusedNamingTheField) {
  EXPECT_NE(ArenaBytes({0, 32, 1024}).status().message().find("world size 0"), std::string::npos);
  EXPECT_NE(ArenaBytes({4, 24, 1024}).status().message().find("frames 24 is not a power of two"),
            std::string::npos);
  EXPECT_NE(ArenaBytes({4, 32, kArenaMaxDataBytes + 1}).status().message().find("data bytes"),
            std::string::npos);
  EXPECT_TRUE(ArenaBytes({kArenaMaxWorld, 2, 0}).ok());
}

TEST(Arena, AttachSeesTheGeometryTheDaemonFormatted) {
  Mapped m = Make({4, 16, 1000});
  auto client = ArenaView::Attach(m.mem->data(), m.mem->size());
  ASSERT_TRUE(client.ok()) << client.status();
  EXPECT_EQ(client->world_size(), 4);
  EXPECT_EQ(client->frames(), 16u);
  EXPECT_EQ(client->data_bytes(), 1000u);
  EXPECT_EQ(client->epoch(), 7u);
  EXPECT_TRUE(client->CheckHeader().ok());
  EXPECT_TRUE(client->failure().ok());
}

TEST(Arena, AttachRefusesWhatIsNotAnArenaOrDoesNotFit) {
  Mapped m = Make({2, 4, 64});
  EXPECT_FALSE(ArenaView::Attach(m.mem->data(), 16).ok());
  auto short_map = ArenaView::Attach(m.mem->data(), m.mem->size() - 4096);
  ASSERT_FALSE(short_map.ok());
  EXPECT_NE(short_map.status().message().find("its header says"), std::string::npos);
  auto* h = static_cast<ArenaHeader*>(m.mem->data());
  h->fixed.version = 9;
  auto v = ArenaView::Attach(m.mem->data(), m.mem->size());
  ASSERT_FALSE(v.ok());
  EXPECT_NE(v.status().message().find("arena version 9"), std::string::npos);
  h->fixed.version = kArenaVersion;
  h->fixed.slot_bytes += 64;
  EXPECT_NE(ArenaView::Attach(m.mem->data(), m.mem->size()).status().message().find("inconsistent"),
            std::string::npos);
  EXPECT_FALSE(m.view.CheckHeader().ok());  // the daemon notices the scribble too
  h->fixed.magic = 1;
  EXPECT_NE(ArenaView::Attach(m.mem->data(), m.mem->size()).status().message().find("not a gradsync arena"),
            std::string::npos);
}

TEST(Arena, PublishedFramesAreReadBackWholeByOtherRanks) {
  Mapped m = Make({3, 4, 256});
  ArenaView& a = m.view;
  const std::string sig = "signature-of-op-5";
  const char data[] = "0123456789abcdef";
  EXPECT_FALSE(a.Published(1, 5));
  const uint32_t before = a.bell().Snapshot();
  ASSERT_TRUE(a.Publish(1, 5, sig, data, sizeof(data)).ok());
  EXPECT_NE(a.bell().Snapshot(), before);  // publishing rings the bell
  EXPECT_TRUE(a.Published(1, 5));
  EXPECT_FALSE(a.Published(1, 1));  // same frame index (5 % 4), other op
  EXPECT_FALSE(a.Published(0, 5));
  auto f = a.Read(1, 5);
  ASSERT_TRUE(f.ok()) << f.status();
  EXPECT_EQ(f->signature, sig);
  ASSERT_EQ(f->data_len, sizeof(data));
  EXPECT_EQ(std::memcmp(f->data, data, sizeof(data)), 0);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(f->data) % 64, 0u);  // aligned for any dtype
  // A signature-only frame (an op the daemon runs).
  ASSERT_TRUE(a.Publish(2, 5, sig, nullptr, 0).ok());
  EXPECT_EQ(a.Read(2, 5)->data_len, 0u);
}

TEST(Arena, PublishRefusesOversizeFieldsAndReadRefusesCorruptedOnes) {
  Mapped m = Make({2, 4, 64});
  std::vector<char> big(65);
  EXPECT_NE(m.view.Publish(0, 1, "s", big.data(), big.size()).message().find("65 bytes exceeds"),
            std::string::npos);
  EXPECT_FALSE(m.view.Publish(0, 1, std::string(kArenaMaxSignatureBytes + 1, 'x'), nullptr, 0).ok());
  EXPECT_FALSE(m.view.Publish(0, 0, "s", nullptr, 0).ok());
  EXPECT_FALSE(m.view.Publish(2, 1, "s", nullptr, 0).ok());
  ASSERT_TRUE(m.view.Publish(0, 1, "s", big.data(), 64).ok());
  // A client scribbles a length after publishing: readers refuse the frame.
  auto* base = static_cast<char*>(m.mem->data());
  const auto& fx = static_cast<ArenaHeader*>(m.mem->data())->fixed;
  auto* fh = reinterpret_cast<ArenaFrameHeader*>(base + fx.slots_offset + fx.slot_header_bytes +
                                                 1 * fx.frame_bytes);
  fh->data_len = 1 << 30;
  auto r = m.view.Read(0, 1);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_NE(r.status().message().find("rank 0's arena frame of op 1 is corrupted"), std::string::npos);
}

TEST(Arena, AFrameIsFreeOnlyOnceEveryRankConsumedItsLastOp) {
  Mapped m = Make({3, 4, 8});
  ArenaView& a = m.view;
  for (uint64_t k = 1; k <= 4; ++k) EXPECT_TRUE(a.FrameFree(k));
  EXPECT_FALSE(a.FrameFree(5));  // would overwrite op 1, which nobody finished
  EXPECT_EQ(a.RanksHolding(5), (std::vector<int>{0, 1, 2}));
  a.SetConsumed(0, 1);
  a.SetConsumed(2, 3);
  EXPECT_EQ(a.RanksHolding(5), (std::vector<int>{1}));
  EXPECT_FALSE(a.FrameFree(5));
  a.SetConsumed(1, 1);
  EXPECT_TRUE(a.FrameFree(5));
  EXPECT_FALSE(a.FrameFree(6));
  EXPECT_EQ(a.RanksHolding(7), (std::vector<int>{0, 1}));
  EXPECT_EQ(a.consumed(2), 3u);
}

TEST(Arena, TheFirstFailureWinsAndRingsTheBell) {
  Mapped m = Make({2, 2, 8});
  EXPECT_FALSE(m.view.has_failed());
  const uint32_t before = m.view.bell().Snapshot();
  m.view.Fail(absl::DeadlineExceededError("op 9 timed out at rank 0: waiting for rank 1"));
  m.view.Fail(absl::CancelledError("rank 1 closed its session"));
  EXPECT_NE(m.view.bell().Snapshot(), before);
  EXPECT_TRUE(m.view.has_failed());
  auto client = ArenaView::Attach(m.mem->data(), m.mem->size());
  ASSERT_TRUE(client.ok());
  absl::Status f = client->failure();
  EXPECT_EQ(f.code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_EQ(f.message(), "op 9 timed out at rank 0: waiting for rank 1");
}

TEST(Arena, LongFailureMessagesAreCutAndSaySo) {
  Mapped m = Make({2, 2, 8});
  m.view.Fail(absl::AbortedError(std::string(5000, 'x')));
  absl::Status f = m.view.failure();
  EXPECT_LE(f.message().size(), kArenaMaxFailureBytes);
  EXPECT_NE(f.message().find("[truncated]"), std::string::npos);
}

TEST(Arena, PublicationTimeAndCountersAreVisibleToTheDaemon) {
  Mapped m = Make({2, 2, 8});
  const int64_t before = absl::ToUnixMicros(absl::Now());
  ASSERT_TRUE(m.view.Publish(1, 12, "s", nullptr, 0).ok());
  const int64_t at = m.view.Read(1, 12)->published_us;
  EXPECT_GE(at, before);
  EXPECT_LE(at, absl::ToUnixMicros(absl::Now()));
  m.view.counters(1, kArenaCounterBarrier).ok.fetch_add(3);
  EXPECT_EQ(m.view.counters(1, kArenaCounterBarrier).ok.load(), 3u);
  EXPECT_EQ(m.view.counters(0, kArenaCounterBarrier).ok.load(), 0u);
}

TEST(Arena, AnOpsOutcomeIsKeptInItsFrameUntilTheFrameIsReused) {
  Mapped m = Make({2, 2, 8});
  ASSERT_TRUE(m.view.Publish(0, 5, "s", nullptr, 0).ok());
  EXPECT_FALSE(m.view.Read(0, 5)->outcome.has_value());
  m.view.SetOutcome(0, 5, absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(m.view.Read(0, 5)->outcome, absl::StatusCode::kInvalidArgument);
  m.view.SetOutcome(0, 6, absl::StatusCode::kOk);  // not published: ignored
  EXPECT_EQ(m.view.Read(0, 5)->outcome, absl::StatusCode::kInvalidArgument);
  ASSERT_TRUE(m.view.Publish(0, 7, "t", nullptr, 0).ok());  // the same frame, reused
  EXPECT_FALSE(m.view.Read(0, 7)->outcome.has_value());
  m.view.SetOutcome(0, 7, absl::StatusCode::kOk);
  EXPECT_EQ(m.view.Read(0, 7)->outcome, absl::StatusCode::kOk);
}

TEST(Arena, ALeftRankIsMarkedWithTheLastOpItFinished) {
  Mapped m = Make({3, 4, 8});
  m.view.SetConsumed(1, 7);
  const uint32_t before = m.view.bell().Snapshot();
  EXPECT_FALSE(m.view.Left(1));
  m.view.Leave(1);
  m.view.SetConsumed(1, 9);
  m.view.Leave(1);  // once: the first mark stays
  uint64_t done = 0;
  EXPECT_TRUE(m.view.Left(1, &done));
  EXPECT_EQ(done, 7u);
  EXPECT_NE(m.view.bell().Snapshot(), before);
  EXPECT_FALSE(m.view.Left(0));
  EXPECT_FALSE(m.view.has_failed());  // leaving is not a failure
}

// Two processes (fork, an anonymous shared mapping): each publishes 2000 ops
// and reads the other's, reusing 4 frames, waiting on the bell.
TEST(Arena, TwoProcessesExchangeThousandsOfOpsThroughFourFrames) {
  Mapped m = Make({2, 4, 64});
  constexpr uint64_t kOps = 2000;
  auto run = [&](int me) -> bool {
    ArenaView a = m.view;
    const int other = 1 - me;
    for (uint64_t k = 1; k <= kOps; ++k) {
      while (!a.FrameFree(k)) {
        const uint32_t snap = a.bell().Snapshot();
        if (a.FrameFree(k)) break;
        a.bell().Wait(snap, absl::Milliseconds(10));
      }
      const uint64_t mine = k * 10 + me;
      if (!a.Publish(me, k, "sig", &mine, sizeof(mine)).ok()) return false;
      const absl::Time deadline = absl::Now() + absl::Seconds(20);
      while (!a.Published(other, k)) {
        const uint32_t snap = a.bell().Snapshot();
        if (a.Published(other, k)) break;
        if (absl::Now() > deadline) return false;
        a.bell().Wait(snap, absl::Milliseconds(10));
      }
      auto f = a.Read(other, k);
      if (!f.ok() || f->data_len != sizeof(uint64_t)) return false;
      uint64_t theirs;
      std::memcpy(&theirs, f->data, sizeof(theirs));
      if (theirs != k * 10 + other) return false;
      a.SetConsumed(me, k);
      a.bell().Ring();  // a writer may wait for this frame
    }
    return true;
  };
  const pid_t pid = fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) _exit(run(1) ? 0 : 1);
  EXPECT_TRUE(run(0));
  int status = 0;
  ASSERT_EQ(waitpid(pid, &status, 0), pid);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0);
}

}  // namespace
}  // namespace ipc
}  // namespace gradsync
