#include "collective/test_cluster.h"

#include <thread>

#include "absl/time/clock.h"
#include "gtest/gtest.h"

namespace gradsync::testing {

using transport::TcpContext;
using transport::TcpContextOptions;
using transport::TcpListener;

Cluster MakeCluster(int world, const std::string& job) {
  Cluster c;
  std::vector<HostPort> addrs;
  for (int r = 0; r < world; ++r) {
    transport::ListenerOptions lo;
    lo.listen = {"127.0.0.1", 0};
    auto l = TcpListener::Start(lo);
    EXPECT_TRUE(l.ok()) << l.status();
    if (!l.ok()) return c;
    addrs.push_back({"127.0.0.1", (*l)->port()});
    c.listeners.push_back(std::move(*l));
  }
  c.contexts.resize(world);
  std::vector<std::thread> threads;
  for (int r = 0; r < world; ++r) {
    threads.emplace_back([&, r] {
      TcpContextOptions o;
      o.job_id = job;
      o.epoch = 1;
      o.rank = r;
      o.world_size = world;
      o.peers = addrs;
      o.deadline = absl::Now() + absl::Seconds(10);
      auto ctx = TcpContext::Connect(o, c.listeners[r].get());
      ASSERT_TRUE(ctx.ok()) << ctx.status();
      c.contexts[r] = std::move(*ctx);
    });
  }
  for (auto& t : threads) t.join();
  return c;
}

std::vector<absl::Status> RunOnRanks(int world, const std::function<absl::Status(int)>& fn) {
  std::vector<absl::Status> st(world);
  std::vector<std::thread> threads;
  for (int r = 0; r < world; ++r) threads.emplace_back([&, r] { st[r] = fn(r); });
  for (auto& t : threads) t.join();
  return st;
}

}  // namespace gradsync::testing
