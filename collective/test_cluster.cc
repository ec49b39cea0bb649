#include "collective/test_cluster.h"

#include <thread>

#include "absl/time/clock.h"
#include "gtest/gtest.h"
#include "rdma/verbs_emulation.h"
#include "transport/staging_testing.h"
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
    case DeviceKind::kTcpStaged: return "tcp-staged-device";
  }
  return "?";
}

const rdma::VerbsEmulation& Emulation() {
  static auto* emu = new rdma::VerbsEmulation();  // never destroyed: contexts may outlive tests
  return *emu;
}

namespace {
// The CPU kernels, for memory labelled as the emulated device's.
class EmulatedDeviceReducer final : public Reducer {
 public:
  transport::MemKind kind() const override { return transport::testing::EmulatedDevice(); }
  void Reduce(DType t, ReduceOp op, void* dst, const void* src, size_t n) const override {
    CpuReducer().Reduce(t, op, dst, src, n);
  }
  void Combine(DType t, ReduceOp op, void* dst, const void* a, const void* b,
               size_t n) const override {
    CpuReducer().Combine(t, op, dst, a, b, n);
  }
  void Divide(DType t, void* data, size_t n, int64_t divisor) const override {
    CpuReducer().Divide(t, data, n, divisor);
  }
  void Copy(void* dst, const void* src, size_t bytes) const override {
    CpuReducer().Copy(dst, src, bytes);
  }
  void Encode(CodecId codec, const float* in, size_t n, void* out) const override {
    CpuReducer().Encode(codec, in, n, out);
  }
  void Decode(CodecId codec, const void* in, size_t n, float* out, bool add) const override {
    CpuReducer().Decode(codec, in, n, out, add);
  }
};
}  // namespace

transport::MemKind BufferKindFor(DeviceKind kind) {
  return kind == DeviceKind::kTcpStaged ? transport::testing::EmulatedDevice()
                                        : transport::MemKind::Host();
}

const Reducer* ReducerFor(DeviceKind kind) {
  static const EmulatedDeviceReducer device;
  return kind == DeviceKind::kTcpStaged ? &device : nullptr;
}

const transport::MemoryAllocator& ScratchAllocatorFor(DeviceKind kind) {
  static const transport::testing::EmulatedDeviceAllocator device;
  return kind == DeviceKind::kTcpStaged ? device : transport::HostAllocator();
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
  if (device == DeviceKind::kTcpStaged) {
    for (int r = 0; r < world; ++r) {
      if (c.contexts[r] == nullptr) continue;
      c.copiers.push_back(std::make_unique<transport::testing::EmulatedCopier>(absl::Microseconds(50)));
      c.inner.push_back(std::move(c.contexts[r]));
      c.contexts[r] = std::make_unique<transport::StagingContext>(*c.inner.back(), *c.copiers.back());
    }
  }
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
