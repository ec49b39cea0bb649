#include "transport/inproc.h"

#include <sys/syscall.h>

#include <atomic>
#include <cstring>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "common/thread_testing.h"
#include "gtest/gtest.h"

namespace gradsync::transport {
namespace {

std::vector<std::unique_ptr<Context>> Make(int n, InProcFaults faults = {}) {
  InProcDevice device(n, faults);
  std::vector<std::unique_ptr<Context>> out;
  for (int r = 0; r < n; ++r) {
    ContextSpec s;
    s.world_size = n;
    s.rank = r;
    auto c = device.CreateContext(s);
    EXPECT_TRUE(c.ok()) << c.status();
    out.push_back(std::move(*c));
  }
  ContextSpec again;
  again.world_size = n;
  EXPECT_TRUE(absl::IsAlreadyExists(device.CreateContext(again).status()));
  return out;
}

absl::Status Await(Context& ctx, const Request& req) {
  const absl::Time deadline = absl::Now() + absl::Seconds(5);
  while (!req.done) {
    absl::Status s = ctx.Progress(deadline);
    if (!s.ok()) return s;
  }
  return absl::OkStatus();
}

TEST(InProc, MessagesArriveInOrderWithTheirTags) {
  auto ctx = Make(2);
  std::vector<char> a(64), b(64);
  for (int i = 0; i < 64; ++i) a[i] = static_cast<char>(i);
  auto ma = ctx[0]->RegisterMemory(a.data(), a.size());
  auto mb = ctx[1]->RegisterMemory(b.data(), b.size());
  ASSERT_TRUE(ma.ok() && mb.ok());
  Request s1, s2, r1, r2;
  ASSERT_TRUE(ctx[0]->PostSend(1, **ma, 0, 16, MessageTag{1, 0, 0, 0}, &s1).ok());
  ASSERT_TRUE(ctx[0]->PostSend(1, **ma, 16, 32, MessageTag{1, 1, 0, 16}, &s2).ok());
  ASSERT_TRUE(ctx[1]->PostRecv(0, **mb, 0, 16, true, MessageTag{1, 0, 0, 0}, &r1).ok());
  ASSERT_TRUE(ctx[1]->PostRecv(0, **mb, 16, 48, false, MessageTag{1, 1, 0, 16}, &r2).ok());
  ASSERT_TRUE(Await(*ctx[1], r2).ok());
  EXPECT_TRUE(r1.done);
  EXPECT_EQ(r2.bytes, 32u);
  EXPECT_EQ(std::memcmp(a.data(), b.data(), 48), 0);
  EXPECT_EQ(ctx[0]->BytesSentTo(1), 48u);
  EXPECT_EQ(ctx[1]->BytesReceivedFrom(0), 48u);
}

TEST(InProc, AnUnexpectedTagIsAProtocolErrorAndThePeersHearOfIt) {
  auto ctx = Make(3);
  std::vector<char> a(8), b(8);
  auto ma = ctx[0]->RegisterMemory(a.data(), a.size());
  auto mb = ctx[1]->RegisterMemory(b.data(), b.size());
  Request s, r;
  ASSERT_TRUE(ctx[0]->PostSend(1, **ma, 0, 8, MessageTag{2, 0, 0, 0}, &s).ok());
  ASSERT_TRUE(ctx[1]->PostRecv(0, **mb, 0, 8, true, MessageTag{3, 0, 0, 0}, &r).ok());
  absl::Status st = Await(*ctx[1], r);
  EXPECT_TRUE(absl::IsDataLoss(st)) << st;
  EXPECT_EQ(st.message(),
            "rank 1: protocol error from rank 0: message for op 2 slot 0 offset 0 where op 3 "
            "slot 0 offset 0 was expected");
  // Rank 2 was not involved, but its context fails too (as over TCP).
  st = ctx[2]->Progress(absl::Now() + absl::Seconds(1));
  EXPECT_TRUE(absl::IsAborted(st)) << st;
  EXPECT_TRUE(absl::StrContains(st.message(), "aborted by rank 1: rank 1: protocol error")) << st;
}

TEST(InProc, HostMemoryOnly) {
  auto ctx = Make(1);
  char x[4];
  auto mr = ctx[0]->RegisterMemory(x, sizeof(x), MemKind::Cuda(0));
  EXPECT_TRUE(absl::IsFailedPrecondition(mr.status()));
  EXPECT_TRUE(absl::StrContains(mr.status().message(), "cuda:0")) << mr.status();
}

TEST(InProc, AbortFromAnotherThreadWakesProgress) {
  auto ctx = Make(2);
  std::vector<char> b(8);
  auto mb = ctx[1]->RegisterMemory(b.data(), b.size());
  Request r;
  ASSERT_TRUE(ctx[1]->PostRecv(0, **mb, 0, 8, true, MessageTag{1, 0, 0, 0}, &r).ok());
  const pid_t progress_thread = ::gradsync::testing::ThisThreadId();
  std::atomic<bool> progressing{false};
  std::atomic<bool> was_asleep{false};
  std::thread t([&] {
    // Abort once Progress sleeps on its condition variable (a futex).
    while (!progressing.load()) absl::SleepFor(absl::Milliseconds(1));
    was_asleep = ::gradsync::testing::WaitUntilAsleepInSyscall(progress_thread, {SYS_futex});
    ctx[1]->Abort(absl::CancelledError("closing"));
  });
  const absl::Time t0 = absl::Now();
  progressing = true;
  absl::Status st = ctx[1]->Progress(absl::Now() + absl::Seconds(10));
  t.join();
  EXPECT_TRUE(was_asleep) << "Progress never slept";
  EXPECT_TRUE(absl::IsCancelled(st)) << st;
  EXPECT_LT(absl::Now() - t0, absl::Seconds(5));
}

// ---- CheckPeers: what a peer did while this rank posts nothing.

// Messages sent before their receives are posted stay queued: CheckPeers
// reads nothing, and the receives posted later complete bit-exact.
TEST(InProc, CheckPeersLeavesEarlyMessagesForTheReceivesPostedLater) {
  auto ctx = Make(2);
  std::vector<char> a(64), b(64, 0);
  for (int i = 0; i < 64; ++i) a[i] = static_cast<char>(i * 13 + 5);
  auto ma = ctx[0]->RegisterMemory(a.data(), a.size());
  auto mb = ctx[1]->RegisterMemory(b.data(), b.size());
  ASSERT_TRUE(ma.ok() && mb.ok());
  Request s1, s2, r1, r2;
  ASSERT_TRUE(ctx[0]->PostSend(1, **ma, 0, 16, MessageTag{1, kControlSlot, 0, 0}, &s1).ok());
  ASSERT_TRUE(ctx[0]->PostSend(1, **ma, 16, 48, MessageTag{1, 0, 1, 16}, &s2).ok());
  for (int i = 0; i < 3; ++i) EXPECT_TRUE(ctx[1]->CheckPeers().ok());
  EXPECT_EQ(ctx[1]->fault().kind, PeerFault::kNone);
  EXPECT_EQ(ctx[1]->BytesReceivedFrom(0), 0u);
  ASSERT_TRUE(ctx[1]->PostRecv(0, **mb, 0, 16, true, MessageTag{1, kControlSlot, 0, 0}, &r1).ok());
  ASSERT_TRUE(ctx[1]->PostRecv(0, **mb, 16, 48, true, MessageTag{1, 0, 1, 16}, &r2).ok());
  ASSERT_TRUE(Await(*ctx[1], r1).ok());
  ASSERT_TRUE(Await(*ctx[1], r2).ok());
  EXPECT_EQ(a, b);
  EXPECT_TRUE(ctx[1]->health().ok());
}

// A peer that failed (its owner aborted it: an ABORT over TCP) fails this
// context through CheckPeers, with the peer's reason and code in fault(),
// though its message for this rank is still queued.
TEST(InProc, CheckPeersFailsWithAPeersAbortNamingIt) {
  auto ctx = Make(3);
  std::vector<char> a(16, 1);
  auto ma = ctx[0]->RegisterMemory(a.data(), a.size());
  Request sent;
  ASSERT_TRUE(ctx[0]->PostSend(1, **ma, 0, 16, MessageTag{2, kControlSlot, 0, 0}, &sent).ok());
  EXPECT_TRUE(ctx[1]->CheckPeers().ok());
  ctx[0]->Abort(absl::UnavailableError("daemon 0 stopping"));
  absl::Status st = ctx[1]->CheckPeers();
  EXPECT_TRUE(absl::IsAborted(st)) << st;
  EXPECT_EQ(st.message(), "aborted by rank 0: daemon 0 stopping");
  EXPECT_EQ(ctx[1]->health(), st);
  const PeerFault f = ctx[1]->fault();
  EXPECT_EQ(f.kind, PeerFault::kAborted);
  EXPECT_EQ(f.peer, 0);
  EXPECT_EQ(f.code, absl::StatusCode::kUnavailable);
  EXPECT_EQ(f.cause, "daemon 0 stopping");
}

// A lost peer, and a peer whose context is gone (its daemon closed it), are
// noticed by CheckPeers.
TEST(InProc, CheckPeersNoticesALostOrClosedPeer) {
  InProcFaults faults;
  faults.lost_rank = 0;
  faults.lost_after = 0;
  auto ctx = Make(3, faults);
  std::vector<char> a(8);
  auto ma = ctx[0]->RegisterMemory(a.data(), a.size());
  Request sent;
  EXPECT_FALSE(ctx[0]->PostSend(1, **ma, 0, 8, MessageTag{1, 0, 0, 0}, &sent).ok());
  absl::Status st = ctx[1]->CheckPeers();
  EXPECT_TRUE(absl::IsUnavailable(st)) << st;
  EXPECT_EQ(st.message(), "rank 1: connection to rank 0 lost (in-process fault)");
  EXPECT_EQ(ctx[1]->fault().kind, PeerFault::kLost);
  EXPECT_EQ(ctx[1]->fault().peer, 0);

  auto two = Make(2);
  two[0].reset();
  st = two[1]->CheckPeers();
  EXPECT_TRUE(absl::IsAborted(st)) << st;
  EXPECT_EQ(st.message(), "aborted by rank 0: context destroyed");
  EXPECT_EQ(two[1]->fault().peer, 0);
}

}  // namespace
}  // namespace gradsync::transport
