// The parameter server over the RDMA device, on the verbs emulation: a shard
// and its workers in one process, each with a device of its own. Steps are
// bit-exact, and the shard registers a partition buffer once per connection,
// not once per frame: over a NIC every registration is an ibv_reg_mr that
// pins the buffer's pages.
#include <memory>
#include <vector>

#include "absl/time/clock.h"
#include "gtest/gtest.h"
#include "ps/ps_testing.h"
#include "ps/shard.h"
#include "ps/slicer.h"
#include "ps/worker_client.h"
#include "rdma/verbs_emulation.h"
#include "transport/rdma_device.h"

namespace gradsync::ps {
namespace {

std::unique_ptr<transport::RdmaDevice> OpenDevice(const rdma::VerbsEmulation& emu) {
  transport::RdmaDeviceOptions o;
  o.verbs = &emu.verbs();
  o.max_in_flight = 8;
  auto d = transport::RdmaDevice::Open(o);
  EXPECT_TRUE(d.ok()) << d.status();
  return d.ok() ? std::move(*d) : nullptr;
}

TEST(PsOverRdma, StepsAreExactAndPartitionBuffersAreRegisteredOncePerConnection) {
  rdma::VerbsEmulation emu;
  auto shard_device = OpenDevice(emu);
  auto worker_device = OpenDevice(emu);
  ASSERT_NE(shard_device, nullptr);
  ASSERT_NE(worker_device, nullptr);

  PsShardOptions so;
  so.threads = 2;
  so.rdma_device = shard_device.get();
  auto shards = testing::StartShards(1, so);
  ASSERT_EQ(shards.size(), 1u);

  constexpr int kWorkers = 3;
  constexpr size_t kCount = 64 * 1024;           // f32: 256 KiB
  constexpr uint64_t kPartitionBytes = 32 << 10;  // 8 partitions per step
  constexpr int kPartitions = 8;
  std::vector<std::unique_ptr<PsWorker>> workers;
  for (int r = 0; r < kWorkers; ++r) {
    PsWorkerOptions o;
    o.job_id = "rdma-registrations";
    o.epoch = 1;
    o.shards = testing::Addresses(shards);
    o.device = worker_device.get();
    auto w = PsWorker::Create(o);
    ASSERT_TRUE(w.ok()) << w.status();
    workers.push_back(std::move(*w));
  }
  const BalancedSlicer slicer;
  uint64_t regs_before = 0;
  constexpr int kWarmup = 4, kMeasured = 10;
  for (int step = 1; step <= kWarmup + kMeasured; ++step) {
    if (step == kWarmup + 1) regs_before = emu.stats().reg_mr;
    std::vector<std::vector<char>> in(kWorkers), buf(kWorkers);
    for (int r = 0; r < kWorkers; ++r) {
      buf[r] = in[r] = testing::RandomData(DType::kF32, kCount, r, static_cast<uint32_t>(step));
    }
    const std::vector<char> want =
        testing::RankOrderReference(in, DType::kF32, ReduceOp::kSum, kCount);
    const std::vector<absl::Status> st =
        testing::RunRanks({0, 1, 2}, [&](int r) {
          return workers[r]->PushPull(step, buf[r].data(), kCount, DType::kF32, ReduceOp::kSum,
                                      kWorkers, r, kPartitionBytes, slicer,
                                      absl::Now() + absl::Seconds(20));
        });
    for (int r = 0; r < kWorkers; ++r) {
      ASSERT_TRUE(st[r].ok()) << "step " << step << " rank " << r << ": " << st[r];
      ASSERT_TRUE(buf[r] == want) << "step " << step << " rank " << r;
    }
  }
  // Steady state, per step: each worker registers its gradient buffer and
  // the header it sends (2 x workers); the shard receives each header into
  // memory of its own (workers), while pushes land in, and results leave
  // from, pooled buffers registered on each connection once (slack: the pool
  // growing by a buffer per partition and worker once). Registering every
  // result frame instead adds (workers - 1) x partitions per step.
  const uint64_t registered = emu.stats().reg_mr - regs_before;
  EXPECT_LE(registered, static_cast<uint64_t>(kMeasured * 3 * kWorkers + kWorkers * kPartitions))
      << "shard and workers registered " << registered << " regions in " << kMeasured
      << " steps of " << kWorkers << " workers x " << kPartitions << " partitions";
  EXPECT_EQ(shards[0]->stats().rdma_connections, static_cast<uint64_t>(kWorkers));
}

}  // namespace
}  // namespace gradsync::ps
