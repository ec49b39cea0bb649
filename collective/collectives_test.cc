// Every collective x every algorithm that implements it x world sizes x counts
// x dtypes x ops, over every transport device (real TCP sockets on loopback,
// the in-process device, and the RDMA device over the verbs emulation; one
// thread per rank), all compared bit-exact.
// What they do with injected faults: collective_faults_test.cc.
//
// How the expected values are made:
//   * Ring reductions (allreduce, reduce_scatter, reduce with "ring"): random
//     floats (RandomData), compared with references computed in the ring's
//     own reduction order (reference.h): allreduce chunk c from rank c,
//     reduce_scatter block c from rank c+1, reduce from rank root+1.
//   * rhd, rd and tree reductions: integer-valued inputs (IntegerValuedData),
//     for which every reduction order gives the same bits (also in f16/bf16
//     and for avg, which divides an exact sum once), compared with a
//     reference in rank order. Integer dtypes are full-range in both cases
//     (wrapping sum and prod do not depend on the order).
//   * Data movement (allgather, broadcast, alltoall, gather, scatter): random
//     data of the dtype; the bytes must arrive unchanged, and blocks a rank
//     does not own start as garbage so a missing write shows. gather's
//     non-root ranks and scatter's root must end exactly as they started
//     (garbage included): nothing may write there.
//   * reduce_scatter + allgather == allreduce: integer-valued inputs (the
//     algorithms reduce in different orders).
#include "collective/collectives.h"
#include "kernels/cpu_reduce.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <limits>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "collective/reducer.h"
#include "collective/reference.h"
#include "collective/test_cluster.h"
#include "gtest/gtest.h"

namespace gradsync {
namespace {

using testing::HostBuffer;
using testing::Cluster;
using testing::DeviceKind;
using testing::DeviceName;
using testing::IntegerValuedData;
using testing::MakeCluster;
using testing::RandomData;
using testing::RingOrderReduce;
using testing::RingOrderReference;
using testing::RunOnRanks;

constexpr int kWorlds[] = {1, 2, 3, 4, 5, 7, 8};
constexpr size_t kCounts[] = {0, 1, 7, 1023};
constexpr DType kDTypes[] = {DType::kF32, DType::kBF16, DType::kI32};
constexpr ReduceOp kOps[] = {ReduceOp::kSum, ReduceOp::kAvg, ReduceOp::kMax};

// One loopback cluster per world size, shared by every test, with per-rank
// scratch that is reused between ops (as the daemon does).
struct World {
  Cluster cluster;
  DeviceKind device = DeviceKind::kTcp;
  std::vector<std::unique_ptr<transport::Scratch>> scratch;
  uint64_t seq = 0;
};

class Worlds : public ::testing::Environment {
 public:
  static World& Get(int n, DeviceKind device = DeviceKind::kTcp) {
    auto& w = map()[{device, n}];
    if (w == nullptr) {
      w = std::make_unique<World>();
      w->cluster = MakeCluster(n, absl::StrCat("collectives-", n), device);
      w->device = device;
      w->scratch.reserve(n);
      for (int r = 0; r < n; ++r) w->scratch.push_back(std::make_unique<transport::Scratch>(
          testing::ScratchAllocatorFor(device)));
    }
    return *w;
  }
  void TearDown() override { map().clear(); }

