// Point-to-point ops (worker/point_to_point.h) between real daemons in one
// process (worker/daemon_testing.h): four ranks, two on each of two daemons,
// so every case runs both between ranks of one daemon (a memcpy) and across
// daemons (the epoch's point-to-point TCP connections). Results are checked
// byte for byte; errors by their words. No sleeps.
#include <atomic>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "absl/strings/str_cat.h"
#include "worker/daemon_testing.h"

namespace gradsync {
namespace {

using ::testing::HasSubstr;
using testing_daemon::Allreduce;
using testing_daemon::DaemonTest;
using testing_daemon::MappedBuffer;
using testing_daemon::RunToEnd;

OpDesc P2p(CollectiveKind kind, const MappedBuffer& buf, uint64_t count, int peer, int32_t tag,
           DType dtype = DType::kF32, absl::Duration timeout = absl::ZeroDuration()) {
  OpDesc op;
  op.kind = kind;
  op.dtype = dtype;
  op.count = count;
  op.buffer_id = buf.id();
  op.root = peer;
  op.tag = tag;
  op.name = "act";
  op.timeout = timeout;
  return op;
}

// Counts what the daemons' metrics hear: every op queued must be reported done.
class CountingObserver : public DaemonObserver {
 public:
  void OnOpQueued() override { ++queued; }
  void OnOpDone(const OpRecord& op) override {
    ++done;
    if (IsPointToPoint(op.kind) && op.code == absl::StatusCode::kOk) ++p2p_ok;
  }
  std::atomic<int> queued{0}, done{0}, p2p_ok{0};
};

class PointToPointTest : public DaemonTest {
 protected:
  void SetUp() override {
    DaemonTest::SetUp();
    a_ = StartDaemon("node-a", absl::Minutes(2), &observer_);
    b_ = StartDaemon("node-b", absl::Minutes(2), &observer_);
    ASSERT_NE(a_, nullptr);
    ASSERT_NE(b_, nullptr);
    // Ranks 0 and 1 on node-a, 2 and 3 on node-b.
    s_ = OpenJob({a_.get(), a_.get(), b_.get(), b_.get()}, "pp");
    ASSERT_EQ(s_.size(), 4u);
  }

  std::unique_ptr<MappedBuffer> Buffer(int rank, size_t bytes) {
    auto buf = MappedBuffer::Allocate(*s_[rank], bytes);
    EXPECT_TRUE(buf.ok()) << buf.status();
    return buf.ok() ? std::move(*buf) : nullptr;
  }

  uint64_t Submit(int rank, const OpDesc& op) {
    auto id = s_[rank]->Submit(op);
    EXPECT_TRUE(id.ok()) << "rank " << rank << ": " << id.status();
    return id.ok() ? *id : 0;
  }

  // The op's outcome (done, or a test failure).
  OpOutcome Outcome(int rank, uint64_t id) {
    absl::StatusOr<OpOutcome> out = s_[rank]->Wait(id, absl::Seconds(20));
    EXPECT_TRUE(out.ok()) << out.status();
    if (!out.ok()) return OpOutcome{};
    EXPECT_TRUE(out->done) << "rank " << rank << " op " << id << " still running";
    return *out;
  }

  // A bit-exact allreduce of every rank: the epoch is still usable.
  void ExpectAllreduceWorks() {
    std::vector<std::unique_ptr<MappedBuffer>> bufs;
    std::vector<uint64_t> ids;
    for (int r = 0; r < 4; ++r) {
      bufs.push_back(Buffer(r, 16 * sizeof(float)));
      for (int k = 0; k < 16; ++k) bufs[r]->as<float>()[k] = static_cast<float>(r * 100 + k);
    }
    for (int r = 0; r < 4; ++r) ids.push_back(Submit(r, Allreduce(*bufs[r], 16, "after")));
    for (int r = 0; r < 4; ++r) {
      EXPECT_TRUE(RunToEnd(*s_[r], ids[r], absl::Seconds(20)).ok()) << "rank " << r;
      for (int k = 0; k < 16; ++k) {
        ASSERT_EQ(bufs[r]->as<float>()[k], static_cast<float>(600 + 4 * k)) << "rank " << r;
      }
    }
  }

