// OpRunner with daemons as threads over the in-process transport: each
// daemon's runner runs op k of its local ranks (QueuedOps on private host
// memory) and every rank's buffer must hold the job's result, bit for bit.
#include "worker/op_runner.h"

#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "collective/plan_code.h"
#include "collective/test_cluster.h"
#include "common/clock.h"
#include "gtest/gtest.h"
#include "worker/device_staging.h"
#include "worker/session.h"
#include "worker/shm_segment.h"

namespace gradsync {
namespace {

// `ranks_of_node`: the job's ranks on each daemon.
JobPlacement Placement(const std::vector<std::vector<int>>& ranks_of_node, int node) {
  JobPlacement p;
  p.ranks_of_node = ranks_of_node;
  p.node_index = node;
  p.world = 0;
  for (const auto& r : ranks_of_node) p.world += static_cast<int>(r.size());
  p.node_of_rank.resize(p.world);
  for (int n = 0; n < static_cast<int>(ranks_of_node.size()); ++n) {
    for (int r : ranks_of_node[n]) p.node_of_rank[r] = n;
    p.node_names.push_back("daemon" + std::to_string(n) + ":1");
  }
  return p;
}

// One daemon: its runner and its ranks' ops.
struct Daemon {
  JobPlacement place;
  std::unique_ptr<DeviceStaging> staging;
  std::unique_ptr<OpRunner> runner;
  std::vector<std::shared_ptr<QueuedOp>> ops;  // by local index
  std::vector<int> arrived;                    // what the runner noted
  std::vector<std::string> phases;

