// A node cut off from the coordinator (issue: liveness that tells the
// truth). Daemon 1 reaches the coordinator through a TCP proxy in this test
// that can go silent: while cut, it forwards nothing either way and keeps the
// connections open, as a partition does (TCP retransmits, nothing arrives).
// Both sides of the job must fail within 10 s naming the partition — the
// cut-off daemon because the coordinator stopped answering its heartbeats,
// the other because the coordinator declared the cut-off rank dead — not at
// the op deadline blaming a healthy rank; after healing, a new job forms at once.
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <fstream>
#include <sstream>
#include <thread>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "common/net.h"
#include "gtest/gtest.h"
#include "tests/cluster_util.h"

namespace gradsync {
namespace {

// Forwards TCP connections to a target; Cut(true) makes it a black hole.
class SilentProxy {
 public:
  SilentProxy() {
    auto l = TcpListen(HostPort{"127.0.0.1", 0});
    EXPECT_TRUE(l.ok()) << l.status();
    listener_ = std::move(*l);
    port_ = *LocalPort(listener_.get());
    accept_ = std::thread([this] { AcceptLoop(); });
  }
  ~SilentProxy() {
    stop_ = true;
    ::shutdown(listener_.get(), SHUT_RDWR);
    accept_.join();
    for (std::thread& t : pumps_) t.join();
  }
  int port() const { return port_; }
  void SetTarget(const HostPort& target) {
    absl::MutexLock l(&mu_);
    target_ = target;
  }
  void Cut(bool cut) { cut_ = cut; }

 private:
  void AcceptLoop() {
    while (!stop_) {
      pollfd p{listener_.get(), POLLIN, 0};
      if (::poll(&p, 1, 50) <= 0) continue;
      int fd = ::accept(listener_.get(), nullptr, nullptr);
      if (fd < 0) continue;
      pumps_.emplace_back([this, fd] { Pump(UniqueFd(fd)); });
    }
  }
  void Pump(UniqueFd client) {
    HostPort target;
    {
      absl::MutexLock l(&mu_);
      mu_.AwaitWithTimeout(absl::Condition(
                               +[](HostPort* t) { return t->port != 0; }, &target_),
                           absl::Seconds(20));
      target = target_;
    }
    auto server = TcpConnect(target, absl::Now() + absl::Seconds(5));
    if (!server.ok()) return;
    int fds[2] = {client.get(), server->get()};
    char buf[64 << 10];
    while (!stop_) {
      if (cut_) {  // nothing moves; the kernel's buffers fill up
        absl::SleepFor(absl::Milliseconds(10));
        continue;
      }
      pollfd p[2] = {{fds[0], POLLIN, 0}, {fds[1], POLLIN, 0}};
      if (::poll(p, 2, 20) <= 0) continue;
      for (int i = 0; i < 2; ++i) {
        if ((p[i].revents & (POLLIN | POLLHUP | POLLERR)) == 0) continue;
        const ssize_t n = ::read(fds[i], buf, sizeof(buf));
        if (n <= 0) return;
        if (!WriteFull(fds[1 - i], buf, static_cast<size_t>(n), absl::Now() + absl::Seconds(10)).ok()) {
          return;
        }
      }
    }
  }

