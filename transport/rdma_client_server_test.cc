// The RDMA device's client and server contexts (ConnectToServers /
// AcceptClient, the parameter server's path) against the verbs emulation:
// the client's Hello asks for RDMA, its sends are announced (RTS) so a
// server can Probe them, data lands bit-exact both ways, and a server's
// op-scoped ABORT reaches the client with its code.
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "gtest/gtest.h"
#include "rdma/verbs_emulation.h"
#include "transport/rdma_device.h"
#include "transport/tcp_listener.h"
#include "transport/wire.h"

namespace gradsync::transport {
namespace {

constexpr char kJob[] = "ps/rdma-client-test";

std::unique_ptr<RdmaDevice> OpenDevice(const rdma::VerbsEmulation& emu) {
  RdmaDeviceOptions o;
  o.verbs = &emu.verbs();
  o.max_in_flight = 8;
  auto d = RdmaDevice::Open(o);
  EXPECT_TRUE(d.ok()) << d.status();
  return d.ok() ? std::move(*d) : nullptr;
}

// A server: the job-key handshake (empty key) on its listener's route, then
// an RDMA context over the connection when the Hello asks for one.
class Server {
 public:
  Server(const rdma::VerbsEmulation& emu, int index) : device_(OpenDevice(emu)) {
    ListenerOptions lo;
    lo.listen = {"127.0.0.1", 0};
    lo.route_prefix = "ps/";
    lo.route = [this, index](RoutedConnection rc) {
      const absl::Time deadline = absl::Now() + absl::Seconds(10);
      const int fd = rc.fd.get();
      std::string client_nonce(kNonceBytes, '\0');
      if (!ReadFull(fd, client_nonce.data(), kNonceBytes, deadline).ok()) return;
      HelloAck ack{kHelloMagic, 0, 0};
      const std::string nonce = RandomNonce();
      const std::string proof = HandshakeProof("", HandshakeRole::kAcceptor, rc.hello, rc.job_id,
                                               client_nonce, nonce);
      std::string theirs(kProofBytes, '\0');
      if (!WriteFull(fd, &ack, sizeof(ack), deadline).ok() ||
          !WriteFull(fd, nonce.data(), nonce.size(), deadline).ok() ||
          !WriteFull(fd, proof.data(), proof.size(), deadline).ok() ||
          !ReadFull(fd, theirs.data(), theirs.size(), deadline).ok() ||
          !WriteHelloAck(fd, absl::OkStatus(), deadline).ok()) {  // admitted
        return;
      }
      ClientSpec spec;
      spec.job_id = rc.job_id;
      spec.epoch = rc.hello.epoch;
      spec.client_name = absl::StrCat("worker rank ", rc.hello.src_rank);
      spec.self_name = absl::StrCat("shard ", index);
      spec.deadline = deadline;
      absl::MutexLock l(&mu_);
      hello_stream_ = rc.hello.stream;
      auto ctx = device_->AcceptClient(std::move(rc.fd), spec);
      EXPECT_TRUE(ctx.ok()) << ctx.status();
      if (ctx.ok()) ctx_ = std::move(*ctx);
    };
    auto l = TcpListener::Start(lo);
    EXPECT_TRUE(l.ok()) << l.status();
    listener_ = std::move(*l);
  }
  HostPort address() const { return {"127.0.0.1", listener_->port()}; }
  Context* ctx() {
    absl::MutexLock l(&mu_);
    return ctx_.get();
  }
  uint32_t hello_stream() {
    absl::MutexLock l(&mu_);
    return hello_stream_;
  }

