// The top-k allreduce (sparse_allreduce.h) against a plain reference of its
// documented arithmetic - each rank's selection with its own residual
// (kernels/topk.h, checked there against an exact top-k), every message added
// into zeros in rank order, avg divided once - bit for bit, over several
// steps with kept state, for world sizes 1, 3 and 5, sum and avg, with and
// without momentum correction, over TCP, the in-process device and the RDMA
// emulation; every rank ends with the same bits; what does not apply is
// refused by name.
#include "collective/sparse_allreduce.h"

#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "absl/strings/str_cat.h"
#include "collective/test_cluster.h"
#include "gtest/gtest.h"
#include "kernels/cpu_reduce.h"
#include "kernels/topk.h"

namespace gradsync {
namespace {

using testing::Cluster;
using testing::DeviceKind;
using testing::MakeCluster;
using testing::RunOnRanks;

std::vector<float> Gradient(size_t n, int rank, uint32_t seed) {
  std::mt19937 rng(seed * 131 + static_cast<uint32_t>(rank));
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> v(n);
  for (float& x : v) x = normal(rng);
  return v;
}

struct Case {
  DeviceKind device;
  int world;
  size_t count;
  SparseSpec spec;
  ReduceOp op;
};

void RunSteps(const Case& k, int steps, uint64_t* seq) {
  Cluster c = MakeCluster(k.world, absl::StrCat("topk-", k.world, "-", *seq), k.device);
  const int n = k.world;
  std::vector<ErrorFeedback> state(n), reference(n);
  const size_t per = k.spec.K(k.count);
  for (int step = 0; step < steps; ++step) {
    std::vector<std::vector<float>> in(n), buf(n);
    for (int r = 0; r < n; ++r) buf[r] = in[r] = Gradient(k.count, r, static_cast<uint32_t>(*seq));
    // The reference.
    std::vector<SparseEntry> all(static_cast<size_t>(n) * per);
    TopkWork work;
    for (int r = 0; r < n; ++r) {
      SparsifyWithFeedback(in[r].data(), k.count, k.spec, &reference[r], all.data() + r * per,
                           &work);
    }
    std::vector<float> want(k.count, 0.0f);
    for (int r = 0; r < n; ++r) ScatterAdd(all.data() + r * per, per, want.data(), k.count);
    if (k.op == ReduceOp::kAvg) DivideBy(DType::kF32, want.data(), k.count, n);

    const std::vector<absl::Status> st = RunOnRanks(n, [&](int r) {
      transport::Scratch scratch;
      CollectiveCall call;
      call.buffer = testing::HostBuffer(buf[r]);
      call.count = k.count;
      call.op = k.op;
      call.seq = *seq;
      call.deadline = absl::Now() + absl::Seconds(60);
      call.sparse = SparseStage{k.spec, &state[r]};
      return RunCollective(*c.contexts[r], call, Algorithm::kRing, &scratch);
    });
    const std::string what =
        absl::StrCat(testing::DeviceName(k.device), " world ", n, " count ", k.count, " ",
                     k.spec.ToString(), " ", ReduceOpName(k.op), " step ", step);
    ++*seq;
    for (int r = 0; r < n; ++r) {
      ASSERT_TRUE(st[r].ok()) << what << " rank " << r << ": " << st[r];
      ASSERT_EQ(std::memcmp(buf[r].data(), want.data(), k.count * sizeof(float)), 0)
          << what << " rank " << r;
      ASSERT_EQ(state[r].residual, reference[r].residual) << what << " rank " << r;
      ASSERT_EQ(state[r].momentum, reference[r].momentum) << what << " rank " << r;
    }
  }
}

TEST(SparseAllreduce, BitExactAgainstTheReferenceWithKeptState) {
  uint64_t seq = 1;
  SparseSpec plain;
  plain.ratio_ppm = 10000;  // 1%
  SparseSpec momentum = plain;
  momentum.momentum_milli = 900;
  for (DeviceKind device : {DeviceKind::kTcp, DeviceKind::kInProc, DeviceKind::kRdma}) {
    for (int world : {1, 3, 5}) {
      for (size_t count : {size_t{4099}, size_t{250007}}) {  // exact, and sampled selection
        for (const SparseSpec& spec : {plain, momentum}) {
          for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kAvg}) {
            if (device != DeviceKind::kTcp && (count > 5000 || op == ReduceOp::kAvg)) continue;
            RunSteps({device, world, count, spec, op}, 3, &seq);
            if (::testing::Test::HasFatalFailure()) return;
          }
        }
      }
    }
  }
}

