// The daemon's hierarchical collectives (co-located ranks combined in memory,
// then one share per daemon across daemons) on device memory, as the device
// path runs them: the emulated GPU (host memory labelled cuda:0, a
// device-kind reducer and scratch) with every message staged through host
// blocks, compared byte for byte with the same ops on host memory over plain
// TCP. Also RunInMemory (every rank on one daemon) on device memory.
#include "collective/hierarchical.h"

#include <algorithm>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "collective/reference.h"
#include "collective/test_cluster.h"
#include "common/slice_pool.h"
#include "gtest/gtest.h"

namespace gradsync {
namespace {

using testing::DeviceKind;

// Ranks 0,1 on daemon 0; 2 on daemon 1; 3,4,5 on daemon 2.
JobPlacement Placement(int node) {
  JobPlacement p;
  p.world = 6;
  p.ranks_of_node = {{0, 1}, {2}, {3, 4, 5}};
  p.node_of_rank = {0, 0, 1, 2, 2, 2};
  p.node_names = {"a:1", "b:1", "c:1"};
  p.node_index = node;
  return p;
}

// Every rank's buffer after `kind` across the three daemons on `device`.
std::vector<std::vector<char>> RunEverywhere(DeviceKind device, CollectiveKind kind, DType dtype,
                                             ReduceOp op, size_t count, int root,
                                             Algorithm algo, uint64_t seq) {
  const size_t elems = IsBlockedCollective(kind) ? 6 * count : count;
  std::vector<std::vector<char>> bufs(6);
  for (int r = 0; r < 6; ++r) bufs[r] = testing::IntegerValuedData(dtype, elems, r, 7, op);
  testing::Cluster cluster = testing::MakeCluster(3, absl::StrCat("hier-", seq), device);
  EXPECT_EQ(cluster.size(), 3);
  std::vector<absl::Status> st = testing::RunOnRanks(3, [&](int node) {
    JobPlacement p = Placement(node);
    LocalCollective c{kind, dtype, op, count, root, {}};
    for (int r : p.local_ranks()) c.bufs.push_back(bufs[r].data());
    c.reducer = testing::ReducerFor(device);
    transport::Scratch scratch(testing::ScratchAllocatorFor(device));
    transport::Scratch algo_scratch(testing::ScratchAllocatorFor(device));
    RingOptions ring;
    ring.segment_bytes = 64 << 10;  // several segments per message
    return RunAcrossNodes(*cluster.contexts[node], p, c, algo, seq,
                          absl::Now() + absl::Seconds(30), ring, &scratch, &algo_scratch);
  });
  for (int n = 0; n < 3; ++n) {
    EXPECT_TRUE(st[n].ok()) << "daemon " << n << ": " << st[n];
    if (device != DeviceKind::kTcpStaged) continue;
    // The messages between daemons went through the staging blocks.
    auto* staged = dynamic_cast<transport::StagingContext*>(cluster.contexts[n].get());
    EXPECT_NE(staged, nullptr);
    if (staged == nullptr) continue;
    EXPECT_GT(staged->counters().staged_sends + staged->counters().staged_recvs, 0u)
        << "daemon " << n;
  }
  return bufs;
}

TEST(NodeCollectives, OnDeviceMemoryEveryCollectiveMatchesTheHostRunByteForByte) {
  const CollectiveKind kinds[] = {CollectiveKind::kAllreduce, CollectiveKind::kReduceScatter,
                                  CollectiveKind::kAllgather, CollectiveKind::kBroadcast,
                                  CollectiveKind::kReduce, CollectiveKind::kAlltoall};
  uint64_t seq = 1;
  for (CollectiveKind kind : kinds) {
    for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kAvg, ReduceOp::kMax}) {
      if (!IsReducingCollective(kind) && op != ReduceOp::kSum) continue;
      SCOPED_TRACE(absl::StrCat(CollectiveName(kind), " ", ReduceOpName(op)));
      const Algorithm algo =
          kind == CollectiveKind::kBroadcast || kind == CollectiveKind::kReduce
              ? Algorithm::kBinomialTree
              : Algorithm::kRing;
      const size_t count = 100003;
      const auto host = RunEverywhere(DeviceKind::kTcp, kind, DType::kF32, op, count, 4, algo, seq++);
      const auto device =
          RunEverywhere(DeviceKind::kTcpStaged, kind, DType::kF32, op, count, 4, algo, seq++);
      for (int r = 0; r < 6; ++r) EXPECT_TRUE(host[r] == device[r]) << "rank " << r;
    }
  }
}

