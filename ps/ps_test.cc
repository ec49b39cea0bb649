// End-to-end parameter-server steps over real sockets on 127.0.0.1:
// in-process PsShard instances, one thread per worker rank.
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "gtest/gtest.h"
#include "ps/ps_testing.h"
#include "ps/shard.h"
#include "ps/slicer.h"
#include "ps/worker_client.h"

namespace gradsync::ps {
namespace {

using testing::Addresses;
using testing::MakeWorkers;
using testing::RandomData;
using testing::RankOrderReference;
using testing::RunRanks;
using testing::StartShards;

std::vector<int> AllRanks(int n) {
  std::vector<int> r(n);
  for (int i = 0; i < n; ++i) r[i] = i;
  return r;
}

// One step on every worker; checks every worker's result bit for bit.
void StepAndCheck(std::vector<std::unique_ptr<PsWorker>>& workers, uint64_t step, DType t,
                  ReduceOp op, size_t count, uint64_t partition_bytes, uint32_t seed) {
  const int n = static_cast<int>(workers.size());
  std::vector<std::vector<char>> in(n), buf(n);
  for (int r = 0; r < n; ++r) buf[r] = in[r] = RandomData(t, count, r, seed);
  const std::vector<char> want = RankOrderReference(in, t, op, count);
  const BalancedSlicer slicer;
  const std::vector<absl::Status> st = RunRanks(AllRanks(n), [&](int r) {
    return workers[r]->PushPull(step, buf[r].data(), count, t, op, n, r, partition_bytes, slicer,
                                absl::Now() + absl::Seconds(20));
  });
  for (int r = 0; r < n; ++r) {
    const std::string what = absl::StrCat(
        "rank ", r, " of ", n, " workers, ", workers[r]->shards(), " shards, ", DTypeName(t), " ",
        ReduceOpName(op), " count ", count, " partition ", partition_bytes, " step ", step);
    ASSERT_TRUE(st[r].ok()) << what << ": " << st[r];
    ASSERT_TRUE(buf[r] == want) << what;
  }
}

TEST(Ps, BitExactForEveryWorkerAndShardCountSizeDtypeAndOp) {
  PsShardOptions so;
  so.threads = 3;
  for (int shards : {1, 2, 3}) {
    auto servers = StartShards(shards, so);
    for (int workers : {1, 2, 3, 5}) {
      auto w =
          MakeWorkers(workers, absl::StrCat("exact-", shards, "-", workers), Addresses(servers));
      uint64_t step = 1;
      // 12345 elements is no multiple of any partition size used here.
      for (size_t count : {0ul, 1ul, 7ul, 1023ul, 12345ul, 100003ul}) {
        for (DType t : {DType::kF32, DType::kBF16, DType::kI32}) {
          for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kAvg, ReduceOp::kMax}) {
            const uint64_t partition_bytes = count > 10000 ? 16000 : 1000;
            StepAndCheck(w, step, t, op, count, partition_bytes, static_cast<uint32_t>(step));
            ++step;
          }
        }
      }
    }
  }
}

TEST(Ps, BitExactForEveryDtypeAndOp) {
  auto servers = StartShards(2);
  auto w = MakeWorkers(3, "every-dtype", Addresses(servers));
  uint64_t step = 10;
  for (DType t : kAllDTypes) {
    for (ReduceOp op : kAllReduceOps) {
      StepAndCheck(w, step, t, op, 3001, 1000, static_cast<uint32_t>(step));
      ++step;
    }
  }
}

TEST(Ps, PartitionSizesThatAreNoMultipleOfTheElementAndTinyOnes) {
  auto servers = StartShards(3);
  auto w = MakeWorkers(2, "odd-partitions", Addresses(servers));
  uint64_t step = 1;
  // 1 byte: one element per partition; 1001 and 4099 bytes: rounded down to whole elements.
  for (uint64_t pb : {1ull, 1001ull, 4099ull}) {
    StepAndCheck(w, step++, DType::kF32, ReduceOp::kSum, 777, pb, 5);
    StepAndCheck(w, step++, DType::kF64, ReduceOp::kAvg, 777, pb, 6);
  }
}

TEST(Ps, LargeTensorWithFewInflightPartitionsAndBigPartitions) {
  PsShardOptions so;
  so.threads = 2;
  auto servers = StartShards(2, so);
  {
    auto w = MakeWorkers(3, "window-1", Addresses(servers), /*max_inflight=*/1);
    StepAndCheck(w, 1, DType::kF32, ReduceOp::kSum, 1 << 20, 64 << 10, 1);
  }
  {
    auto w = MakeWorkers(4, "big-partitions", Addresses(servers), /*max_inflight=*/2);
    StepAndCheck(w, 1, DType::kBF16, ReduceOp::kAvg, 3'000'017, 4 << 20, 2);
    StepAndCheck(w, 2, DType::kF32, ReduceOp::kSum, 3'000'017, 4 << 20, 3);
  }
}

