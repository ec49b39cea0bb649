// How the algorithms use memory: an op whose buffer comes with a cached
// registration registers nothing, the scratch is registered once and reused,
// and every exchange keeps to the device's posting bound however many
// pieces an op cuts its messages into. On the in-process device, which
// checks every region as an RDMA NIC checks keys.
#include <cstring>
#include <memory>
#include <vector>

#include "collective/collectives.h"
#include "collective/reference.h"
#include "collective/test_cluster.h"
#include "gtest/gtest.h"
#include "transport/inproc.h"
#include "transport/memory.h"

namespace gradsync {
namespace {

using testing::HostBuffer;
using testing::IntegerValuedData;
using testing::RingOrderReduce;
using testing::RunOnRanks;

struct InProcWorld {
  explicit InProcWorld(int n) : device(n), scratch(n), cache(n) {
    for (int r = 0; r < n; ++r) {
      transport::ContextSpec spec;
      spec.world_size = n;
      spec.rank = r;
      contexts.push_back(*device.CreateContext(spec));
    }
  }
  transport::InProcDevice device;
  std::vector<std::unique_ptr<transport::Context>> contexts;
  std::vector<transport::Scratch> scratch;
  std::vector<transport::RegistrationCache> cache;
};

// Runs `kind` with `algo` `ops` times on buffers that live across the ops
// (as a client's buffers do), each registered through the rank's cache.
void RunRepeatedly(InProcWorld& w, CollectiveKind kind, Algorithm algo, size_t count, int ops,
                   const RingOptions& ring, std::vector<std::vector<char>>* out,
                   std::vector<std::vector<char>>* in) {
  const int n = static_cast<int>(w.contexts.size());
  const size_t elems = IsBlockedCollective(kind) ? n * count : count;
  std::vector<std::shared_ptr<std::vector<char>>> bufs(n);
  for (int r = 0; r < n; ++r) bufs[r] = std::make_shared<std::vector<char>>();
  in->assign(n, {});
  for (int op = 1; op <= ops; ++op) {
    for (int r = 0; r < n; ++r) {
      (*in)[r] = IntegerValuedData(DType::kF32, elems, r, static_cast<uint32_t>(op), ReduceOp::kSum);
      if (bufs[r]->size() != (*in)[r].size()) bufs[r]->resize((*in)[r].size());
      std::memcpy(bufs[r]->data(), (*in)[r].data(), (*in)[r].size());
    }
    const std::vector<absl::Status> st = RunOnRanks(n, [&](int r) {
      CollectiveCall call;
      call.kind = kind;
      call.buffer = HostBuffer(*bufs[r]);
      auto region = w.cache[r].Get(*w.contexts[r], call.buffer, bufs[r]);
      if (!region.ok()) return region.status();
      call.region = *region;
      call.count = count;
      call.seq = static_cast<uint64_t>(op);
      call.deadline = absl::Now() + absl::Seconds(30);
      call.ring = ring;
      return RunCollective(*w.contexts[r], call, algo, &w.scratch[r]);
    });
    for (int r = 0; r < n; ++r) ASSERT_TRUE(st[r].ok()) << AlgorithmName(algo) << " rank " << r << ": " << st[r];
  }
  out->clear();
  for (int r = 0; r < n; ++r) out->push_back(*bufs[r]);
}

TEST(CollectiveMemory, RepeatedOpsRegisterNothingNew) {
  const int n = 4;
  RingOptions ring;
  ring.segment_bytes = 4 << 10;
  ring.min_segment_bytes = 1 << 10;
  for (Algorithm algo : {Algorithm::kRing, Algorithm::kRecursiveHalvingDoubling,
                         Algorithm::kRecursiveDoubling, Algorithm::kBinomialTree,
                         Algorithm::kOneShot}) {
    InProcWorld once(n), many(n);
    std::vector<std::vector<char>> out, in;
    RunRepeatedly(once, CollectiveKind::kAllreduce, algo, 3000, 1, ring, &out, &in);
    const uint64_t after_one = once.device.registrations();
    RunRepeatedly(many, CollectiveKind::kAllreduce, algo, 3000, 20, ring, &out, &in);
    // 20 ops cost the registrations of 1: the buffer once (cache), the scratch once.
    EXPECT_EQ(many.device.registrations(), after_one) << AlgorithmName(algo);
    EXPECT_LE(after_one, static_cast<uint64_t>(2 * n)) << AlgorithmName(algo);
    const std::vector<char> want = RingOrderReduce(in, DType::kF32, ReduceOp::kSum, 0, 3000, 0);
    for (int r = 0; r < n; ++r) {
      EXPECT_EQ(out[r], want) << AlgorithmName(algo) << " rank " << r;
    }
  }
}

// 64-byte pieces: every message of these ops is dozens of pieces, far past
// the in-process device's bound of 4 posted requests per peer. Integer-valued
// data, so every reduction order gives the same exact result.
TEST(CollectiveMemory, ExchangesKeepToTheDevicesPostingBound) {
  const int n = 3;
  RingOptions ring;
  ring.segment_bytes = 64;
  ring.min_segment_bytes = 64;
  const size_t count = 2000;
  for (Algorithm algo : {Algorithm::kRing, Algorithm::kRecursiveHalvingDoubling,
                         Algorithm::kRecursiveDoubling, Algorithm::kBinomialTree,
                         Algorithm::kOneShot}) {
    InProcWorld w(n);
    std::vector<std::vector<char>> out, in;
    RunRepeatedly(w, CollectiveKind::kAllreduce, algo, count, 2, ring, &out, &in);
    const std::vector<char> want = RingOrderReduce(in, DType::kF32, ReduceOp::kSum, 0, count, 0);
    for (int r = 0; r < n; ++r) EXPECT_EQ(out[r], want) << AlgorithmName(algo) << " rank " << r;
  }
  InProcWorld w(n);
  std::vector<std::vector<char>> out, in;
  RunRepeatedly(w, CollectiveKind::kAlltoall, Algorithm::kPairwise, count, 1, ring, &out, &in);
  const size_t block = count * sizeof(float);
  for (int i = 0; i < n; ++i) {
    for (int j = 0; j < n; ++j) {  // rank j's block i is rank i's block j
      EXPECT_EQ(std::memcmp(out[j].data() + i * block, in[i].data() + j * block, block), 0)
          << "alltoall rank " << j << " block " << i;
    }
  }
}

}  // namespace
}  // namespace gradsync
