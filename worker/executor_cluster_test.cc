// The job executor and its sessions across several daemons, as threads of
// this process (worker/threaded_cluster_testing.h): results bit-exact against
// a reference, ordering, a signature mismatch, a late rank, drain, abort, a
// session closing, an epoch change, and every plan giving the same bits.
// Nothing here sleeps: every wait is on a condition with a deadline.
#include <algorithm>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/synchronization/mutex.h"
#include "collective/plan_code.h"
#include "collective/reference.h"
#include "common/types.h"
#include "gmock/gmock.h"
#include "kernels/cpu_reduce.h"
#include "gtest/gtest.h"
#include "kernels/codec.h"
#include "worker/threaded_cluster_testing.h"

namespace gradsync {
namespace {

using testing::ClusterSpec;
using testing::FakeCoordinator;
using testing::OpSpec;
using testing::RankBuffer;
using testing::ThreadedCluster;
using ::testing::HasSubstr;
using ::testing::Not;

// The rank-order reduction of `inputs`. The inputs are integer-valued
// (IntegerValuedData), so every reduction order, and so every plan, must give
// exactly these bits.
std::vector<char> Reference(const std::vector<std::vector<char>>& inputs, DType t, ReduceOp op,
                            size_t count) {
  return testing::RingOrderReduce(inputs, t, op, 0, count, 0);
}

std::unique_ptr<ThreadedCluster> Form(FakeCoordinator& coord) {
  auto c = coord.Form();
  EXPECT_TRUE(c.ok()) << c.status();
  return c.ok() ? std::move(*c) : nullptr;
}

std::vector<RankBuffer> Buffers(ThreadedCluster& c, size_t bytes) {
  std::vector<RankBuffer> b;
  for (int r = 0; r < c.world(); ++r) {
    auto buf = c.Allocate(r, bytes);
    EXPECT_TRUE(buf.ok()) << buf.status();
    b.push_back(buf.ok() ? *buf : RankBuffer{});
  }
  return b;
}

std::vector<uint64_t> Ids(const std::vector<RankBuffer>& b) {
  std::vector<uint64_t> ids;
  for (const RankBuffer& x : b) ids.push_back(x.id);
  return ids;
}

// Fills each rank's buffer at `offset` with its inputs; returns them.
std::vector<std::vector<char>> Fill(std::vector<RankBuffer>& bufs, DType t, ReduceOp op,
                                    size_t count, uint32_t seed, size_t offset = 0) {
  std::vector<std::vector<char>> inputs;
  for (size_t r = 0; r < bufs.size(); ++r) {
    inputs.push_back(testing::IntegerValuedData(t, count, static_cast<int>(r), seed, op));
    std::memcpy(bufs[r].data + offset, inputs.back().data(), inputs.back().size());
  }
  return inputs;
}

// Every rank's buffer at `offset` holds `expect`.
void ExpectResult(const std::vector<RankBuffer>& bufs, const std::vector<char>& expect,
                  const std::string& what, size_t offset = 0) {
  for (size_t r = 0; r < bufs.size(); ++r) {
    EXPECT_EQ(std::memcmp(bufs[r].data + offset, expect.data(), expect.size()), 0)
        << what << ": rank " << r << " differs from the reference";
  }
}

void ExpectAllOk(const std::vector<absl::Status>& st, const std::string& what) {
  for (size_t r = 0; r < st.size(); ++r) EXPECT_TRUE(st[r].ok()) << what << ": rank " << r << ": " << st[r];
}

OpSpec Allreduce(DType t, ReduceOp op, uint64_t count, std::string name = "g") {
  OpSpec s;
  s.kind = CollectiveKind::kAllreduce;
  s.name = std::move(name);
  s.dtype = t;
  s.op = op;
  s.count = count;
  return s;
}

// Submits the 16-element f32 sum allreduce `name` on ranks [0, n), each on
// its buffer; the op ids, or empty (the failure recorded) if one was refused.
std::vector<uint64_t> SubmitSmall(ThreadedCluster& c, const std::vector<RankBuffer>& bufs, int n,
                                  const std::string& name) {
  std::vector<uint64_t> ids;
  for (int r = 0; r < n; ++r) {
    OpSpec op = Allreduce(DType::kF32, ReduceOp::kSum, 16, name);
    op.buffer_id = bufs[r].id;
    absl::StatusOr<uint64_t> id = c.Submit(r, op);
    EXPECT_TRUE(id.ok()) << "rank " << r << ": " << id.status();
    if (!id.ok()) return {};
    ids.push_back(*id);
  }
  return ids;
}

// Whether every rank of the placement is on one daemon (no link to compress).
bool OnOneDaemon(const std::vector<int>& node_of_rank) {
  return *std::max_element(node_of_rank.begin(), node_of_rank.end()) == 0;
}

std::string ShapeName(const std::vector<int>& node_of_rank) {
  std::string s;
  for (int n : node_of_rank) absl::StrAppend(&s, n);
  return s;
}

// ---- The fake coordinator.

TEST(FakeCoordinator, HandsOutWhatAnEpochsMembersLearn) {
  ClusterSpec spec;
  spec.node_of_rank = {0, 1, 0, 2};
  spec.job_algorithm = "ring";
  FakeCoordinator coord(spec);
  const JobPlacement p = coord.PlacementFor(1);
  EXPECT_EQ(p.world, 4);
  EXPECT_EQ(p.node_index, 1);
  EXPECT_EQ(p.nodes(), 3);
  EXPECT_EQ(p.ranks_of_node[0], (std::vector<int>{0, 2}));
  EXPECT_EQ(p.local_ranks(), (std::vector<int>{1}));
  const SessionInfo info = coord.InfoFor(2, 7);
  EXPECT_EQ(info.rank, 2);
  EXPECT_EQ(info.world_size, 4);
  EXPECT_EQ(info.epoch, 7);
  EXPECT_EQ(info.job_algorithm, "ring");
  EXPECT_FALSE(info.job_key.empty());
  auto c = Form(coord);
  ASSERT_NE(c, nullptr);
  EXPECT_EQ(c->epoch(), 1);
  EXPECT_EQ(c->daemons(), 3);
  EXPECT_EQ(c->ranks_of(0), (std::vector<int>{0, 2}));
  EXPECT_EQ(c->session(3).info().rank, 3);

  spec.node_of_rank = {1, 0};  // daemons are numbered by first appearance
  FakeCoordinator bad(spec);
  EXPECT_EQ(bad.Form().status().code(), absl::StatusCode::kInvalidArgument);
}

// ---- Results.

class ExecutorClusterShapes : public ::testing::TestWithParam<std::vector<int>> {
 protected:
  // This placement, every op of the job through `codec` unless it names one.
  ClusterSpec SpecWithCodec(const std::string& codec) const {
    ClusterSpec spec;
    spec.node_of_rank = GetParam();
    spec.job_codec = codec;
    return spec;
  }
};

TEST_P(ExecutorClusterShapes, AllreduceIsBitExactForEverySizeDtypeAndOp) {
  ClusterSpec spec;
  spec.node_of_rank = GetParam();
  FakeCoordinator coord(spec);
  auto c = Form(coord);
  ASSERT_NE(c, nullptr);
  constexpr size_t kCounts[] = {1, 7, 1023, 70001};
  std::vector<RankBuffer> bufs = Buffers(*c, 70001 * 8);
  uint32_t seed = 1;
  for (DType t : kAllDTypes) {
    std::vector<ReduceOp> ops = {ReduceOp::kSum};
    if (t == DType::kF32 || t == DType::kBF16 || t == DType::kI32) {
      ops = {ReduceOp::kSum, ReduceOp::kAvg, ReduceOp::kMin, ReduceOp::kMax, ReduceOp::kProd};
    }
    for (ReduceOp op : ops) {
      for (size_t count : kCounts) {
        const std::string what = absl::StrCat("placement ", ShapeName(GetParam()), " ",
                                              DTypeName(t), " ", ReduceOpName(op), " x", count);
        auto inputs = Fill(bufs, t, op, count, seed++);
        ExpectAllOk(c->RunOnAll(Allreduce(t, op, count), Ids(bufs)), what);
        ExpectResult(bufs, Reference(inputs, t, op, count), what);
      }
    }
  }
}

// premul_sum: each rank's input multiplied by its own factor, then summed.
// Powers of two keep every product and partial sum exact (the integer-valued
// inputs), so every placement and plan must give the reference's bits.
TEST_P(ExecutorClusterShapes, PremulSumMultipliesEachRanksInputByItsOwnFactor) {
  ClusterSpec spec;
  spec.node_of_rank = GetParam();
  FakeCoordinator coord(spec);
  auto c = Form(coord);
  ASSERT_NE(c, nullptr);
  const int n = c->world();
  constexpr double kFactors[] = {0.5, 2, -1, 0.25, 1};
  std::vector<RankBuffer> bufs = Buffers(*c, 70001 * 8 * 5);
  uint32_t seed = 900;
  for (CollectiveKind kind : {CollectiveKind::kAllreduce, CollectiveKind::kReduceScatter}) {
    for (DType t : {DType::kF32, DType::kF64, DType::kF16, DType::kBF16}) {
      for (size_t count : {size_t{7}, size_t{70001}}) {
        const std::string what =
            absl::StrCat("placement ", ShapeName(GetParam()), " premul_sum ",
                         CollectiveName(kind), " ", DTypeName(t), " x", count);
        const size_t total = kind == CollectiveKind::kReduceScatter ? count * n : count;
        auto inputs = Fill(bufs, t, ReduceOp::kSum, total, seed++);
        std::vector<std::vector<char>> scaled = inputs;
        std::vector<uint64_t> ids(n);
        for (int r = 0; r < n; ++r) {
          MultiplyBy(t, scaled[r].data(), total, kFactors[r]);
          OpSpec op = Allreduce(t, ReduceOp::kPremulSum, count);
          op.kind = kind;
          op.premul_factor = kFactors[r];
          op.buffer_id = bufs[r].id;
          absl::StatusOr<uint64_t> id = c->Submit(r, op);
          ASSERT_TRUE(id.ok()) << what << ": rank " << r << ": " << id.status();
          ids[r] = *id;
        }
        const size_t es = DTypeSize(t);
        for (int r = 0; r < n; ++r) {
          absl::StatusOr<OpOutcome> out = c->Wait(r, ids[r]);
          ASSERT_TRUE(out.ok()) << what << ": rank " << r << ": " << out.status();
          EXPECT_TRUE(out->status.ok()) << what << ": rank " << r << ": " << out->status;
          const size_t begin = kind == CollectiveKind::kReduceScatter ? r * count : 0;
          const std::vector<char> want =
              testing::RingOrderReduce(scaled, t, ReduceOp::kSum, begin, count, 0);
          EXPECT_EQ(std::memcmp(bufs[r].data + begin * es, want.data(), want.size()), 0)
              << what << ": rank " << r << " differs from the reference";
        }
      }
    }
  }
  // Refused at submission, naming the op and rank: an integer dtype, a
  // collective that does not sum, a factor that is not finite.
  OpSpec op = Allreduce(DType::kI32, ReduceOp::kPremulSum, 4);
  op.buffer_id = bufs[0].id;
  op.premul_factor = 2;
  EXPECT_THAT(c->Submit(0, op).status().message(),
              HasSubstr("allreduce 'g' on rank 0: reduce op premul_sum needs a float dtype"));
  op.dtype = DType::kF32;
  op.kind = CollectiveKind::kReduce;
  EXPECT_THAT(c->Submit(0, op).status().message(),
              HasSubstr("reduce op premul_sum applies to allreduce and reduce_scatter only"));
  op.kind = CollectiveKind::kAllreduce;
  op.premul_factor = std::numeric_limits<double>::infinity();
  EXPECT_THAT(c->Submit(0, op).status().message(),
              HasSubstr("premul_sum factor must be finite, got inf"));
}

// Codecs through the daemons: an op's own codec runs on the ring among the
// daemons (shown as "ring+int8" / "hier+int8"), every rank ends with the
// same bits within the codec's bound of the exact sum; with every rank on
// one daemon nothing crosses a link and the op runs dense. The job's codec
// applies where it can (an i32 op runs dense); an op's own codec that
// cannot apply is refused naming it; ranks that disagree on the codec fail
// the op naming both sides.
TEST_P(ExecutorClusterShapes, CodecsCompressTheStageBetweenDaemons) {
  const ClusterSpec spec = SpecWithCodec("bf16");
  FakeCoordinator coord(spec);
  auto c = Form(coord);
  ASSERT_NE(c, nullptr);
  const int n = c->world();
  const bool one_daemon = OnOneDaemon(spec.node_of_rank);
  const size_t count = 3 * kCodecBlockElements + 17;
  std::vector<RankBuffer> bufs = Buffers(*c, count * 4);
  auto run = [&](DType t, const std::vector<std::string>& codecs,
                 std::vector<OpOutcome>* outs) -> std::vector<std::vector<char>> {
    auto inputs = Fill(bufs, t, ReduceOp::kSum, count, 77);
    std::vector<uint64_t> ids(n);
    for (int r = 0; r < n; ++r) {
      OpSpec op = Allreduce(t, ReduceOp::kSum, count);
      op.codec = codecs[r];
      op.buffer_id = bufs[r].id;
      absl::StatusOr<uint64_t> id = c->Submit(r, op);
      EXPECT_TRUE(id.ok()) << id.status();
      ids[r] = id.ok() ? *id : 0;
    }
    outs->clear();
    for (int r = 0; r < n; ++r) {
      absl::StatusOr<OpOutcome> out = c->Wait(r, ids[r]);
      EXPECT_TRUE(out.ok()) << out.status();
      outs->push_back(out.ok() ? *out : OpOutcome{});
    }
    return inputs;
  };
  std::vector<OpOutcome> outs;
  // The op's own codec.
  auto inputs = run(DType::kF32, std::vector<std::string>(n, "int8"), &outs);
  for (int r = 0; r < n; ++r) {
    ASSERT_TRUE(outs[r].status.ok()) << "rank " << r << ": " << outs[r].status;
    if (one_daemon) {
      EXPECT_THAT(outs[r].algorithm, Not(HasSubstr("+"))) << "rank " << r;
    } else {
      EXPECT_THAT(outs[r].algorithm, HasSubstr("+int8")) << "rank " << r;
    }
    EXPECT_EQ(std::memcmp(bufs[r].data, bufs[0].data, count * 4), 0) << "rank " << r;
  }
  const float* got = reinterpret_cast<const float*>(bufs[0].data);
  double abs_max = 0, worst = 0;
  for (size_t i = 0; i < count; ++i) {
    double exact = 0, abs_sum = 0;
    for (int r = 0; r < n; ++r) {
      const float x = reinterpret_cast<const float*>(inputs[r].data())[i];
      exact += x;
      abs_sum += std::fabs(x);
    }
    abs_max = std::max(abs_max, abs_sum);
    worst = std::max(worst, std::fabs(got[i] - exact));
  }
  // n quantizations of at most amax/254 each (the inputs' scale is uniform).
  EXPECT_LE(worst, n * abs_max / 254 * 1.01);
  if (one_daemon) {
    EXPECT_EQ(worst, 0.0);
  }
  // The job's codec (bf16) on an f32 op, and not on an i32 one.
  run(DType::kF32, std::vector<std::string>(n, ""), &outs);
  for (int r = 0; r < n; ++r) {
    ASSERT_TRUE(outs[r].status.ok()) << outs[r].status;
    if (!one_daemon) {
      EXPECT_THAT(outs[r].algorithm, HasSubstr("+bf16"));
    }
  }
  auto ints = run(DType::kI32, std::vector<std::string>(n, ""), &outs);
  for (int r = 0; r < n; ++r) {
    ASSERT_TRUE(outs[r].status.ok()) << outs[r].status;
    EXPECT_THAT(outs[r].algorithm, Not(HasSubstr("+")));
  }
  ExpectResult(bufs, Reference(ints, DType::kI32, ReduceOp::kSum, count), "i32 under a job codec");
  // Refused at submission, naming the codec, the op and the rank.
  OpSpec op = Allreduce(DType::kI32, ReduceOp::kSum, count);
  op.buffer_id = bufs[0].id;
  op.codec = "fp16";
  EXPECT_THAT(c->Submit(0, op).status().message(),
              HasSubstr("allreduce 'g' on rank 0: codec 'fp16' does not apply: codecs encode f32 "
                        "values, not i32"));
  op.dtype = DType::kF32;
  op.codec = "zip";
  EXPECT_THAT(c->Submit(0, op).status().message(), HasSubstr("unknown codec 'zip'"));
  op.codec = "int8";
  op.count = 100;
  EXPECT_THAT(c->Submit(0, op).status().message(),
              HasSubstr("100 elements per rank are fewer than one codec block (4096)"));
  // Ranks that disagree fail the op on every rank, naming both sides.
  if (n >= 2) {
    std::vector<std::string> mixed(n, "int8");
    mixed[n - 1] = "none";
    run(DType::kF32, mixed, &outs);
    for (int r = 0; r < n; ++r) {
      EXPECT_EQ(outs[r].status.code(), absl::StatusCode::kInvalidArgument) << outs[r].status;
      EXPECT_THAT(outs[r].status.message(), HasSubstr("codec int8")) << outs[r].status;
    }
  }
}

// Top-k with error feedback kept by the daemons, per op name: the first op
// of the name is its warm-up (dense); the next sends each daemon's k largest
// values; the one after, with zero input, sends what the daemons owed. The
// two results add up to the dense sum exactly (integer inputs), on every
// placement (with every rank on one daemon nothing crosses a link: dense).
TEST_P(ExecutorClusterShapes, TopkSendsTheLargestValuesAndThenWhatIsOwed) {
  const ClusterSpec spec = SpecWithCodec("topk:0.01,warmup=1");
  FakeCoordinator coord(spec);
  auto c = Form(coord);
  ASSERT_NE(c, nullptr);
  const int n = c->world();
  const bool one_daemon = OnOneDaemon(spec.node_of_rank);
  const size_t count = 3 * kCodecBlockElements + 17;
  const size_t k = count / 100;  // 123 per daemon
  std::vector<RankBuffer> bufs = Buffers(*c, count * 4);
  // 2k distinct values, the same on every rank: each daemon's share is a
  // multiple of them, so every daemon selects the same k.
  std::vector<float> x(count, 0.0f);
  for (size_t i = 0; i < 2 * k; ++i) x[i * 50] = static_cast<float>(i + 1);
  auto step = [&](bool zero, const std::string& what) {
    std::vector<uint64_t> ids(n);
    for (int r = 0; r < n; ++r) {
      if (zero) {
        std::memset(bufs[r].data, 0, count * 4);
      } else {
        std::memcpy(bufs[r].data, x.data(), count * 4);
      }
      OpSpec op = Allreduce(DType::kF32, ReduceOp::kSum, count);
      op.buffer_id = bufs[r].id;
      absl::StatusOr<uint64_t> id = c->Submit(r, op);
      EXPECT_TRUE(id.ok()) << what << ": " << id.status();
      ids[r] = id.ok() ? *id : 0;
    }
    std::vector<OpOutcome> outs;
    for (int r = 0; r < n; ++r) {
      absl::StatusOr<OpOutcome> out = c->Wait(r, ids[r]);
      EXPECT_TRUE(out.ok()) << out.status();
      outs.push_back(out.ok() ? *out : OpOutcome{});
      EXPECT_TRUE(outs.back().status.ok()) << what << " rank " << r << ": " << outs.back().status;
      EXPECT_EQ(std::memcmp(bufs[r].data, bufs[0].data, count * 4), 0) << what << " rank " << r;
    }
    std::vector<float> got(count);
    std::memcpy(got.data(), bufs[0].data, count * 4);
    return std::make_pair(outs[0].algorithm, got);
  };
  // Warm-up: dense.
  auto [warm_plan, warm] = step(false, "warm-up");
  EXPECT_THAT(warm_plan, Not(HasSubstr("+"))) << "warm-up";
  for (size_t i = 0; i < count; ++i) ASSERT_EQ(warm[i], n * x[i]) << "warm-up element " << i;
  auto [first_plan, first] = step(false, "top-k");
  auto [owed_plan, owed] = step(true, "owed");
  size_t sent_first = 0;
  for (size_t i = 0; i < count; ++i) {
    ASSERT_EQ(first[i] + owed[i], n * x[i]) << "element " << i;
    if (first[i] != 0) ++sent_first;
  }
  if (one_daemon) {
    EXPECT_THAT(first_plan, Not(HasSubstr("+")));
    EXPECT_EQ(sent_first, 2 * k);
  } else {
    EXPECT_THAT(first_plan, HasSubstr("+topk"));
    EXPECT_THAT(owed_plan, HasSubstr("+topk"));
    EXPECT_EQ(sent_first, k);  // the k largest; the rest came with the zero input
    EXPECT_EQ(first[(2 * k - 1) * 50], n * x[(2 * k - 1) * 50]);
    EXPECT_EQ(first[0], 0.0f);
  }
  // An op's own topk: refused where it cannot apply, naming it.
  OpSpec op = Allreduce(DType::kI32, ReduceOp::kSum, count);
  op.buffer_id = bufs[0].id;
  op.codec = "topk:0.01";
  EXPECT_THAT(c->Submit(0, op).status().message(),
              HasSubstr("allreduce 'g' on rank 0: codec 'topk:0.01' does not apply"));
  op.dtype = DType::kF32;
  op.name = "";
  EXPECT_THAT(c->Submit(0, op).status().message(), HasSubstr("the op's name, and this op has none"));
  op.name = "g";
  op.codec = "auto:bf16,topk";
  EXPECT_THAT(c->Submit(0, op).status().message(), HasSubstr("never chosen by 'auto'"));
  op.codec = "topk:3";
  EXPECT_THAT(c->Submit(0, op).status().message(), HasSubstr("the ratio is a number from"));
}

// A named op under int8 owes its next op of the name what the quantization
// lost: an op of x, then an op of zeros, deliver n x together to f32
// rounding (the second op's own quantization of the small residual aside),
// far closer than the first alone - whether the second runs int8 or dense.
// One f32 sum allreduce of `count` values on every rank's buffer: x, or
// zeros; the plan and rank 0's result (every rank's checked equal to it).
std::pair<std::string, std::vector<float>> RunCodecStep(ThreadedCluster& c,
                                                        const std::vector<RankBuffer>& bufs,
                                                        const std::vector<float>& x, bool zero,
                                                        const std::string& name,
                                                        const std::string& codec) {
  const int n = c.world();
  const size_t count = x.size();
  std::vector<uint64_t> ids(n);
  for (int r = 0; r < n; ++r) {
    if (zero) {
      std::memset(bufs[r].data, 0, count * 4);
    } else {
      std::memcpy(bufs[r].data, x.data(), count * 4);
    }
    OpSpec op = Allreduce(DType::kF32, ReduceOp::kSum, count, name);
    op.buffer_id = bufs[r].id;
    op.codec = codec;
    absl::StatusOr<uint64_t> id = c.Submit(r, op);
    EXPECT_TRUE(id.ok()) << id.status();
    ids[r] = id.ok() ? *id : 0;
  }
  std::string plan;
  for (int r = 0; r < n; ++r) {
    absl::StatusOr<OpOutcome> out = c.Wait(r, ids[r]);
    EXPECT_TRUE(out.ok() && out->status.ok()) << "rank " << r;
    if (r == 0 && out.ok()) plan = out->algorithm;
    EXPECT_EQ(std::memcmp(bufs[r].data, bufs[0].data, count * 4), 0) << "rank " << r;
  }
  std::vector<float> got(count);
  std::memcpy(got.data(), bufs[0].data, count * 4);
  return {plan, got};
}

// The largest error of an op of x on every rank (n x), and of it plus the
// next op (of zeros), which delivers what the first owes.
std::pair<double, double> CodecErrors(const std::vector<float>& x, int n,
                                      const std::vector<float>& first,
                                      const std::vector<float>& owed) {
  double first_err = 0, together_err = 0;
  for (size_t i = 0; i < x.size(); ++i) {
    const double want = n * double{x[i]};
    first_err = std::max(first_err, std::fabs(first[i] - want));
    together_err = std::max(together_err, std::fabs(double{first[i]} + owed[i] - want));
  }
  return {first_err, together_err};
}

std::vector<float> CodecInput() {
  std::vector<float> x(2 * kCodecBlockElements + 33);
  for (size_t i = 0; i < x.size(); ++i) x[i] = std::sin(0.37f * static_cast<float>(i)) * 3.0f + 0.01f;
  return x;
}

TEST_P(ExecutorClusterShapes, QuantizedOpsOweTheirLossToTheNextOpOfTheName) {
  const ClusterSpec spec = SpecWithCodec("int8");
  FakeCoordinator coord(spec);
  auto c = Form(coord);
  ASSERT_NE(c, nullptr);
  const int n = c->world();
  const bool one_daemon = OnOneDaemon(spec.node_of_rank);
  const std::vector<float> x = CodecInput();
  std::vector<RankBuffer> bufs = Buffers(*c, x.size() * 4);
  // The owed values come back through the codec (the job's int8), or
  // through a dense op of the name (the op's own "none"), which takes them
  // into its input.
  for (const std::string payback : {"", "none"}) {
    auto [first_plan, first] = RunCodecStep(*c, bufs, x, false, "g", "");
    auto [owed_plan, owed] = RunCodecStep(*c, bufs, x, true, "g", payback);
    const auto [first_err, together_err] = CodecErrors(x, n, first, owed);
    if (one_daemon) {  // no link: dense, exact, nothing owed
      EXPECT_THAT(first_plan, Not(HasSubstr("+")));
      EXPECT_EQ(first_err, 0.0);
      EXPECT_EQ(together_err, 0.0);
      continue;
    }
    EXPECT_THAT(first_plan, HasSubstr("+int8"));
    if (payback.empty()) {
      EXPECT_THAT(owed_plan, HasSubstr("+int8"));
    } else {
      EXPECT_THAT(owed_plan, Not(HasSubstr("+")));
    }
    EXPECT_GT(first_err, 3.0 * n / 254 / 8) << "int8 should lose something of x";
    EXPECT_LT(together_err * 20, first_err)
        << "the op after it (" << owed_plan << ") did not deliver what was owed";
  }
}

// An unnamed op keeps its error feedback where it runs on the client's own
// memory (the PyTorch backend's adopted buckets): keyed by that memory. On
// a buffer the daemon allocated (which a client may reuse for any tensor:
// a staging pool) it keeps none, and the loss stays lost.
TEST_P(ExecutorClusterShapes, UnnamedOpsOnTheClientsOwnMemoryOweTheirLossToo) {
  const ClusterSpec spec = SpecWithCodec("int8");
  FakeCoordinator coord(spec);
  auto c = Form(coord);
  ASSERT_NE(c, nullptr);
  const int n = c->world();
  if (OnOneDaemon(spec.node_of_rank)) GTEST_SKIP() << "no link: dense, nothing owed";
  const std::vector<float> x = CodecInput();
  std::vector<RankBuffer> own;
  for (int r = 0; r < n; ++r) {
    absl::StatusOr<RankBuffer> b = c->Register(r, x.size() * 4);
    ASSERT_TRUE(b.ok()) << b.status();
    own.push_back(*b);
  }
  auto [first_plan, first] = RunCodecStep(*c, own, x, false, "", "");
  auto [owed_plan, owed] = RunCodecStep(*c, own, x, true, "", "");
  EXPECT_THAT(first_plan, HasSubstr("+int8"));
  auto [first_err, together_err] = CodecErrors(x, n, first, owed);
  EXPECT_GT(first_err, 3.0 * n / 254 / 8) << "int8 should lose something of x";
  EXPECT_LT(together_err * 20, first_err) << "the unnamed op on own memory kept nothing";
  // Allocated buffers: the next op has nothing to deliver.
  std::vector<RankBuffer> pool = Buffers(*c, x.size() * 4);
  std::tie(first_plan, first) = RunCodecStep(*c, pool, x, false, "", "");
  std::tie(owed_plan, owed) = RunCodecStep(*c, pool, x, true, "", "");
  std::tie(first_err, together_err) = CodecErrors(x, n, first, owed);
  EXPECT_GT(first_err, 3.0 * n / 254 / 8);
  EXPECT_EQ(together_err, first_err) << "an allocated buffer's unnamed op kept state";
}

INSTANTIATE_TEST_SUITE_P(Placements, ExecutorClusterShapes,
                         ::testing::Values(std::vector<int>{0, 0, 1, 1},  // 2 daemons x 2 ranks
                                           std::vector<int>{0, 0, 0, 0},  // 1 x 4
                                           std::vector<int>{0, 1, 2, 3},  // 4 x 1
                                           std::vector<int>{0, 1, 0, 1},  // interleaved
                                           std::vector<int>{0, 0, 0, 1, 2}),  // uneven
                         [](const ::testing::TestParamInfo<std::vector<int>>& info) {
                           return absl::StrCat("daemons_of_ranks_", ShapeName(info.param));
                         });

// ---- Daemons that share hosts: large allreduces run in two levels.

// 2 hosts x 2 daemons (and 3 x 2, and 2 x 3): an allreduce at or above the
// threshold runs in two levels ("2level"), bit-exact for every op; below it,
// with an algorithm forced, or with hosts of different sizes, flat.
TEST(ExecutorCluster, DaemonsSharingHostsAllreduceInTwoLevels) {
  struct Shape {
    std::vector<int> node_of_rank;
    std::vector<std::string> hosts;
    bool two_level;
  };
  const Shape shapes[] = {
      {{0, 1, 2, 3}, {"a", "a", "b", "b"}, true},
      {{0, 1, 2, 3, 4, 5}, {"a", "a", "b", "b", "c", "c"}, true},
      {{0, 1, 2, 3, 4, 5}, {"a", "a", "a", "b", "b", "b"}, true},
      {{0, 1, 2}, {"a", "a", "b"}, false},       // uneven hosts
      {{0, 1, 2, 3}, {"a", "b", "c", "d"}, false}, // a daemon per host
  };
  for (const Shape& shape : shapes) {
    ClusterSpec spec;
    spec.node_of_rank = shape.node_of_rank;
    spec.host_of_node = shape.hosts;
    spec.planner.two_level_min_bytes = 4096;
    FakeCoordinator coord(spec);
    auto c = Form(coord);
    ASSERT_NE(c, nullptr);
    std::vector<RankBuffer> bufs = Buffers(*c, 70001 * 8);
    uint32_t seed = 1700;
    for (DType t : {DType::kF32, DType::kBF16, DType::kI64}) {
      for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kAvg, ReduceOp::kMax, ReduceOp::kProd}) {
        for (size_t count : {size_t{100}, size_t{70001}}) {
          const bool large = count * DTypeSize(t) >= 4096;
          const std::string what =
              absl::StrCat(absl::StrJoin(shape.hosts, ","), " ", DTypeName(t), " ",
                           ReduceOpName(op), " x", count);
          auto inputs = Fill(bufs, t, op, count, seed++);
          std::vector<OpOutcome> outcomes;
          ExpectAllOk(c->RunOnAll(Allreduce(t, op, count), Ids(bufs), &outcomes), what);
          ExpectResult(bufs, Reference(inputs, t, op, count), what);
          for (const OpOutcome& o : outcomes) {
            EXPECT_EQ(o.algorithm == "2level", shape.two_level && large)
                << what << ": ran " << o.algorithm;
          }
        }
      }
    }
    // A forced algorithm runs flat.
    auto inputs = Fill(bufs, DType::kF32, ReduceOp::kSum, 70001, seed++);
    OpSpec forced = Allreduce(DType::kF32, ReduceOp::kSum, 70001);
    forced.algorithm = "ring";
    std::vector<OpOutcome> outcomes;
    ExpectAllOk(c->RunOnAll(forced, Ids(bufs), &outcomes), "forced ring");
    ExpectResult(bufs, Reference(inputs, DType::kF32, ReduceOp::kSum, 70001), "forced ring");
    EXPECT_EQ(outcomes[0].algorithm, "ring");
    // Top-k sparsifies the allreduce across the hosts (only the hosts'
    // leaders select); topk:1 selects every value, so the integer-valued
    // sum is exact.
    inputs = Fill(bufs, DType::kF32, ReduceOp::kSum, 70001, seed++);
    OpSpec sparse = Allreduce(DType::kF32, ReduceOp::kSum, 70001);
    sparse.codec = "topk:1";
    outcomes.clear();
    ExpectAllOk(c->RunOnAll(sparse, Ids(bufs), &outcomes), "topk");
    ExpectResult(bufs, Reference(inputs, DType::kF32, ReduceOp::kSum, 70001), "topk");
    for (const OpOutcome& o : outcomes) {
      EXPECT_EQ(o.algorithm, shape.two_level ? "2level+topk" : "ring+topk") << "topk";
    }
  }
}