TEST(Ps, ManyStepsReuseTheConnections) {
  auto servers = StartShards(2);
  auto w = MakeWorkers(3, "many-steps", Addresses(servers));
  for (uint64_t step = 1; step <= 50; ++step) {
    StepAndCheck(w, step, DType::kF32, ReduceOp::kSum, 5000, 4096, static_cast<uint32_t>(step));
  }
  for (const auto& worker : w) {
    EXPECT_EQ(worker->stats().connects, 2u);
    EXPECT_EQ(worker->stats().steps, 50u);
  }
  // A writer counts a result once its write returned, which may be after the
  // worker has read it.
  const absl::Time until = absl::Now() + absl::Seconds(5);
  while (servers[0]->stats().bytes_pulled < servers[0]->stats().bytes_pushed &&
         absl::Now() < until) {
    absl::SleepFor(absl::Milliseconds(1));
  }
  const PsShardStats st = servers[0]->stats();
  EXPECT_EQ(st.steps_completed, 50u);
  EXPECT_EQ(st.steps_failed, 0u);
  EXPECT_EQ(st.reserved_bytes, 0u);
  EXPECT_EQ(st.bytes_pushed, st.bytes_pulled);
}

TEST(Ps, TwoJobsShareTheShardsConcurrently) {
  auto servers = StartShards(2);
  const std::vector<HostPort> addrs = Addresses(servers);
  auto a = MakeWorkers(3, "job-a", addrs);
  auto b = MakeWorkers(2, "job-b", addrs);
  // Both jobs use the same step numbers, sizes and partitions at the same time.
  std::thread ta([&] {
    for (uint64_t step = 1; step <= 15; ++step) {
      StepAndCheck(a, step, DType::kF32, ReduceOp::kSum, 20011, 2048, static_cast<uint32_t>(step));
    }
  });
  std::thread tb([&] {
    for (uint64_t step = 1; step <= 15; ++step) {
      StepAndCheck(b, step, DType::kF32, ReduceOp::kSum, 20011, 2048,
                   static_cast<uint32_t>(step + 1000));
    }
  });
  ta.join();
  tb.join();
  EXPECT_EQ(servers[0]->stats().jobs, 2u);
  EXPECT_EQ(servers[0]->stats().steps_completed, 30u);
  // Per job (gradsync_ps_job_*): the same partitions from 3 and 2 workers.
  const absl::Time until = absl::Now() + absl::Seconds(5);
  while (servers[0]->stats().bytes_pulled < servers[0]->stats().bytes_pushed &&
         absl::Now() < until) {
    absl::SleepFor(absl::Milliseconds(1));
  }
  const PsShardStats st = servers[0]->stats();
  ASSERT_EQ(st.per_job.size(), 2u);
  const PsJobStats& ja = st.per_job[0];
  const PsJobStats& jb = st.per_job[1];
  EXPECT_EQ(ja.job, "job-a");
  EXPECT_EQ(jb.job, "job-b");
  EXPECT_EQ(ja.steps_completed, 15u);
  EXPECT_EQ(jb.steps_completed, 15u);
  EXPECT_EQ(ja.steps_failed + jb.steps_failed, 0u);
  EXPECT_GT(jb.bytes_pushed, 0u);
  EXPECT_EQ(ja.bytes_pushed * 2, jb.bytes_pushed * 3);
  EXPECT_EQ(ja.bytes_pushed + jb.bytes_pushed, st.bytes_pushed);
  EXPECT_EQ(ja.bytes_pulled, ja.bytes_pushed);
  EXPECT_EQ(jb.bytes_pulled, jb.bytes_pushed);
}

TEST(Ps, ShardsAreAssignedPerJobSoAServerCanBeShard0OfOneJobAndShard1OfAnother) {
  auto servers = StartShards(2);
  auto a = MakeWorkers(2, "order-a", Addresses(servers));
  std::vector<HostPort> reversed = Addresses(servers);
  std::swap(reversed[0], reversed[1]);
  auto b = MakeWorkers(2, "order-b", reversed);
  StepAndCheck(a, 1, DType::kI32, ReduceOp::kSum, 9999, 1000, 1);
  StepAndCheck(b, 1, DType::kI32, ReduceOp::kSum, 9999, 1000, 2);
}

}  // namespace
}  // namespace gradsync::ps
