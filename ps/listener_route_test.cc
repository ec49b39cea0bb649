// The optional route of transport::TcpListener: connections whose job id
// starts with a prefix go to a callback; everything else is parked for
// Claim() exactly as without a route.
#include <string>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "gtest/gtest.h"
#include "ps/protocol.h"
#include "ps/ps_testing.h"
#include "ps/shard_handshake.h"
#include "transport/tcp_listener.h"
#include "transport/wire.h"

namespace gradsync::transport {
namespace {

struct Routed {
  absl::Mutex mu;
  std::vector<RoutedConnection> conns;
};

std::unique_ptr<TcpListener> StartRouting(Routed* routed, const std::string& prefix = "ps/") {
  ListenerOptions lo;
  lo.listen = {"127.0.0.1", 0};
  lo.route_prefix = prefix;
  lo.route = [routed](RoutedConnection rc) {
    // The shard's side of the handshake (empty key), under the lock: the
    // test looks once its connect returned.
    const absl::Time deadline = absl::Now() + absl::Seconds(1);
    absl::MutexLock l(&routed->mu);
    absl::StatusOr<std::string> nonce = ps::ReadWorkerNonce(rc, deadline);
    if (nonce.ok() && ps::ProveJobKey(rc, "", *nonce, deadline).ok()) {
      (void)WriteHelloAck(rc.fd.get(), absl::OkStatus(), deadline);  // admitted
    }
    routed->conns.push_back(std::move(rc));
  };
  auto l = TcpListener::Start(lo);
  EXPECT_TRUE(l.ok()) << l.status();
  return std::move(*l);
}

// Sends a hello; returns the socket (the reply is not read).
UniqueFd SendHello(int port, const std::string& job, int src, int dst, int world) {
  const absl::Time deadline = absl::Now() + absl::Seconds(5);
  auto fd = TcpConnect({"127.0.0.1", port}, deadline);
  EXPECT_TRUE(fd.ok()) << fd.status();
  Hello h{kHelloMagic, kWireVersion, static_cast<uint16_t>(job.size()), 1, src, dst, world, 0};
  EXPECT_TRUE(WriteFull(fd->get(), &h, sizeof(h), deadline).ok());
  EXPECT_TRUE(WriteFull(fd->get(), job.data(), job.size(), deadline).ok());
  return std::move(*fd);
}

// Reads the HelloAck: its code, and its message in *msg.
int ReadAck(int fd, std::string* msg) {
  const absl::Time deadline = absl::Now() + absl::Seconds(5);
  HelloAck ack{};
  EXPECT_TRUE(ReadFull(fd, &ack, sizeof(ack), deadline).ok());
  msg->assign(ack.message_len, '\0');
  EXPECT_TRUE(ReadFull(fd, msg->data(), msg->size(), deadline).ok());
  return ack.code;
}

TEST(ListenerRoute, HandsPrefixedJobsToTheCallbackWithShardIndexAsDstRank) {
  Routed routed;
  auto l = StartRouting(&routed);
  // One worker, shard 3: dst_rank is outside the job's world, as PS hellos are.
  auto fd = ps::testing::ConnectToShard({"127.0.0.1", l->port()}, "ps/train", 1, 0, 1, 3,
                               absl::Now() + absl::Seconds(5), 0);
  ASSERT_TRUE(fd.ok()) << fd.status();
  absl::MutexLock lock(&routed.mu);
  ASSERT_EQ(routed.conns.size(), 1u);
  const RoutedConnection& rc = routed.conns[0];
  EXPECT_EQ(rc.job_id, "ps/train");
  EXPECT_EQ(rc.hello.src_rank, 0);
  EXPECT_EQ(rc.hello.dst_rank, 3);
  EXPECT_EQ(rc.hello.world_size, 1);
  EXPECT_EQ(rc.hello.epoch, 1u);
  EXPECT_NE(rc.peer.find("127.0.0.1:"), std::string::npos);
  EXPECT_EQ(l->stats().routed, 1u);
}

TEST(ListenerRoute, OtherJobsAreParkedForClaimAsBefore) {
  Routed routed;
  auto l = StartRouting(&routed);
  UniqueFd a = SendHello(l->port(), "plain", 0, 1, 2);
  auto claimed = l->Claim("plain", 1, 0, 1, 0, absl::Now() + absl::Seconds(5));
  EXPECT_TRUE(claimed.ok()) << claimed.status();
  // "ps" without the slash is not the prefix.
  UniqueFd b = SendHello(l->port(), "psx", 1, 0, 2);
  EXPECT_TRUE(l->Claim("psx", 1, 1, 0, 0, absl::Now() + absl::Seconds(5)).ok());
  absl::MutexLock lock(&routed.mu);
  EXPECT_TRUE(routed.conns.empty());
  EXPECT_EQ(l->stats().routed, 0u);
}

TEST(ListenerRoute, RanksAreStillChecked) {
  Routed routed;
  auto l = StartRouting(&routed);
  std::string msg;
  UniqueFd a = SendHello(l->port(), "ps/j", 2, 0, 2);  // src >= world
  EXPECT_EQ(ReadAck(a.get(), &msg), static_cast<int>(absl::StatusCode::kInvalidArgument));
  EXPECT_EQ(msg, "bad ranks src=2 dst=0 for world size 2");
  UniqueFd b = SendHello(l->port(), "ps/j", 0, kMaxWorldSize, 2);  // dst out of bounds
  EXPECT_EQ(ReadAck(b.get(), &msg), static_cast<int>(absl::StatusCode::kInvalidArgument));
  UniqueFd c = SendHello(l->port(), "plain", 1, 1, 2);  // src == dst outside the prefix
  EXPECT_EQ(ReadAck(c.get(), &msg), static_cast<int>(absl::StatusCode::kInvalidArgument));
  EXPECT_EQ(msg, "bad ranks src=1 dst=1 for world size 2");
  // The listener counts a rejection after answering it.
  const absl::Time until = absl::Now() + absl::Seconds(5);
  while (l->stats().rejected < 3 && absl::Now() < until) absl::SleepFor(absl::Milliseconds(1));
  EXPECT_EQ(l->stats().rejected, 3u);
  absl::MutexLock lock(&routed.mu);
  EXPECT_TRUE(routed.conns.empty());
}

TEST(ListenerRoute, WithoutARoutePrefixedJobsAreParkedToo) {
  ListenerOptions lo;
  lo.listen = {"127.0.0.1", 0};
  auto l = TcpListener::Start(lo);
  ASSERT_TRUE(l.ok());
  UniqueFd a = SendHello((*l)->port(), "ps/j", 0, 1, 2);
  EXPECT_TRUE((*l)->Claim("ps/j", 1, 0, 1, 0, absl::Now() + absl::Seconds(5)).ok());
}

}  // namespace
}  // namespace gradsync::transport