 private:
  static std::map<std::pair<DeviceKind, int>, std::unique_ptr<World>>& map() {
    static auto* m = new std::map<std::pair<DeviceKind, int>, std::unique_ptr<World>>();
    return *m;
  }
};
[[maybe_unused]] ::testing::Environment* const kWorldsEnv =
    ::testing::AddGlobalTestEnvironment(new Worlds);

std::vector<Algorithm> AlgorithmsFor(CollectiveKind kind) {
  std::vector<Algorithm> out;
  for (Algorithm a : kAllAlgorithms) {
    if (Implements(a, kind)) out.push_back(a);
  }
  return out;
}

struct Case {
  CollectiveKind kind = CollectiveKind::kAllreduce;
  Algorithm algo = Algorithm::kRing;
  DType dtype = DType::kF32;
  ReduceOp op = ReduceOp::kSum;
  size_t count = 0;
  int root = 0;
  RingOptions ring;
};

std::string Describe(const Case& c, int n) {
  return absl::StrCat(AlgorithmName(c.algo), " ", CollectiveName(c.kind), " world ", n, " ",
                      DTypeName(c.dtype), "[", c.count, "] ", ReduceOpName(c.op), " root ", c.root);
}

std::vector<absl::Status> RunEverywhere(World& w, const Case& c, uint64_t seq,
                                        std::vector<std::vector<char>>& bufs) {
  const int n = w.cluster.size();
  return RunOnRanks(n, [&](int r) {
    CollectiveCall call;
    call.kind = c.kind;
    call.buffer = HostBuffer(bufs[r]);
    call.buffer.kind = testing::BufferKindFor(w.device);
    call.reducer = testing::ReducerFor(w.device);
    call.count = c.count;
    call.dtype = c.dtype;
    call.op = c.op;
    call.root = c.root;
    call.seq = seq;
    call.deadline = absl::Now() + absl::Seconds(30);
    call.ring = c.ring;
    return RunCollective(*w.cluster.contexts[r], call, c.algo, w.scratch[r].get());
  });
}

// Runs `c` on every rank of the world of `n` and checks every rank's result.
void RunAndCheck(int n, const Case& c, DeviceKind device = DeviceKind::kTcp) {
  World& w = Worlds::Get(n, device);
  ASSERT_EQ(w.cluster.size(), n);
  const uint64_t seq = ++w.seq;
  const size_t es = DTypeSize(c.dtype);
  const bool blocked = IsBlockedCollective(c.kind);
  const size_t elems = blocked ? n * c.count : c.count;
  const size_t block = c.count * es;
  const bool reducing = IsReducingCollective(c.kind);
  const bool ring_order = reducing && c.algo == Algorithm::kRing;
  std::vector<std::vector<char>> in(n), bufs(n);
  for (int r = 0; r < n; ++r) {
    in[r] = reducing && !ring_order
                ? IntegerValuedData(c.dtype, elems, r, static_cast<uint32_t>(seq), c.op)
                : RandomData(c.dtype, elems, r, static_cast<uint32_t>(seq));
    bufs[r] = in[r];
    if (c.kind == CollectiveKind::kAllgather || c.kind == CollectiveKind::kGather) {
      // only block r is valid on entry
      for (int j = 0; j < n; ++j) {
        if (j != r && block > 0) std::memset(bufs[r].data() + j * block, 0x5a, block);
      }
    }
    if ((c.kind == CollectiveKind::kBroadcast || c.kind == CollectiveKind::kScatter) &&
        r != c.root) {
      if (!bufs[r].empty()) std::memset(bufs[r].data(), 0x5a, bufs[r].size());
    }
  }
  const std::vector<std::vector<char>> before = bufs;
  const std::vector<absl::Status> st = RunEverywhere(w, c, seq, bufs);
  const std::string what = absl::StrCat(DeviceName(device), ": ", Describe(c, n));
  for (int r = 0; r < n; ++r) ASSERT_TRUE(st[r].ok()) << what << " rank " << r << ": " << st[r];

  for (int r = 0; r < n; ++r) {
    std::vector<char> want;
    size_t at = 0;  // bytes of bufs[r] compared: [at, at + want.size())
    switch (c.kind) {
      case CollectiveKind::kAllreduce:
        want = ring_order ? RingOrderReference(in, c.dtype, c.op, c.count)
                          : RingOrderReduce(in, c.dtype, c.op, 0, c.count, 0);
        break;
      case CollectiveKind::kReduceScatter:
        want =
            RingOrderReduce(in, c.dtype, c.op, r * c.count, c.count, ring_order ? (r + 1) % n : 0);
        at = r * block;
        break;
      case CollectiveKind::kAllgather:
        for (int j = 0; j < n; ++j) {
          want.insert(want.end(), in[j].begin() + j * block, in[j].begin() + (j + 1) * block);
        }
        break;
      case CollectiveKind::kBroadcast: want = in[c.root]; break;
      case CollectiveKind::kReduce:
        want = r != c.root ? in[r]
                           : RingOrderReduce(in, c.dtype, c.op, 0, c.count,
                                             ring_order ? (c.root + 1) % n : 0);
        break;
      case CollectiveKind::kAlltoall:
        for (int i = 0; i < n; ++i) {
          want.insert(want.end(), in[i].begin() + r * block, in[i].begin() + (r + 1) * block);
        }
        break;
      case CollectiveKind::kGather:
        want = before[r];
        if (r == c.root) {
          for (int j = 0; j < n; ++j) {
            std::copy(in[j].begin() + j * block, in[j].begin() + (j + 1) * block,
                      want.begin() + j * block);
          }
        }
        break;
      case CollectiveKind::kScatter:
        want = before[r];
        std::copy(in[c.root].begin() + r * block, in[c.root].begin() + (r + 1) * block,
                  want.begin() + r * block);
        break;
      case CollectiveKind::kBarrier: break;
      case CollectiveKind::kSend:
      case CollectiveKind::kRecv: FAIL() << "not a collective";
    }
    ASSERT_LE(at + want.size(), bufs[r].size());
    ASSERT_EQ(want.empty() ? 0 : std::memcmp(bufs[r].data() + at, want.data(), want.size()), 0)
        << what << ": rank " << r << " differs";
  }
}

// Sweeps every algorithm of `kind` over the worlds, counts, dtypes and ops
// (ops only for reducing collectives). Rooted collectives rotate the root.
void Sweep(CollectiveKind kind, const std::vector<DType>& dtypes, const std::vector<ReduceOp>& ops,
           const std::vector<size_t>& counts, const std::vector<int>& worlds,
           const RingOptions& ring = RingOptions{}, DeviceKind device = DeviceKind::kTcp) {
  const std::vector<ReduceOp> sum_only = {ReduceOp::kSum};
  for (Algorithm algo : AlgorithmsFor(kind)) {
    for (int n : worlds) {
      for (size_t count : counts) {
        for (DType t : dtypes) {
          if (algo == Algorithm::kOneShot &&
              CollectiveBufferBytes(kind, count, t, n) > kOneShotMaxBytes) {
            continue;  // refused (see OneShotRefusesBuffersAboveItsCap)
          }
          for (ReduceOp op : IsReducingCollective(kind) ? ops : sum_only) {
            Case c;
            c.kind = kind;
            c.algo = algo;
            c.dtype = t;
            c.op = op;
            c.count = count;
            c.root = IsRootedCollective(kind) ? static_cast<int>((count + 1) % n) : 0;
            c.ring = ring;
            ASSERT_NO_FATAL_FAILURE(RunAndCheck(n, c, device));
          }
        }
      }
    }
  }
}

// ... on every device.
void SweepMain(CollectiveKind kind) {
  for (DeviceKind device : testing::kAllDevices) {
    Sweep(kind, {std::begin(kDTypes), std::end(kDTypes)}, {std::begin(kOps), std::end(kOps)},
          {std::begin(kCounts), std::end(kCounts)}, {std::begin(kWorlds), std::end(kWorlds)},
          RingOptions{}, device);
  }
}

// Every dtype and op at two world sizes (one not a power of two).
void SweepAllTypes(CollectiveKind kind) {
  Sweep(kind, {std::begin(kAllDTypes), std::end(kAllDTypes)},
        {std::begin(kAllReduceOps), std::end(kAllReduceOps)}, {7, 1023}, {4, 5});
}

// Many pieces per message: small segments, a large count.
void SweepLarge(CollectiveKind kind) {
  RingOptions small;
  small.segment_bytes = 16 << 10;
  small.min_segment_bytes = 4 << 10;
  small.max_inflight = 3;
  Sweep(kind, {DType::kF32}, {ReduceOp::kAvg}, {100003}, {3, 8}, small);
  Sweep(kind, {DType::kBF16}, {ReduceOp::kSum}, {100003}, {5}, RingOptions{});
  Sweep(kind, {DType::kF32}, {ReduceOp::kSum}, {100003}, {4}, small, DeviceKind::kInProc);
  Sweep(kind, {DType::kF32}, {ReduceOp::kSum}, {100003}, {4}, small, DeviceKind::kRdma);
  Sweep(kind, {DType::kF32}, {ReduceOp::kSum}, {100003}, {4}, small, DeviceKind::kTcpStaged);
}

TEST(Collectives, AllreduceEveryAlgorithmIsBitExact) { SweepMain(CollectiveKind::kAllreduce); }
TEST(Collectives, ReduceScatterEveryAlgorithmIsBitExact) {
  SweepMain(CollectiveKind::kReduceScatter);
}
TEST(Collectives, AllgatherEveryAlgorithmIsBitExact) { SweepMain(CollectiveKind::kAllgather); }
TEST(Collectives, BroadcastEveryAlgorithmIsBitExact) { SweepMain(CollectiveKind::kBroadcast); }
TEST(Collectives, ReduceEveryAlgorithmIsBitExact) { SweepMain(CollectiveKind::kReduce); }
TEST(Collectives, AlltoallEveryAlgorithmIsBitExact) { SweepMain(CollectiveKind::kAlltoall); }
TEST(Collectives, GatherEveryAlgorithmIsBitExact) { SweepMain(CollectiveKind::kGather); }
TEST(Collectives, ScatterEveryAlgorithmIsBitExact) { SweepMain(CollectiveKind::kScatter); }

// gather and scatter to and from every root, several dtypes (on the
// in-process device and TCP).
TEST(Collectives, GatherAndScatterAtEveryRoot) {
  for (DeviceKind device : {DeviceKind::kInProc, DeviceKind::kTcp}) {
    for (CollectiveKind kind : {CollectiveKind::kGather, CollectiveKind::kScatter}) {
      for (int n : {2, 3, 4, 6}) {
        for (int root = 0; root < n; ++root) {
          for (DType t : {DType::kF32, DType::kF64, DType::kF16, DType::kU8, DType::kI64}) {
            Case c;
            c.kind = kind;
            c.algo = Algorithm::kPairwise;
            c.dtype = t;
            c.count = 5 + static_cast<size_t>(root);
            c.root = root;
            ASSERT_NO_FATAL_FAILURE(RunAndCheck(n, c, device));
          }
        }
      }
    }
  }
}

TEST(Collectives, EveryDtypeAndOpForEveryAlgorithm) {
  for (CollectiveKind kind : kAllCollectives) {
    if (kind == CollectiveKind::kBarrier) continue;
    ASSERT_NO_FATAL_FAILURE(SweepAllTypes(kind)) << CollectiveName(kind);
  }
}

TEST(Collectives, LargeCountsPipelineManyPieces) {
  for (CollectiveKind kind : kAllCollectives) {
    if (kind == CollectiveKind::kBarrier) continue;
    ASSERT_NO_FATAL_FAILURE(SweepLarge(kind)) << CollectiveName(kind);
  }
}

TEST(Collectives, BroadcastFromNonZeroRoot) {
  for (Algorithm algo : AlgorithmsFor(CollectiveKind::kBroadcast)) {
    for (auto [n, root] : {std::pair{5, 3}, {8, 7}, {7, 6}, {3, 1}}) {
      Case c;
      c.kind = CollectiveKind::kBroadcast;
      c.algo = algo;
      c.count = 1023;
      c.root = root;
      ASSERT_NO_FATAL_FAILURE(RunAndCheck(n, c));
    }
  }
}

// RunAndCheck already checks that non-root buffers come back unchanged; this
// runs root 3 at every world that has one, random floats for every op.
TEST(Collectives, ReduceToRoot3LeavesOtherBuffersUnchanged) {
  for (Algorithm algo : AlgorithmsFor(CollectiveKind::kReduce)) {
    for (int n : {4, 5, 7, 8}) {
      for (ReduceOp op : kAllReduceOps) {
        Case c;
        c.kind = CollectiveKind::kReduce;
        c.algo = algo;
        c.op = op;
        c.count = 1023;
        c.root = 3;
        ASSERT_NO_FATAL_FAILURE(RunAndCheck(n, c));
      }
    }
  }
}

TEST(Collectives, AlltoallAtWorldSizes3And5And8) {
  for (int n : {3, 5, 8}) {
    for (size_t count : {1ul, 7ul, 4099ul}) {
      Case c;
      c.kind = CollectiveKind::kAlltoall;
      c.algo = Algorithm::kPairwise;
      c.dtype = DType::kF64;
      c.count = count;
      ASSERT_NO_FATAL_FAILURE(RunAndCheck(n, c));
    }
  }
}

// reduce_scatter then allgather (any pair of algorithms) gives what allreduce
// gives on the whole n*count buffer. Integer-valued inputs: the algorithms
// reduce in different orders.
TEST(Collectives, ReduceScatterThenAllgatherEqualsAllreduce) {
  for (int n : {3, 4, 7}) {
    World& w = Worlds::Get(n);
    const size_t count = 1023, total = n * count;
    for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kAvg}) {
      for (Algorithm rs : AlgorithmsFor(CollectiveKind::kReduceScatter)) {
        for (Algorithm ag : AlgorithmsFor(CollectiveKind::kAllgather)) {
          const uint64_t seq = ++w.seq;
          std::vector<std::vector<char>> a(n), b(n);
          for (int r = 0; r < n; ++r) {
            a[r] = b[r] = IntegerValuedData(DType::kF32, total, r, static_cast<uint32_t>(seq), op);
          }
          Case c;
          c.dtype = DType::kF32;
          c.op = op;
          c.kind = CollectiveKind::kReduceScatter;
          c.algo = rs;
          c.count = count;
          for (const absl::Status& s : RunEverywhere(w, c, seq, a)) ASSERT_TRUE(s.ok()) << s;
          c.kind = CollectiveKind::kAllgather;
          c.algo = ag;
          for (const absl::Status& s : RunEverywhere(w, c, ++w.seq, a)) ASSERT_TRUE(s.ok()) << s;
          for (Algorithm ar : AlgorithmsFor(CollectiveKind::kAllreduce)) {
            std::vector<std::vector<char>> want = b;
            c.kind = CollectiveKind::kAllreduce;
            c.algo = ar;
            c.count = total;
            for (const absl::Status& s : RunEverywhere(w, c, ++w.seq, want)) {
              ASSERT_TRUE(s.ok()) << s;
            }
            c.count = count;
            for (int r = 0; r < n; ++r) {
              ASSERT_EQ(a[r], want[r])
                  << AlgorithmName(rs) << " reduce_scatter + " << AlgorithmName(ag)
                  << " allgather vs " << AlgorithmName(ar) << " allreduce, world " << n << " rank "
                  << r << " " << ReduceOpName(op);
            }
          }
        }
      }
    }
  }
}