  CountingObserver observer_;  // outlives the daemons (declared first)
  std::unique_ptr<Daemon> a_, b_;
  std::vector<std::shared_ptr<Session>> s_;
};

void Fill(MappedBuffer& buf, uint64_t count, int seed) {
  for (uint64_t k = 0; k < count; ++k) {
    buf.as<float>()[k] = static_cast<float>(seed) * 1000.0f + 0.5f * static_cast<float>(k % 4093);
  }
}

bool Holds(const MappedBuffer& buf, uint64_t count, int seed) {
  for (uint64_t k = 0; k < count; ++k) {
    if (buf.as<float>()[k] != static_cast<float>(seed) * 1000.0f + 0.5f * static_cast<float>(k % 4093)) {
      return false;
    }
  }
  return true;
}

TEST_F(PointToPointTest, MessagesArriveBitExactWithinAndAcrossDaemonsPostedInEitherOrder) {
  constexpr uint64_t kCount = 4099;
  // (from, to): within node-a, node-a to node-b, node-b to node-a, within node-b.
  const std::vector<std::pair<int, int>> pairs = {{1, 0}, {0, 2}, {3, 1}, {2, 3}};
  for (bool recv_first : {true, false}) {
    for (const auto& [from, to] : pairs) {
      SCOPED_TRACE(absl::StrCat(from, " -> ", to, recv_first ? ", recv first" : ", send first"));
      auto out = Buffer(from, kCount * sizeof(float));
      auto in = Buffer(to, kCount * sizeof(float));
      Fill(*out, kCount, from + 1);
      uint64_t recv = 0, send = 0;
      if (recv_first) recv = Submit(to, P2p(CollectiveKind::kRecv, *in, kCount, from, 7));
      send = Submit(from, P2p(CollectiveKind::kSend, *out, kCount, to, 7));
      if (!recv_first) recv = Submit(to, P2p(CollectiveKind::kRecv, *in, kCount, from, 7));
      const OpOutcome r = Outcome(to, recv), s = Outcome(from, send);
      ASSERT_TRUE(r.status.ok()) << r.status;
      ASSERT_TRUE(s.status.ok()) << s.status;
      EXPECT_EQ(r.source, from);
      EXPECT_EQ(s.source, to);
      EXPECT_TRUE(Holds(*in, kCount, from + 1));
    }
  }
  ExpectAllreduceWorks();
  // The metrics hear of every op (after its client may have): 16 sends and
  // recvs, 4 allreduces, as many as were queued.
  EXPECT_TRUE(testing_daemon::Eventually([&] { return observer_.done.load() == 20; }))
      << observer_.done.load();
  EXPECT_EQ(observer_.p2p_ok.load(), 16);
  EXPECT_EQ(observer_.queued.load(), 20);
}

TEST_F(PointToPointTest, OneTagKeepsSendOrderAndTagsAndAnySourceMatchAsTorchSays) {
  constexpr uint64_t kCount = 257;
  // Rank 0 sends three messages with tag 1 and one with tag 2 to rank 3
  // (across) before rank 3 posts anything; rank 3 takes tag 2 first.
  std::vector<std::unique_ptr<MappedBuffer>> outs, ins;
  std::vector<uint64_t> sends;
  for (int m = 0; m < 4; ++m) {
    outs.push_back(Buffer(0, kCount * sizeof(float)));
    Fill(*outs[m], kCount, 10 + m);
    sends.push_back(Submit(0, P2p(CollectiveKind::kSend, *outs[m], kCount, 3, m == 3 ? 2 : 1)));
  }
  for (int m = 0; m < 4; ++m) ins.push_back(Buffer(3, kCount * sizeof(float)));
  const uint64_t t2 = Submit(3, P2p(CollectiveKind::kRecv, *ins[3], kCount, 0, 2));
  ASSERT_TRUE(Outcome(3, t2).status.ok());
  EXPECT_TRUE(Holds(*ins[3], kCount, 13));
  for (int m = 0; m < 3; ++m) {
    const uint64_t id = Submit(3, P2p(CollectiveKind::kRecv, *ins[m], kCount, 0, 1));
    ASSERT_TRUE(Outcome(3, id).status.ok());
    EXPECT_TRUE(Holds(*ins[m], kCount, 10 + m)) << "message " << m << " out of order";
  }
  for (uint64_t id : sends) EXPECT_TRUE(Outcome(0, id).status.ok());

  // A recv from any source at rank 1 takes rank 3's message (across), then
  // rank 0's (within); each names its sender.
  auto any = Buffer(1, kCount * sizeof(float));
  auto from3 = Buffer(3, kCount * sizeof(float));
  Fill(*from3, kCount, 33);
  const uint64_t r1 = Submit(1, P2p(CollectiveKind::kRecv, *any, kCount, -1, 5));
  const uint64_t s3 = Submit(3, P2p(CollectiveKind::kSend, *from3, kCount, 1, 5));
  const OpOutcome got = Outcome(1, r1);
  ASSERT_TRUE(got.status.ok()) << got.status;
  EXPECT_EQ(got.source, 3);
  EXPECT_TRUE(Holds(*any, kCount, 33));
  EXPECT_TRUE(Outcome(3, s3).status.ok());
  auto from0 = Buffer(0, kCount * sizeof(float));
  Fill(*from0, kCount, 44);
  const uint64_t s0 = Submit(0, P2p(CollectiveKind::kSend, *from0, kCount, 1, 5));
  const uint64_t r2 = Submit(1, P2p(CollectiveKind::kRecv, *any, kCount, -1, 5));
  const OpOutcome got2 = Outcome(1, r2);
  ASSERT_TRUE(got2.status.ok()) << got2.status;
  EXPECT_EQ(got2.source, 0);
  EXPECT_TRUE(Holds(*any, kCount, 44));
  EXPECT_TRUE(Outcome(0, s0).status.ok());
}

TEST_F(PointToPointTest, AMessageLargerThanOneFrameArrivesWhole) {
  // 80 MiB: two frames of the 64 MiB limit, across daemons, into a posted
  // recv, and sent before its recv is posted.
  constexpr uint64_t kCount = (uint64_t{80} << 20) / sizeof(float);
  auto out = Buffer(1, kCount * sizeof(float));
  auto in = Buffer(2, kCount * sizeof(float));
  Fill(*out, kCount, 5);
  const uint64_t r = Submit(2, P2p(CollectiveKind::kRecv, *in, kCount, 1, 0));
  const uint64_t s = Submit(1, P2p(CollectiveKind::kSend, *out, kCount, 2, 0));
  ASSERT_TRUE(Outcome(2, r).status.ok());
  ASSERT_TRUE(Outcome(1, s).status.ok());
  EXPECT_TRUE(Holds(*in, kCount, 5));
  std::memset(in->as<float>(), 0, kCount * sizeof(float));
  Fill(*out, kCount, 6);
  const uint64_t s2 = Submit(1, P2p(CollectiveKind::kSend, *out, kCount, 2, 0));
  // More than the receiving daemon holds for recvs to come (64 MiB): it
  // waits in the socket until the recv is posted, then lands in it.
  EXPECT_FALSE(s_[1]->Wait(s2, absl::Milliseconds(200))->done);
  const uint64_t r2 = Submit(2, P2p(CollectiveKind::kRecv, *in, kCount, 1, 0));
  ASSERT_TRUE(Outcome(2, r2).status.ok());
  ASSERT_TRUE(Outcome(1, s2).status.ok());
  EXPECT_TRUE(Holds(*in, kCount, 6));
}

TEST_F(PointToPointTest, AMessageOfAnotherSizeFailsTheRecvNamingBothAndTheJobGoesOn) {
  for (const auto& [from, to] : std::vector<std::pair<int, int>>{{0, 1}, {0, 3}}) {
    SCOPED_TRACE(absl::StrCat(from, " -> ", to));
    auto out = Buffer(from, 64 * sizeof(float));
    auto in = Buffer(to, 64 * sizeof(float));
    const uint64_t r = Submit(to, P2p(CollectiveKind::kRecv, *in, 32, from, 4));
    const uint64_t s = Submit(from, P2p(CollectiveKind::kSend, *out, 64, to, 4));
    const OpOutcome got = Outcome(to, r);
    EXPECT_EQ(got.status.code(), absl::StatusCode::kInvalidArgument);
    EXPECT_EQ(got.status.message(),
              absl::StrCat("recv 'act' f32[32] from rank ", from, " tag 4 on rank ", to,
                           ": the message from rank ", from,
                           " with tag 4 has 256 bytes (f32[64]); this recv's tensor has 128 bytes "
                           "(f32[32]) (send and recv must agree on dtype and size)"));
    const OpOutcome sent = Outcome(from, s);
    if (to == 1) {  // the sender here learns it too
      EXPECT_EQ(sent.status.code(), absl::StatusCode::kInvalidArgument);
      EXPECT_THAT(std::string(sent.status.message()),
                  HasSubstr("rank 1's matching recv (recv 'act' f32[32] from rank 0 tag 4) has "
                            "128 bytes (f32[32]); this message has 256 bytes (f32[64])"));
    } else {  // across daemons the message left: the send is done
      EXPECT_TRUE(sent.status.ok()) << sent.status;
    }
    EXPECT_TRUE(s_[to]->health().ok());
  }
  ExpectAllreduceWorks();
}

TEST_F(PointToPointTest, ARecvNothingMatchesFailsAtItsDeadlineAloneNamingThePeer) {
  auto in = Buffer(2, 64);
  const uint64_t r = Submit(2, P2p(CollectiveKind::kRecv, *in, 16, 0, 9, DType::kF32,
                                   absl::Milliseconds(300)));
  const OpOutcome got = Outcome(2, r);
  EXPECT_EQ(got.status.code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_EQ(got.status.message(),
            "recv 'act' f32[16] from rank 0 tag 9 on rank 2: no matching send from rank 0 with "
            "tag 9 arrived by the op's deadline");
  // A send within node-b nobody receives.
  auto out = Buffer(3, 64);
  const uint64_t s = Submit(3, P2p(CollectiveKind::kSend, *out, 16, 2, 9, DType::kF32,
                                   absl::Milliseconds(300)));
  const OpOutcome sent = Outcome(3, s);
  EXPECT_EQ(sent.status.code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_EQ(sent.status.message(),
            "send 'act' f32[16] to rank 2 tag 9 on rank 3: rank 2 posted no matching recv (from "
            "rank 3, tag 9) by the op's deadline");
  EXPECT_TRUE(s_[2]->health().ok());
  ExpectAllreduceWorks();
}

TEST_F(PointToPointTest, BadPeersAreRefusedAtSubmissionNamingTheOpAndRank) {
  auto buf = Buffer(1, 64);
  auto refused = s_[1]->Submit(P2p(CollectiveKind::kSend, *buf, 4, 4, 0));
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(refused.status().message(),
            "send 'act' on rank 1: peer rank 4 is not in the group of world size 4 (expected 0..3)");
  refused = s_[1]->Submit(P2p(CollectiveKind::kRecv, *buf, 4, 1, 0));
  EXPECT_EQ(refused.status().message(), "recv 'act' on rank 1: peer rank 1 is this rank itself");
  refused = s_[1]->Submit(P2p(CollectiveKind::kSend, *buf, 4, -1, 0));
  EXPECT_EQ(refused.status().message(),
            "send 'act' on rank 1: peer rank -1 is not in the group of world size 4 (expected 0..3)");
}

TEST_F(PointToPointTest, ClosingASessionFailsItsPendingRecvAndASendWaitingForIt) {
  auto in = Buffer(0, 64);
  const uint64_t r = Submit(0, P2p(CollectiveKind::kRecv, *in, 16, 2, 0));
  auto out = Buffer(1, 64);
  const uint64_t s = Submit(1, P2p(CollectiveKind::kSend, *out, 16, 0, 3));  // no recv for tag 3
  s_[0]->Close();
  const OpOutcome sent = Outcome(1, s);
  EXPECT_FALSE(sent.status.ok());
  EXPECT_THAT(std::string(sent.status.message()),
              HasSubstr("send 'act' f32[16] to rank 0 tag 3 on rank 1: "));
  absl::StatusOr<OpOutcome> gone = s_[0]->Wait(r, absl::Seconds(5));
  ASSERT_TRUE(gone.ok()) << gone.status();
  EXPECT_TRUE(gone->done);
  EXPECT_EQ(gone->status.code(), absl::StatusCode::kCancelled);
  EXPECT_THAT(std::string(gone->status.message()),
              HasSubstr("recv 'act' f32[16] from rank 2 tag 0 on rank 0: rank 0 closed its session"));
}

TEST_F(PointToPointTest, ARecvFromADaemonWhoseRanksAllLeftFailsAtOnceNamingWhy) {
  auto in = Buffer(0, 64);
  const uint64_t r = Submit(0, P2p(CollectiveKind::kRecv, *in, 16, 2, 0));  // op deadline: 60 s
  // Both of node-b's ranks leave: its executor stops and tells the others.
  for (int rank : {2, 3}) {
    ASSERT_TRUE(b_->CloseSession(s_[rank]->info().session_id).ok());
    s_[rank].reset();
  }
  absl::StatusOr<OpOutcome> out = s_[0]->Wait(r, absl::Seconds(10));
  ASSERT_TRUE(out.ok()) << out.status();
  ASSERT_TRUE(out->done) << "still waiting 10 s after rank 2's daemon stopped";
  EXPECT_FALSE(out->status.ok());
  EXPECT_THAT(std::string(out->status.message()),
              HasSubstr("recv 'act' f32[16] from rank 2 tag 0 on rank 0: "));
  EXPECT_THAT(std::string(out->status.message()),
              HasSubstr(absl::StrCat("aborted by daemon 1 (127.0.0.1:", b_->data_port(), ")")));
}

}  // namespace
}  // namespace gradsync
