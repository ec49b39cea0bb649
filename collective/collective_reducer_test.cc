// The algorithms reduce through the Reducer their CollectiveCall carries and
// check its memory kind against the buffer's and the scratch's.
#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "collective/collectives.h"
#include "collective/reducer.h"
#include "collective/reference.h"
#include "collective/test_cluster.h"
#include "gtest/gtest.h"
#include "kernels/cpu_reduce.h"
#include "transport/inproc.h"

namespace gradsync {
namespace {

using testing::Cluster;
using testing::DeviceKind;
using testing::HostBuffer;
using testing::IntegerValuedData;
using testing::MakeCluster;
using testing::RingOrderReduce;
using testing::RunOnRanks;

struct World {
  Cluster cluster;
  std::vector<transport::Scratch> scratch;
  uint64_t seq = 0;
};

// The algorithms reduce with the call's reducer: one that counts (and
// reduces on the CPU) sees every reducing algorithm's work, and the results
// stay exact. A buffer of another memory kind than the reducer's is refused
// naming both; the TCP and in-process devices refuse to register CUDA memory.
class CountingReducer final : public Reducer {
 public:
  transport::MemKind kind() const override { return transport::MemKind::Host(); }
  void Reduce(DType t, ReduceOp op, void* dst, const void* src, size_t count) const override {
    calls_.fetch_add(1);
    CpuReducer().Reduce(t, op, dst, src, count);
  }
  void Combine(DType t, ReduceOp op, void* dst, const void* a, const void* b,
               size_t count) const override {
    calls_.fetch_add(1);
    CpuReducer().Combine(t, op, dst, a, b, count);
  }
  void Divide(DType t, void* data, size_t count, int64_t divisor) const override {
    calls_.fetch_add(1);
    CpuReducer().Divide(t, data, count, divisor);
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
  int calls() const { return calls_.load(); }

 private:
  mutable std::atomic<int> calls_{0};
};


class CudaLabelledAllocator final : public transport::MemoryAllocator {
 public:
  transport::MemKind kind() const override { return transport::MemKind::Cuda(0); }
  absl::StatusOr<void*> Allocate(size_t bytes) const override {
    return transport::HostAllocator().Allocate(bytes);
  }
  void Free(void* ptr, size_t bytes) const override { transport::HostAllocator().Free(ptr, bytes); }
};

TEST(Collectives, AlgorithmsReduceWithTheCallsReducerAndCheckItsMemoryKind) {
  const int n = 4;
  World w;
  w.cluster = MakeCluster(n, "reducer", DeviceKind::kTcp);
  w.scratch = std::vector<transport::Scratch>(n);
  const size_t count = 1000;
  for (const auto& [kind, algo] : std::vector<std::pair<CollectiveKind, Algorithm>>{
           {CollectiveKind::kAllreduce, Algorithm::kRing},
           {CollectiveKind::kAllreduce, Algorithm::kRecursiveHalvingDoubling},
           {CollectiveKind::kAllreduce, Algorithm::kRecursiveDoubling},
           {CollectiveKind::kAllreduce, Algorithm::kBinomialTree},
           {CollectiveKind::kAllreduce, Algorithm::kOneShot},
           {CollectiveKind::kReduceScatter, Algorithm::kRing},
           {CollectiveKind::kReduce, Algorithm::kRing},
           {CollectiveKind::kReduce, Algorithm::kBinomialTree}}) {
    std::vector<CountingReducer> reducers(n);
    const uint64_t seq = ++w.seq;
    const size_t elems = IsBlockedCollective(kind) ? n * count : count;
    std::vector<std::vector<char>> in(n), bufs(n);
    for (int r = 0; r < n; ++r) {
      in[r] = IntegerValuedData(DType::kF32, elems, r, static_cast<uint32_t>(seq), ReduceOp::kAvg);
      bufs[r] = in[r];
    }
    const std::vector<absl::Status> st = RunOnRanks(n, [&](int r) {
      CollectiveCall call;
      call.kind = kind;
      call.buffer = HostBuffer(bufs[r]);
      call.count = count;
      call.op = ReduceOp::kAvg;
      call.seq = seq;
      call.deadline = absl::Now() + absl::Seconds(30);
      call.reducer = &reducers[r];
      return RunCollective(*w.cluster.contexts[r], call, algo, &w.scratch[r]);
    });
    int calls = 0;
    for (int r = 0; r < n; ++r) {
      ASSERT_TRUE(st[r].ok()) << AlgorithmName(algo) << " rank " << r << ": " << st[r];
      calls += reducers[r].calls();
    }
    EXPECT_GT(calls, 0) << AlgorithmName(algo) << " " << CollectiveName(kind);
    if (kind == CollectiveKind::kAllreduce) {
      const std::vector<char> want = RingOrderReduce(in, DType::kF32, ReduceOp::kAvg, 0, count, 0);
      for (int r = 0; r < n; ++r) {
        EXPECT_EQ(std::memcmp(bufs[r].data(), want.data(), want.size()), 0)
            << AlgorithmName(algo) << " rank " << r;
      }
    }
  }
  // Host memory labelled cuda:0: the checks refuse it before anything runs.
  std::vector<float> x(8, 1.0f);
  CollectiveCall call;
  call.buffer = HostBuffer(x);
  call.buffer.kind = transport::MemKind::Cuda(0);
  call.count = 8;
  absl::Status s = RunCollective(*w.cluster.contexts[0], call, Algorithm::kRing, &w.scratch[0]);
  EXPECT_TRUE(absl::IsInvalidArgument(s)) << s;
  EXPECT_EQ(s.message(), "allreduce: the buffer is cuda:0 memory, the reducer works on host memory");
  // Host memory that claims to be cuda:0 (the emulated device's reducer), to
  // reach the checks that follow the memory-kind ones without a GPU.
  const Reducer& cuda_reducer = *testing::ReducerFor(testing::DeviceKind::kTcpStaged);
  call.reducer = &cuda_reducer;
  s = RunCollective(*w.cluster.contexts[0], call, Algorithm::kRing, &w.scratch[0]);
  EXPECT_TRUE(absl::IsInvalidArgument(s)) << s;
  EXPECT_EQ(s.message(), "allreduce: the buffer is cuda:0 memory, the scratch is host memory");
  // With a reducer and scratch of its kind, the device refuses to register it.
  const CudaLabelledAllocator cuda_alloc;
  transport::Scratch cuda_scratch(cuda_alloc);
  transport::InProcDevice dev(2);
  transport::ContextSpec spec;
  spec.world_size = 2;
  auto c0 = dev.CreateContext(spec);
  ASSERT_TRUE(c0.ok());
  call.kind = CollectiveKind::kBroadcast;
  s = RunCollective(**c0, call, Algorithm::kRing, &cuda_scratch);
  EXPECT_TRUE(absl::IsFailedPrecondition(s)) << s;
  EXPECT_NE(s.message().find("cuda:0"), std::string::npos) << s;
}

}  // namespace
}  // namespace gradsync