TEST(Collectives, BarrierSucceedsAtEveryWorldSize) {
  for (Algorithm algo : AlgorithmsFor(CollectiveKind::kBarrier)) {
    for (int n : kWorlds) {
      for (int i = 0; i < 3; ++i) {
        Case c;
        c.kind = CollectiveKind::kBarrier;
        c.algo = algo;
        ASSERT_NO_FATAL_FAILURE(RunAndCheck(n, c));
      }
    }
  }
}

// A rank that enters late holds every other rank in the barrier: no rank
// leaves before the late one entered (exact: same clock), and the others
// waited most of the delay (loosely: 200 ms delay, 100 ms asserted).
TEST(Collectives, BarrierWaitsForTheLastRankToEnter) {
  using Clock = std::chrono::steady_clock;
  const int n = 5;
  World& w = Worlds::Get(n);
  for (Algorithm algo : AlgorithmsFor(CollectiveKind::kBarrier)) {
    for (int late : {0, 3}) {
      const uint64_t seq = ++w.seq;
      std::vector<Clock::time_point> enter(n), leave(n);
      const std::vector<absl::Status> st = RunOnRanks(n, [&](int r) {
        if (r == late) std::this_thread::sleep_for(std::chrono::milliseconds(200));
        CollectiveCall call;
        call.kind = CollectiveKind::kBarrier;
        call.seq = seq;
        call.deadline = absl::Now() + absl::Seconds(30);
        enter[r] = Clock::now();
        absl::Status s = RunCollective(*w.cluster.contexts[r], call, algo, w.scratch[r].get());
        leave[r] = Clock::now();
        return s;
      });
      for (int r = 0; r < n; ++r) {
        ASSERT_TRUE(st[r].ok()) << st[r];
        EXPECT_GE(leave[r], enter[late]) << AlgorithmName(algo) << " rank " << r;
        if (r != late) {
          EXPECT_GE(leave[r] - enter[r], std::chrono::milliseconds(100))
              << AlgorithmName(algo) << " rank " << r << " left early";
        }
      }
    }
  }
}