TEST(NodeCollectives, EveryRankOnOneDaemonOnDeviceMemoryMatchesTheHostRun) {
  JobPlacement p;
  p.world = 4;
  p.ranks_of_node = {{0, 1, 2, 3}};
  p.node_of_rank = {0, 0, 0, 0};
  p.node_names = {"a:1"};
  for (DType t : {DType::kF32, DType::kBF16, DType::kI32}) {
    std::vector<std::vector<char>> out[2];
    for (int run = 0; run < 2; ++run) {
      const DeviceKind device = run == 0 ? DeviceKind::kTcp : DeviceKind::kTcpStaged;
      std::vector<std::vector<char>>& bufs = out[run];
      bufs.resize(4);
      for (int r = 0; r < 4; ++r) bufs[r] = testing::IntegerValuedData(t, 5000, r, 3, ReduceOp::kAvg);
      LocalCollective c{CollectiveKind::kAllreduce, t, ReduceOp::kAvg, 5000, 0, {}};
      for (auto& b : bufs) c.bufs.push_back(b.data());
      c.reducer = testing::ReducerFor(device);
      transport::Scratch scratch(testing::ScratchAllocatorFor(device));
      ASSERT_TRUE(RunInMemory(p, c, &scratch).ok());
    }
    for (int r = 0; r < 4; ++r) EXPECT_TRUE(out[0][r] == out[1][r]) << DTypeName(t) << " rank " << r;
  }
}

// The allreduce's local stages (also the PS path's): sliced on a pool or
// on one thread, every element combined in rank order, the same bytes.
TEST(NodeCollectives, LocalStagesGiveTheSameBytesSlicedOrNot) {
  constexpr size_t kCount = 10000;  // 40000 bytes of f32: ten slices of 4096
  SlicePool pool(3);
  std::vector<std::vector<char>> out[3];
  const Slicing slicings[3] = {Slicing{}, Slicing{&pool, 4096}, Slicing{&pool, 0}};
  for (int run = 0; run < 3; ++run) {
    std::vector<std::vector<char>>& bufs = out[run];
    bufs.resize(3);
    for (int r = 0; r < 3; ++r) {
      bufs[r] = testing::IntegerValuedData(DType::kF32, kCount, r, 5, ReduceOp::kAvg);
    }
    LocalCollective c{CollectiveKind::kAllreduce, DType::kF32, ReduceOp::kAvg, kCount, 0, {}};
    for (auto& b : bufs) c.bufs.push_back(b.data());
    ReduceLocalShare(c, slicings[run]);
    SpreadLocalResult(c, /*world=*/6, slicings[run]);
  }
  // The reference: ReduceInOrder, then the division and the copies.
  std::vector<std::vector<char>> want(3);
  for (int r = 0; r < 3; ++r) {
    want[r] = testing::IntegerValuedData(DType::kF32, kCount, r, 5, ReduceOp::kAvg);
  }
  ReduceInOrder(CpuReducer(), {want[0].data(), want[1].data(), want[2].data()}, kCount,
                DType::kF32, ReduceOp::kAvg, /*divide_by=*/6);
  for (int run = 0; run < 3; ++run) {
    for (int r = 0; r < 3; ++r) {
      EXPECT_TRUE(out[run][r] == want[0]) << "run " << run << " rank " << r;
    }
  }
}

