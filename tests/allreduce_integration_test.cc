// Real processes: one gradsync-coordinator and 8 gradsyncd on loopback; the
// test is the client of every rank. Results are compared bit-exact with the
// reference computed in the ring's own reduction order.
#include <algorithm>
#include <cstring>
#include <memory>
#include <vector>

#include "absl/strings/str_cat.h"
#include "cli/local_cluster.h"
#include "cli/expected.h"
#include "collective/reference.h"
#include "collective/stream_tuner.h"
#include "common/metrics_testing.h"
#include "gtest/gtest.h"
#include "tests/cluster_util.h"

namespace gradsync {
namespace {

using testing::OnEveryRank;
using testing::OpenJob;

using AllreduceIntegration = testing::SharedClusterTest<8>;

// Runs one allreduce on every rank of `job` and checks it against the
// reference (ring order: exact for ring, and for any algorithm with integer
// sums and maxima) and that `algorithm` ran ("" = the daemon's choice, which
// must be `want_algorithm`).
void CheckAllreduce(std::vector<testing::RankHandle>& job, DType t, ReduceOp op, size_t count,
                    uint32_t seed, const std::string& algorithm = "ring",
                    const std::string& want_algorithm = "ring") {
  const int n = static_cast<int>(job.size());
  std::vector<std::vector<char>> in(n);
  for (int r = 0; r < n; ++r) in[r] = testing::RandomData(t, count, r, seed);
  const std::vector<char> want = testing::RingOrderReference(in, t, op, count);
  std::vector<std::string> errors(n);
  OnEveryRank(n, [&](int r) {
    auto& s = *job[r].session;
    auto buf = s.AllocateBuffer(std::max<size_t>(1, in[r].size()));
    if (!buf.ok()) {
      errors[r] = std::string(buf.status().message());
      return;
    }
    if (!in[r].empty()) std::memcpy((*buf)->data(), in[r].data(), in[r].size());
    client::CollectiveSpec spec;
    spec.buffer = buf->get();
    spec.count = count;
    spec.dtype = t;
    spec.op = op;
    spec.name = absl::StrCat("t", seed);
    spec.algorithm = algorithm;
    auto res = s.Run(spec);
    if (!res.ok()) {
      errors[r] = std::string(res.status().message());
    } else if (res->algorithm != want_algorithm) {  // first: the reference is that algorithm's
      errors[r] = "unexpected algorithm " + res->algorithm;
    } else if (!want.empty() && std::memcmp((*buf)->data(), want.data(), want.size()) != 0) {
      errors[r] = "result differs from the reference";
    }
    (void)s.FreeBuffer(std::move(*buf));
  });
  for (int r = 0; r < n; ++r) {
    EXPECT_EQ(errors[r], "") << "rank " << r << " of " << n << ", " << DTypeName(t) << " "
                             << ReduceOpName(op) << " count " << count;
  }
}

TEST_F(AllreduceIntegration, BitExactAcrossWorldSizesAndCounts) {
  uint32_t seed = 1;
  for (int world : {1, 2, 3, 4, 5, 8}) {
    auto job = OpenJob(*cluster_, absl::StrCat("sizes-", world), testing::FirstN(world));
    ASSERT_TRUE(job.ok()) << job.status();
    for (size_t count : {0ul, 1ul, 7ul, 1023ul, 1000003ul}) {
      CheckAllreduce(*job, DType::kF32, ReduceOp::kSum, count, seed++);
    }
    for (auto& r : *job) EXPECT_TRUE(r.session->Close().ok());
  }
}

// With every rank on one host (the local cluster: 127.0.0.1), from 3 ranks
// every op's signatures travel by recursive doubling
// (DefaultSignaturePattern), and a small allreduce's data ride along: every
// rank gets the bits of that pattern's reduction order (random floats, so
// another order would show; 3 and 5 ranks fold in and out), a mismatch is
// named alike on every rank, and the job goes on.
TEST_F(AllreduceIntegration, SmallAllreducesRideOnRecursiveDoublingFromThreeRanks) {
  EXPECT_EQ(DefaultSignaturePattern(2, /*one_host=*/true), SignaturePattern::kAllToAll);
  const std::string expected_algo = "oneshot";
  uint32_t seed = 900;
  LocalCluster& cluster = *cluster_;
  for (int world : {3, 4, 5, 8}) {
    ASSERT_EQ(DefaultSignaturePattern(world, /*one_host=*/true),
              SignaturePattern::kRecursiveDoubling);
    auto job =
        OpenJob(cluster, absl::StrCat("rd-", expected_algo, "-", world), testing::FirstN(world));
    ASSERT_TRUE(job.ok()) << job.status();
    struct Case { DType t; ReduceOp op; size_t count; };
    for (const Case& c : {Case{DType::kF32, ReduceOp::kSum, 13}, Case{DType::kF64, ReduceOp::kAvg, 5},
                          Case{DType::kBF16, ReduceOp::kSum, 1000}, Case{DType::kF32, ReduceOp::kMin, 7}}) {
      std::vector<std::vector<char>> in(world);
      for (int r = 0; r < world; ++r) in[r] = testing::RandomData(c.t, c.count, r, seed);
      const std::vector<char> want = testing::SignaturePatternReference(
          SignaturePattern::kRecursiveDoubling, in, c.t, c.op, c.count);
      std::vector<std::string> errors(world);
      OnEveryRank(world, [&](int r) {
        auto& s = *(*job)[r].session;
        auto buf = s.AllocateBuffer(in[r].size());
        if (!buf.ok()) return void(errors[r] = std::string(buf.status().message()));
        if (!in[r].empty()) std::memcpy((*buf)->data(), in[r].data(), in[r].size());
        // Forced: the cost model's choice for a small op depends on the links it
        // measured (rd on a loaded machine); a forced oneshot is fused alike.
        client::CollectiveSpec spec;
        spec.buffer = buf->get();
        spec.count = c.count;
        spec.dtype = c.t;
        spec.op = c.op;
        spec.name = absl::StrCat("rd.", seed);
        spec.algorithm = expected_algo;
        auto res = s.Run(spec);
        if (!res.ok()) return void(errors[r] = std::string(res.status().message()));
        if (res->algorithm != expected_algo) errors[r] = "ran " + res->algorithm;
        if (!want.empty() && std::memcmp((*buf)->data(), want.data(), want.size()) != 0) {
          errors[r] += " wrong bits";
        }
        (void)s.FreeBuffer(std::move(*buf));
      });
      for (int r = 0; r < world; ++r) {
        EXPECT_EQ(errors[r], "") << expected_algo << " world " << world << " rank " << r << " "
                                 << DTypeName(c.t) << " " << ReduceOpName(c.op);
      }
      ++seed;
    }
    // Forcing oneshot above its size is refused with the limit.
    OnEveryRank(world, [&](int r) {
      auto& s = *(*job)[r].session;
      auto buf = s.AllocateBuffer(1 << 17);
      ASSERT_TRUE(buf.ok());
      client::CollectiveSpec spec;
      spec.buffer = buf->get();
      spec.count = 20000;  // 80000 bytes
      spec.algorithm = "oneshot";
      spec.name = "forced";
      auto res = s.Run(spec);
      EXPECT_TRUE(absl::IsInvalidArgument(res.status())) << res.status();
      EXPECT_NE(res.status().message().find("algorithm 'oneshot' carries at most 65536 bytes "
                                            "per rank; this op has 80000"),
                std::string::npos)
          << res.status();
    });
    // The last rank submits a different count.
    const int odd = world - 1;
    std::string others;
    for (int r = 0; r < odd; ++r) absl::StrAppend(&others, r == 0 ? "" : ",", r);
    std::vector<absl::Status> st(world);
    OnEveryRank(world, [&](int r) {
      auto& s = *(*job)[r].session;
      auto buf = s.AllocateBuffer(4096);
      ASSERT_TRUE(buf.ok());
      st[r] = s.Allreduce(**buf, 0, r == odd ? 10 : 16, DType::kF32, ReduceOp::kSum, "odd").status();
      for (int i = 0; i < 16; ++i) (*buf)->as<float>()[i] = 1;
      auto again = s.Allreduce(**buf, 0, 16, DType::kF32, ReduceOp::kSum, "odd");
      EXPECT_TRUE(again.ok()) << again.status();
      EXPECT_EQ((*buf)->as<float>()[15], static_cast<float>(world));
    });
    for (int r = 0; r < world; ++r) {
      EXPECT_TRUE(absl::IsInvalidArgument(st[r])) << st[r];
      EXPECT_NE(st[r].message().find(absl::StrCat(
                    "does not match across ranks: rank ", odd, " submitted allreduce 'odd' "
                    "f32[10] sum, ranks ", others, " submitted allreduce 'odd' f32[16] sum")),
                std::string::npos)
          << st[r];
    }
    for (auto& r : *job) EXPECT_TRUE(r.session->Close().ok());
  }
}

// Large ops carry a stream count proposal and rank 0's tuner may switch the
// job between one and both TCP streams from op to op
// (collective/stream_tuner.h); the results stay bit-exact whichever ran.
// The ops force ring (the tuner runs for forced algorithms too): which
// algorithm the cost model picks at 16 MiB depends on the links it measured
// (rhd on a loaded machine), and random floats are exact only against the
// reference of the algorithm that ran.
TEST_F(AllreduceIntegration, LargeOpsStayExactWhileTheStreamCountIsTuned) {
  auto job = OpenJob(*cluster_, "streams", testing::FirstN(4));
  ASSERT_TRUE(job.ok()) << job.status();
  const size_t count = StreamTuner::kMinBytes / 4 + 3;
  for (uint32_t i = 0; i < 4; ++i) {
    CheckAllreduce(*job, DType::kF32, ReduceOp::kSum, count, 700 + i);
    CheckAllreduce(*job, DType::kF32, ReduceOp::kSum, 262147, 800 + i);  // below the tuner's size
  }
}

TEST_F(AllreduceIntegration, EveryDtypeAndOpThroughTheDaemons) {
  auto job = OpenJob(*cluster_, "dtypes", {0, 3, 5});
  ASSERT_TRUE(job.ok()) << job.status();
  uint32_t seed = 100;
  for (DType t : kAllDTypes) {
    for (ReduceOp op : kAllReduceOps) CheckAllreduce(*job, t, op, 1023, seed++);
  }
}

TEST_F(AllreduceIntegration, ConcurrentJobsOnTheSameDaemonsKeepTheirDataApart) {
  // Two 4-rank jobs share daemons 0-3 (one in reverse rank order) and run at once.
  auto a = OpenJob(*cluster_, "concurrent-a", {0, 1, 2, 3});
  ASSERT_TRUE(a.ok()) << a.status();
  auto b = OpenJob(*cluster_, "concurrent-b", {3, 2, 1, 0});
  ASSERT_TRUE(b.ok()) << b.status();
  std::thread ta([&] {
    for (uint32_t i = 0; i < 5; ++i) CheckAllreduce(*a, DType::kF32, ReduceOp::kSum, 262147, 500 + i);
  });
  std::thread tb([&] {
    for (uint32_t i = 0; i < 5; ++i) CheckAllreduce(*b, DType::kI64, ReduceOp::kMax, 131075, 600 + i);
  });
  ta.join();
  tb.join();
}

// Two node-local jobs (every rank on one daemon) on the same daemon at once,
// each mixing small ops and large ones: every result exact, nothing mixed;
// the daemon combines the ranks in memory ("hier"). Integer sums and maxima
// give the same bits in any reduction order.
TEST_F(AllreduceIntegration, ConcurrentNodeLocalJobsKeepTheirDataApart) {
  auto a = OpenJob(*cluster_, "local-a", {5, 5, 5, 5});
  ASSERT_TRUE(a.ok()) << a.status();
  auto b = OpenJob(*cluster_, "local-b", {5, 5, 5});
  ASSERT_TRUE(b.ok()) << b.status();
  auto run = [](std::vector<testing::RankHandle>& job, DType t, ReduceOp op, uint32_t seed0) {
    for (uint32_t k = 0; k < 40; ++k) {
      const bool large = k % 8 == 7;  // every 8th op above 256 KiB
      const size_t count = large ? 100003 : 1 + k % 5;
      CheckAllreduce(job, t, op, count, seed0 + k, /*algorithm=*/"", /*want_algorithm=*/"hier");
    }
  };
  std::thread ta([&] { run(*a, DType::kI64, ReduceOp::kSum, 700); });
  std::thread tb([&] { run(*b, DType::kI32, ReduceOp::kMax, 800); });
  ta.join();
  tb.join();
  for (auto& r : *a) EXPECT_TRUE(r.session->Close().ok());
  for (auto& r : *b) EXPECT_TRUE(r.session->Close().ok());
}

// A node-local job whose clients reach the daemon over gRPC instead of the op
// queue (GRADSYNC_OP_CHANNEL=grpc): the results are the same.
TEST_F(AllreduceIntegration, NodeLocalJobOverTheGrpcChannel) {
  testing::ScopedEnv grpc("GRADSYNC_OP_CHANNEL", "grpc");
  auto job = OpenJob(*cluster_, "local-grpc", {5, 5, 5});
  ASSERT_TRUE(job.ok()) << job.status();
  for (uint32_t k = 0; k < 6; ++k) {
    const bool large = k % 2 == 1;
    CheckAllreduce(*job, DType::kI32, ReduceOp::kSum, large ? 100003 : 3, 900 + k, "",
                   "hier");
  }
  std::vector<std::string> errors(3);
  OnEveryRank(3, [&](int r) {
    auto& s = *(*job)[r].session;
    auto buf = s.AllocateBuffer(1024 * 4);
    if (!buf.ok()) return void(errors[r] = std::string(buf.status().message()));
    for (int i = 0; i < 1024; ++i) (*buf)->as<int32_t>()[i] = r == 2 ? i : -1;
    client::CollectiveSpec spec;
    spec.kind = CollectiveKind::kBroadcast;
    spec.buffer = buf->get();
    spec.count = 1024;
    spec.dtype = DType::kI32;
    spec.root = 2;
    spec.name = "bcast";
    auto res = s.Run(spec);
    if (!res.ok()) return void(errors[r] = std::string(res.status().message()));
    for (int i = 0; i < 1024; ++i) {
      if ((*buf)->as<int32_t>()[i] != i) return void(errors[r] = absl::StrCat("element ", i));
    }
  });
  for (int r = 0; r < 3; ++r) EXPECT_EQ(errors[r], "") << "rank " << r;
}

// Every collective with the cost model's choice and with every algorithm that
// implements it, through the daemons. Inputs are integer-valued, so every
// reduction order gives the same bits (cli/expected.h).
TEST_F(AllreduceIntegration, EveryCollectiveAndAlgorithmThroughTheDaemons) {
  const std::vector<std::pair<CollectiveKind, std::vector<std::string>>> table = {
      {CollectiveKind::kAllreduce, {"", "ring", "rhd", "rd", "tree", "oneshot"}},
      {CollectiveKind::kReduceScatter, {"", "ring", "rhd"}},
      {CollectiveKind::kAllgather, {"", "ring", "rhd", "rd"}},
      {CollectiveKind::kBroadcast, {"", "ring", "tree"}},
      {CollectiveKind::kReduce, {"", "ring", "tree"}},
      {CollectiveKind::kAlltoall, {"", "pairwise"}},
      {CollectiveKind::kBarrier, {"", "rd", "tree", "pairwise", "oneshot"}},
  };
  for (int world : {3, 4}) {
    std::vector<int> daemons = world == 3 ? std::vector<int>{7, 2, 5} : testing::FirstN(4);
    auto job = OpenJob(*cluster_, absl::StrCat("every-", world), daemons);
    ASSERT_TRUE(job.ok()) << job.status();
    for (const auto& [kind, algos] : table) {
      for (const std::string& algo : algos) {
        for (uint64_t count : {uint64_t{0}, uint64_t{1}, uint64_t{1023}, uint64_t{65537}}) {
          if (kind == CollectiveKind::kBarrier && count > 0) continue;
          const int root = world - 1;
          std::vector<std::string> errors(world);
          OnEveryRank(world, [&](int r) {
            auto& s = *(*job)[r].session;
            const uint64_t elems = BufferElements(kind, world, count);
            auto buf = s.AllocateBuffer(std::max<uint64_t>(1, elems * 4));
            if (!buf.ok()) return void(errors[r] = std::string(buf.status().message()));
            char* data = static_cast<char*>((*buf)->data());
            FillInput(kind, DType::kF32, r, world, count, data);
            client::CollectiveSpec spec;
            spec.kind = kind;
            spec.buffer = buf->get();
            spec.count = count;
            spec.op = ReduceOp::kSum;
            spec.root = root;
            spec.algorithm = algo;
            spec.name = absl::StrCat(CollectiveName(kind), ".", algo, ".", count);
            auto res = s.Run(spec);
            if (algo == "oneshot" && elems * 4 > 65536) {  // above oneshot's cap: refused
              const std::string want = absl::StrCat(
                  "algorithm 'oneshot' carries at most 65536 bytes per rank; this op has ",
                  elems * 4);
              if (res.ok() || !absl::IsInvalidArgument(res.status()) ||
                  res.status().message().find(want) == std::string::npos) {
                errors[r] = absl::StrCat("expected a refusal containing \"", want, "\", got ",
                                         res.status().ToString());
              }
              return;
            }
            if (!res.ok()) return void(errors[r] = std::string(res.status().message()));
            if (!algo.empty() && res->algorithm != algo) {
              errors[r] = absl::StrCat("ran ", res->algorithm, " instead of ", algo);
            }
            const uint64_t wrong =
                CountWrong(kind, DType::kF32, ReduceOp::kSum, root, r, world, count, data);
            if (wrong > 0) errors[r] = absl::StrCat(wrong, " wrong elements");
            (void)s.FreeBuffer(std::move(*buf));
          });
          for (int r = 0; r < world; ++r) {
            EXPECT_EQ(errors[r], "") << CollectiveName(kind) << " algo '" << algo << "' world "
                                     << world << " count " << count << " rank " << r;
          }
        }
      }
    }
  }
}

// Every collective where ranks share daemons: every rank here (in memory),
// two daemons of two ranks, and ranks interleaved over two daemons (5 ranks,
// 3 and 2). The daemon combines its ranks in memory and carries one share per
// daemon between them ("hier"), for whatever algorithm was asked; every
// result is bit-exact (integer-valued inputs), for every root.
TEST_F(AllreduceIntegration, EveryCollectiveWhereRanksShareDaemons) {
  const std::vector<std::vector<int>> layouts = {{6, 6, 6}, {0, 0, 1, 1}, {2, 1, 2, 1, 2}};
  const std::vector<std::pair<CollectiveKind, std::string>> table = {
      {CollectiveKind::kAllreduce, ""},      {CollectiveKind::kAllreduce, "rd"},
      {CollectiveKind::kReduceScatter, ""},  {CollectiveKind::kReduceScatter, "rhd"},
      {CollectiveKind::kAllgather, ""},      {CollectiveKind::kBroadcast, ""},
      {CollectiveKind::kBroadcast, "tree"},  {CollectiveKind::kReduce, ""},
      {CollectiveKind::kReduce, "tree"},     {CollectiveKind::kAlltoall, ""},
      {CollectiveKind::kBarrier, ""},
  };
  int job_no = 0;
  for (const auto& daemons : layouts) {
    const int world = static_cast<int>(daemons.size());
    auto job = OpenJob(*cluster_, absl::StrCat("shared-", job_no++), daemons);
    ASSERT_TRUE(job.ok()) << job.status();
    for (const auto& [kind, algo] : table) {
      for (uint64_t count : {uint64_t{0}, uint64_t{1}, uint64_t{1023}, uint64_t{65537}}) {
        if (kind == CollectiveKind::kBarrier && count > 0) continue;
        for (int root : {0, world - 1}) {
          if (!IsRootedCollective(kind) && root != 0) continue;
          for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kMax}) {
            if (!IsReducingCollective(kind) && op != ReduceOp::kSum) continue;
            std::vector<std::string> errors(world);
            OnEveryRank(world, [&](int r) {
              auto& s = *(*job)[r].session;
              const uint64_t elems = BufferElements(kind, world, count);
              auto buf = s.AllocateBuffer(std::max<uint64_t>(1, elems * 4));
              if (!buf.ok()) return void(errors[r] = std::string(buf.status().message()));
              char* data = static_cast<char*>((*buf)->data());
              FillInput(kind, DType::kF32, r, world, count, data);
              client::CollectiveSpec spec;
              spec.kind = kind;
              spec.buffer = buf->get();
              spec.count = count;
              spec.op = op;
              spec.root = root;
              spec.algorithm = algo;
              spec.name = absl::StrCat(CollectiveName(kind), ".", algo, ".", count);
              auto res = s.Run(spec);
              if (!res.ok()) return void(errors[r] = std::string(res.status().message()));
              if (res->algorithm != "hier") errors[r] = absl::StrCat("ran ", res->algorithm);
              const uint64_t wrong = CountWrong(kind, DType::kF32, op, root, r, world, count, data);
              if (wrong > 0) errors[r] = absl::StrCat(wrong, " wrong elements");
              (void)s.FreeBuffer(std::move(*buf));
            });
            for (int r = 0; r < world; ++r) {
              EXPECT_EQ(errors[r], "") << "layout " << job_no - 1 << " " << CollectiveName(kind)
                                       << " algo '" << algo << "' " << ReduceOpName(op)
                                       << " root " << root << " count " << count << " rank " << r;
            }
          }
        }
      }
    }
    for (auto& r : *job) EXPECT_TRUE(r.session->Close().ok());
  }
}