TEST(Collectives, OneShotRefusesBuffersAboveItsCap) {
  World& w = Worlds::Get(2);
  std::vector<char> buf(kOneShotMaxBytes + 4);
  CollectiveCall call;
  call.buffer = HostBuffer(buf);
  call.count = buf.size() / 4;
  call.seq = ++w.seq;
  absl::Status s = RunCollective(*w.cluster.contexts[0], call, Algorithm::kOneShot, w.scratch[0].get());
  EXPECT_TRUE(absl::IsInvalidArgument(s)) << s;
  EXPECT_EQ(s.message(), "oneshot allreduce of 65540 bytes: oneshot carries at most 65536 bytes per rank");
}

// oneshot combines left to right in rank order, (x0 OP x1) OP x2 ..., on every
// rank: random floats (NaN, signed zeros included) give identical bits
// everywhere, equal to that fold.
TEST(Collectives, OneShotFoldsInRankOrderOnEveryRank) {
  for (int n : {2, 3, 5}) {
    for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kMin, ReduceOp::kMax, ReduceOp::kAvg}) {
      World& w = Worlds::Get(n);
      const uint64_t seq = ++w.seq;
      const size_t count = 1029;
      std::vector<std::vector<char>> in(n), bufs(n);
      for (int r = 0; r < n; ++r) {
        in[r] = RandomData(DType::kF32, count, r, static_cast<uint32_t>(seq));
        float* f = reinterpret_cast<float*>(in[r].data());
        f[r] = r % 2 ? -0.0f : 0.0f;  // signed zeros meet
        if (r == 1) f[7] = std::numeric_limits<float>::quiet_NaN();
        bufs[r] = in[r];
      }
      Case c;
      c.algo = Algorithm::kOneShot;
      c.op = op;
      c.count = count;
      const std::vector<absl::Status> st = RunEverywhere(w, c, seq, bufs);
      std::vector<char> want = in[0];
      const ReduceOp combine = op == ReduceOp::kAvg ? ReduceOp::kSum : op;
      for (int r = 1; r < n; ++r) ReduceInto(DType::kF32, combine, want.data(), in[r].data(), count);
      if (op == ReduceOp::kAvg) DivideBy(DType::kF32, want.data(), count, n);
      for (int r = 0; r < n; ++r) {
        ASSERT_TRUE(st[r].ok()) << st[r];
        EXPECT_EQ(want.empty() ? 0 : std::memcmp(bufs[r].data(), want.data(), want.size()), 0)
            << "n " << n << " " << ReduceOpName(op) << " rank " << r;
      }
    }
  }
}

