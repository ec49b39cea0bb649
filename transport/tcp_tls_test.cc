// Data TLS between two real TcpContexts, with a tap between them (rank 0
// reaches rank 1 through a forwarding proxy, tcp_tap_testing.h, that records
// every byte and can flip one): frames arrive intact, no payload byte pattern is on
// the wire with TLS (and it is without), a flipped byte fails the context
// naming TLS instead of delivering wrong data, and certificates that are not
// a node's, or another CA's, are refused at the handshake.
#include "transport/tcp_tls.h"

#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <cstring>
#include <thread>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "common/certs.h"
#include "gtest/gtest.h"
#include "transport/tcp_context.h"
#include "transport/tcp_listener.h"
#include "transport/tcp_tap_testing.h"

namespace gradsync::transport {
namespace {

struct Certs {
  LabCerts lab;
  TlsConfig node0, node1;
};

Certs MakeCerts(const std::string& name) {
  const std::string dir = absl::StrCat(std::getenv("TEST_TMPDIR"), "/", name);
  Certs c;
  auto lab = MakeLabCerts(dir, {});
  EXPECT_TRUE(lab.ok()) << lab.status();
  c.lab = *lab;
  c.node0 = *AddLabCert(dir, "node", "node-0", {});
  c.node1 = *AddLabCert(dir, "node", "node-1", {});
  return c;
}

// Rank 0 and rank 1 of a 2-rank job, rank 0 dialing rank 1 through `tap`.
struct TlsPair {
  std::unique_ptr<TcpListener> l0, l1;
  std::unique_ptr<testing::Tap> tap;
  std::unique_ptr<TcpContext> ctx[2];
  absl::Status status[2];
};

void ConnectPair(TlsPair& p, const TlsConfig* tls0, const TlsConfig* tls1) {
  ListenerOptions lo;
  lo.listen = {"127.0.0.1", 0};
  p.l0 = std::move(*TcpListener::Start(lo));
  p.l1 = std::move(*TcpListener::Start(lo));
  p.tap = std::make_unique<testing::Tap>(p.l1->port());
  const absl::Time deadline = absl::Now() + absl::Seconds(10);
  auto run = [&](int rank, const TlsConfig* tls) {
    TcpContextOptions o;
    o.job_id = "tls-job";
    o.epoch = 1;
    o.rank = rank;
    o.world_size = 2;
    o.peers = {{"127.0.0.1", p.l0->port()}, {"127.0.0.1", rank == 0 ? p.tap->port() : p.l1->port()}};
    o.deadline = deadline;
    o.job_key = std::string(32, 'k');
    if (tls != nullptr) {
      auto loaded = DataTls::Load(*tls);
      if (!loaded.ok()) return void(p.status[rank] = loaded.status());
      o.tls = *loaded;
    }
    auto ctx = TcpContext::Connect(o, rank == 0 ? p.l0.get() : p.l1.get());
    if (!ctx.ok()) return void(p.status[rank] = ctx.status());
    p.ctx[rank] = std::move(*ctx);
  };
  std::thread t0(run, 0, tls0), t1(run, 1, tls1);
  t0.join();
  t1.join();
}

// Sends `data` from rank 0 to rank 1 in one message; rank 1's result.
absl::Status Transfer(TlsPair& p, const std::string& data, std::string* got) {
  got->assign(data.size(), '\0');
  auto send_mr = p.ctx[0]->RegisterMemory(const_cast<char*>(data.data()), data.size());
  auto recv_mr = p.ctx[1]->RegisterMemory(got->data(), got->size());
  Request sreq, rreq;
  const MessageTag tag{5, 0, 0, 1};
  absl::Status s0 = p.ctx[0]->PostSend(1, **send_mr, 0, data.size(), tag, &sreq);
  absl::Status s1 = p.ctx[1]->PostRecv(0, **recv_mr, 0, data.size(), true, tag, &rreq);
  if (!s0.ok() || !s1.ok()) return !s0.ok() ? s0 : s1;
  std::thread sender([&] {
    while (s0.ok() && !sreq.done) s0 = p.ctx[0]->Progress(absl::Now() + absl::Seconds(10));
  });
  while (s1.ok() && !rreq.done) s1 = p.ctx[1]->Progress(absl::Now() + absl::Seconds(10));
  sender.join();
  return s1;
}

std::string Pattern(size_t n) {
  std::string s;
  while (s.size() < n) s += "gradsync-plaintext-gradient-";
  s.resize(n);
  return s;
}

// OpenSSL writes with write(2): a reset peer must not kill the test (gradsyncd
// ignores SIGPIPE the same way).
const bool kNoSigpipe = [] {
  ::signal(SIGPIPE, SIG_IGN);
  return true;
}();

TEST(DataTls, FramesArriveIntactAndNothingOfThemIsOnTheWire) {
  const Certs c = MakeCerts("intact");
  TlsPair p;
  ConnectPair(p, &c.node0, &c.node1);
  ASSERT_TRUE(p.status[0].ok()) << p.status[0];
  ASSERT_TRUE(p.status[1].ok()) << p.status[1];
  const std::string data = Pattern(3 << 20);
  std::string got;
  ASSERT_TRUE(Transfer(p, data, &got).ok());
  EXPECT_TRUE(got == data);
  const std::string wire = p.tap->recorded();
  EXPECT_GT(wire.size(), data.size());
  EXPECT_FALSE(absl::StrContains(wire, "gradsync-plaintext-gradient-"));
}

TEST(DataTls, WithoutItThePayloadIsOnTheWire) {  // the tap sees what TLS hides
  TlsPair p;
  ConnectPair(p, nullptr, nullptr);
  ASSERT_TRUE(p.status[0].ok() && p.status[1].ok());
  const std::string data = Pattern(1 << 20);
  std::string got;
  ASSERT_TRUE(Transfer(p, data, &got).ok());
  EXPECT_TRUE(absl::StrContains(p.tap->recorded(), "gradsync-plaintext-gradient-"));
}

TEST(DataTls, AFlippedByteFailsTheConnectionInsteadOfCorruptingData) {
  const Certs c = MakeCerts("flip");
  TlsPair p;
  ConnectPair(p, &c.node0, &c.node1);
  ASSERT_TRUE(p.status[0].ok() && p.status[1].ok());
  p.tap->FlipAfter(100000);
  std::string got;
  absl::Status s = Transfer(p, Pattern(1 << 20), &got);
  std::printf("a flipped byte: %s\n", s.ToString().c_str());
  EXPECT_FALSE(s.ok());
  EXPECT_TRUE(absl::StrContains(s.message(), "TLS")) << s;
  EXPECT_TRUE(absl::StrContains(s.message(), "connection to rank 0 lost")) << s;
}

TEST(DataTls, OnlyNodeCertificatesOfTheClustersCaAreAccepted) {
  const Certs c = MakeCerts("roles");
  {
    TlsPair p;  // rank 0 presents the operator's certificate
    ConnectPair(p, &c.lab.operator_, &c.node1);
    ASSERT_FALSE(p.status[1].ok());
    EXPECT_TRUE(absl::StrContains(p.status[1].message(), "not a node's (OU=operator)")) << p.status[1];
  }
  {
    const Certs other = MakeCerts("other-ca");
    TlsPair p;  // rank 1 is a node of another CA
    TlsConfig foreign = other.node1;
    ConnectPair(p, &c.node0, &foreign);
    std::printf("another CA's node: %s\n", p.status[0].ToString().c_str());
    ASSERT_FALSE(p.status[0].ok());
    EXPECT_TRUE(absl::StrContains(p.status[0].message(), "TLS with rank 1 (stream 0) failed")) << p.status[0];
    EXPECT_TRUE(absl::StrContains(p.status[0].message(), "certificate")) << p.status[0];
  }
}

TEST(DataTls, LoadNamesTheFileThatCannotBeUsed) {
  TlsConfig bad;
  bad.cert = "/nonexistent/node.pem";
  bad.key = "/nonexistent/node.key";
  bad.ca = "/nonexistent/ca.pem";
  auto t = DataTls::Load(bad);
  ASSERT_FALSE(t.ok());
  EXPECT_TRUE(absl::StrContains(t.status().message(), "/nonexistent/node.pem")) << t.status();
  EXPECT_EQ(DataTls::Load(TlsConfig{}).status().code(), absl::StatusCode::kFailedPrecondition);
}

}  // namespace
}  // namespace gradsync::transport