// ---- gather and scatter: every root, every placement.

// The reference on blocked buffers (n blocks of `block` bytes each):
// gather: the root's block j is rank j's block j, the others unchanged;
// scatter: rank r's block r is the root's block r, the rest unchanged.
std::vector<std::vector<char>> RootedReference(CollectiveKind kind,
                                               const std::vector<std::vector<char>>& in,
                                               size_t block, int root) {
  std::vector<std::vector<char>> want = in;
  for (int j = 0; j < static_cast<int>(in.size()); ++j) {
    if (j == root) continue;
    const auto& from = kind == CollectiveKind::kGather ? in[j] : in[root];
    std::vector<char>& to = kind == CollectiveKind::kGather ? want[root] : want[j];
    std::copy(from.begin() + j * block, from.begin() + (j + 1) * block, to.begin() + j * block);
  }
  return want;
}

class ExecutorClusterRooted : public ::testing::TestWithParam<std::vector<int>> {};

TEST_P(ExecutorClusterRooted, GatherAndScatterAreBitExactForEveryRoot) {
  ClusterSpec spec;
  spec.node_of_rank = GetParam();
  FakeCoordinator coord(spec);
  auto c = Form(coord);
  ASSERT_NE(c, nullptr);
  const int n = c->world();
  constexpr size_t kCounts[] = {1, 4099};
  std::vector<RankBuffer> bufs = Buffers(*c, 4099 * 8 * n);
  uint32_t seed = 900;
  for (CollectiveKind kind : {CollectiveKind::kGather, CollectiveKind::kScatter}) {
    for (DType t : {DType::kF32, DType::kBF16, DType::kI64, DType::kU8}) {
      for (size_t count : kCounts) {
        for (int root = 0; root < n; ++root) {
          const std::string what =
              absl::StrCat("placement ", ShapeName(GetParam()), " ", CollectiveName(kind), " ",
                           DTypeName(t), " x", count, " root ", root);
          auto inputs = Fill(bufs, t, ReduceOp::kSum, count * n, seed++);
          OpSpec op;
          op.kind = kind;
          op.name = absl::StrCat(CollectiveName(kind), "-", root);
          op.dtype = t;
          op.count = count;
          op.root = root;
          std::vector<OpOutcome> outcomes;
          ExpectAllOk(c->RunOnAll(op, Ids(bufs), &outcomes), what);
          const auto want = RootedReference(kind, inputs, count * DTypeSize(t), root);
          for (int r = 0; r < n; ++r) {
            EXPECT_EQ(std::memcmp(bufs[r].data, want[r].data(), want[r].size()), 0)
                << what << ": rank " << r << " differs from the reference";
          }
          const bool shared = !coord.PlacementFor(0).one_rank_per_node();
          if (!outcomes.empty()) {
            EXPECT_EQ(outcomes[0].algorithm, shared ? "hier" : n == 1 ? "ring" : "pairwise")
                << what;
          }
        }
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Placements, ExecutorClusterRooted,
                         ::testing::Values(std::vector<int>{0, 0, 1, 1},  // 2 daemons x 2 ranks
                                           std::vector<int>{0, 0, 0, 0},  // 1 x 4
                                           std::vector<int>{0, 1, 2, 3},  // 4 x 1
                                           std::vector<int>{0, 1, 0, 1},  // interleaved
                                           std::vector<int>{0, 0, 0, 1, 2}),  // uneven
                         [](const ::testing::TestParamInfo<std::vector<int>>& info) {
                           return absl::StrCat("daemons_of_ranks_", ShapeName(info.param));
                         });

// ---- Ordering.

TEST(ExecutorCluster, OpsCompleteInSubmissionOrderOnEveryRank) {
  FakeCoordinator coord(ClusterSpec::Blocks(2, 2));
  auto c = Form(coord);
  ASSERT_NE(c, nullptr);
  absl::Mutex mu;
  std::vector<std::vector<uint64_t>> order(c->world());
  for (int r = 0; r < c->world(); ++r) {
    c->session(r).SetCompletionListener([&mu, &order, r](uint64_t id, const OpOutcome&) {
      absl::MutexLock l(&mu);
      order[r].push_back(id);
      return false;  // Wait still reports it
    });
  }
  // Ops of very different sizes (small ones would overtake large ones if
  // anything ran them out of order), each in its own part of the buffer.
  constexpr int kOps = 12;
  const size_t counts[] = {1, 50000, 3, 20000, 7, 1};
  std::vector<size_t> offsets;
  size_t total = 0;
  for (int k = 0; k < kOps; ++k) {
    offsets.push_back(total);
    total += counts[k % 6] * 4;
  }
  std::vector<RankBuffer> bufs = Buffers(*c, total);
  std::vector<std::vector<char>> expect;
  for (int k = 0; k < kOps; ++k) {
    auto inputs = Fill(bufs, DType::kF32, ReduceOp::kSum, counts[k % 6], 100 + k, offsets[k]);
    expect.push_back(Reference(inputs, DType::kF32, ReduceOp::kSum, counts[k % 6]));
  }
  std::vector<std::vector<uint64_t>> ids(c->world());
  for (int k = 0; k < kOps; ++k) {
    for (int r = 0; r < c->world(); ++r) {
      OpSpec op = Allreduce(DType::kF32, ReduceOp::kSum, counts[k % 6], absl::StrCat("op", k));
      op.buffer_id = bufs[r].id;
      op.offset_bytes = offsets[k];
      auto id = c->Submit(r, op);
      ASSERT_TRUE(id.ok()) << id.status();
      ids[r].push_back(*id);
    }
  }
  for (int r = 0; r < c->world(); ++r) {
    for (int k = 0; k < kOps; ++k) {
      EXPECT_EQ(ids[r][k], static_cast<uint64_t>(k + 1)) << "op ids are sequence numbers";
      auto out = c->Wait(r, ids[r][k]);
      ASSERT_TRUE(out.ok()) << out.status();
      EXPECT_TRUE(out->status.ok()) << out->status;
    }
  }
  for (int k = 0; k < kOps; ++k) ExpectResult(bufs, expect[k], absl::StrCat("op ", k), offsets[k]);
  // The listener runs after Wait can see the outcome: wait for its last call.
  auto heard_all = [&] {
    for (int r = 0; r < c->world(); ++r) {
      if (order[r].size() < static_cast<size_t>(kOps)) return false;
    }
    return true;
  };
  {
    absl::MutexLock l(&mu);
    mu.AwaitWithTimeout(absl::Condition(&heard_all), absl::Seconds(20));
    for (int r = 0; r < c->world(); ++r) EXPECT_EQ(order[r], ids[r]) << "rank " << r;
  }
  c.reset();  // before the listeners' `mu` and `order` go

}

// ---- A signature mismatch.

class ExecutorClusterMismatch : public ::testing::TestWithParam<std::vector<int>> {};

TEST_P(ExecutorClusterMismatch, FailsOnlyThatOpOnEveryRankNamingTheRanks) {
  ClusterSpec spec;
  spec.node_of_rank = GetParam();
  FakeCoordinator coord(spec);
  auto c = Form(coord);
  ASSERT_NE(c, nullptr);
  std::vector<RankBuffer> bufs = Buffers(*c, 4096);
  ExpectAllOk(c->RunOnAll(Allreduce(DType::kF32, ReduceOp::kSum, 10, "before"), Ids(bufs)),
              "op 1");
  // Op 2: rank 3 disagrees on the count.
  std::vector<uint64_t> ids;
  for (int r = 0; r < c->world(); ++r) {
    OpSpec op = Allreduce(DType::kF32, ReduceOp::kSum, r == 3 ? 11 : 10, "grads");
    op.buffer_id = bufs[r].id;
    auto id = c->Submit(r, op);
    ASSERT_TRUE(id.ok()) << id.status();
    ids.push_back(*id);
  }
  for (int r = 0; r < c->world(); ++r) {
    auto out = c->Wait(r, ids[r]);
    ASSERT_TRUE(out.ok()) << out.status();
    EXPECT_EQ(out->status.code(), absl::StatusCode::kInvalidArgument) << out->status;
    const std::string msg(out->status.message());
    EXPECT_THAT(msg, HasSubstr("rank 3 submitted allreduce 'grads' f32[11] sum")) << "rank " << r;
    EXPECT_THAT(msg, HasSubstr("ranks 0,1,2 submitted allreduce 'grads' f32[10] sum"))
        << "rank " << r;
    EXPECT_THAT(msg, HasSubstr("op 2")) << "rank " << r;
  }
  // Only that op: the epoch is fine and the next op works.
  for (int r = 0; r < c->world(); ++r) EXPECT_TRUE(c->session(r).health().ok()) << r;
  auto inputs = Fill(bufs, DType::kI32, ReduceOp::kSum, 100, 7);
  ExpectAllOk(c->RunOnAll(Allreduce(DType::kI32, ReduceOp::kSum, 100), Ids(bufs)), "after");
  ExpectResult(bufs, Reference(inputs, DType::kI32, ReduceOp::kSum, 100), "after the mismatch");
}

INSTANTIATE_TEST_SUITE_P(Placements, ExecutorClusterMismatch,
                         ::testing::Values(std::vector<int>{0, 0, 1, 1},  // 2 daemons x 2 ranks
                                           std::vector<int>{0, 0, 0, 0},  // 1 x 4
                                           std::vector<int>{0, 1, 2, 3},  // 4 x 1
                                           std::vector<int>{0, 1, 0, 1}),  // interleaved
                         [](const ::testing::TestParamInfo<std::vector<int>>& info) {
                           return absl::StrCat("daemons_of_ranks_", ShapeName(info.param));
                         });

// ---- A late rank.

TEST(ExecutorCluster, LateRankIsNamedWhenTheOpTimesOut) {
  FakeCoordinator coord(ClusterSpec::Blocks(2, 2));
  auto c = Form(coord);
  ASSERT_NE(c, nullptr);
  std::vector<RankBuffer> bufs = Buffers(*c, 4096);
  // Rank 3 never submits op 1; the others' deadline is short.
  std::vector<uint64_t> ids(3);
  for (int r = 0; r < 3; ++r) {
    OpSpec op = Allreduce(DType::kF32, ReduceOp::kSum, 10, "late");
    op.buffer_id = bufs[r].id;
    op.timeout = absl::Milliseconds(300);
    auto id = c->Submit(r, op);
    ASSERT_TRUE(id.ok()) << id.status();
    ids[r] = *id;
  }
  // Daemon 1 holds rank 2's op and waits for rank 3: its error names both.
  auto out = c->Wait(2, ids[2], absl::Seconds(20));
  ASSERT_TRUE(out.ok()) << out.status();
  EXPECT_EQ(out->status.code(), absl::StatusCode::kDeadlineExceeded) << out->status;
  EXPECT_THAT(std::string(out->status.message()),
              HasSubstr("timed out at rank 2 waiting for rank(s) 3 to submit op 1"));
  // Daemon 0's ranks fail too (the epoch is broken), naming the late rank.
  for (int r = 0; r < 2; ++r) {
    auto o = c->Wait(r, ids[r], absl::Seconds(20));
    ASSERT_TRUE(o.ok()) << o.status();
    EXPECT_FALSE(o->status.ok());
    // Daemon 0 times out itself (it saw neither of daemon 1's ranks:
    // "waiting for rank(s) 2,3"), or first hears daemon 1's error.
    EXPECT_THAT(std::string(o->status.message()),
                ::testing::ContainsRegex("waiting for rank\\(s\\) ([0-9]+,)*3 to submit op 1"))
        << "rank " << r << ": " << o->status;
  }
}

TEST(ExecutorCluster, LateRankAloneOnItsDaemonIsNamedByTheOthers) {
  // Rank 2's daemon has nothing of op 1; the others wait for it in the
  // signature exchange and name it.
  FakeCoordinator coord(ClusterSpec::Blocks(4, 1));
  auto c = Form(coord);
  ASSERT_NE(c, nullptr);
  std::vector<RankBuffer> bufs = Buffers(*c, 4096);
  std::vector<uint64_t> ids(4);
  for (int r : {0, 1, 3}) {
    OpSpec op = Allreduce(DType::kF32, ReduceOp::kSum, 10, "late");
    op.buffer_id = bufs[r].id;
    op.timeout = absl::Milliseconds(300);
    auto id = c->Submit(r, op);
    ASSERT_TRUE(id.ok()) << id.status();
    ids[r] = *id;
  }
  for (int r : {0, 1, 3}) {
    auto out = c->Wait(r, ids[r], absl::Seconds(20));
    ASSERT_TRUE(out.ok()) << out.status();
    EXPECT_FALSE(out->status.ok()) << "rank " << r;
    EXPECT_THAT(std::string(out->status.message()),
                ::testing::ContainsRegex("waiting for rank\\(s\\) ([0-9]+,)*2 to submit op 1"))
        << "rank " << r << ": " << out->status;
  }
}

TEST(ExecutorCluster, LateLocalRankIsNamedOnOneDaemon) {
  FakeCoordinator coord(ClusterSpec::Blocks(1, 3));
  auto c = Form(coord);
  ASSERT_NE(c, nullptr);
  std::vector<RankBuffer> bufs = Buffers(*c, 4096);
  // Op 1 completes; op 2 is missing rank 1.
  ExpectAllOk(c->RunOnAll(Allreduce(DType::kF32, ReduceOp::kSum, 4), Ids(bufs)), "op 1");
  std::vector<uint64_t> ids;
  for (int r : {0, 2}) {
    OpSpec op = Allreduce(DType::kF32, ReduceOp::kSum, 4, "second");
    op.buffer_id = bufs[r].id;
    op.timeout = absl::Milliseconds(200);
    auto id = c->Submit(r, op);
    ASSERT_TRUE(id.ok()) << id.status();
    ids.push_back(*id);
  }
  for (size_t i = 0; i < ids.size(); ++i) {
    const int r = i == 0 ? 0 : 2;
    auto out = c->Wait(r, ids[i], absl::Seconds(20));
    ASSERT_TRUE(out.ok()) << out.status();
    EXPECT_EQ(out->status.code(), absl::StatusCode::kDeadlineExceeded) << out->status;
    EXPECT_THAT(std::string(out->status.message()),
                HasSubstr("timed out at ranks 0,2 waiting for rank(s) 1 to submit op 2"));
  }
}

// ---- Drain.

TEST(ExecutorCluster, DrainFinishesQueuedOpsAndRefusesNewOnes) {
  FakeCoordinator coord(ClusterSpec::Blocks(2, 2));
  auto c = Form(coord);
  ASSERT_NE(c, nullptr);
  constexpr int kOps = 3;
  constexpr size_t kCount = 1000;
  std::vector<RankBuffer> bufs = Buffers(*c, kOps * kCount * 4);
  std::vector<std::vector<char>> expect;
  for (int k = 0; k < kOps; ++k) {
    auto inputs = Fill(bufs, DType::kF32, ReduceOp::kSum, kCount, 40 + k, k * kCount * 4);
    expect.push_back(Reference(inputs, DType::kF32, ReduceOp::kSum, kCount));
  }
  auto submit = [&](int r, int k) {
    OpSpec op = Allreduce(DType::kF32, ReduceOp::kSum, kCount, absl::StrCat("d", k));
    op.buffer_id = bufs[r].id;
    op.offset_bytes = k * kCount * 4;
    return c->Submit(r, op);
  };
  // Daemon 0's ranks queue every op; none can run before daemon 1's do.
  std::vector<std::vector<uint64_t>> ids(c->world());
  for (int r : c->ranks_of(0)) {
    for (int k = 0; k < kOps; ++k) {
      auto id = submit(r, k);
      ASSERT_TRUE(id.ok()) << id.status();
      ids[r].push_back(*id);
    }
  }
  const std::string kReason = "daemon is draining: restart in progress";
  for (int r : c->ranks_of(0)) c->session(r).StopAccepting(kReason);
  for (int r : c->ranks_of(0)) {
    auto refused = submit(r, 0);
    EXPECT_EQ(refused.status().code(), absl::StatusCode::kUnavailable) << refused.status();
    EXPECT_THAT(std::string(refused.status().message()), HasSubstr(kReason));
    EXPECT_EQ(c->session(r).Refusal().code(), absl::StatusCode::kUnavailable);
  }
  for (int r : c->ranks_of(1)) {
    for (int k = 0; k < kOps; ++k) {
      auto id = submit(r, k);
      ASSERT_TRUE(id.ok()) << id.status();
      ids[r].push_back(*id);
    }
  }
  for (int r = 0; r < c->world(); ++r) {
    for (uint64_t id : ids[r]) {
      auto out = c->Wait(r, id);
      ASSERT_TRUE(out.ok()) << out.status();
      EXPECT_TRUE(out->status.ok()) << "rank " << r << " op " << id << ": " << out->status;
    }
  }
  for (int k = 0; k < kOps; ++k) ExpectResult(bufs, expect[k], absl::StrCat("op ", k), k * kCount * 4);
}

// ---- Abort.

// Waits until daemon `d`'s executor has taken op `seq` of every one of its
// ranks (it is then exchanging signatures with the other daemons; `arrived`
// may also name ranks of other daemons it has heard from).
bool TakenEverywhereOn(ThreadedCluster& c, int d, uint64_t seq) {
  return testing::WaitUntil([&] {
    const std::vector<int> arrived = c.executor(d).Progress(seq).arrived;  // ascending
    return std::includes(arrived.begin(), arrived.end(), c.ranks_of(d).begin(),
                         c.ranks_of(d).end());
  });
}

TEST(ExecutorCluster, AbortFailsTheRunningOpOnEveryDaemonAndLaterOpsAtOnce) {
  // Three daemons of two ranks. Op 2: daemons 0 and 1 have all their ranks'
  // and exchange signatures, waiting for daemon 2, whose ranks submit only
  // after the abort.
  FakeCoordinator coord(ClusterSpec::Blocks(3, 2));
  auto c = Form(coord);
  ASSERT_NE(c, nullptr);
  std::vector<RankBuffer> bufs = Buffers(*c, 4096);
  ExpectAllOk(c->RunOnAll(Allreduce(DType::kF32, ReduceOp::kSum, 16), Ids(bufs)), "op 1");
  auto submit = [&](int r, const char* name) {
    OpSpec op = Allreduce(DType::kF32, ReduceOp::kSum, 16, name);
    op.buffer_id = bufs[r].id;
    return c->Submit(r, op);
  };
  std::vector<uint64_t> ids(c->world());
  for (int r = 0; r < 4; ++r) {
    auto id = submit(r, "aborted");
    ASSERT_TRUE(id.ok()) << id.status();
    ids[r] = *id;
  }
  ASSERT_TRUE(TakenEverywhereOn(*c, 0, 2));
  ASSERT_TRUE(TakenEverywhereOn(*c, 1, 2));
  c->executor(0).Abort(absl::AbortedError("coordinator: rank 5 missed heartbeats"));
  // The running op fails on both daemons, naming the reason.
  for (int r = 0; r < 4; ++r) {
    auto out = c->Wait(r, ids[r], absl::Seconds(20));
    ASSERT_TRUE(out.ok()) << out.status();
    EXPECT_FALSE(out->status.ok()) << "rank " << r;
    EXPECT_THAT(std::string(out->status.message()), HasSubstr("rank 5 missed heartbeats"))
        << "rank " << r << ": " << out->status;
  }
  // Daemon 2's ranks submit op 2 late: it fails at once (not at its
  // deadline, which would say "timed out"), naming the reason.
  for (int r : c->ranks_of(2)) {
    auto id = submit(r, "aborted");
    ASSERT_TRUE(id.ok()) << id.status();
    ids[r] = *id;
  }
  for (int r : c->ranks_of(2)) {
    auto out = c->Wait(r, ids[r], absl::Seconds(20));
    ASSERT_TRUE(out.ok()) << out.status();
    EXPECT_THAT(std::string(out->status.message()), HasSubstr("rank 5 missed heartbeats"))
        << "rank " << r << ": " << out->status;
  }
  // Later ops fail at once on every rank of every daemon, naming the reason
  // (refused by Submit, or failed by the executor).
  for (int r = 0; r < c->world(); ++r) {
    absl::StatusOr<uint64_t> id = submit(r, "after");
    absl::Status s = id.status();
    if (id.ok()) {
      auto out = c->Wait(r, *id, absl::Seconds(20));
      ASSERT_TRUE(out.ok()) << out.status();
      s = out->status;
    }
    EXPECT_FALSE(s.ok()) << "rank " << r;
    EXPECT_THAT(std::string(s.message()), HasSubstr("rank 5 missed heartbeats"))
        << "rank " << r << ": " << s;
  }
}

// An abort on daemon 0 while daemon 1 waits for one of its own ranks (rank 3)
// to submit the op its rank 2 already submitted. Daemon 1's executor looks at
// its node context's peers before each sleep (Context::CheckPeers), so rank
// 2's op fails at once, naming daemon 0's reason as a failing exchange would
// ("aborted by rank 0: ..."), not at its deadline ("timed out ... waiting for
// rank(s) 3"), and the epoch is broken there (rank 3's late op fails at once).
TEST(ExecutorCluster, AbortReachesADaemonWaitingForALocalRank) {
  ClusterSpec spec = ClusterSpec::Blocks(2, 2);
  spec.op_timeout = absl::Seconds(20);
  FakeCoordinator coord(spec);
  auto c = Form(coord);
  ASSERT_NE(c, nullptr);
  std::vector<RankBuffer> bufs = Buffers(*c, 4096);
  auto submit = [&](int r) {
    OpSpec op = Allreduce(DType::kF32, ReduceOp::kSum, 16, "pending");
    op.buffer_id = bufs[r].id;
    return c->Submit(r, op);
  };
  std::vector<uint64_t> ids(4);
  for (int r = 0; r < 3; ++r) {
    auto id = submit(r);
    ASSERT_TRUE(id.ok()) << id.status();
    ids[r] = *id;
  }
  ASSERT_TRUE(TakenEverywhereOn(*c, 0, 1));
  const absl::Time aborted = absl::Now();
  c->executor(0).Abort(absl::UnavailableError("daemon 0 stopping"));
  std::vector<absl::Status> got(3);
  for (int r = 0; r < 3; ++r) {
    auto out = c->Wait(r, ids[r], absl::Seconds(5));  // well before the op's deadline (20 s)
    ASSERT_TRUE(out.ok()) << "rank " << r << ": " << out.status();
    got[r] = out->status;
    EXPECT_THAT(std::string(got[r].message()), HasSubstr("daemon 0 stopping"))
        << "rank " << r << ": " << got[r];
    EXPECT_THAT(std::string(got[r].message()), Not(HasSubstr("timed out")))
        << "rank " << r << ": " << got[r];
  }
  EXPECT_LT(absl::Now() - aborted, absl::Seconds(5));
  // Daemon 1's rank 2: exactly as if the exchange had failed.
  EXPECT_EQ(got[2].code(), absl::StatusCode::kAborted) << got[2];
  EXPECT_THAT(std::string(got[2].message()),
              HasSubstr("(op 1) failed at rank 2: aborted by rank 0: daemon 0 stopping"))
      << got[2];
  // Rank 3 submits late: the epoch is broken on daemon 1, so it fails at
  // once (refused, or failed by the executor), naming the cause.
  absl::StatusOr<uint64_t> late = submit(3);
  absl::Status s = late.status();
  if (late.ok()) {
    auto out = c->Wait(3, *late, absl::Seconds(5));
    ASSERT_TRUE(out.ok()) << out.status();
    s = out->status;
  }
  EXPECT_THAT(std::string(s.message()), HasSubstr("daemon 0 stopping")) << s;
}

// A session on daemon 0 closes while daemon 0 runs the op and daemon 1 waits
// for its own rank 3: daemon 0's failing op fails its node context, and
// daemon 1 sees that before its next sleep, so rank 2's op fails at once,
// naming the closed session, not at its deadline.
TEST(ExecutorCluster, ASessionClosingOnAnotherDaemonReachesADaemonWaitingForALocalRank) {
  ClusterSpec spec = ClusterSpec::Blocks(2, 2);
  spec.op_timeout = absl::Seconds(20);
  FakeCoordinator coord(spec);
  auto c = Form(coord);
  ASSERT_NE(c, nullptr);
  std::vector<RankBuffer> bufs = Buffers(*c, 4096);
  const std::vector<uint64_t> ids = SubmitSmall(*c, bufs, 3, "pending");
  ASSERT_EQ(ids.size(), 3u);
  ASSERT_TRUE(TakenEverywhereOn(*c, 0, 1));
  c->CloseSession(0);
  for (int r = 1; r < 3; ++r) {
    auto out = c->Wait(r, ids[r], absl::Seconds(5));  // well before the op's deadline (20 s)
    ASSERT_TRUE(out.ok()) << "rank " << r << ": " << out.status();
    EXPECT_THAT(std::string(out->status.message()), HasSubstr("rank 0 closed its session"))
        << "rank " << r << ": " << out->status;
    EXPECT_THAT(std::string(out->status.message()), Not(HasSubstr("timed out")))
        << "rank " << r << ": " << out->status;
  }
}

// ---- A session closing.

TEST(ExecutorCluster, ClosingASessionBreaksTheEpochNamingTheRank) {
  FakeCoordinator coord(ClusterSpec::Blocks(2, 2));
  auto c = Form(coord);
  ASSERT_NE(c, nullptr);
  std::vector<RankBuffer> bufs = Buffers(*c, 4096);
  const std::vector<uint64_t> ids = SubmitSmall(*c, bufs, 3, "orphan");
  ASSERT_EQ(ids.size(), 3u);
  ASSERT_TRUE(TakenEverywhereOn(*c, 0, 1));
  c->CloseSession(3);
  for (int r = 0; r < 3; ++r) {
    auto out = c->Wait(r, ids[r], absl::Seconds(20));
    ASSERT_TRUE(out.ok()) << out.status();
    EXPECT_FALSE(out->status.ok()) << "rank " << r;
    EXPECT_THAT(std::string(out->status.message()), HasSubstr("rank 3 closed its session"))
        << "rank " << r << ": " << out->status;
  }
  for (int r = 0; r < 3; ++r) {
    EXPECT_FALSE(c->session(r).health().ok()) << "rank " << r;
    OpSpec op = Allreduce(DType::kF32, ReduceOp::kSum, 16, "after");
    op.buffer_id = bufs[r].id;
    absl::StatusOr<uint64_t> id = c->Submit(r, op);
    EXPECT_EQ(id.status().code(), absl::StatusCode::kFailedPrecondition) << id.status();
  }
}

// ---- Epoch change.

TEST(ExecutorCluster, NewEpochWorksAndNothingOfTheOldOneMixesIn) {
  FakeCoordinator coord(ClusterSpec::Blocks(2, 2));
  auto e1 = Form(coord);
  ASSERT_NE(e1, nullptr);
  EXPECT_EQ(e1->epoch(), 1);
  std::vector<RankBuffer> b1 = Buffers(*e1, 8192);
  ExpectAllOk(e1->RunOnAll(Allreduce(DType::kF32, ReduceOp::kSum, 100), Ids(b1)), "epoch 1 op 1");
  // Epoch 1's op 2 is stuck on daemon 0 (daemon 1's ranks never submit it),
  // its buffers full of other data.
  Fill(b1, DType::kF32, ReduceOp::kSum, 100, 999);
  std::vector<uint64_t> stale(2);
  for (int r : e1->ranks_of(0)) {
    OpSpec op = Allreduce(DType::kF32, ReduceOp::kSum, 100, "g");
    op.buffer_id = b1[r].id;
    auto id = e1->Submit(r, op);
    ASSERT_TRUE(id.ok()) << id.status();
    stale[r] = *id;
  }
  auto e2r = coord.Reform(*e1, absl::AbortedError("epoch 1 aborted: rank 2 left the job"));
  ASSERT_TRUE(e2r.ok()) << e2r.status();
  std::unique_ptr<ThreadedCluster> e2 = std::move(*e2r);
  EXPECT_EQ(e2->epoch(), 2);
  for (int r = 0; r < e2->world(); ++r) EXPECT_EQ(e2->session(r).info().epoch, 2);
  // The old epoch's op fails with the reason; its sessions refuse new ops.
  for (int r : e1->ranks_of(0)) {
    auto out = e1->Wait(r, stale[r], absl::Seconds(20));
    ASSERT_TRUE(out.ok()) << out.status();
    EXPECT_THAT(std::string(out->status.message()), HasSubstr("rank 2 left the job"))
        << out->status;
  }
  for (int r = 0; r < e1->world(); ++r) {
    OpSpec op = Allreduce(DType::kF32, ReduceOp::kSum, 100, "g");
    op.buffer_id = b1[r].id;
    auto id = e1->Submit(r, op);
    EXPECT_EQ(id.status().code(), absl::StatusCode::kFailedPrecondition) << id.status();
    EXPECT_THAT(std::string(id.status().message()), HasSubstr("epoch 1"));
  }
  // The new epoch numbers its ops from 1 and gives exactly its own inputs' sum.
  std::vector<RankBuffer> b2 = Buffers(*e2, 8192);
  for (int k = 0; k < 3; ++k) {
    auto inputs = Fill(b2, DType::kF32, ReduceOp::kSum, 100, 2000 + k);
    std::vector<OpOutcome> outcomes;
    std::vector<absl::Status> st;
    std::vector<uint64_t> ids;
    for (int r = 0; r < e2->world(); ++r) {
      OpSpec op = Allreduce(DType::kF32, ReduceOp::kSum, 100, "g");
      op.buffer_id = b2[r].id;
      auto id = e2->Submit(r, op);
      ASSERT_TRUE(id.ok()) << id.status();
      EXPECT_EQ(*id, static_cast<uint64_t>(k + 1));
      ids.push_back(*id);
    }
    for (int r = 0; r < e2->world(); ++r) {
      auto out = e2->Wait(r, ids[r]);
      ASSERT_TRUE(out.ok()) << out.status();
      EXPECT_TRUE(out->status.ok()) << out->status;
    }
    ExpectResult(b2, Reference(inputs, DType::kF32, ReduceOp::kSum, 100),
                 absl::StrCat("epoch 2 op ", k + 1));
  }
  // Epoch 1's buffers were left alone by epoch 2.
  auto again = testing::IntegerValuedData(DType::kF32, 100, 0, 999, ReduceOp::kSum);
  EXPECT_EQ(std::memcmp(b1[0].data, again.data(), again.size()), 0);
}

// ---- Plans: every forced plan gives the same bits.

std::vector<std::string> PlanNames(bool shared_daemons) {
  std::vector<std::string> names;
  for (Algorithm a : kAllAlgorithms) names.push_back(AlgorithmName(a));
  if (shared_daemons) names.push_back("hier");
  return names;
}

class ExecutorClusterPlans : public ::testing::TestWithParam<std::vector<int>> {};

TEST_P(ExecutorClusterPlans, EveryForcedPlanGivesTheSameBits) {
  const std::vector<int> placement = GetParam();
  ClusterSpec base;
  base.node_of_rank = placement;
  FakeCoordinator probe(base);
  const bool shared = !probe.PlacementFor(0).one_rank_per_node();
  constexpr size_t kCounts[] = {5, 4099, 200003};
  constexpr DType kTypes[] = {DType::kF32, DType::kBF16, DType::kI64};
  for (const std::string& name : PlanNames(shared)) {
    // The plan forced for the job (SessionInfo::job_algorithm) ...
    ClusterSpec spec = base;
    spec.job_algorithm = name;
    FakeCoordinator coord(spec);
    auto c = Form(coord);
    ASSERT_NE(c, nullptr);
    std::vector<RankBuffer> bufs = Buffers(*c, 200003 * 8);
    uint32_t seed = 500;
    for (DType t : kTypes) {
      for (size_t count : kCounts) {
        const uint64_t bytes = count * DTypeSize(t);
        if (!RequestedPlanCode(name, CollectiveKind::kAllreduce, bytes).ok()) continue;
        const std::string what = absl::StrCat("job plan ", name, " ", DTypeName(t), " x", count);
        auto inputs = Fill(bufs, t, ReduceOp::kSum, count, seed++);
        std::vector<OpOutcome> outcomes;
        ExpectAllOk(c->RunOnAll(Allreduce(t, ReduceOp::kSum, count), Ids(bufs), &outcomes), what);
        ExpectResult(bufs, Reference(inputs, t, ReduceOp::kSum, count), what);
        EXPECT_EQ(outcomes[0].algorithm, shared ? "hier" : name) << what;
      }
    }
    c.reset();
    // ... and requested by the op, in a job without one.
    FakeCoordinator plain(base);
    auto p = Form(plain);
    ASSERT_NE(p, nullptr);
    bufs = Buffers(*p, 200003 * 8);
    for (DType t : kTypes) {
      for (size_t count : kCounts) {
        const uint64_t bytes = count * DTypeSize(t);
        if (!RequestedPlanCode(name, CollectiveKind::kAllreduce, bytes).ok()) continue;
        const std::string what = absl::StrCat("op plan ", name, " ", DTypeName(t), " x", count);
        auto inputs = Fill(bufs, t, ReduceOp::kSum, count, seed++);
        OpSpec op = Allreduce(t, ReduceOp::kSum, count);
        op.algorithm = name;
        std::vector<OpOutcome> outcomes;
        ExpectAllOk(p->RunOnAll(op, Ids(bufs), &outcomes), what);
        ExpectResult(bufs, Reference(inputs, t, ReduceOp::kSum, count), what);
        EXPECT_EQ(outcomes[0].algorithm, shared ? "hier" : name) << what;
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Placements, ExecutorClusterPlans,
                         ::testing::Values(std::vector<int>{0, 0, 1, 1},   // 2 daemons x 2 ranks
                                           std::vector<int>{0, 0, 0, 0},   // 1 x 4 (in memory)
                                           std::vector<int>{0, 1, 2},      // 3 x 1
                                           std::vector<int>{0, 1, 2, 3},   // 4 x 1
                                           std::vector<int>{0, 0, 1, 2, 2}),  // uneven
                         [](const ::testing::TestParamInfo<std::vector<int>>& info) {
                           return absl::StrCat("daemons_of_ranks_", ShapeName(info.param));
                         });

}  // namespace
}  // namespace gradsync