// Several ranks per daemon: allreduce takes the hierarchical path (local
// reduction in shared memory, one rank per daemon on the network) and must
// give the same bits as any flat algorithm (integer-valued inputs).
TEST_F(AllreduceIntegration, RanksSharingADaemonUseTheHierarchicalPath) {
  const std::vector<std::vector<int>> layouts = {{6, 6, 6, 6}, {0, 0, 1, 1}, {2, 1, 2, 1, 2}};
  int job_no = 0;
  for (const auto& daemons : layouts) {
    const int world = static_cast<int>(daemons.size());
    auto job = OpenJob(*cluster_, absl::StrCat("hier-", job_no++), daemons);
    ASSERT_TRUE(job.ok()) << job.status();
    struct Case { DType t; ReduceOp op; std::string algo; CollectiveKind kind; };
    const std::vector<Case> cases = {
        {DType::kF32, ReduceOp::kSum, "", CollectiveKind::kAllreduce},
        {DType::kF32, ReduceOp::kAvg, "", CollectiveKind::kAllreduce},
        {DType::kI32, ReduceOp::kMax, "hier", CollectiveKind::kAllreduce},
        {DType::kBF16, ReduceOp::kSum, "ring", CollectiveKind::kAllreduce},
        {DType::kF32, ReduceOp::kSum, "", CollectiveKind::kReduceScatter},
    };
    for (const Case& c : cases) {
      for (uint64_t count : {uint64_t{0}, uint64_t{1}, uint64_t{1023}, uint64_t{100003}, uint64_t{1000003}}) {
        std::vector<std::string> errors(world);
        OnEveryRank(world, [&](int r) {
          auto& s = *(*job)[r].session;
          const uint64_t elems = BufferElements(c.kind, world, count);
          auto buf = s.AllocateBuffer(std::max<uint64_t>(1, elems * DTypeSize(c.t)));
          if (!buf.ok()) return void(errors[r] = std::string(buf.status().message()));
          char* data = static_cast<char*>((*buf)->data());
          FillInput(c.kind, c.t, r, world, count, data);
          client::CollectiveSpec spec;
          spec.kind = c.kind;
          spec.buffer = buf->get();
          spec.count = count;
          spec.dtype = c.t;
          spec.op = c.op;
          spec.algorithm = c.algo;
          spec.name = absl::StrCat("h.", count);
          auto res = s.Run(spec);
          if (!res.ok()) return void(errors[r] = std::string(res.status().message()));
          // Ranks share daemons: an allreduce combines them in memory
          // whatever algorithm runs between the daemons.
          const std::string want_algo = c.kind != CollectiveKind::kAllreduce ? "" : "hier";
          if (!want_algo.empty() && res->algorithm != want_algo) {
            errors[r] = absl::StrCat("ran ", res->algorithm, " instead of ", want_algo);
          }
          const uint64_t wrong = CountWrong(c.kind, c.t, c.op, 0, r, world, count, data);
          if (wrong > 0) errors[r] = absl::StrCat(wrong, " wrong elements");
          (void)s.FreeBuffer(std::move(*buf));
        });
        for (int r = 0; r < world; ++r) {
          EXPECT_EQ(errors[r], "") << "layout " << job_no - 1 << " " << DTypeName(c.t) << " "
                                   << ReduceOpName(c.op) << " algo '" << c.algo << "' "
                                   << CollectiveName(c.kind) << " count " << count << " rank " << r;
        }
      }
    }
  }
}