  std::vector<QueuedOp*> op_ptrs() const {
    std::vector<QueuedOp*> v;
    for (const auto& op : ops) v.push_back(op.get());
    return v;
  }
  float* data(size_t i) const { return reinterpret_cast<float*>(ops[i]->data()); }
};

std::unique_ptr<Daemon> MakeDaemon(const std::vector<std::vector<int>>& ranks_of_node, int node,
                                   transport::Context* ctx) {
  auto d = std::make_unique<Daemon>();
  d->place = Placement(ranks_of_node, node);
  d->staging = std::make_unique<DeviceStaging>("job", d->place, RingOptions{}, ctx, false);
  OpRunnerOptions o;
  o.job_id = "job";
  o.epoch = 1;
  o.placement = d->place;
  Daemon* raw = d.get();
  o.note_arrived = [raw](int rank) { raw->arrived.push_back(rank); };
  o.set_phase = [raw](const std::string& phase) { raw->phases.push_back(phase); };
  d->runner = std::make_unique<OpRunner>(std::move(o), ctx, d->staging.get());
  return d;
}

// Op 1, an allreduce of `count` f32 on each of the daemon's ranks; rank r's
// element i is r + 1 + (i % 7) (sums of small integers: exact in f32).
void AddAllreduce(Daemon* d, uint64_t count, ReduceOp op, const std::string& forced = "",
                  uint64_t count_of_rank3 = 0) {
  for (int rank : d->place.local_ranks()) {
    auto q = std::make_shared<QueuedOp>();
    q->seq = 1;
    q->sig.seq = 1;
    q->sig.kind = CollectiveKind::kAllreduce;
    q->sig.dtype = DType::kF32;
    q->sig.op = op;
    q->sig.count = rank == 3 && count_of_rank3 != 0 ? count_of_rank3 : count;
    q->sig.name = "g";
    if (!forced.empty()) {
      q->sig.forced = *RequestedPlanCode(forced, CollectiveKind::kAllreduce, count * 4);
    }
    auto seg = ShmSegment::CreatePrivate("test", count * sizeof(float));
    EXPECT_TRUE(seg.ok()) << seg.status();
    q->buffer = std::move(*seg);
    float* f = reinterpret_cast<float*>(q->buffer->data());
    for (uint64_t i = 0; i < count; ++i) f[i] = static_cast<float>(rank + 1 + i % 7);
    q->started = FastNow();
    q->deadline = FastNow() + absl::Seconds(30);
    d->ops.push_back(q);
  }
}

// The sum over ranks 0..world-1 of element i.
float Sum(int world, uint64_t i) {
  float s = 0;
  for (int r = 0; r < world; ++r) s += static_cast<float>(r + 1 + i % 7);
  return s;
}

// Runs op 1 on every daemon of `cluster` at once.
std::vector<absl::Status> RunAll(std::vector<std::unique_ptr<Daemon>>& daemons,
                                 std::vector<OpRunner::Outcome>* outcomes) {
  outcomes->resize(daemons.size());
  return testing::RunOnRanks(static_cast<int>(daemons.size()), [&](int n) {
    return daemons[n]->runner->Run(daemons[n]->op_ptrs(), FastNow(), &(*outcomes)[n]);
  });
}

struct TwoByTwo : ::testing::Test {
  void SetUp() override {
    cluster = testing::MakeCluster(2, "op-runner", testing::DeviceKind::kInProc);
    ASSERT_EQ(cluster.size(), 2);
    for (int n = 0; n < 2; ++n) {
      daemons.push_back(MakeDaemon({{0, 1}, {2, 3}}, n, cluster.contexts[n].get()));
    }
  }
  void TearDown() override { daemons.clear(); }
  testing::Cluster cluster;
  std::vector<std::unique_ptr<Daemon>> daemons;
};

TEST_F(TwoByTwo, FusedAllreduceCarriesEachDaemonsPartialResult) {
  constexpr uint64_t kCount = 100;
  for (auto& d : daemons) AddAllreduce(d.get(), kCount, ReduceOp::kSum, "oneshot");
  std::vector<OpRunner::Outcome> outcomes;
  const std::vector<absl::Status> st = RunAll(daemons, &outcomes);
  for (int n = 0; n < 2; ++n) {
    ASSERT_TRUE(st[n].ok()) << "daemon " << n << ": " << st[n];
    // Shown as "hier" (ranks share daemons); fused: done with the exchange,
    // so it never entered a "running" phase.
    EXPECT_EQ(outcomes[n].plan_name, "hier");
    EXPECT_TRUE(daemons[n]->phases.empty()) << daemons[n]->phases[0];
    for (size_t j = 0; j < 2; ++j) {
      for (uint64_t i = 0; i < kCount; ++i) {
        ASSERT_EQ(daemons[n]->data(j)[i], Sum(4, i)) << "daemon " << n << " buffer " << j << " [" << i << "]";
      }
    }
    // The exchange told progress of the other daemon's ranks.
    const std::vector<int> other = n == 0 ? std::vector<int>{2, 3} : std::vector<int>{0, 1};
    for (int r : other) {
      EXPECT_NE(std::find(daemons[n]->arrived.begin(), daemons[n]->arrived.end(), r),
                daemons[n]->arrived.end())
          << "daemon " << n << " rank " << r;
    }
  }
}

TEST_F(TwoByTwo, FusedAverageDividesByTheRanksOnce) {
  constexpr uint64_t kCount = 64;
  for (auto& d : daemons) AddAllreduce(d.get(), kCount, ReduceOp::kAvg, "oneshot");
  std::vector<OpRunner::Outcome> outcomes;
  const std::vector<absl::Status> st = RunAll(daemons, &outcomes);
  for (int n = 0; n < 2; ++n) {
    ASSERT_TRUE(st[n].ok()) << st[n];
    EXPECT_TRUE(daemons[n]->phases.empty());  // fused
    for (size_t j = 0; j < 2; ++j) {
      for (uint64_t i = 0; i < kCount; ++i) {
        ASSERT_EQ(daemons[n]->data(j)[i], Sum(4, i) / 4) << "daemon " << n << " [" << i << "]";
      }
    }
  }
}

TEST_F(TwoByTwo, HierarchicalAllreduceOfALargeOp) {
  constexpr uint64_t kCount = 1 << 17;  // 512 KiB per rank
  for (auto& d : daemons) AddAllreduce(d.get(), kCount, ReduceOp::kSum, "hier");
  std::vector<OpRunner::Outcome> outcomes;
  const std::vector<absl::Status> st = RunAll(daemons, &outcomes);
  for (int n = 0; n < 2; ++n) {
    ASSERT_TRUE(st[n].ok()) << st[n];
    EXPECT_FALSE(outcomes[n].plan_name.empty());
    EXPECT_NE(std::find(daemons[n]->phases.begin(), daemons[n]->phases.end(),
                        "running " + outcomes[n].plan_name),
              daemons[n]->phases.end());
    for (size_t j = 0; j < 2; ++j) {
      for (uint64_t i = 0; i < kCount; ++i) {
        ASSERT_EQ(daemons[n]->data(j)[i], Sum(4, i)) << "daemon " << n << " [" << i << "]";
      }
    }
  }
}

TEST_F(TwoByTwo, AMismatchIsReportedAlikeOnEveryDaemonNamingTheRank) {
  for (auto& d : daemons) AddAllreduce(d.get(), 32, ReduceOp::kSum, "", /*count_of_rank3=*/16);
  std::vector<OpRunner::Outcome> outcomes;
  const std::vector<absl::Status> st = RunAll(daemons, &outcomes);
  for (int n = 0; n < 2; ++n) {
    EXPECT_EQ(st[n].code(), absl::StatusCode::kInvalidArgument) << st[n];
    EXPECT_TRUE(absl::StrContains(st[n].message(), "rank 3 submitted")) << st[n];
    EXPECT_TRUE(outcomes[n].plan_name.empty());
    // A mismatch fails only the op: the clients' buffers are as they were
    // (a fused op's partial result was combined in scratch).
    for (size_t j = 0; j < 2; ++j) {
      const int rank = daemons[n]->place.local_ranks()[j];
      EXPECT_EQ(daemons[n]->data(j)[5], static_cast<float>(rank + 1 + 5)) << "rank " << rank;
    }
  }
  EXPECT_EQ(st[0].message(), st[1].message());
}

TEST(OpRunnerInMemory, EveryRankHereRunsInMemory) {
  std::unique_ptr<Daemon> d = MakeDaemon({{0, 1, 2}}, 0, nullptr);
  AddAllreduce(d.get(), 1000, ReduceOp::kSum);
  OpRunner::Outcome out;
  ASSERT_TRUE(d->runner->Run(d->op_ptrs(), FastNow(), &out).ok());
  EXPECT_FALSE(out.plan_name.empty());
  for (size_t j = 0; j < 3; ++j) {
    for (uint64_t i = 0; i < 1000; ++i) ASSERT_EQ(d->data(j)[i], Sum(3, i)) << j << " " << i;
  }
}

TEST(OpRunnerInMemory, ALocalMismatchFailsOnlyTheOp) {
  std::unique_ptr<Daemon> d = MakeDaemon({{0, 1, 2, 3}}, 0, nullptr);
  AddAllreduce(d.get(), 32, ReduceOp::kSum, "", /*count_of_rank3=*/16);
  OpRunner::Outcome out;
  const absl::Status s = d->runner->Run(d->op_ptrs(), FastNow(), &out);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_TRUE(absl::StrContains(s.message(), "rank 3 submitted")) << s;
  // The buffers are as they were.
  for (size_t j = 0; j < 4; ++j) EXPECT_EQ(d->data(j)[5], static_cast<float>(j + 1 + 5));
}

}  // namespace
}  // namespace gradsync
