// TcpContext against a hand-driven peer socket: handshake, tagged frames,
// and every kind of bad input a peer can send.
#include "transport/tcp_context.h"

#include <linux/sockios.h>
#include <poll.h>
#include <sched.h>
#include <sys/ioctl.h>
#include <sys/syscall.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <thread>

#include "common/thread_testing.h"
#include "gtest/gtest.h"
#include "transport/handshake_testing.h"
#include "transport/tcp_listener.h"
#include "transport/wire.h"

namespace gradsync::transport {
namespace {

// Rank 1 is a real TcpContext; rank 0 is a raw socket the test drives.
struct Pair {
  std::unique_ptr<TcpListener> listener;
  std::unique_ptr<TcpContext> ctx;
  UniqueFd raw;
};

Pair Connect(const std::string& job = "job-x", uint64_t epoch = 7) {
  Pair p;
  ListenerOptions lo;
  lo.listen = {"127.0.0.1", 0};
  auto l = TcpListener::Start(lo);
  EXPECT_TRUE(l.ok()) << l.status();
  p.listener = std::move(*l);
  const absl::Time deadline = absl::Now() + absl::Seconds(10);
  auto fd = TcpConnect({"127.0.0.1", p.listener->port()}, deadline);
  EXPECT_TRUE(fd.ok());
  const std::string nonce = testing::SendHelloAndNonce(fd->get(), job, epoch, 0, 1, 2, deadline);
  // The raw peer proves the (empty) key while the context accepts it.
  std::thread peer([&] {
    EXPECT_TRUE(
        testing::FinishConnector(fd->get(), job, epoch, 0, 1, 2, nonce, "", "", deadline).ok());
  });
  TcpContextOptions o;
  o.job_id = job;
  o.epoch = epoch;
  o.rank = 1;
  o.world_size = 2;
  o.peers = {{"127.0.0.1", 1}, {"127.0.0.1", p.listener->port()}};
  o.deadline = deadline;
  auto ctx = TcpContext::Connect(o, p.listener.get());
  peer.join();
  EXPECT_TRUE(ctx.ok()) << ctx.status();
  p.ctx = std::move(*ctx);
  p.raw = std::move(*fd);
  return p;
}

FrameHeader Header(uint64_t seq, uint32_t slot, uint64_t offset, uint32_t len,
                   const std::string& job = "job-x", uint64_t epoch = 7) {
  FrameHeader h;
  h.magic = kFrameMagic;
  h.version = kWireVersion;
  h.type = static_cast<uint8_t>(FrameType::kData);
  h.dtype = 1;
  h.length = len;
  h.slot = slot;
  h.job_tag = JobTag(job);
  h.epoch = epoch;
  h.op_seq = seq;
  h.offset = offset;
  return h;
}

// Posts a receive of 16 bytes (op 3, slot 0, offset 0) and drives progress.
absl::Status ReceiveOne(Pair& p, std::vector<char>* buf) {
  buf->assign(16, 0);
  auto mr = p.ctx->RegisterMemory(buf->data(), buf->size());
  Request req;
  absl::Status s = p.ctx->PostRecv(0, **mr, 0, 16, true, MessageTag{3, 0, 1, 0}, &req);
  if (!s.ok()) return s;
  while (!req.done) {
    s = p.ctx->Progress(absl::Now() + absl::Seconds(5));
    if (!s.ok()) return s;
  }
  return absl::OkStatus();
}

void Send(Pair& p, const void* data, size_t n) {
  ASSERT_TRUE(WriteFull(p.raw.get(), data, n, absl::Now() + absl::Seconds(5)).ok());
}

TEST(TcpContext, ReceivesAWellFormedFrameStraightIntoPlace) {
  Pair p = Connect();
  FrameHeader h = Header(3, 0, 0, 16);
  Send(p, &h, sizeof(h));
  Send(p, "0123456789abcdef", 16);
  std::vector<char> buf;
  ASSERT_TRUE(ReceiveOne(p, &buf).ok());
  EXPECT_EQ(std::string(buf.data(), 16), "0123456789abcdef");
}

// Many frames in one write land in one recv() (the staging buffer): each is
// matched to its own receive, including receives posted only after the bytes
// arrived, a large payload read straight into place after a staged header,
// and an empty frame.
TEST(TcpContext, FramesArrivingTogetherAreSplitOntoTheirReceives) {
  Pair p = Connect();
  std::string wire;
  auto add = [&](uint32_t slot, const std::string& payload) {
    FrameHeader h = Header(3, slot, 0, static_cast<uint32_t>(payload.size()));
    wire.append(reinterpret_cast<const char*>(&h), sizeof(h));
    wire += payload;
  };
  std::vector<std::string> payloads;
  for (uint32_t i = 0; i < 40; ++i) payloads.push_back(std::string(i % 7 + 1, static_cast<char>('a' + i % 26)));
  payloads.push_back(std::string());                        // empty
  payloads.push_back(std::string(200 << 10, 'L'));          // larger than the stage
  payloads.back()[12345] = 'x';
  payloads.push_back("tail");
  size_t before_large = 0;  // the bytes up to and including the large frame's header
  for (uint32_t i = 0; i < payloads.size(); ++i) {
    if (payloads[i].size() == (200u << 10)) before_large = wire.size() + sizeof(FrameHeader);
    add(i, payloads[i]);
  }
  Send(p, wire.data(), wire.size());  // before any receive is posted
  // The small frames and the large one's header are in the context's socket
  // before a receive is posted: the raw end's send queue (unsent +
  // unacknowledged; on loopback acknowledged means queued at the receiver)
  // holds no more than the rest. (The receiver's buffer need not hold the
  // whole large payload.)
  int unacked = -1;
  auto arrived = [&] {
    return ::ioctl(p.raw.get(), SIOCOUTQ, &unacked) == 0 && unacked >= 0 &&
           wire.size() - static_cast<size_t>(unacked) >= before_large;
  };
  const absl::Time arrive_by = absl::Now() + absl::Seconds(20);
  while (!arrived() && absl::Now() < arrive_by) absl::SleepFor(absl::Milliseconds(1));
  ASSERT_TRUE(arrived()) << "only " << wire.size() - unacked << " of the first " << before_large
                         << " bytes reached the context's socket";
  std::vector<std::vector<char>> bufs(payloads.size());
  std::vector<Request> reqs(payloads.size());
  std::vector<std::unique_ptr<MemoryRegion>> mrs;
  for (uint32_t i = 0; i < payloads.size(); ++i) {
    bufs[i].assign(payloads[i].size() + 1, '#');
    auto mr = p.ctx->RegisterMemory(bufs[i].data(), bufs[i].size());
    ASSERT_TRUE(mr.ok());
    mrs.push_back(std::move(*mr));
    // Half the receives exist before progress starts, the rest one at a time.
    if (i < payloads.size() / 2) {
      ASSERT_TRUE(p.ctx->PostRecv(0, *mrs[i], 0, payloads[i].size(), true,
                                  MessageTag{3, i, 1, 0}, &reqs[i]).ok());
    }
  }
  for (uint32_t i = 0; i < payloads.size(); ++i) {
    if (i >= payloads.size() / 2) {
      ASSERT_TRUE(p.ctx->PostRecv(0, *mrs[i], 0, payloads[i].size(), true,
                                  MessageTag{3, i, 1, 0}, &reqs[i]).ok());
    }
    while (!reqs[i].done) ASSERT_TRUE(p.ctx->Progress(absl::Now() + absl::Seconds(5)).ok());
    EXPECT_EQ(reqs[i].bytes, payloads[i].size()) << "frame " << i;
    EXPECT_EQ(std::string(bufs[i].data(), payloads[i].size()), payloads[i]) << "frame " << i;
    EXPECT_EQ(bufs[i].back(), '#') << "frame " << i << " overran its receive";
  }
  EXPECT_EQ(p.ctx->BytesReceivedFrom(0), wire.size());
}

TEST(TcpContext, GarbageFrameIsAProtocolErrorNamingThePeer) {
  Pair p = Connect();
  std::string junk(64, '\x5a');
  Send(p, junk.data(), junk.size());
  std::vector<char> buf;
  absl::Status s = ReceiveOne(p, &buf);
  EXPECT_TRUE(absl::IsDataLoss(s)) << s;
  EXPECT_NE(s.message().find("protocol error from rank 0: bad frame magic"), std::string::npos) << s;
  // The context stays failed with the first error.
  EXPECT_EQ(p.ctx->health(), s);
}

TEST(TcpContext, FrameOfAnotherOpOrLengthIsRefused) {
  Pair p = Connect();
  FrameHeader h = Header(4, 0, 0, 16);  // op 4 where op 3 is expected
  Send(p, &h, sizeof(h));
  std::vector<char> buf;
  absl::Status s = ReceiveOne(p, &buf);
  EXPECT_TRUE(absl::IsDataLoss(s)) << s;
  EXPECT_NE(s.message().find("expected op 3 slot 0 offset 0 (16 bytes), got"), std::string::npos) << s;
}

TEST(TcpContext, FrameOfAnotherJobOrEpochIsRefused) {
  Pair p = Connect();
  FrameHeader h = Header(3, 0, 0, 16, "job-x", 6);
  Send(p, &h, sizeof(h));
  std::vector<char> buf;
  absl::Status s = ReceiveOne(p, &buf);
  EXPECT_TRUE(absl::IsDataLoss(s)) << s;
  EXPECT_NE(s.message().find("another job or epoch"), std::string::npos) << s;
}

TEST(TcpContext, OversizedFrameIsRefusedBeforeReadingIt) {
  Pair p = Connect();
  FrameHeader h = Header(3, 0, 0, kMaxFrameBytes + 1);
  Send(p, &h, sizeof(h));
  std::vector<char> buf;
  absl::Status s = ReceiveOne(p, &buf);
  EXPECT_TRUE(absl::IsDataLoss(s)) << s;
  EXPECT_NE(s.message().find("frame too long"), std::string::npos) << s;
}

TEST(TcpContext, TruncatedFrameThenCloseIsALostPeer) {
  Pair p = Connect();
  FrameHeader h = Header(3, 0, 0, 16);
  Send(p, &h, sizeof(h));
  Send(p, "01234", 5);
  p.raw.Reset();
  std::vector<char> buf;
  absl::Status s = ReceiveOne(p, &buf);
  EXPECT_TRUE(absl::IsUnavailable(s)) << s;
  EXPECT_NE(s.message().find("connection to rank 0 lost mid-frame"), std::string::npos) << s;
}

TEST(TcpContext, OrderlyCloseOfAnIdlePeerFailsOnlyWhenItIsNeededAgain) {
  Pair p = Connect();
  p.raw.Reset();  // the peer finished and left: FIN at a frame boundary
  // Nothing is expected from it: progress is not an error (just no completion).
  EXPECT_TRUE(absl::IsDeadlineExceeded(p.ctx->Progress(absl::Now() + absl::Milliseconds(100))));
  EXPECT_TRUE(p.ctx->health().ok());
  // Expecting something from it now fails at once, naming it.
  std::vector<char> buf(16);
  auto mr = p.ctx->RegisterMemory(buf.data(), buf.size());
  Request req;
  absl::Status s = p.ctx->PostRecv(0, **mr, 0, 16, true, MessageTag{3, 0, 1, 0}, &req);
  EXPECT_TRUE(absl::IsUnavailable(s)) << s;
  EXPECT_NE(s.message().find("connection to rank 0 lost: closed by peer"), std::string::npos) << s;
}

// A server may answer requests in any order: a message completes the posted
// receive with its tag, wherever that receive is in posting order.
TEST(TcpContext, ReceivesMatchTheirTagInAnyOrder) {
  Pair p = Connect();
  std::vector<char> buf(16, 0);
  auto mr = p.ctx->RegisterMemory(buf.data(), buf.size());
  Request first, second;
  ASSERT_TRUE(p.ctx->PostRecv(0, **mr, 0, 8, true, MessageTag{3, 0, 1, 0}, &first).ok());
  ASSERT_TRUE(p.ctx->PostRecv(0, **mr, 8, 8, true, MessageTag{3, 1, 1, 8}, &second).ok());
  FrameHeader h1 = Header(3, 1, 8, 8);
  Send(p, &h1, sizeof(h1));
  Send(p, "second!!", 8);
  FrameHeader h0 = Header(3, 0, 0, 8);
  Send(p, &h0, sizeof(h0));
  Send(p, "first!!!", 8);
  while (!first.done || !second.done) {
    ASSERT_TRUE(p.ctx->Progress(absl::Now() + absl::Seconds(5)).ok());
  }
  EXPECT_EQ(std::string(buf.data(), 16), "first!!!second!!");
}

TEST(TcpContext, AbortFrameCarriesThePeersReason) {
  Pair p = Connect();
  const std::string why = "rank 0: connection to rank 5 lost";
  FrameHeader h = Header(0, kControlSlot, 0, static_cast<uint32_t>(why.size()));
  h.type = static_cast<uint8_t>(FrameType::kAbort);
  Send(p, &h, sizeof(h));
  Send(p, why.data(), why.size());
  std::vector<char> buf;
  absl::Status s = ReceiveOne(p, &buf);
  EXPECT_TRUE(absl::IsAborted(s)) << s;
  EXPECT_EQ(s.message(), "aborted by rank 0: rank 0: connection to rank 5 lost");
  const PeerFault f = p.ctx->fault();
  EXPECT_EQ(f.kind, PeerFault::kAborted);
  EXPECT_EQ(f.peer, 0);
  EXPECT_EQ(f.cause, why);
}

TEST(TcpContext, AbortFrameCodeAndOpReachTheFault) {
  Pair p = Connect();
  const std::string why = "step 4 does not match";
  FrameHeader h = Header(4, kControlSlot, static_cast<uint64_t>(absl::StatusCode::kInvalidArgument),
                         static_cast<uint32_t>(why.size()));
  h.type = static_cast<uint8_t>(FrameType::kAbort);
  Send(p, &h, sizeof(h));
  Send(p, why.data(), why.size());
  std::vector<char> buf;
  absl::Status s = ReceiveOne(p, &buf);
  EXPECT_TRUE(absl::IsAborted(s)) << s;  // a collective context keeps its own code
  const PeerFault f = p.ctx->fault();
  EXPECT_EQ(f.code, absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(f.op_seq, 4u);
}

TEST(TcpContext, FailTellsThePeerWhy) {
  Pair p = Connect();
  std::vector<char> buf(16);
  auto mr = p.ctx->RegisterMemory(buf.data(), buf.size());
  Request req;
  ASSERT_TRUE(p.ctx->PostRecv(0, **mr, 0, 16, true, MessageTag{9, 0, 1, 0}, &req).ok());
  (void)p.ctx->Fail(absl::DeadlineExceededError("op 9 timed out at rank 1"));
  FrameHeader h;
  ASSERT_TRUE(ReadFull(p.raw.get(), &h, sizeof(h), absl::Now() + absl::Seconds(5)).ok());
  EXPECT_EQ(h.type, static_cast<uint8_t>(FrameType::kAbort));
  EXPECT_EQ(h.op_seq, 9u);  // the op it was posting for
  EXPECT_EQ(h.offset, static_cast<uint64_t>(absl::StatusCode::kDeadlineExceeded));
  std::string msg(h.length, '\0');
  ASSERT_TRUE(ReadFull(p.raw.get(), msg.data(), msg.size(), absl::Now() + absl::Seconds(5)).ok());
  EXPECT_EQ(msg, "op 9 timed out at rank 1");
}

TEST(TcpContext, AbortFromAnotherThreadWakesProgress) {
  Pair p = Connect();
  const pid_t progress_thread = ::gradsync::testing::ThisThreadId();
  std::atomic<bool> receiving{false};
  std::atomic<bool> was_asleep{false};
  std::thread t([&] {
    // Abort once Progress sleeps in poll() (the spin before it is over).
    while (!receiving.load()) absl::SleepFor(absl::Milliseconds(1));
    was_asleep = ::gradsync::testing::WaitUntilAsleepInSyscall(progress_thread, {SYS_poll, SYS_ppoll});
    p.ctx->Abort(absl::AbortedError("coordinator says rank 0 is dead"));
  });
  std::vector<char> buf;
  const absl::Time t0 = absl::Now();
  receiving = true;
  absl::Status s = ReceiveOne(p, &buf);
  t.join();
  EXPECT_TRUE(was_asleep) << "Progress never slept in poll()";
  EXPECT_TRUE(absl::IsAborted(s)) << s;
  EXPECT_LT(absl::Now() - t0, absl::Seconds(2));
}

TEST(TcpContext, ProgressReturnsDeadlineExceededAndStaysUsable) {
  Pair p = Connect();
  std::vector<char> buf(16);
  auto mr = p.ctx->RegisterMemory(buf.data(), buf.size());
  Request req;
  ASSERT_TRUE(p.ctx->PostRecv(0, **mr, 0, 16, true, MessageTag{3, 0, 1, 0}, &req).ok());
  EXPECT_TRUE(absl::IsDeadlineExceeded(p.ctx->Progress(absl::Now() + absl::Milliseconds(50))));
  FrameHeader h = Header(3, 0, 0, 16);
  Send(p, &h, sizeof(h));
  Send(p, "0123456789abcdef", 16);
  while (!req.done) ASSERT_TRUE(p.ctx->Progress(absl::Now() + absl::Seconds(5)).ok());
}

}  // namespace
}  // namespace gradsync::transport

namespace gradsync::transport {
namespace {

TEST(TcpContext, MultipleStreamsPerPeerDeliverEveryMessageInPlace) {
  std::vector<std::unique_ptr<TcpListener>> listeners;
  std::vector<HostPort> addrs;
  for (int r = 0; r < 2; ++r) {
    ListenerOptions lo;
    lo.listen = {"127.0.0.1", 0};
    listeners.push_back(std::move(*TcpListener::Start(lo)));
    addrs.push_back({"127.0.0.1", listeners.back()->port()});
  }
  std::vector<std::unique_ptr<TcpContext>> ctx(2);
  std::vector<std::thread> threads;
  for (int r = 0; r < 2; ++r) {
    threads.emplace_back([&, r] {
      TcpContextOptions o;
      o.job_id = "streams";
      o.epoch = 1;
      o.rank = r;
      o.world_size = 2;
      o.peers = addrs;
      o.streams = 3;
      o.deadline = absl::Now() + absl::Seconds(10);
      auto c = TcpContext::Connect(o, listeners[r].get());
      ASSERT_TRUE(c.ok()) << c.status();
      ctx[r] = std::move(*c);
    });
  }
  for (auto& t : threads) t.join();
  // Rank 0 sends 10 messages of growing size; rank 1 receives each in place.
  const size_t total = 10 * 11 / 2 * 1000;
  std::vector<char> src(total), dst(total, 0);
  for (size_t i = 0; i < total; ++i) src[i] = static_cast<char>(i * 31 + 7);
  auto smr = ctx[0]->RegisterMemory(src.data(), src.size());
  auto dmr = ctx[1]->RegisterMemory(dst.data(), dst.size());
  std::vector<Request> sreq(10), rreq(10);
  size_t off = 0;
  for (uint32_t i = 0; i < 10; ++i) {
    const size_t len = (i + 1) * 1000;
    MessageTag tag{1, i, 1, off};
    ASSERT_TRUE(ctx[1]->PostRecv(0, **dmr, off, len, true, tag, &rreq[i]).ok());
    ASSERT_TRUE(ctx[0]->PostSend(1, **smr, off, len, tag, &sreq[i]).ok());
    off += len;
  }
  std::thread sender([&] {
    auto all = [&] { for (auto& r : sreq) if (!r.done) return false; return true; };
    while (!all()) ASSERT_TRUE(ctx[0]->Progress(absl::Now() + absl::Seconds(5)).ok());
  });
  auto all = [&] { for (auto& r : rreq) if (!r.done) return false; return true; };
  while (!all()) ASSERT_TRUE(ctx[1]->Progress(absl::Now() + absl::Seconds(5)).ok());
  sender.join();
  EXPECT_EQ(src, dst);
}

// Posting is bounded per peer and direction: the receive past the bound is
// refused (ResourceExhausted) and accepted again once one completed.
TEST(TcpContext, PostingIsBoundedPerPeer) {
  Pair p = Connect();
  EXPECT_EQ(p.ctx->max_in_flight(), TcpContextOptions::kDefaultMaxInFlight);
  std::vector<char> buf(16 * (TcpContextOptions::kDefaultMaxInFlight + 1));
  auto mr = p.ctx->RegisterMemory(buf.data(), buf.size());
  ASSERT_TRUE(mr.ok());
  const int bound = p.ctx->max_in_flight();
  std::vector<Request> reqs(bound + 1);
  for (int i = 0; i < bound; ++i) {
    ASSERT_TRUE(p.ctx->PostRecv(0, **mr, 16 * i, 16, true, MessageTag{3, static_cast<uint32_t>(i), 1, 0},
                                &reqs[i]).ok());
  }
  const MessageTag next{3, static_cast<uint32_t>(bound), 1, 0};
  absl::Status s = p.ctx->PostRecv(0, **mr, 16 * bound, 16, true, next, &reqs[bound]);
  EXPECT_TRUE(absl::IsResourceExhausted(s)) << s;
  // The peer sends the first message; once it landed, one more may be posted.
  const FrameHeader h = Header(3, 0, 0, 16);
  const absl::Time deadline = absl::Now() + absl::Seconds(5);
  std::vector<char> payload(16, 7);
  ASSERT_TRUE(WriteFull(p.raw.get(), &h, sizeof(h), deadline).ok());
  ASSERT_TRUE(WriteFull(p.raw.get(), payload.data(), payload.size(), deadline).ok());
  while (!reqs[0].done) ASSERT_TRUE(p.ctx->Progress(deadline).ok());
  EXPECT_TRUE(p.ctx->PostRecv(0, **mr, 16 * bound, 16, true, next, &reqs[bound]).ok());
}

// ---- CheckPeers: what a peer did while this rank posts nothing.

// Calls CheckPeers until `done` holds or it fails (10 s at most); its last
// result.
template <typename Done>
absl::Status CheckPeersUntil(TcpContext& ctx, Done done) {
  const absl::Time deadline = absl::Now() + absl::Seconds(10);
  while (true) {
    absl::Status s = ctx.CheckPeers();
    if (!s.ok() || done()) return s;
    if (absl::Now() >= deadline) return absl::DeadlineExceededError("CheckPeers: condition not met");
    sched_yield();
  }
}

std::string Frame(uint64_t seq, uint32_t slot, uint64_t offset, const std::string& payload) {
  FrameHeader h = Header(seq, slot, offset, static_cast<uint32_t>(payload.size()));
  return std::string(reinterpret_cast<const char*>(&h), sizeof(h)) + payload;
}

std::string AbortFrame(uint64_t seq, absl::StatusCode code, const std::string& why) {
  FrameHeader h = Header(seq, kControlSlot, static_cast<uint64_t>(code),
                         static_cast<uint32_t>(why.size()));
  h.type = static_cast<uint8_t>(FrameType::kAbort);
  return std::string(reinterpret_cast<const char*>(&h), sizeof(h)) + why;
}

// Frames that arrive before their receives are posted (another daemon's
// signature for an op this one has not started) are read by CheckPeers into
// the context's own memory and complete the receives posted later,
// bit-exact: a small one, one larger than the receive stage, an empty one.
TEST(TcpContext, CheckPeersKeepsEarlyDataForTheReceivesPostedLater) {
  Pair p = Connect();
  std::string large(200 << 10, 0);
  for (size_t i = 0; i < large.size(); ++i) large[i] = static_cast<char>(i * 131 + 17);
  const std::string wire =
      Frame(3, 0, 0, "0123456789abcdef") + Frame(3, 1, 16, large) + Frame(3, 2, 0, "");
  std::thread writer([&] { Send(p, wire.data(), wire.size()); });
  // Every byte is read off the socket, and nothing fails.
  absl::Status s = CheckPeersUntil(*p.ctx, [&] { return p.ctx->BytesReceivedFrom(0) == wire.size(); });
  writer.join();
  ASSERT_TRUE(s.ok()) << s;
  EXPECT_TRUE(p.ctx->health().ok());
  EXPECT_EQ(p.ctx->fault().kind, PeerFault::kNone);
  std::vector<char> small(16, 0), big(large.size(), 0), empty(1, 'x');
  auto ms = p.ctx->RegisterMemory(small.data(), small.size());
  auto mb = p.ctx->RegisterMemory(big.data(), big.size());
  auto me = p.ctx->RegisterMemory(empty.data(), empty.size());
  Request r0, r1, r2;
  ASSERT_TRUE(p.ctx->PostRecv(0, **mb, 0, big.size(), true, MessageTag{3, 1, 1, 16}, &r1).ok());
  ASSERT_TRUE(p.ctx->PostRecv(0, **ms, 0, 16, true, MessageTag{3, 0, 1, 0}, &r0).ok());
  ASSERT_TRUE(p.ctx->PostRecv(0, **me, 0, 1, false, MessageTag{3, 2, 1, 0}, &r2).ok());
  const absl::Time deadline = absl::Now() + absl::Seconds(5);
  while (!r0.done || !r1.done || !r2.done) ASSERT_TRUE(p.ctx->Progress(deadline).ok());
  EXPECT_EQ(std::string(small.data(), 16), "0123456789abcdef");
  EXPECT_EQ(r1.bytes, large.size());
  EXPECT_TRUE(std::equal(big.begin(), big.end(), large.begin()));
  EXPECT_EQ(r2.bytes, 0u);
  // The connection goes on as before.
  std::vector<char> buf;
  const std::string next = Frame(3, 0, 0, "after-the-early!");
  Send(p, next.data(), next.size());
  ASSERT_TRUE(ReceiveOne(p, &buf).ok());
  EXPECT_EQ(std::string(buf.data(), 16), "after-the-early!");
}

// A frame read early is still checked against the receive posted for it.
TEST(TcpContext, EarlyDataForAnotherReceiveIsStillAProtocolError) {
  Pair p = Connect();
  const std::string wire = Frame(4, 0, 0, "0123456789abcdef");
  Send(p, wire.data(), wire.size());
  ASSERT_TRUE(
      CheckPeersUntil(*p.ctx, [&] { return p.ctx->BytesReceivedFrom(0) == wire.size(); }).ok());
  std::vector<char> buf;
  absl::Status s = ReceiveOne(p, &buf);  // expects op 3
  EXPECT_TRUE(absl::IsDataLoss(s)) << s;
  EXPECT_NE(s.message().find("protocol error from rank 0: expected op 3"), std::string::npos) << s;
}

// The peer sent its signature for the next op and then an ABORT (it failed
// while waiting for this rank): CheckPeers reads past the data to the ABORT
// and fails the context with the peer's reason and code, and tells it.
TEST(TcpContext, CheckPeersFailsWithAnAbortBehindEarlyData) {
  Pair p = Connect();
  const std::string why = "daemon 0 stopping";
  const std::string wire = Frame(5, kControlSlot, 0, std::string(40, 's')) +
                           AbortFrame(5, absl::StatusCode::kUnavailable, why);
  Send(p, wire.data(), wire.size());
  absl::Status s = CheckPeersUntil(*p.ctx, [] { return false; });
  EXPECT_TRUE(absl::IsAborted(s)) << s;
  EXPECT_EQ(s.message(), "aborted by rank 0: daemon 0 stopping");
  EXPECT_EQ(p.ctx->health(), s);
  const PeerFault f = p.ctx->fault();
  EXPECT_EQ(f.kind, PeerFault::kAborted);
  EXPECT_EQ(f.peer, 0);
  EXPECT_EQ(f.cause, why);
  EXPECT_EQ(f.code, absl::StatusCode::kUnavailable);
  EXPECT_EQ(f.op_seq, 5u);
  // Relayed as Progress relays a fault: the peer hears an ABORT back.
  FrameHeader h;
  ASSERT_TRUE(ReadFull(p.raw.get(), &h, sizeof(h), absl::Now() + absl::Seconds(5)).ok());
  EXPECT_EQ(h.type, static_cast<uint8_t>(FrameType::kAbort));
}

// A peer that closed its connection (its daemon stopped or left) is a lost
// peer to CheckPeers, even at a frame boundary with nothing expected.
TEST(TcpContext, CheckPeersNoticesAClosedPeer) {
  Pair p = Connect();
  EXPECT_TRUE(p.ctx->CheckPeers().ok());  // a quiet peer is fine
  p.raw.Reset();
  absl::Status s = CheckPeersUntil(*p.ctx, [] { return false; });
  EXPECT_TRUE(absl::IsUnavailable(s)) << s;
  EXPECT_NE(s.message().find("rank 1: connection to rank 0 lost: closed by peer"),
            std::string::npos)
      << s;
  const PeerFault f = p.ctx->fault();
  EXPECT_EQ(f.kind, PeerFault::kLost);
  EXPECT_EQ(f.peer, 0);
}

// Abort() from another thread is not CheckPeers' to tell the peers (Progress
// does, for a driver that still runs an op): it returns the error, and the
// peer hears nothing.
TEST(TcpContext, CheckPeersAfterAbortReturnsTheErrorAndTellsNobody) {
  Pair p = Connect();
  p.ctx->Abort(absl::CancelledError("rank 3 closed its session"));
  absl::Status s = p.ctx->CheckPeers();
  EXPECT_TRUE(absl::IsCancelled(s)) << s;
  EXPECT_EQ(p.ctx->fault().kind, PeerFault::kNone);
  pollfd pfd{p.raw.get(), POLLIN, 0};
  EXPECT_EQ(::poll(&pfd, 1, 0), 0);
}

// A frame larger than the early-data bound stays in the socket (parked, as
// without CheckPeers) and still completes its receive.
TEST(TcpContext, EarlyFrameBeyondTheBoundStaysParkedForItsReceive) {
  Pair p = Connect();
  std::string large(TcpContext::kMaxEarlyBytes + 4096, 0);
  for (size_t i = 0; i < large.size(); ++i) large[i] = static_cast<char>(i * 7 + 3);
  const std::string wire = Frame(3, 0, 0, large);
  std::thread writer([&] { Send(p, wire.data(), wire.size()); });
  ASSERT_TRUE(CheckPeersUntil(*p.ctx, [&] { return p.ctx->BytesReceivedFrom(0) > 0; }).ok());
  for (int i = 0; i < 10; ++i) ASSERT_TRUE(p.ctx->CheckPeers().ok());
  std::vector<char> buf(large.size(), 0);
  auto mr = p.ctx->RegisterMemory(buf.data(), buf.size());
  Request req;
  ASSERT_TRUE(p.ctx->PostRecv(0, **mr, 0, buf.size(), true, MessageTag{3, 0, 1, 0}, &req).ok());
  const absl::Time deadline = absl::Now() + absl::Seconds(10);
  while (!req.done) ASSERT_TRUE(p.ctx->Progress(deadline).ok());
  writer.join();
  EXPECT_TRUE(std::equal(buf.begin(), buf.end(), large.begin()));
}

}  // namespace
}  // namespace gradsync::transport