TEST_F(AllreduceIntegration, MismatchAmongRanksOfOneDaemonNamesTheRanks) {
  auto job = OpenJob(*cluster_, "local-mismatch", {5, 5, 5});
  ASSERT_TRUE(job.ok()) << job.status();
  std::vector<absl::Status> st(3);
  OnEveryRank(3, [&](int r) {
    auto& s = *(*job)[r].session;
    auto buf = s.AllocateBuffer(64 * sizeof(float));
    ASSERT_TRUE(buf.ok());
    st[r] = s.Allreduce(**buf, 0, r == 1 ? 60 : 64, DType::kF32, ReduceOp::kSum, "w").status();
  });
  for (int r = 0; r < 3; ++r) {
    EXPECT_TRUE(absl::IsInvalidArgument(st[r])) << st[r];
    EXPECT_EQ(st[r].message(),
              "op 1 does not match across ranks: rank 1 submitted allreduce 'w' f32[60] sum, "
              "ranks 0,2 submitted allreduce 'w' f32[64] sum");
  }
}

// Ranks on two daemons of two ranks each, one of which submits another op:
// the daemons exchange every rank's signature, so all four name the ranks
// and both signatures alike; the job goes on.
TEST_F(AllreduceIntegration, MismatchAcrossDaemonsHostingSeveralRanksNamesTheRanks) {
  auto job = OpenJob(*cluster_, "shared-mismatch", {0, 0, 1, 1});
  ASSERT_TRUE(job.ok()) << job.status();
  for (int odd : {1, 2}) {
    std::vector<absl::Status> st(4);
    std::vector<std::string> errors(4);
    OnEveryRank(4, [&](int r) {
      auto& s = *(*job)[r].session;
      auto buf = s.AllocateBuffer(64 * sizeof(float));
      ASSERT_TRUE(buf.ok());
      st[r] = s.Allreduce(**buf, 0, r == odd ? 60 : 64, DType::kF32, ReduceOp::kSum, "w").status();
      for (int i = 0; i < 64; ++i) (*buf)->as<float>()[i] = 1.0f;
      auto again = s.Allreduce(**buf, 0, 64, DType::kF32, ReduceOp::kSum, "w");
      if (!again.ok()) errors[r] = std::string(again.status().message());
      else if ((*buf)->as<float>()[63] != 4.0f) errors[r] = "wrong sum after the mismatch";
    });
    std::string others;
    for (int r = 0; r < 4; ++r) {
      if (r != odd) absl::StrAppend(&others, others.empty() ? "" : ",", r);
    }
    for (int r = 0; r < 4; ++r) {
      EXPECT_TRUE(absl::IsInvalidArgument(st[r])) << st[r];
      EXPECT_EQ(st[r].message(),
                absl::StrCat("op ", 2 * odd - 1, " does not match across ranks: rank ", odd,
                             " submitted allreduce 'w' f32[60] sum, ranks ", others,
                             " submitted allreduce 'w' f32[64] sum"))
          << "rank " << r;
      EXPECT_EQ(errors[r], "") << "rank " << r;
    }
  }
}