TEST(Collectives, RefusesUnimplementedPairsAndBadRootsBeforeMovingData) {
  const int n = 4;
  World& w = Worlds::Get(n);
  std::vector<float> buf(8);
  CollectiveCall call;
  call.buffer = HostBuffer(buf);
  call.count = 2;
  call.seq = ++w.seq;
  call.kind = CollectiveKind::kAllreduce;
  absl::Status s = RunCollective(*w.cluster.contexts[0], call, Algorithm::kPairwise, w.scratch[0].get());
  EXPECT_TRUE(absl::IsInvalidArgument(s)) << s;
  EXPECT_EQ(s.message(),
            "algorithm 'pairwise' does not implement allreduce (algorithms for allreduce: ring, "
            "rhd, rd, tree, oneshot)");
  call.kind = CollectiveKind::kBroadcast;
  call.root = 4;
  s = RunCollective(*w.cluster.contexts[0], call, Algorithm::kBinomialTree, w.scratch[0].get());
  EXPECT_TRUE(absl::IsInvalidArgument(s)) << s;
  EXPECT_NE(s.message().find("root 4 out of range for world size 4"), std::string::npos) << s;
  call.kind = CollectiveKind::kReduce;
  call.root = -1;
  s = RunCollective(*w.cluster.contexts[1], call, Algorithm::kRing, w.scratch[1].get());
  EXPECT_TRUE(absl::IsInvalidArgument(s)) << s;
  // allgather of 2 elements per rank at 4 ranks needs 32 bytes; 16 are there.
  call.kind = CollectiveKind::kAllgather;
  call.root = 0;
  call.buffer.size = 16;
  s = RunCollective(*w.cluster.contexts[1], call, Algorithm::kRing, w.scratch[1].get());
  EXPECT_TRUE(absl::IsInvalidArgument(s)) << s;
  EXPECT_EQ(s.message(), "allgather of 2 f32 elements at 4 ranks needs a buffer of 32 bytes; got 16");
  call.buffer = HostBuffer(buf);
  for (CollectiveKind kind : kAllCollectives) {
    for (Algorithm algo : kAllAlgorithms) {
      if (Implements(algo, kind)) continue;
      call.kind = kind;
      call.root = 0;
      s = RunCollective(*w.cluster.contexts[2], call, algo, w.scratch[2].get());
      EXPECT_TRUE(absl::IsInvalidArgument(s)) << s;
      EXPECT_NE(s.message().find(absl::StrCat("'", AlgorithmName(algo), "' does not implement ",
                                              CollectiveName(kind))),
                std::string::npos)
          << s;
    }
  }
  // Nothing moved: the streams are still aligned.
  Case c;
  c.count = 7;
  ASSERT_NO_FATAL_FAILURE(RunAndCheck(n, c));
}