  UniqueFd listener_;
  int port_ = 0;
  absl::Mutex mu_;
  HostPort target_ ABSL_GUARDED_BY(mu_);
  std::atomic<bool> cut_{false};
  std::atomic<bool> stop_{false};
  std::thread accept_;
  std::vector<std::thread> pumps_;  // only the accept thread adds, before ~SilentProxy joins
};

client::CollectiveSpec Spec(const client::Buffer* buf, const std::string& name) {
  return testing::AllreduceSpec(buf, 1024, name);
}

TEST(Partition, BothSidesFailWithinTenSecondsNamingThePartitionAndANewJobFormsAfterHealing) {
  SilentProxy proxy;
  LocalClusterOptions o;
  o.daemons = 2;
  o.per_daemon_flags = {{}, {absl::StrCat("--coordinator=127.0.0.1:", proxy.port())}};
  auto started = LocalCluster::Start(o);
  ASSERT_TRUE(started.ok()) << started.status();
  std::unique_ptr<LocalCluster> cluster = std::move(*started);
  auto coordinator = ParseHostPort(cluster->coordinator_address());
  ASSERT_TRUE(coordinator.ok());
  proxy.SetTarget(*coordinator);

  auto ranks = testing::OpenJob(*cluster, "cut", {0, 1}, /*op_timeout_ms=*/60000,
                                /*heartbeat_timeout_ms=*/3000);
  ASSERT_TRUE(ranks.ok()) << ranks.status();
  std::vector<std::unique_ptr<client::Buffer>> bufs = testing::AllocateOnEveryRank(*ranks, 4096);
  ASSERT_EQ(bufs.size(), 2u);
  testing::OnEveryRank(2, [&](int r) {
    ASSERT_TRUE((*ranks)[r].session->Run(Spec(bufs[r].get(), "before")).ok());
  });

  // Rank 1 (cut off) waits in an op; rank 0 is still computing when the cut
  // comes and submits the same op 4 s later.
  proxy.Cut(true);
  const absl::Time cut_at = absl::Now();
  absl::Status cut_off, healthy;
  absl::Duration cut_off_took, healthy_took;
  std::thread r1([&] {
    cut_off = (*ranks)[1].session->Run(Spec(bufs[1].get(), "during")).status();
    cut_off_took = absl::Now() - cut_at;
  });
  absl::SleepFor(absl::Seconds(4));
  healthy = (*ranks)[0].session->Run(Spec(bufs[0].get(), "during")).status();
  healthy_took = absl::Now() - cut_at;
  r1.join();
  std::printf("cut-off rank 1 after %.2f s: %s\nhealthy rank 0 after %.2f s: %s\n",
              absl::ToDoubleSeconds(cut_off_took), cut_off.ToString().c_str(),
              absl::ToDoubleSeconds(healthy_took), healthy.ToString().c_str());
  EXPECT_FALSE(cut_off.ok());
  // Its own finding, or the healthy side's abort relayed on the data plane:
  // either names the cut, neither blames a healthy rank.
  EXPECT_TRUE(absl::StrContains(cut_off.message(), "cut off from the coordinator") ||
              absl::StrContains(cut_off.message(), "rank 1 (member"))
      << cut_off;
  EXPECT_FALSE(absl::StrContains(cut_off.message(), "waiting for rank")) << cut_off;
  EXPECT_LT(cut_off_took, absl::Seconds(10));
  EXPECT_FALSE(healthy.ok());
  EXPECT_TRUE(absl::StrContains(healthy.message(), "rank 1")) << healthy;
  EXPECT_LT(healthy_took, absl::Seconds(10));

  // Healing: the same connections carry on, and a new job forms at once.
  proxy.Cut(false);
  const absl::Time healed = absl::Now();
  ranks->clear();
  auto again = testing::OpenJob(*cluster, "healed", {0, 1});
  ASSERT_TRUE(again.ok()) << again.status();
  std::printf("a new job formed %.2f s after healing\n", absl::ToDoubleSeconds(absl::Now() - healed));
  EXPECT_LT(absl::Now() - healed, absl::Seconds(5));
  testing::OnEveryRank(2, [&](int r) {
    auto b = (*again)[r].session->AllocateBuffer(4096);
    ASSERT_TRUE(b.ok());
    auto* v = static_cast<float*>((*b)->data());
    for (int k = 0; k < 1024; ++k) v[k] = static_cast<float>(r + 1);
    ASSERT_TRUE((*again)[r].session->Run(Spec(b->get(), "healed")).ok());
    for (int k = 0; k < 1024; ++k) ASSERT_EQ(v[k], 3.0f);
  });
}

}  // namespace
}  // namespace gradsync