TEST_F(AllreduceIntegration, HierarchicalNeedsRanksThatShareADaemon) {
  auto job = OpenJob(*cluster_, "no-hier", {3, 4});
  ASSERT_TRUE(job.ok()) << job.status();
  auto& s = *(*job)[0].session;
  auto buf = s.AllocateBuffer(64);
  ASSERT_TRUE(buf.ok());
  client::CollectiveSpec spec;
  spec.buffer = buf->get();
  spec.count = 4;
  spec.algorithm = "hier";
  spec.name = "g";
  // The daemon refuses it; over the op queue the refusal is the op's result.
  auto h = s.Run(spec);
  EXPECT_TRUE(absl::IsInvalidArgument(h.status())) << h.status();
  EXPECT_NE(h.status().message().find("needs ranks that share a daemon"), std::string::npos)
      << h.status();
}

TEST_F(AllreduceIntegration, ForcingAnAlgorithmThatCannotRunTheCollectiveIsRefused) {
  auto job = OpenJob(*cluster_, "bad-algo", {0, 1});
  ASSERT_TRUE(job.ok()) << job.status();
  auto& s = *(*job)[0].session;
  auto buf = s.AllocateBuffer(64);
  ASSERT_TRUE(buf.ok());
  client::CollectiveSpec spec;
  spec.kind = CollectiveKind::kAllreduce;
  spec.buffer = buf->get();
  spec.count = 4;
  spec.algorithm = "pairwise";
  spec.name = "g";
  auto h = s.Run(spec);
  EXPECT_TRUE(absl::IsInvalidArgument(h.status())) << h.status();
  EXPECT_NE(h.status().message().find("'pairwise' does not implement allreduce"), std::string::npos)
      << h.status();
  spec.algorithm = "fastest";
  h = s.Run(spec);
  EXPECT_TRUE(absl::IsInvalidArgument(h.status())) << h.status();
  EXPECT_NE(h.status().message().find("fastest"), std::string::npos) << h.status();
}