// A rank that never shows up: the ranks waiting on it time out naming it.
TEST(Collectives, MissingRankTimesOutWithItsRankNamed) {
  struct Probe {
    CollectiveKind kind;
    Algorithm algo;
    int n;
    int waiter;  // a rank that waits on the missing (last) rank
  };
  for (const Probe& p :
       {Probe{CollectiveKind::kAllreduce, Algorithm::kRecursiveHalvingDoubling, 3, 1},
        Probe{CollectiveKind::kAllgather, Algorithm::kRecursiveDoubling, 4, 2},
        Probe{CollectiveKind::kReduce, Algorithm::kBinomialTree, 4, 2},
        Probe{CollectiveKind::kReduceScatter, Algorithm::kRing, 3, 0},
        Probe{CollectiveKind::kBarrier, Algorithm::kPairwise, 3, 1},
        Probe{CollectiveKind::kGather, Algorithm::kPairwise, 4, 0}}) {
   for (DeviceKind device : testing::kAllDevices) {
    Cluster c = MakeCluster(p.n, absl::StrCat("timeout-", AlgorithmName(p.algo)), device);
    const int missing = p.n - 1;
    std::vector<std::vector<float>> bufs(p.n, std::vector<float>(64 * p.n, 1.0f));
    std::vector<transport::Scratch> scratch(p.n);
    const std::vector<absl::Status> st = RunOnRanks(missing, [&](int r) {
      CollectiveCall call;
      call.kind = p.kind;
      call.buffer = HostBuffer(bufs[r]);
      call.count = 64;
      call.seq = 1;
      call.deadline = absl::Now() + absl::Milliseconds(300);
      return RunCollective(*c.contexts[r], call, p.algo, &scratch[r]);
    });
    const absl::Status& s = st[p.waiter];
    EXPECT_TRUE(absl::IsDeadlineExceeded(s)) << s;
    EXPECT_NE(s.message().find(absl::StrCat("rank ", missing)), std::string::npos)
        << AlgorithmName(p.algo) << " " << CollectiveName(p.kind) << ": " << s;
    EXPECT_NE(s.message().find(absl::StrCat("timed out at rank ", p.waiter)), std::string::npos)
        << DeviceName(device) << ": " << s;
   }
  }
}