// gather's and scatter's reference on a blocked buffer of `n` ranks:
// gather: the root's block j is rank j's block j, the others unchanged;
// scatter: rank r's block r is the root's block r, the rest unchanged.
std::vector<std::vector<char>> RootedReference(CollectiveKind kind,
                                               const std::vector<std::vector<char>>& in,
                                               size_t block, int root) {
  std::vector<std::vector<char>> want = in;
  const int n = static_cast<int>(in.size());
  for (int j = 0; j < n; ++j) {
    if (j == root) continue;
    if (kind == CollectiveKind::kGather) {
      std::copy(in[j].begin() + j * block, in[j].begin() + (j + 1) * block,
                want[root].begin() + j * block);
    } else {
      std::copy(in[root].begin() + j * block, in[root].begin() + (j + 1) * block,
                want[j].begin() + j * block);
    }
  }
  return want;
}

// Across the three daemons (2, 1 and 3 ranks), from every root, on host
// memory and on the staged device path: byte for byte the reference.
TEST(NodeCollectives, GatherAndScatterAcrossDaemonsFromEveryRoot) {
  uint64_t seq = 1000;
  for (CollectiveKind kind : {CollectiveKind::kGather, CollectiveKind::kScatter}) {
    for (DType t : {DType::kF32, DType::kBF16, DType::kI64}) {
      for (int root = 0; root < 6; ++root) {
        const size_t count = t == DType::kF32 ? 100003 : 37;
        std::vector<std::vector<char>> in(6);
        for (int r = 0; r < 6; ++r) in[r] = testing::IntegerValuedData(t, 6 * count, r, 7, ReduceOp::kSum);
        const auto want = RootedReference(kind, in, count * DTypeSize(t), root);
        for (DeviceKind device : {DeviceKind::kTcp, DeviceKind::kTcpStaged}) {
          if (device == DeviceKind::kTcpStaged && t != DType::kF32) continue;
          SCOPED_TRACE(absl::StrCat(CollectiveName(kind), " ", DTypeName(t), " root ", root, " ",
                                    testing::DeviceName(device)));
          const auto got = RunEverywhere(device, kind, t, ReduceOp::kSum, count, root,
                                         Algorithm::kPairwise, seq++);
          for (int r = 0; r < 6; ++r) EXPECT_TRUE(got[r] == want[r]) << "rank " << r;
        }
      }
    }
  }
}

// Every rank on one daemon: block copies between the root and the others.
TEST(NodeCollectives, GatherAndScatterInMemoryFromEveryRoot) {
  JobPlacement p;
  p.world = 4;
  p.ranks_of_node = {{0, 1, 2, 3}};
  p.node_of_rank = {0, 0, 0, 0};
  p.node_names = {"a:1"};
  const size_t count = 1001;
  for (CollectiveKind kind : {CollectiveKind::kGather, CollectiveKind::kScatter}) {
    for (DType t : {DType::kF32, DType::kF16, DType::kU8}) {
      for (int root = 0; root < 4; ++root) {
        std::vector<std::vector<char>> bufs(4);
        for (int r = 0; r < 4; ++r) bufs[r] = testing::IntegerValuedData(t, 4 * count, r, 9, ReduceOp::kSum);
        const auto want = RootedReference(kind, bufs, count * DTypeSize(t), root);
        LocalCollective c{kind, t, ReduceOp::kSum, count, root, {}};
        for (auto& b : bufs) c.bufs.push_back(b.data());
        transport::Scratch scratch;
        ASSERT_TRUE(RunInMemory(p, c, &scratch).ok());
        for (int r = 0; r < 4; ++r) {
          EXPECT_TRUE(bufs[r] == want[r])
              << CollectiveName(kind) << " " << DTypeName(t) << " root " << root << " rank " << r;
        }
      }
    }
  }
}

}  // namespace
}  // namespace gradsync