TEST_F(AllreduceIntegration, AsyncOpsCompleteInSubmissionOrder) {
  auto job = OpenJob(*cluster_, "async", {4, 5});
  ASSERT_TRUE(job.ok()) << job.status();
  const int kOps = 8;
  const size_t kCount = 10007;
  std::vector<std::string> errors(2);
  OnEveryRank(2, [&](int r) {
    auto& s = *(*job)[r].session;
    auto buf = s.AllocateBuffer(kOps * kCount * sizeof(float));
    ASSERT_TRUE(buf.ok());
    float* x = (*buf)->as<float>();
    for (size_t i = 0; i < kOps * kCount; ++i) x[i] = static_cast<float>((i % 100) + r);
    std::vector<client::OpHandle> handles;
    for (int k = 0; k < kOps; ++k) {
      auto h = s.AllreduceAsync(**buf, k * kCount * sizeof(float), kCount, DType::kF32,
                                ReduceOp::kSum, absl::StrCat("part", k));
      ASSERT_TRUE(h.ok()) << h.status();
      handles.push_back(*h);
    }
    for (int k = kOps - 1; k >= 0; --k) {  // wait out of order
      auto res = s.Wait(handles[k], absl::Seconds(30));
      if (!res.ok()) errors[r] = std::string(res.status().message());
    }
    for (size_t i = 0; i < kOps * kCount; ++i) {
      if (x[i] != static_cast<float>(2 * (i % 100) + 1)) {
        errors[r] = absl::StrCat("element ", i, " = ", x[i]);
        break;
      }
    }
  });
  EXPECT_EQ(errors[0], "");
  EXPECT_EQ(errors[1], "");
}

}  // namespace
}  // namespace gradsync
