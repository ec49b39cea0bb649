// TcpContext::ConnectToServers (a client of several servers, as the PS
// worker uses it) against servers the test drives by hand.
#include <sys/socket.h>

#include <thread>

#include "absl/synchronization/mutex.h"
#include "gtest/gtest.h"
#include "transport/tcp_context.h"
#include "transport/tcp_device.h"
#include "transport/tcp_listener.h"
#include "transport/wire.h"

namespace gradsync::transport {
namespace {

constexpr char kJob[] = "ps/client-test";

// A server that answers every "ps/" Hello with `code` (0: accept, with no
// message otherwise "no such job") and keeps the accepted connections.
class RawServer {
 public:
  explicit RawServer(uint16_t code = 0) {
    ListenerOptions lo;
    lo.listen = {"127.0.0.1", 0};
    lo.route_prefix = "ps/";
    lo.route = [this, code](RoutedConnection rc) {
      // The whole handshake (empty key) under the lock, so fd() is valid
      // and past the client's proof once the client connected.
      absl::MutexLock l(&mu_);
      const int fd = rc.fd.get();
      const absl::Time deadline = absl::Now() + absl::Seconds(5);
      std::string client_nonce(kNonceBytes, '\0');
      if (!ReadFull(fd, client_nonce.data(), kNonceBytes, deadline).ok()) return;
      hellos_.push_back(rc.hello);
      const std::string msg = code == 0 ? "" : "no such job";
      HelloAck ack{kHelloMagic, code, static_cast<uint16_t>(msg.size())};
      if (!WriteFull(fd, &ack, sizeof(ack), deadline).ok()) return;
      (void)WriteFull(fd, msg.data(), msg.size(), deadline);
      if (code == 0) {
        const std::string nonce = RandomNonce();
        const std::string proof = HandshakeProof("", HandshakeRole::kAcceptor, rc.hello, rc.job_id,
                                                 client_nonce, nonce);
        std::string theirs(kProofBytes, '\0');
        if (!WriteFull(fd, nonce.data(), nonce.size(), deadline).ok() ||
            !WriteFull(fd, proof.data(), proof.size(), deadline).ok() ||
            !ReadFull(fd, theirs.data(), theirs.size(), deadline).ok() ||
            !WriteHelloAck(fd, absl::OkStatus(), deadline).ok()) {  // admitted
          return;
        }
      }
      conns_.push_back(std::move(rc.fd));
    };
    auto l = TcpListener::Start(lo);
    EXPECT_TRUE(l.ok()) << l.status();
    listener_ = std::move(*l);
  }
  HostPort address() const { return {"127.0.0.1", listener_->port()}; }
  int fd() {
    absl::MutexLock l(&mu_);
    return conns_.empty() ? -1 : conns_[0].get();
  }
  Hello hello() {
    absl::MutexLock l(&mu_);
    return hellos_.at(0);
  }