// Over many steps, what every rank sent plus what it still owes is what it
// was given: the allreduce's sum over steps plus the residuals' sum is the
// exact sum of all the gradients.
TEST(SparseAllreduce, NothingIsLostOverSteps) {
  const int n = 3;
  const size_t count = 20000;
  Cluster c = MakeCluster(n, "topk-sum", DeviceKind::kInProc);
  SparseSpec spec;
  spec.ratio_ppm = 50000;  // 5%
  std::vector<ErrorFeedback> state(n);
  std::vector<double> exact(count, 0), received(count, 0);
  for (uint64_t seq = 1; seq <= 40; ++seq) {
    std::vector<std::vector<float>> buf(n);
    for (int r = 0; r < n; ++r) {
      buf[r] = Gradient(count, r, static_cast<uint32_t>(seq) + 1000);
      for (size_t i = 0; i < count; ++i) exact[i] += buf[r][i];
    }
    const std::vector<absl::Status> st = RunOnRanks(n, [&](int r) {
      transport::Scratch scratch;
      CollectiveCall call;
      call.buffer = testing::HostBuffer(buf[r]);
      call.count = count;
      call.seq = seq;
      call.deadline = absl::Now() + absl::Seconds(60);
      call.sparse = SparseStage{spec, &state[r]};
      return RunCollective(*c.contexts[r], call, Algorithm::kRing, &scratch);
    });
    for (int r = 0; r < n; ++r) ASSERT_TRUE(st[r].ok()) << st[r];
    for (size_t i = 0; i < count; ++i) received[i] += buf[0][i];
  }
  double worst = 0, owed = 0;
  for (size_t i = 0; i < count; ++i) {
    double residual = 0;
    for (int r = 0; r < n; ++r) residual += state[r].residual[i];
    worst = std::max(worst, std::fabs(received[i] + residual - exact[i]));
    owed = std::max(owed, std::fabs(residual));
  }
  EXPECT_LT(worst, 1e-3);
  EXPECT_GT(owed, 0.1);  // something is still owed: the test can tell
}

TEST(SparseAllreduce, WhatDoesNotApplyIsRefusedByName) {
  auto check = [](CollectiveKind kind, DType dtype, ReduceOp op, transport::MemKind mem,
                  const char* want) {
    const absl::Status s = internal::CheckSparseApplies(kind, dtype, op, 100000, mem);
    ASSERT_FALSE(s.ok()) << want;
    EXPECT_NE(s.message().find(want), std::string::npos) << s;
    EXPECT_NE(s.message().find("codec 'topk'"), std::string::npos) << s;
  };
  const transport::MemKind host = transport::MemKind::Host();
  check(CollectiveKind::kReduceScatter, DType::kF32, ReduceOp::kSum, host, "allreduce only");
  check(CollectiveKind::kAllreduce, DType::kBF16, ReduceOp::kSum, host, "not bf16");
  check(CollectiveKind::kAllreduce, DType::kF32, ReduceOp::kMax, host, "not max");
  EXPECT_TRUE(internal::CheckSparseApplies(CollectiveKind::kAllreduce, DType::kF32,
                                           ReduceOp::kPremulSum, 1, host)
                  .ok());
}

}  // namespace
}  // namespace gradsync