 private:
  std::unique_ptr<RdmaDevice> device_;
  absl::Mutex mu_;
  std::unique_ptr<Context> ctx_;
  uint32_t hello_stream_ = 0;
  std::unique_ptr<TcpListener> listener_;
};

MessageTag Tag(uint64_t op, uint32_t slot, uint64_t offset = 0) {
  MessageTag t;
  t.op_seq = op;
  t.slot = slot;
  t.offset = offset;
  return t;
}

absl::Status Wait(Context& c, const Request& req) {
  const absl::Time deadline = absl::Now() + absl::Seconds(10);
  while (!req.done) {
    absl::Status s = c.Progress(deadline);
    if (!s.ok()) return s;
  }
  return absl::OkStatus();
}

class RdmaClientServer : public ::testing::Test {
 protected:
  void SetUp() override {
    servers_.push_back(std::make_unique<Server>(emu_, 0));
    servers_.push_back(std::make_unique<Server>(emu_, 1));
    client_device_ = OpenDevice(emu_);
    ServerSetSpec spec;
    spec.job_id = kJob;
    spec.epoch = 2;
    spec.rank = 1;
    spec.clients = 2;
    spec.servers = {servers_[0]->address(), servers_[1]->address()};
    spec.server_names = {"shard A", "shard B"};
    spec.deadline = absl::Now() + absl::Seconds(10);
    auto ctx = client_device_->ConnectToServers(spec);
    ASSERT_TRUE(ctx.ok()) << ctx.status();
    client_.reset(static_cast<RdmaContext*>(ctx->release()));
    for (auto& s : servers_) {
      const absl::Time deadline = absl::Now() + absl::Seconds(10);
      while (s->ctx() == nullptr && absl::Now() < deadline) absl::SleepFor(absl::Milliseconds(1));
      ASSERT_NE(s->ctx(), nullptr);
    }
  }

