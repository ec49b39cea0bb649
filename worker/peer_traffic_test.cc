// PeerTraffic over two in-process contexts (which count the bytes they move)
// with a recording observer.
#include "worker/peer_traffic.h"

#include <string>
#include <vector>

#include "collective/test_cluster.h"
#include "gtest/gtest.h"

namespace gradsync {
namespace {

struct Recorder : DaemonObserver {
  struct Bytes {
    std::string peer, transport;
    uint64_t sent, received;
  };
  void OnPeerBytes(const std::string& peer, const std::string& transport, uint64_t sent,
                   uint64_t received) override {
    bytes.push_back({peer, transport, sent, received});
  }
  void OnPeerBandwidth(const std::string& peer, const std::string& transport,
                       double bytes_per_second) override {
    bandwidth.push_back({peer, bytes_per_second});
    (void)transport;
  }
  std::vector<Bytes> bytes;
  std::vector<std::pair<std::string, double>> bandwidth;
};

JobPlacement TwoDaemons(int node) {
  JobPlacement p;
  p.world = 2;
  p.node_index = node;
  p.node_of_rank = {0, 1};
  p.ranks_of_node = {{0}, {1}};
  p.node_names = {"a:1", "b:1"};
  return p;
}

// Moves `bytes` from context 0 to context 1.
void Send(testing::Cluster& c, size_t bytes, uint64_t seq) {
  std::vector<char> out(bytes, 'x'), in(bytes);
  const std::vector<absl::Status> st = testing::RunOnRanks(2, [&](int rank) -> absl::Status {
    transport::Context& ctx = *c.contexts[rank];
    std::vector<char>& mem = rank == 0 ? out : in;
    auto mr = ctx.RegisterMemory(mem.data(), mem.size());
    if (!mr.ok()) return mr.status();
    transport::MessageTag tag;
    tag.op_seq = seq;
    transport::Request req;
    absl::Status s = rank == 0 ? ctx.PostSend(1, **mr, 0, bytes, tag, &req)
                               : ctx.PostRecv(0, **mr, 0, bytes, /*exact=*/true, tag, &req);
    while (s.ok() && !req.done) s = ctx.Progress(absl::Now() + absl::Seconds(20));
    return s;
  });
  ASSERT_TRUE(st[0].ok()) << st[0];
  ASSERT_TRUE(st[1].ok()) << st[1];
}

TEST(PeerTraffic, ALargeOpReportsItsBytesAndBandwidthAtOnce) {
  testing::Cluster c = testing::MakeCluster(2, "traffic", testing::DeviceKind::kInProc);
  const JobPlacement p0 = TwoDaemons(0), p1 = TwoDaemons(1);
  Recorder r0, r1;
  PeerTraffic t0(p0, "inproc", c.contexts[0].get(), &r0);
  PeerTraffic t1(p1, "inproc", c.contexts[1].get(), &r1);
  constexpr size_t kBytes = 2 << 20;
  Send(c, kBytes, 1);
  const absl::Time now = absl::Now();
  t0.Account(kBytes, absl::Seconds(2), now);
  t1.Account(kBytes, absl::Seconds(2), now);
  ASSERT_EQ(r0.bytes.size(), 1u);
  EXPECT_EQ(r0.bytes[0].peer, "b:1");
  EXPECT_EQ(r0.bytes[0].transport, "inproc");
  EXPECT_GE(r0.bytes[0].sent, kBytes);  // the payload (and any framing)
  ASSERT_EQ(r0.bandwidth.size(), 1u);
  EXPECT_EQ(r0.bandwidth[0].first, "b:1");
  EXPECT_DOUBLE_EQ(r0.bandwidth[0].second, r0.bytes[0].sent / 2.0);
  ASSERT_EQ(r1.bytes.size(), 1u);
  EXPECT_EQ(r1.bytes[0].peer, "a:1");
  EXPECT_EQ(r1.bytes[0].received, r0.bytes[0].sent);
  EXPECT_TRUE(r1.bandwidth.empty());  // it sent nothing
  // Nothing moved since: nothing to report.
  t0.Flush(absl::Seconds(1), now + absl::Seconds(1));
  EXPECT_EQ(r0.bytes.size(), 1u);
}

TEST(PeerTraffic, SmallOpsWithinAPeriodAreReportedTogetherBeforeSleeping) {
  testing::Cluster c = testing::MakeCluster(2, "traffic", testing::DeviceKind::kInProc);
  const JobPlacement p0 = TwoDaemons(0);
  Recorder r0;
  PeerTraffic t0(p0, "inproc", c.contexts[0].get(), &r0);
  const absl::Time t = absl::Now();
  Send(c, 100, 1);
  t0.Account(100, absl::Milliseconds(1), t);  // the first op flushes (the period starts)
  ASSERT_EQ(r0.bytes.size(), 1u);
  const uint64_t first = r0.bytes[0].sent;
  EXPECT_GE(first, 100u);
  Send(c, 200, 2);
  t0.Account(200, absl::Milliseconds(1), t + absl::Milliseconds(10));
  Send(c, 300, 3);
  t0.Account(300, absl::Milliseconds(1), t + absl::Milliseconds(20));
  EXPECT_EQ(r0.bytes.size(), 1u);  // within the period: held back
  EXPECT_TRUE(t0.dirty());
  t0.FlushIfDirty(t + absl::Milliseconds(30));
  ASSERT_EQ(r0.bytes.size(), 2u);
  EXPECT_GE(r0.bytes[1].sent, 500u);
  EXPECT_TRUE(r0.bandwidth.empty());  // under 1 MiB
  EXPECT_FALSE(t0.dirty());
  t0.FlushIfDirty(t + absl::Milliseconds(40));
  EXPECT_EQ(r0.bytes.size(), 2u);
  // After the period an op flushes by itself.
  Send(c, 100, 4);
  t0.Account(100, absl::Milliseconds(1), t + absl::Milliseconds(200));
  EXPECT_EQ(r0.bytes.size(), 3u);
}

TEST(PeerTraffic, WithoutAnObserverOrANodeContextNothingIsReported) {
  const JobPlacement p0 = TwoDaemons(0);
  Recorder r;
  PeerTraffic no_ctx(p0, "local", nullptr, &r);
  no_ctx.Account(4 << 20, absl::Seconds(1), absl::Now());
  no_ctx.FlushIfDirty(absl::Now());
  EXPECT_TRUE(r.bytes.empty());
  testing::Cluster c = testing::MakeCluster(2, "traffic", testing::DeviceKind::kInProc);
  PeerTraffic no_observer(p0, "inproc", c.contexts[0].get(), nullptr);
  Send(c, 100, 1);
  no_observer.Account(100, absl::Seconds(1), absl::Now());  // must not crash
  EXPECT_FALSE(no_observer.dirty());
}

}  // namespace
}  // namespace gradsync
