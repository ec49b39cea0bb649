// The data-plane handshake between the daemons of a job: both sides prove
// the job key over fresh nonces (wire.h). Peers with the key connect; a peer
// with another key does not, and says so; a forger who connects first with
// the right Hello but no key is closed, and the real peer behind it is taken.
#include <algorithm>
#include <atomic>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "gtest/gtest.h"
#include "transport/handshake_testing.h"
#include "transport/tcp_context.h"
#include "transport/tcp_listener.h"

namespace gradsync::transport {
namespace {

struct Mesh {
  std::vector<std::unique_ptr<TcpListener>> listeners;
  std::vector<HostPort> addrs;
};

Mesh Listeners(int n) {
  Mesh m;
  for (int r = 0; r < n; ++r) {
    ListenerOptions lo;
    lo.listen = {"127.0.0.1", 0};
    m.listeners.push_back(std::move(*TcpListener::Start(lo)));
    m.addrs.push_back({"127.0.0.1", m.listeners.back()->port()});
  }
  return m;
}

TcpContextOptions Options(const Mesh& m, int rank, const std::string& key,
                          std::vector<std::string>* failures, absl::Duration timeout) {
  TcpContextOptions o;
  o.job_id = "keyed";
  o.epoch = 3;
  o.rank = rank;
  o.world_size = static_cast<int>(m.addrs.size());
  o.peers = m.addrs;
  o.job_key = key;
  o.deadline = absl::Now() + timeout;
  static absl::Mutex mu;
  o.on_auth_failure = [failures](absl::string_view reason) {
    absl::MutexLock l(&mu);
    failures->emplace_back(reason);
  };
  return o;
}

// Connects every rank of `m` with its key; returns each rank's result.
std::vector<absl::Status> ConnectAll(const Mesh& m, const std::vector<std::string>& keys,
                                     std::vector<std::string>* failures,
                                     absl::Duration timeout = absl::Seconds(10)) {
  const int n = static_cast<int>(m.addrs.size());
  std::vector<absl::Status> out(n);
  std::vector<std::thread> threads;
  for (int r = 0; r < n; ++r) {
    threads.emplace_back([&, r] {
      auto c = TcpContext::Connect(Options(m, r, keys[r], failures, timeout),
                                   m.listeners[r].get());
      out[r] = c.status();
    });
  }
  for (auto& t : threads) t.join();
  return out;
}

TEST(TcpHandshake, RanksWithTheJobKeyConnect) {
  Mesh m = Listeners(3);
  std::vector<std::string> failures;
  const std::string key(32, 'k');
  for (const absl::Status& s : ConnectAll(m, {key, key, key}, &failures)) EXPECT_TRUE(s.ok()) << s;
  EXPECT_TRUE(failures.empty());
}

// A daemon holding another key (another job's, or none) cannot join the
// mesh: the connector names the acceptor that did not prove the key, and
// the acceptor counts the connection it closed.
TEST(TcpHandshake, ARankWithAnotherKeyIsRefused) {
  Mesh m = Listeners(2);
  std::vector<std::string> failures;
  auto st = ConnectAll(m, {std::string(32, 'a'), std::string(32, 'b')}, &failures,
                       absl::Seconds(2));
  EXPECT_EQ(st[0].code(), absl::StatusCode::kUnauthenticated) << st[0];
  EXPECT_TRUE(absl::StrContains(st[0].message(), "rank 0 could not connect to rank 1"))
      << st[0];
  EXPECT_TRUE(absl::StrContains(st[0].message(), "did not prove the job's key")) << st[0];
  EXPECT_FALSE(st[1].ok());
  ASSERT_GE(failures.size(), 2u);
  EXPECT_NE(std::find(failures.begin(), failures.end(), "bad_proof"), failures.end());
  EXPECT_NE(std::find(failures.begin(), failures.end(), "no_proof"), failures.end());
}

// The forger's Hello is parked first; it answers the challenge with a proof
// under a guessed key. Rank 1 closes it and takes rank 0's real connection.
TEST(TcpHandshake, AForgerWhoConnectsFirstDoesNotKeepTheRealPeerOut) {
  Mesh m = Listeners(2);
  const std::string key(32, 'k');
  const absl::Time deadline = absl::Now() + absl::Seconds(10);
  auto forged = TcpConnect(m.addrs[1], deadline);
  ASSERT_TRUE(forged.ok());
  const std::string nonce =
      testing::SendHelloAndNonce(forged->get(), "keyed", 3, 0, 1, 2, deadline);
  while (m.listeners[1]->stats().parked < 1 && absl::Now() < deadline) {
    absl::SleepFor(absl::Milliseconds(5));
  }
  std::atomic<bool> forger_answered{false};
  std::thread forger([&] {
    // It cannot check rank 1's proof without the key, and answers with a guess.
    absl::Status s = testing::FinishConnector(forged->get(), "keyed", 3, 0, 1, 2, nonce,
                                              std::string(32, 'g'), std::string(32, 'g'),
                                              deadline);
    forger_answered = absl::IsUnauthenticated(s);
    if (forger_answered) {
      // Answer anyway, as a forger would.
      const std::string junk(kProofBytes, 'j');
      (void)WriteFull(forged->get(), junk.data(), junk.size(), deadline);
    }
  });
  std::vector<std::string> failures;
  auto st = ConnectAll(m, {key, key}, &failures);
  forger.join();
  EXPECT_TRUE(forger_answered);
  for (const absl::Status& s : st) EXPECT_TRUE(s.ok()) << s;
  EXPECT_EQ(failures, std::vector<std::string>{"bad_proof"});
}

// Forgers who connected first with the real peer's Hello and then stay
// silent (one never sends its nonce, one never proves the key) each cost
// one handshake step, not the whole connect deadline (both ranks failed
// after 30 s): rank 1 drops them and takes rank 0's real connection.
TEST(TcpHandshake, SilentForgersWhoConnectedFirstCostOneStepEach) {
  Mesh m = Listeners(2);
  const std::string key(32, 'k');
  const absl::Time deadline = absl::Now() + absl::Seconds(20);
  std::vector<UniqueFd> forgers;
  for (bool with_nonce : {false, true}) {
    auto fd = TcpConnect(m.addrs[1], deadline);
    ASSERT_TRUE(fd.ok());
    if (with_nonce) {
      (void)testing::SendHelloAndNonce(fd->get(), "keyed", 3, 0, 1, 2, deadline);
    } else {
      Hello h{kHelloMagic, kWireVersion, 5, 3, 0, 1, 2, 0};
      ASSERT_TRUE(WriteFull(fd->get(), &h, sizeof(h), deadline).ok());
      ASSERT_TRUE(WriteFull(fd->get(), "keyed", 5, deadline).ok());
    }
    forgers.push_back(std::move(*fd));
    const uint64_t want = forgers.size();
    while (m.listeners[1]->stats().parked < want && absl::Now() < deadline) {
      absl::SleepFor(absl::Milliseconds(5));
    }
  }
  std::vector<std::string> failures;
  std::vector<absl::Status> st(2);
  std::vector<std::thread> threads;
  const absl::Time start = absl::Now();
  for (int r = 0; r < 2; ++r) {
    threads.emplace_back([&, r] {
      TcpContextOptions o = Options(m, r, key, &failures, absl::Seconds(20));
      o.handshake_step_timeout = absl::Milliseconds(500);
      st[r] = TcpContext::Connect(o, m.listeners[r].get()).status();
    });
  }
  for (auto& t : threads) t.join();
  const absl::Duration took = absl::Now() - start;
  for (const absl::Status& s : st) EXPECT_TRUE(s.ok()) << s;
  EXPECT_EQ(failures, (std::vector<std::string>{"no_proof", "no_proof"}));
  // Two steps of 0.5 s, and the real handshake: far below the 20 s deadline.
  EXPECT_LT(took, absl::Seconds(10)) << took;
}

// A proof is bound to both nonces: the proof rank 1 sent one connection does
// not open another (a replay).
TEST(TcpHandshake, ProofsDependOnBothNoncesAndTheRole) {
  Hello h{kHelloMagic, kWireVersion, 5, 3, 0, 1, 2, 0};
  const std::string key(32, 'k'), n1 = RandomNonce(), n2 = RandomNonce();
  const std::string p = HandshakeProof(key, HandshakeRole::kAcceptor, h, "keyed", n1, n2);
  EXPECT_EQ(p.size(), kProofBytes);
  EXPECT_TRUE(ProofsEqual(p, HandshakeProof(key, HandshakeRole::kAcceptor, h, "keyed", n1, n2)));
  EXPECT_FALSE(ProofsEqual(p, HandshakeProof(key, HandshakeRole::kAcceptor, h, "keyed", n1,
                                             RandomNonce())));
  EXPECT_FALSE(ProofsEqual(p, HandshakeProof(key, HandshakeRole::kConnector, h, "keyed", n1, n2)));
  EXPECT_FALSE(ProofsEqual(p, HandshakeProof(std::string(32, 'x'), HandshakeRole::kAcceptor, h,
                                             "keyed", n1, n2)));
  EXPECT_NE(n1, n2);
}

}  // namespace
}  // namespace gradsync::transport