// ZeRO runs reduce_scatter and allgather where DDP runs allreduce: the two
// ring halves together must cost what the ring allreduce costs (they are its
// two halves, same segments, same pipelining). Best of 3, loose bound.
TEST(Collectives, RingHalvesCostWhatRingAllreduceCosts) {
  const int n = 4;
  World& w = Worlds::Get(n);
  const size_t block = 1 << 20;  // 4 MiB of f32 per block, 16 MiB per rank
  std::vector<std::vector<char>> bufs(n, std::vector<char>(n * block * 4));
  auto time_of = [&](CollectiveKind kind, size_t count) {
    Case c;
    c.kind = kind;
    c.count = count;
    const absl::Time t0 = absl::Now();
    for (const absl::Status& s : RunEverywhere(w, c, ++w.seq, bufs)) EXPECT_TRUE(s.ok()) << s;
    return absl::Now() - t0;
  };
  absl::Duration allreduce = absl::InfiniteDuration(), halves = absl::InfiniteDuration();
  for (int i = 0; i < 3; ++i) {
    allreduce = std::min(allreduce, time_of(CollectiveKind::kAllreduce, n * block));
    halves = std::min(halves, time_of(CollectiveKind::kReduceScatter, block) +
                                  time_of(CollectiveKind::kAllgather, block));
  }
  EXPECT_LE(halves, allreduce * 1.5 + absl::Milliseconds(50))
      << "allreduce " << allreduce << ", reduce_scatter + allgather " << halves;
  std::printf("ring allreduce of 16 MiB on 4 ranks: %s; reduce_scatter + allgather: %s\n",
              absl::FormatDuration(allreduce).c_str(), absl::FormatDuration(halves).c_str());
}

}  // namespace
}  // namespace gradsync
