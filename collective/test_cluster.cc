#include "collective/test_cluster.h"

#include <thread>

#include "absl/time/clock.h"
#include "gtest/gtest.h"
#include "rdma/verbs_emulation.h"
#include "transport/rdma_device.h"
#include "transport/tcp_device.h"

namespace gradsync::testing {

using transport::ContextSpec;
using transport::TcpListener;

const char* DeviceName(DeviceKind kind) {
  switch (kind) {
    case DeviceKind::kTcp: return "tcp";
    case DeviceKind::kInProc: return "inproc";
    case DeviceKind::kRdma: return "rdma-emulated";
  }
  return "?";
}

const rdma::VerbsEmulation& Emulation() {
  static auto* emu = new rdma::VerbsEmulation();  // never destroyed: contexts may outlive tests
  return *emu;
}

Cluster MakeCluster(int world, const std::string& job, DeviceKind device,
                    const transport::InProcFaults& faults) {
  Cluster c;
  c.contexts.resize(world);
  auto spec = [&](int r) {
    ContextSpec s;
    s.job_id = job;
    s.epoch = 1;
    s.rank = r;
    s.world_size = world;
    s.deadline = absl::Now() + absl::Seconds(10);
    return s;
  };
  if (device == DeviceKind::kInProc) {
    transport::InProcDevice dev(world, faults);  // the contexts keep its fabric
    for (int r = 0; r < world; ++r) {
      auto ctx = dev.CreateContext(spec(r));
      EXPECT_TRUE(ctx.ok()) << ctx.status();
      if (ctx.ok()) c.contexts[r] = std::move(*ctx);
    }
    return c;
  }
  std::vector<HostPort> addrs;
  for (int r = 0; r < world; ++r) {
    transport::ListenerOptions lo;
    lo.listen = {"127.0.0.1", 0};
    auto l = TcpListener::Start(lo);
    EXPECT_TRUE(l.ok()) << l.status();
    if (!l.ok()) return c;
    addrs.push_back({"127.0.0.1", (*l)->port()});
    transport::TcpDeviceOptions o;
    o.listener = l->get();
    if (device == DeviceKind::kRdma) {
      transport::RdmaDeviceOptions ro;
      ro.verbs = &Emulation().verbs();
      ro.bootstrap = o;
      auto d = transport::RdmaDevice::Open(ro);
      EXPECT_TRUE(d.ok()) << d.status();
      if (!d.ok()) return c;
      c.devices.push_back(std::move(*d));
    } else {
      c.devices.push_back(std::make_unique<transport::TcpDevice>(o));
    }
    c.listeners.push_back(std::move(*l));
  }
  std::vector<std::thread> threads;
  for (int r = 0; r < world; ++r) {
    threads.emplace_back([&, r] {
      ContextSpec s = spec(r);
      s.peers = addrs;
      auto ctx = c.devices[r]->CreateContext(s);
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
