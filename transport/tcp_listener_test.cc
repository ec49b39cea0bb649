// TcpListener's limits against one hostile host: silent connections and
// unclaimed Hellos from one source address take that source's slots only,
// and a Hello cannot replace a live connection already waiting with the same
// key. The hostile host is 127.0.0.2 (loopback), the real peer 127.0.0.1.
#include "transport/tcp_listener.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <string>
#include <vector>

#include "absl/time/clock.h"
#include "common/net_testing.h"
#include "gtest/gtest.h"
#include "transport/wire.h"

namespace gradsync::transport {
namespace {

using gradsync::testing::ConnectFrom;

// One byte from `fd` within 5 s, else -1.
int ReadByte(int fd) {
  struct pollfd p = {fd, POLLIN, 0};
  if (::poll(&p, 1, 5000) != 1) return -1;
  char c = 0;
  return ::read(fd, &c, 1) == 1 ? c : -1;
}

void SendHello(int fd, const std::string& job, uint64_t epoch, int src, int dst) {
  const absl::Time deadline = absl::Now() + absl::Seconds(5);
  Hello h{kHelloMagic, kWireVersion, static_cast<uint16_t>(job.size()), epoch, src, dst, 4, 0};
  ASSERT_TRUE(WriteFull(fd, &h, sizeof(h), deadline).ok());
  ASSERT_TRUE(WriteFull(fd, job.data(), job.size(), deadline).ok());
}

// Waits (up to 10 s) until `done` holds for the listener's stats.
template <typename Pred>
bool AwaitStats(const TcpListener& l, Pred done) {
  const absl::Time until = absl::Now() + absl::Seconds(10);
  while (!done(l.stats())) {
    if (absl::Now() > until) return false;
    absl::SleepFor(absl::Milliseconds(5));
  }
  return true;
}

std::unique_ptr<TcpListener> Start(ListenerOptions o) {
  o.listen = {"0.0.0.0", 0};  // reachable from 127.0.0.2 as well
  auto l = TcpListener::Start(o);
  EXPECT_TRUE(l.ok()) << l.status();
  return l.ok() ? std::move(*l) : nullptr;
}

// With every handshake slot of the listener taken by silent connections of
// one host (64 of 64 before), a real peer could not connect at all.
TEST(TcpListenerLimits, SilentConnectionsOfOneHostLeaveSlotsForOthers) {
  ListenerOptions o;
  o.max_pending_handshakes = 16;
  o.max_handshakes_per_source = 4;
  auto l = Start(o);
  ASSERT_NE(l, nullptr);
  std::vector<UniqueFd> silent;
  for (int i = 0; i < 16; ++i) silent.push_back(ConnectFrom("127.0.0.2", l->port()));
  ASSERT_TRUE(AwaitStats(*l, [](const ListenerStats& s) { return s.accepted + s.rejected >= 16; }));
  UniqueFd real = ConnectFrom("127.0.0.1", l->port());
  SendHello(real.get(), "job", 1, 0, 1);
  auto claimed = l->Claim("job", 1, 0, 1, 0, absl::Now() + absl::Seconds(5));
  ASSERT_TRUE(claimed.ok()) << claimed.status();
  EXPECT_EQ(l->stats().rejected, 12u);  // 16 silent, 4 admitted
}

// Several hosts together fill every handshake slot with silent connections
// (4 hosts x 64 of 256 slots blocked every job forming on the daemon): a
// connection from a host holding fewer slots takes the slot of the oldest
// silent connection of the host holding the most.
TEST(TcpListenerLimits, SilentHostsFillingEverySlotMakeRoomForANewcomer) {
  ListenerOptions o;
  o.max_pending_handshakes = 8;
  o.max_handshakes_per_source = 4;
  o.handshake_timeout = absl::Seconds(60);
  auto l = Start(o);
  ASSERT_NE(l, nullptr);
  std::vector<UniqueFd> silent;
  for (const char* host : {"127.0.0.2", "127.0.0.3"}) {
    for (int i = 0; i < 4; ++i) silent.push_back(ConnectFrom(host, l->port()));
  }
  ASSERT_TRUE(AwaitStats(*l, [](const ListenerStats& s) { return s.accepted == 8; }));
  UniqueFd real = ConnectFrom("127.0.0.1", l->port());
  SendHello(real.get(), "job", 1, 0, 1);
  auto claimed = l->Claim("job", 1, 0, 1, 0, absl::Now() + absl::Seconds(5));
  ASSERT_TRUE(claimed.ok()) << claimed.status();
  ASSERT_TRUE(AwaitStats(*l, [](const ListenerStats& s) { return s.rejected == 1; }));
  EXPECT_EQ(l->stats().evicted, 1u);
  // The evicted connection was the oldest silent one of 127.0.0.2, closed.
  EXPECT_EQ(ReadByte(silent[0].get()), -1);
  for (size_t i = 1; i < silent.size(); ++i) {
    struct pollfd p = {silent[i].get(), POLLIN, 0};
    EXPECT_EQ(::poll(&p, 1, 0), 0) << "silent connection " << i << " was closed";
  }
}

// One host parks the most Hellos with a real peer's key (job, epoch, ranks):
// the real peer's connection from another host still gets into the queue,
// in place of the oldest of that host's.
TEST(TcpListenerLimits, OneHostsHellosCannotKeepAnothersOut) {
  ListenerOptions o;
  o.max_parked_per_hello = 3;
  auto l = Start(o);
  ASSERT_NE(l, nullptr);
  std::vector<UniqueFd> forged;
  for (int i = 0; i < 3; ++i) {
    forged.push_back(ConnectFrom("127.0.0.2", l->port()));
    SendHello(forged.back().get(), "job", 1, 0, 1);
  }
  ASSERT_TRUE(AwaitStats(*l, [](const ListenerStats& s) { return s.parked == 3; }));
  UniqueFd real = ConnectFrom("127.0.0.1", l->port());
  SendHello(real.get(), "job", 1, 0, 1);
  ASSERT_TRUE(AwaitStats(*l, [](const ListenerStats& s) { return s.evicted == 1; }));
  EXPECT_EQ(l->stats().parked, 3u);
  EXPECT_EQ(ReadByte(forged[0].get()), -1);  // the oldest forged one was closed
  const char x = 'x';
  for (int i = 0; i < 3; ++i) {
    auto claimed = l->Claim("job", 1, 0, 1, 0, absl::Now() + absl::Seconds(5));
    ASSERT_TRUE(claimed.ok()) << claimed.status();
    ASSERT_EQ(::write(claimed->get(), &x, 1), 1);
  }
  EXPECT_EQ(ReadByte(real.get()), 'x');  // the real peer's connection was claimed
}

TEST(TcpListenerLimits, UnclaimedHellosOfOneHostAreCapped) {
  ListenerOptions o;
  o.max_parked_per_source = 3;
  auto l = Start(o);
  ASSERT_NE(l, nullptr);
  std::vector<UniqueFd> forged;
  for (int i = 0; i < 6; ++i) {
    forged.push_back(ConnectFrom("127.0.0.2", l->port()));
    SendHello(forged.back().get(), "squat-" + std::to_string(i), 1, 0, 1);
  }
  UniqueFd real = ConnectFrom("127.0.0.1", l->port());
  SendHello(real.get(), "job", 1, 0, 1);
  auto claimed = l->Claim("job", 1, 0, 1, 0, absl::Now() + absl::Seconds(5));
  ASSERT_TRUE(claimed.ok()) << claimed.status();
  ASSERT_TRUE(AwaitStats(*l, [](const ListenerStats& s) { return s.rejected + s.parked >= 6; }));
  EXPECT_EQ(l->stats().rejected, 3u);
  EXPECT_EQ(l->stats().parked, 3u);
}

// A second Hello with the key of a waiting connection does not replace it
// (it did: a forger's connection was then claimed as the real peer): it
// queues behind it, and Claim takes them in arrival order (the context takes
// the next when one cannot prove the job key). A waiting connection whose
// peer closed leaves the queue.
TEST(TcpListenerLimits, ConnectionsWithTheSameHelloQueueInArrivalOrder) {
  ListenerOptions o;
  o.max_parked_per_hello = 2;
  auto l = Start(o);
  ASSERT_NE(l, nullptr);
  UniqueFd first = ConnectFrom("127.0.0.1", l->port());
  SendHello(first.get(), "job", 1, 0, 1);
  ASSERT_TRUE(AwaitStats(*l, [](const ListenerStats& s) { return s.parked == 1; }));
  UniqueFd second = ConnectFrom("127.0.0.2", l->port());
  SendHello(second.get(), "job", 1, 0, 1);
  ASSERT_TRUE(AwaitStats(*l, [](const ListenerStats& s) { return s.parked == 2; }));
  UniqueFd third = ConnectFrom("127.0.0.2", l->port());
  SendHello(third.get(), "job", 1, 0, 1);
  ASSERT_TRUE(AwaitStats(*l, [](const ListenerStats& s) { return s.rejected == 1; }));
  const char x = 'x';
  for (UniqueFd* want : {&first, &second}) {
    auto claimed = l->Claim("job", 1, 0, 1, 0, absl::Now() + absl::Seconds(5));
    ASSERT_TRUE(claimed.ok()) << claimed.status();
    ASSERT_EQ(::write(claimed->get(), &x, 1), 1);
    EXPECT_EQ(ReadByte(want->get()), 'x');
  }

  UniqueFd dead = ConnectFrom("127.0.0.1", l->port());
  SendHello(dead.get(), "job", 2, 0, 1);
  ASSERT_TRUE(AwaitStats(*l, [](const ListenerStats& s) { return s.parked == 1; }));
  dead.Reset();
  UniqueFd retry = ConnectFrom("127.0.0.1", l->port());
  SendHello(retry.get(), "job", 2, 0, 1);
  ASSERT_TRUE(AwaitStats(*l, [](const ListenerStats& s) { return s.replaced == 1; }));
  auto claimed = l->Claim("job", 2, 0, 1, 0, absl::Now() + absl::Seconds(5));
  ASSERT_TRUE(claimed.ok()) << claimed.status();
  ASSERT_EQ(::write(claimed->get(), &x, 1), 1);
  EXPECT_EQ(ReadByte(retry.get()), 'x');
}

}  // namespace
}  // namespace gradsync::transport