 private:
  absl::Mutex mu_;
  std::vector<Hello> hellos_;
  std::vector<UniqueFd> conns_;
  std::unique_ptr<TcpListener> listener_;
};

ServerSetSpec Spec(const std::vector<HostPort>& servers) {
  ServerSetSpec spec;
  spec.job_id = kJob;
  spec.epoch = 3;
  spec.rank = 1;
  spec.clients = 4;
  spec.servers = servers;
  spec.server_names = {"shard A", "shard B"};
  spec.deadline = absl::Now() + absl::Seconds(10);
  return spec;
}

FrameHeader Frame(FrameType type, uint64_t op, uint32_t slot, uint64_t offset, uint32_t len) {
  FrameHeader h{};
  h.magic = kFrameMagic;
  h.version = kWireVersion;
  h.type = static_cast<uint8_t>(type);
  h.dtype = 1;
  h.length = len;
  h.slot = slot;
  h.job_tag = JobTag(kJob);
  h.epoch = 3;
  h.op_seq = op;
  h.offset = offset;
  return h;
}

TEST(TcpClientContext, NamesItselfInTheHelloAndReachesEveryServer) {
  RawServer a, b;
  TcpDevice device(TcpDeviceOptions{});
  auto ctx = device.ConnectToServers(Spec({a.address(), b.address()}));
  ASSERT_TRUE(ctx.ok()) << ctx.status();
  EXPECT_EQ((*ctx)->rank(), -1);
  EXPECT_EQ((*ctx)->size(), 2);
  EXPECT_EQ(a.hello().src_rank, 1);
  EXPECT_EQ(a.hello().world_size, 4);
  EXPECT_EQ(a.hello().dst_rank, 0);
  EXPECT_EQ(b.hello().dst_rank, 1);
  // A request to each server, answered by server B first.
  std::vector<char> buf(8, 0);
  auto mr = (*ctx)->RegisterMemory(buf.data(), buf.size());
  Request ra, rb;
  ASSERT_TRUE((*ctx)->PostRecv(0, **mr, 0, 4, true, MessageTag{1, 0, 1, 0}, &ra).ok());
  ASSERT_TRUE((*ctx)->PostRecv(1, **mr, 4, 4, true, MessageTag{1, 1, 1, 4}, &rb).ok());
  const absl::Time deadline = absl::Now() + absl::Seconds(5);
  FrameHeader hb = Frame(FrameType::kData, 1, 1, 4, 4);
  ASSERT_TRUE(WriteFull(b.fd(), &hb, sizeof(hb), deadline).ok());
  ASSERT_TRUE(WriteFull(b.fd(), "BBBB", 4, deadline).ok());
  FrameHeader ha = Frame(FrameType::kData, 1, 0, 0, 4);
  ASSERT_TRUE(WriteFull(a.fd(), &ha, sizeof(ha), deadline).ok());
  ASSERT_TRUE(WriteFull(a.fd(), "AAAA", 4, deadline).ok());
  while (!ra.done || !rb.done) ASSERT_TRUE((*ctx)->Progress(deadline).ok());
  EXPECT_EQ(std::string(buf.data(), 8), "AAAABBBB");
}

TEST(TcpClientContext, ARefusalNamesTheServerAndKeepsItsCode) {
  RawServer a;
  RawServer b(static_cast<uint16_t>(absl::StatusCode::kFailedPrecondition));
  TcpDevice device(TcpDeviceOptions{});
  auto ctx = device.ConnectToServers(Spec({a.address(), b.address()}));
  ASSERT_FALSE(ctx.ok());
  EXPECT_TRUE(absl::IsFailedPrecondition(ctx.status())) << ctx.status();
  EXPECT_EQ(ctx.status().message(), "shard B: cannot connect: refused: no such job");
}

// A server's ABORT is the context's error verbatim, with its code; it is told
// to the other servers only by the owner's Fail, in the owner's words.
TEST(TcpClientContext, AServersAbortIsVerbatimAndRelayedInTheOwnersWords) {
  RawServer a, b;
  TcpDevice device(TcpDeviceOptions{});
  auto ctx = device.ConnectToServers(Spec({a.address(), b.address()}));
  ASSERT_TRUE(ctx.ok()) << ctx.status();
  std::vector<char> buf(4);
  auto mr = (*ctx)->RegisterMemory(buf.data(), buf.size());
  Request r;
  ASSERT_TRUE((*ctx)->PostRecv(0, **mr, 0, 4, true, MessageTag{6, 0, 1, 0}, &r).ok());
  const std::string why = "shard A: step 6 does not match across workers";
  const absl::Time deadline = absl::Now() + absl::Seconds(5);
  FrameHeader h = Frame(FrameType::kAbort, 6, kControlSlot,
                        static_cast<uint64_t>(absl::StatusCode::kInvalidArgument),
                        static_cast<uint32_t>(why.size()));
  ASSERT_TRUE(WriteFull(a.fd(), &h, sizeof(h), deadline).ok());
  ASSERT_TRUE(WriteFull(a.fd(), why.data(), why.size(), deadline).ok());
  absl::Status s = (*ctx)->Progress(deadline);
  EXPECT_TRUE(absl::IsInvalidArgument(s)) << s;
  EXPECT_EQ(s.message(), why);
  EXPECT_EQ((*ctx)->fault().peer, 0);
  EXPECT_EQ((*ctx)->fault().op_seq, 6u);
  // Nothing reached server B yet.
  char c;
  EXPECT_EQ(::recv(b.fd(), &c, 1, MSG_DONTWAIT), -1);
  (void)(*ctx)->Fail(absl::InternalError("worker rank 1 gives up on step 6"));
  FrameHeader told;
  ASSERT_TRUE(ReadFull(b.fd(), &told, sizeof(told), deadline).ok());
  EXPECT_EQ(told.type, static_cast<uint8_t>(FrameType::kAbort));
  EXPECT_EQ(told.op_seq, 6u);
  EXPECT_EQ(told.offset, static_cast<uint64_t>(absl::StatusCode::kInternal));
  std::string msg(told.length, '\0');
  ASSERT_TRUE(ReadFull(b.fd(), msg.data(), msg.size(), deadline).ok());
  EXPECT_EQ(msg, "worker rank 1 gives up on step 6");
}

TEST(TcpClientContext, ALostServerIsAFaultNamingIt) {
  RawServer a;
  HostPort gone;
  {
    RawServer b;
    gone = b.address();
    TcpDevice device(TcpDeviceOptions{});
    auto ctx = device.ConnectToServers(Spec({a.address(), gone}));
    ASSERT_TRUE(ctx.ok()) << ctx.status();
    std::vector<char> buf(4);
    auto mr = (*ctx)->RegisterMemory(buf.data(), buf.size());
    Request r;
    ASSERT_TRUE((*ctx)->PostRecv(1, **mr, 0, 4, true, MessageTag{2, 0, 1, 0}, &r).ok());
    ::shutdown(b.fd(), SHUT_RDWR);
    absl::Status s = (*ctx)->Progress(absl::Now() + absl::Seconds(5));
    EXPECT_TRUE(absl::IsUnavailable(s)) << s;
    EXPECT_EQ(s.message(), "client rank 1: connection to shard B lost: closed by peer");
    const PeerFault f = (*ctx)->fault();
    EXPECT_EQ(f.kind, PeerFault::kLost);
    EXPECT_EQ(f.peer, 1);
    EXPECT_FALSE(f.while_sending);
    EXPECT_EQ(f.cause, "closed by peer");
  }
  // A server that is not there is named with the cause.
  TcpDevice device(TcpDeviceOptions{});
  auto ctx = device.ConnectToServers(Spec({a.address(), gone}));
  ASSERT_FALSE(ctx.ok());
  EXPECT_TRUE(absl::IsUnavailable(ctx.status())) << ctx.status();
  EXPECT_NE(ctx.status().message().find("shard B: cannot connect: "), std::string::npos)
      << ctx.status();
}

// The server side: a context over one accepted connection, as the PS shard
// serves each worker.
struct ServerSide {
  std::unique_ptr<Context> server;
  UniqueFd client;
};

ServerSide Accept() {
  ServerSide side;
  int fds[2];
  EXPECT_EQ(::socketpair(AF_UNIX, SOCK_STREAM, 0, fds), 0);
  side.client.Reset(fds[1]);
  TcpDevice device(TcpDeviceOptions{});
  ClientSpec spec;
  spec.job_id = kJob;
  spec.epoch = 3;
  spec.client_name = "worker rank 2";
  spec.self_name = "shard A";
  auto ctx = device.AcceptClient(UniqueFd(fds[0]), spec);
  EXPECT_TRUE(ctx.ok()) << ctx.status();
  side.server = std::move(*ctx);
  return side;
}

TEST(TcpServerContext, ReportsAMessageNobodyExpectedAndTakesItWhenAsked) {
  ServerSide side = Accept();
  const absl::Time deadline = absl::Now() + absl::Seconds(5);
  FrameHeader h = Frame(FrameType::kData, 7, 3, 96, 5);
  ASSERT_TRUE(WriteFull(side.client.get(), &h, sizeof(h), deadline).ok());
  ASSERT_TRUE(WriteFull(side.client.get(), "hello", 5, deadline).ok());
  Incoming in;
  while (!side.server->Probe(0, &in)) ASSERT_TRUE(side.server->Progress(deadline).ok());
  EXPECT_EQ(in.tag.op_seq, 7u);
  EXPECT_EQ(in.tag.slot, 3u);
  EXPECT_EQ(in.tag.offset, 96u);
  EXPECT_EQ(in.bytes, 5u);
  std::string buf(5, '\0');
  auto mr = side.server->RegisterMemory(buf.data(), buf.size());
  Request r;
  ASSERT_TRUE(side.server->PostRecv(0, **mr, 0, 5, true, in.tag, &r).ok());
  while (!r.done) ASSERT_TRUE(side.server->Progress(deadline).ok());
  EXPECT_EQ(buf, "hello");
  EXPECT_FALSE(side.server->Probe(0, &in));
  // The client leaving is reported too.
  side.client.Reset();
  while (!side.server->PeerClosed(0)) ASSERT_TRUE(side.server->Progress(deadline).ok());
  EXPECT_TRUE(side.server->health().ok());
}

TEST(TcpServerContext, AnOpScopedAbortLeavesTheConnectionUsable) {
  ServerSide side = Accept();
  const absl::Time deadline = absl::Now() + absl::Seconds(5);
  Request r;
  ASSERT_TRUE(side.server
                  ->PostAbort(0, 4, absl::FailedPreconditionError("step 4 is over"), &r)
                  .ok());
  while (!r.done) ASSERT_TRUE(side.server->Progress(deadline).ok());
  FrameHeader h;
  ASSERT_TRUE(ReadFull(side.client.get(), &h, sizeof(h), deadline).ok());
  EXPECT_EQ(h.type, static_cast<uint8_t>(FrameType::kAbort));
  EXPECT_EQ(h.op_seq, 4u);
  EXPECT_EQ(h.offset, static_cast<uint64_t>(absl::StatusCode::kFailedPrecondition));
  std::string msg(h.length, '\0');
  ASSERT_TRUE(ReadFull(side.client.get(), msg.data(), msg.size(), deadline).ok());
  EXPECT_EQ(msg, "step 4 is over");
  EXPECT_TRUE(side.server->health().ok());
  // Failing the context names no op: the connection ends.
  (void)side.server->Fail(absl::DataLossError("shard A: protocol error from worker rank 2"));
  ASSERT_TRUE(ReadFull(side.client.get(), &h, sizeof(h), deadline).ok());
  EXPECT_EQ(h.type, static_cast<uint8_t>(FrameType::kAbort));
  EXPECT_EQ(h.op_seq, kConnectionOp);
}

TEST(TcpServerContext, AClientsAbortFailsTheContextWithItsCodeAndStep) {
  ServerSide side = Accept();
  const absl::Time deadline = absl::Now() + absl::Seconds(5);
  const std::string why = "the training process went away";
  FrameHeader h = Frame(FrameType::kAbort, 9, kControlSlot,
                        static_cast<uint64_t>(absl::StatusCode::kCancelled),
                        static_cast<uint32_t>(why.size()));
  ASSERT_TRUE(WriteFull(side.client.get(), &h, sizeof(h), deadline).ok());
  ASSERT_TRUE(WriteFull(side.client.get(), why.data(), why.size(), deadline).ok());
  absl::Status s;
  do {
    s = side.server->Progress(deadline);
  } while (s.ok());
  EXPECT_TRUE(absl::IsAborted(s)) << s;
  EXPECT_EQ(s.message(), "aborted by worker rank 2: the training process went away");
  const PeerFault f = side.server->fault();
  EXPECT_EQ(f.kind, PeerFault::kAborted);
  EXPECT_EQ(f.code, absl::StatusCode::kCancelled);
  EXPECT_EQ(f.op_seq, 9u);
  EXPECT_EQ(f.cause, why);
}

}  // namespace
}  // namespace gradsync::transport
