// What the collective algorithms do with faults the in-process device
// injects (transport/inproc.h): a lost peer, a truncated message, a slow
// peer. Every allreduce algorithm, 4 ranks, integer-valued inputs.
#include <cstring>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "collective/collectives.h"
#include "collective/reference.h"
#include "collective/test_cluster.h"
#include "gtest/gtest.h"
#include "transport/inproc.h"

namespace gradsync {
namespace {

using testing::Cluster;
using testing::DeviceKind;
using testing::IntegerValuedData;
using testing::MakeCluster;
using testing::RingOrderReduce;
using testing::RunOnRanks;

// Runs an allreduce of `count` f32 with `algo` on every rank of a fresh
// in-process cluster with `faults`; returns each rank's status, its buffer
// and how long it took.
struct FaultRun {
  std::vector<absl::Status> st;
  std::vector<std::vector<char>> in, out;
  std::vector<absl::Duration> took;
};
FaultRun RunWithFaults(int n, Algorithm algo, size_t count, const transport::InProcFaults& faults,
                       absl::Duration timeout = absl::Seconds(30)) {
  FaultRun run;
  Cluster c = MakeCluster(n, "faults", DeviceKind::kInProc, faults);
  run.in.resize(n);
  for (int r = 0; r < n; ++r) run.in[r] = IntegerValuedData(DType::kF32, count, r, 7, ReduceOp::kSum);
  run.out = run.in;
  run.took.resize(n);
  std::vector<transport::Scratch> scratch(n);
  RingOptions ring;
  ring.segment_bytes = 16 << 10;  // many messages per op
  ring.min_segment_bytes = 4 << 10;
  run.st = RunOnRanks(n, [&](int r) {
    CollectiveCall call;
    call.kind = CollectiveKind::kAllreduce;
    call.buffer = testing::HostBuffer(run.out[r]);
    call.count = count;
    call.seq = 1;
    call.deadline = absl::Now() + timeout;
    call.ring = ring;
    const absl::Time t0 = absl::Now();
    absl::Status s = RunCollective(*c.contexts[r], call, algo, &scratch[r]);
    run.took[r] = absl::Now() - t0;
    return s;
  });
  return run;
}

constexpr Algorithm kAllreduceAlgorithms[] = {
    Algorithm::kRing, Algorithm::kRecursiveHalvingDoubling, Algorithm::kRecursiveDoubling,
    Algorithm::kBinomialTree, Algorithm::kOneShot};

// A peer that vanishes mid-op: no rank waits for its deadline; the lost rank
// fails; a rank that already had every message it needed (oneshot's rank 0
// got rank 2's first and only message to it) may finish, with exact bits;
// the others fail, and the ones that noticed first name the lost rank.
TEST(CollectivesFaults, LostPeerFailsTheRanksThatNeedItWithoutWaitingForTheDeadline) {
  for (Algorithm algo : kAllreduceAlgorithms) {
    transport::InProcFaults f;
    f.lost_rank = 2;
    f.lost_after = 1;  // its second send never happens
    const size_t count = algo == Algorithm::kOneShot ? 4096 : 40000;
    FaultRun run = RunWithFaults(4, algo, count, f);
    const std::vector<char> want = RingOrderReduce(run.in, DType::kF32, ReduceOp::kSum, 0, count, 0);
    EXPECT_FALSE(run.st[2].ok()) << AlgorithmName(algo);
    int naming = 0, failed = 0;
    for (int r = 0; r < 4; ++r) {
      EXPECT_LT(run.took[r], absl::Seconds(10)) << AlgorithmName(algo) << " rank " << r;
      if (run.st[r].ok()) {
        EXPECT_EQ(std::memcmp(run.out[r].data(), want.data(), want.size()), 0)
            << AlgorithmName(algo) << ": rank " << r << " returned OK with wrong bits";
      } else {
        ++failed;
      }
      if (r != 2 && absl::StrContains(run.st[r].message(), "connection to rank 2 lost")) ++naming;
    }
    EXPECT_GE(naming, 1) << AlgorithmName(algo) << ": " << run.st[0] << " / " << run.st[1];
    EXPECT_GE(failed, 2) << AlgorithmName(algo);  // the lost rank and whoever waits on it
  }
}

// A message that arrives cut short is a protocol error, never a result: no
// rank returns OK with wrong bits, and some rank says which peer sent it.
TEST(CollectivesFaults, TruncatedMessageIsAProtocolErrorNotWrongData) {
  for (Algorithm algo : kAllreduceAlgorithms) {
    transport::InProcFaults f;
    f.truncate_rank = 1;
    f.truncate_at = 1;
    const size_t count = algo == Algorithm::kOneShot ? 4096 : 40000;
    FaultRun run = RunWithFaults(4, algo, count, f, absl::Seconds(5));
    const std::vector<char> want = RingOrderReduce(run.in, DType::kF32, ReduceOp::kSum, 0, count, 0);
    bool named = false;
    for (int r = 0; r < 4; ++r) {
      if (run.st[r].ok()) {
        EXPECT_EQ(std::memcmp(run.out[r].data(), want.data(), want.size()), 0)
            << AlgorithmName(algo) << ": rank " << r << " returned OK with wrong bits";
      }
      named = named || (absl::IsDataLoss(run.st[r]) &&
                        absl::StrContains(run.st[r].message(), "rank 1 sent"));
    }
    EXPECT_TRUE(named) << AlgorithmName(algo) << ": " << run.st[0] << " / " << run.st[2];
  }
}

// A slow peer delays the op, not its result.
TEST(CollectivesFaults, SlowPeerGivesTheSameBits) {
  for (Algorithm algo : kAllreduceAlgorithms) {
    transport::InProcFaults f;
    f.slow_rank = 3;
    f.slow_delay = absl::Milliseconds(20);
    const size_t count = algo == Algorithm::kOneShot ? 4096 : 40000;
    FaultRun run = RunWithFaults(4, algo, count, f);
    const std::vector<char> want = RingOrderReduce(run.in, DType::kF32, ReduceOp::kSum, 0, count, 0);
    for (int r = 0; r < 4; ++r) {
      ASSERT_TRUE(run.st[r].ok()) << AlgorithmName(algo) << " rank " << r << ": " << run.st[r];
      EXPECT_EQ(std::memcmp(run.out[r].data(), want.data(), want.size()), 0)
          << AlgorithmName(algo) << " rank " << r;
    }
    absl::Duration slowest;
    for (absl::Duration t : run.took) slowest = std::max(slowest, t);
    EXPECT_GE(slowest, absl::Milliseconds(20)) << AlgorithmName(algo);
  }
}

}  // namespace
}  // namespace gradsync
