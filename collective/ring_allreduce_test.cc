// Runs the ring over real TCP sockets on loopback: one thread per rank, each
// with its own data-plane listener, exactly as daemons connect.
#include "collective/ring_allreduce.h"

#include <cstring>
#include <random>
#include <thread>
#include <vector>

#include "collective/op_signature.h"
#include "collective/signature_exchange.h"
#include "collective/reference.h"
#include "collective/test_cluster.h"
#include "gtest/gtest.h"
#include "kernels/cpu_reduce.h"

namespace gradsync {
namespace {

using testing::HostBuffer;
using testing::Cluster;
using testing::MakeCluster;
using testing::RandomData;
using testing::RingOrderReference;

void RunAndCheck(Cluster& c, DType t, ReduceOp op, size_t count, uint64_t seq,
                 const RingOptions& ro) {
  const int n = static_cast<int>(c.contexts.size());
  std::vector<std::vector<char>> in(n), buf(n);
  for (int r = 0; r < n; ++r) buf[r] = in[r] = RandomData(t, count, r, static_cast<uint32_t>(seq));
  const std::vector<char> want = RingOrderReference(in, t, op, count);
  std::vector<std::thread> threads;
  std::vector<absl::Status> st(n);
  for (int r = 0; r < n; ++r) {
    threads.emplace_back([&, r] {
      transport::Scratch scratch;
      st[r] = RingAllreduce(*c.contexts[r], HostBuffer(buf[r]), count, t, op, seq,
                            absl::Now() + absl::Seconds(30), ro, &scratch);
    });
  }
  for (auto& th : threads) th.join();
  for (int r = 0; r < n; ++r) {
    ASSERT_TRUE(st[r].ok()) << st[r];
    ASSERT_EQ(want.empty() ? 0 : std::memcmp(buf[r].data(), want.data(), want.size()), 0)
        << "rank " << r << " world " << n << " " << DTypeName(t) << " " << ReduceOpName(op)
        << " count " << count;
  }
}

TEST(RingAllreduce, BitExactForEveryWorldSizeCountDtypeAndOp) {
  uint64_t seq = 1;
  for (int world : {1, 2, 3, 5}) {
    Cluster c = MakeCluster(world, "ring-test-" + std::to_string(world));
    for (size_t count : {0ul, 1ul, 7ul, 1023ul}) {
      for (DType t : kAllDTypes) {
        for (ReduceOp op : kAllReduceOps) {
          RunAndCheck(c, t, op, count, seq++, RingOptions{});
        }
      }
    }
  }
}

TEST(RingAllreduce, PipelinesManySegmentsOfLargeBuffers) {
  Cluster c = MakeCluster(4, "ring-large");
  RingOptions ro;
  ro.segment_bytes = 64 << 10;
  ro.min_segment_bytes = 4 << 10;
  ro.max_inflight = 3;
  RunAndCheck(c, DType::kF32, ReduceOp::kSum, 1000003, 1, ro);
  RunAndCheck(c, DType::kBF16, ReduceOp::kAvg, 1000003, 2, ro);
}

TEST(RingAllreduce, MismatchedSignaturesFailOnEveryRankNamingTheOddRank) {
  const int n = 4;
  Cluster c = MakeCluster(n, "sig-test");
  std::vector<absl::Status> st(n);
  std::vector<std::thread> threads;
  for (int r = 0; r < n; ++r) {
    threads.emplace_back([&, r] {
      OpSignature sig;
      sig.seq = 1;
      sig.name = "grad";
      sig.count = r == 2 ? 1000 : 1024;
      st[r] = CheckSignatures(*c.contexts[r], sig, SignaturePattern::kAllToAll, absl::Now() + absl::Seconds(10));
    });
  }
  for (auto& t : threads) t.join();
  for (int r = 0; r < n; ++r) {
    EXPECT_TRUE(absl::IsInvalidArgument(st[r])) << st[r];
    EXPECT_EQ(st[r].message(),
              "op 1 does not match across ranks: rank 2 submitted allreduce 'grad' f32[1000] sum, "
              "ranks 0,1,3 submitted allreduce 'grad' f32[1024] sum");
  }
  // The streams are still aligned: the next op works.
  RunAndCheck(c, DType::kF32, ReduceOp::kSum, 1023, 2, RingOptions{});
}

TEST(RingAllreduce, PeerThatNeverSubmitsTimesOutWithItsRankNamed) {
  Cluster c = MakeCluster(3, "timeout-test");
  std::vector<absl::Status> st(3);
  std::vector<std::thread> threads;
  for (int r = 0; r < 2; ++r) {  // rank 2 never shows up
    threads.emplace_back([&, r] {
      OpSignature sig;
      sig.seq = 1;
      sig.name = "g";
      sig.count = 8;
      st[r] = CheckSignatures(*c.contexts[r], sig, SignaturePattern::kAllToAll, absl::Now() + absl::Milliseconds(300));
    });
  }
  for (auto& t : threads) t.join();
  for (int r = 0; r < 2; ++r) {
    EXPECT_TRUE(absl::IsDeadlineExceeded(st[r])) << st[r];
    EXPECT_NE(st[r].message().find("waiting for rank(s) 2"), std::string::npos) << st[r];
  }
}

TEST(RingAllreduce, LostPeerFailsEveryOtherRankNamingIt) {
  const int n = 4;
  Cluster c = MakeCluster(n, "lost-peer");
  c.contexts[2].reset();  // rank 2's sockets close, as when its daemon dies
  std::vector<absl::Status> st(n);
  std::vector<std::thread> threads;
  const size_t count = 1 << 20;
  std::vector<std::vector<float>> bufs(n, std::vector<float>(count, 1.0f));
  for (int r : {0, 1, 3}) {
    threads.emplace_back([&, r] {
      transport::Scratch scratch;
      st[r] = RingAllreduce(*c.contexts[r], HostBuffer(bufs[r]), count, DType::kF32, ReduceOp::kSum, 1,
                            absl::Now() + absl::Seconds(10), RingOptions{}, &scratch);
    });
  }
  for (auto& t : threads) t.join();
  for (int r : {0, 1, 3}) {
    EXPECT_FALSE(st[r].ok());
    EXPECT_NE(st[r].message().find("rank 2"), std::string::npos) << "rank " << r << ": " << st[r];
  }
}

}  // namespace
}  // namespace gradsync