  rdma::VerbsEmulation emu_;
  std::vector<std::unique_ptr<Server>> servers_;
  std::unique_ptr<RdmaDevice> client_device_;
  std::unique_ptr<RdmaContext> client_;
};

TEST_F(RdmaClientServer, TheHelloAsksForRdmaAndEveryServerAnswersOverIt) {
  EXPECT_EQ(servers_[0]->hello_stream(), kRdmaBootstrapStream);
  EXPECT_EQ(servers_[1]->hello_stream(), kRdmaBootstrapStream);
  EXPECT_EQ(client_->rank(), -1);
  EXPECT_EQ(client_->size(), 2);
  EXPECT_EQ(servers_[0]->ctx()->size(), 1);
}

TEST_F(RdmaClientServer, AnnouncedSendsAreProbedThenTakenBitExactAndAnswered) {
  // The client pushes two messages to each server without knowing when the
  // servers post their receives; each server answers with its sum.
  const size_t n = (1 << 16) + 5;
  std::vector<std::vector<char>> push(4, std::vector<char>(n));
  for (size_t m = 0; m < push.size(); ++m) {
    for (size_t i = 0; i < n; ++i) push[m][i] = static_cast<char>(i * 13 + m);
  }
  std::vector<std::unique_ptr<MemoryRegion>> push_mr;
  for (auto& p : push) push_mr.push_back(*client_->RegisterMemory(p.data(), p.size()));
  std::vector<char> answers(2 * n, 0);
  auto answer_mr = *client_->RegisterMemory(answers.data(), answers.size());
  std::vector<Request> sends(4), recvs(2);
  for (int k = 0; k < 2; ++k) {
    ASSERT_TRUE(client_->PostRecv(k, *answer_mr, k * n, n, true, Tag(5, 100), &recvs[k]).ok());
  }
  for (int m = 0; m < 4; ++m) {
    ASSERT_TRUE(client_->PostSend(m % 2, *push_mr[m], 0, n, Tag(5, m, m * n), &sends[m]).ok());
  }
  std::vector<std::thread> threads;
  for (int k = 0; k < 2; ++k) {
    threads.emplace_back([&, k] {
      Context& s = *servers_[k]->ctx();
      std::vector<std::vector<char>> got;
      const absl::Time deadline = absl::Now() + absl::Seconds(10);
      while (got.size() < 2) {
        Incoming in;
        if (!s.Probe(0, &in)) {
          ASSERT_TRUE(s.Progress(deadline).ok());
          continue;
        }
        EXPECT_EQ(in.bytes, n);
        EXPECT_EQ(in.tag.slot % 2, static_cast<uint32_t>(k));
        EXPECT_EQ(in.tag.offset, in.tag.slot * n);
        got.emplace_back(in.bytes);
        auto mr = *s.RegisterMemory(got.back().data(), in.bytes);
        Request r;
        ASSERT_TRUE(s.PostRecv(0, *mr, 0, in.bytes, true, in.tag, &r).ok());
        ASSERT_TRUE(Wait(s, r).ok());
        EXPECT_EQ(got.back(), push[in.tag.slot]) << "server " << k << " message " << in.tag.slot;
      }
      std::vector<char> sum(n);
      for (size_t i = 0; i < n; ++i) sum[i] = static_cast<char>(got[0][i] + got[1][i]);
      auto mr = *s.RegisterMemory(sum.data(), sum.size());
      Request r;
      ASSERT_TRUE(s.PostSend(0, *mr, 0, n, Tag(5, 100), &r).ok());
      ASSERT_TRUE(Wait(s, r).ok());
    });
  }
  for (auto& r : sends) ASSERT_TRUE(Wait(*client_, r).ok());
  for (auto& r : recvs) ASSERT_TRUE(Wait(*client_, r).ok());
  for (auto& t : threads) t.join();
  for (int k = 0; k < 2; ++k) {
    for (size_t i = 0; i < n; ++i) {
      ASSERT_EQ(answers[k * n + i], static_cast<char>(push[k][i] + push[k + 2][i])) << k << " " << i;
    }
  }
  // One RTS per push and one CTS per receive: the one extra control message
  // per message on the client-server path.
  EXPECT_EQ(client_->counters().rts_sent, 4u);
  EXPECT_EQ(client_->counters().writes, 4u);
}

TEST_F(RdmaClientServer, AServersOpScopedAbortReachesTheClientWithItsCode) {
  Context& s = *servers_[1]->ctx();
  Request r;
  ASSERT_TRUE(s.PostAbort(0, 7, absl::FailedPreconditionError("step 7 is over"), &r).ok());
  const absl::Time deadline = absl::Now() + absl::Seconds(10);
  while (!r.done) {
    absl::Status st = s.Progress(deadline);
    ASSERT_TRUE(st.ok() || absl::IsDeadlineExceeded(st)) << st;
  }
  EXPECT_TRUE(s.health().ok());
  absl::Status st;
  do {
    st = client_->Progress(deadline);
  } while (st.ok());
  EXPECT_TRUE(absl::IsFailedPrecondition(st)) << st;
  EXPECT_NE(st.message().find("step 7 is over"), std::string::npos) << st;
}

TEST_F(RdmaClientServer, AServerAnswersWithoutAnnouncingItsSend) {
  // The client posts its receive first (it knows what it asked for); the
  // server's send needs no RTS.
  Context& s = *servers_[0]->ctx();
  std::vector<char> buf(16, 'x');
  auto mr = *s.RegisterMemory(buf.data(), buf.size());
  std::vector<char> in(16, 0);
  auto in_mr = *client_->RegisterMemory(in.data(), in.size());
  Request send, recv;
  ASSERT_TRUE(client_->PostRecv(0, *in_mr, 0, 16, true, Tag(9, 1), &recv).ok());
  ASSERT_TRUE(s.PostSend(0, *mr, 0, 16, Tag(9, 1), &send).ok());
  ASSERT_TRUE(Wait(s, send).ok());
  ASSERT_TRUE(Wait(*client_, recv).ok());
  EXPECT_EQ(std::string(in.begin(), in.end()), std::string(16, 'x'));
  EXPECT_EQ(static_cast<RdmaContext&>(s).counters().rts_sent, 0u);
}

}  // namespace
}  // namespace gradsync::transport
