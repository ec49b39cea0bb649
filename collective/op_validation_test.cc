#include "collective/op_validation.h"

#include <string>

#include "absl/strings/str_cat.h"
#include "collective/codec_request.h"
#include "collective/plan_code.h"
#include "gtest/gtest.h"

namespace gradsync {
namespace {

OpDesc Allreduce(uint64_t count = 16) {
  OpDesc op;
  op.kind = CollectiveKind::kAllreduce;
  op.name = "grad/w";
  op.buffer_id = 3;
  op.count = count;
  return op;
}

OpContext Ctx(int world_size = 4) {
  OpContext ctx;
  ctx.rank = 2;
  ctx.world_size = world_size;
  ctx.job_id = "job-7";
  return ctx;
}

// The message of ValidateOp's refusal ("" if it accepted the op).
std::string Refusal(const OpDesc& op, const OpContext& ctx = Ctx()) {
  absl::StatusOr<OpShape> s = ValidateOp(op, ctx);
  if (s.ok()) return "";
  EXPECT_EQ(s.status().code(), absl::StatusCode::kInvalidArgument);
  return std::string(s.status().message());
}

std::string BufferRefusal(const OpDesc& op, uint64_t buffer_bytes, const OpContext& ctx = Ctx()) {
  absl::StatusOr<OpShape> shape = ValidateOp(op, ctx);
  EXPECT_TRUE(shape.ok()) << shape.status();
  if (!shape.ok()) return "not validated";
  absl::Status s = CheckOpBuffer(op, ctx, *shape, buffer_bytes);
  if (s.ok()) return "";
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  return std::string(s.message());
}

TEST(ValidateOp, MeasuresTheOpAndItsPlan) {
  absl::StatusOr<OpShape> s = ValidateOp(Allreduce(16), Ctx());
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_EQ(s->bytes, 64u);
  EXPECT_EQ(s->blocks, 1u);
  EXPECT_EQ(s->plan_code, kAutoCode);

  OpDesc gather = Allreduce(16);
  gather.kind = CollectiveKind::kAllgather;
  gather.dtype = DType::kF64;
  gather.algorithm = "ring";
  s = ValidateOp(gather, Ctx(4));
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_EQ(s->bytes, 16u * 8 * 4);
  EXPECT_EQ(s->blocks, 4u);
  EXPECT_EQ(s->plan_code, static_cast<uint8_t>(Algorithm::kRing));
}

TEST(ValidateOp, NamesTheEnumValueAndTheValidOnes) {
  OpDesc op = Allreduce();
  op.kind = static_cast<CollectiveKind>(12);
  EXPECT_EQ(Refusal(op),
            "op 'grad/w' on rank 2: collective 12 is not a valid value (1..11: allreduce "
            "reduce_scatter allgather broadcast reduce alltoall barrier gather scatter send recv)");
  op = Allreduce();
  op.dtype = static_cast<DType>(42);
  EXPECT_EQ(Refusal(op),
            "allreduce 'grad/w' on rank 2: dtype 42 is not a valid value (1..9: f32 f64 f16 bf16 "
            "i32 i64 u8 f8e4m3 f8e5m2)");
  op = Allreduce();
  op.op = static_cast<ReduceOp>(0);
  EXPECT_EQ(Refusal(op),
            "allreduce 'grad/w' on rank 2: reduce op 0 is not a valid value (1..6: sum avg min "
            "max prod premul_sum)");
}

TEST(ValidateOp, LeavesTheRankOutWhenItIsNotKnown) {
  OpDesc op = Allreduce();
  op.dtype = static_cast<DType>(42);
  OpContext ctx = Ctx();
  ctx.rank = -1;
  EXPECT_EQ(Refusal(op, ctx).substr(0, 24), "allreduce 'grad/w': dtyp");
}

TEST(ValidateOp, RefusesALongNameWithoutQuotingIt) {
  OpDesc op = Allreduce();
  op.name = std::string(kMaxOpNameBytes + 1, 'n');
  EXPECT_EQ(Refusal(op), "allreduce on rank 2: op name is 257 bytes; the limit is 256");
  op.name.pop_back();
  EXPECT_EQ(Refusal(op), "");
}

TEST(ValidateOp, RootMustBeARankOfRootedCollectivesOnly) {
  OpDesc op = Allreduce();
  op.kind = CollectiveKind::kBroadcast;
  op.root = 4;
  EXPECT_EQ(Refusal(op),
            "broadcast 'grad/w' on rank 2: root 4 out of range for world size 4 (expected 0..3)");
  op.root = -1;
  op.kind = CollectiveKind::kReduce;
  EXPECT_EQ(Refusal(op),
            "reduce 'grad/w' on rank 2: root -1 out of range for world size 4 (expected 0..3)");
  op.kind = CollectiveKind::kGather;
  EXPECT_EQ(Refusal(op),
            "gather 'grad/w' on rank 2: root -1 out of range for world size 4 (expected 0..3)");
  op.kind = CollectiveKind::kScatter;
  op.root = 4;
  EXPECT_EQ(Refusal(op),
            "scatter 'grad/w' on rank 2: root 4 out of range for world size 4 (expected 0..3)");
  op.root = 3;
  EXPECT_EQ(Refusal(op), "");
  op.kind = CollectiveKind::kAllreduce;  // no root: any value is ignored
  op.root = -1;
  EXPECT_EQ(Refusal(op), "");
}

// gather and scatter hold world_size blocks of `count`, like allgather.
TEST(ValidateOp, GatherAndScatterAreBlocked) {
  for (CollectiveKind k : {CollectiveKind::kGather, CollectiveKind::kScatter}) {
    OpDesc op = Allreduce(16);
    op.kind = k;
    op.root = 1;
    absl::StatusOr<OpShape> s = ValidateOp(op, Ctx(4));
    ASSERT_TRUE(s.ok()) << s.status();
    EXPECT_EQ(s->blocks, 4u);
    EXPECT_EQ(s->bytes, 16u * 4 * 4);
    op.algorithm = "ring";
    EXPECT_NE(Refusal(op, Ctx(4)).find(absl::StrCat("algorithm 'ring' does not implement ",
                                                     CollectiveName(k), " (pairwise do)")),
              std::string::npos)
        << Refusal(op, Ctx(4));
  }
}

TEST(ValidateOp, TimeoutIsFiniteAndNotNegative) {
  OpDesc op = Allreduce();
  op.timeout = absl::Milliseconds(-1);
  EXPECT_EQ(Refusal(op),
            "allreduce 'grad/w' on rank 2: timeout must be finite and >= 0 (0: the job's "
            "default), got -1ms");
  op.timeout = absl::InfiniteDuration();
  EXPECT_EQ(Refusal(op),
            "allreduce 'grad/w' on rank 2: timeout must be finite and >= 0 (0: the job's "
            "default), got inf");
}

TEST(ValidateOp, OnlyABarrierMayHaveNoBuffer) {
  OpDesc op = Allreduce();
  op.buffer_id = 0;
  EXPECT_EQ(Refusal(op), "allreduce 'grad/w' on rank 2: no buffer (only a barrier may have none)");
  op.kind = CollectiveKind::kBarrier;
  EXPECT_EQ(Refusal(op),
            "barrier 'grad/w' on rank 2: a barrier without a buffer must have count 0, got 16");
  op.count = 0;
  EXPECT_EQ(Refusal(op), "");
}

TEST(ValidateOp, CountIsAtMostTheLargestOp) {
  OpDesc op = Allreduce(kMaxOpBytes / 4 + 1);
  EXPECT_EQ(Refusal(op),
            "allreduce 'grad/w' on rank 2: count 274877906945 x 4-byte f32 is more than "
            "1099511627776 bytes (the largest op)");
  op.kind = CollectiveKind::kAlltoall;
  op.count = kMaxOpBytes / 4 / 4 + 1;
  EXPECT_EQ(Refusal(op),
            "alltoall 'grad/w' on rank 2: count 68719476737 x 4 blocks x 4-byte f32 is more than "
            "1099511627776 bytes (the largest op)");
  op.count = ~uint64_t{0};  // no overflow
  EXPECT_NE(Refusal(op), "");
  op.count = kMaxOpBytes / 4 / 4;
  EXPECT_EQ(Refusal(op), "");
}

// An op's own codec must apply to it; the job's applies where it can.
TEST(ValidateOp, AnOpsCodecMustApplyToIt) {
  OpDesc op = Allreduce(8192);
  op.codec = "int8";
  absl::StatusOr<OpShape> s = ValidateOp(op, Ctx());
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_EQ(s->codecs, ParseCodecRequest("int8", false)->Code());
  op.dtype = DType::kF64;
  EXPECT_EQ(Refusal(op), "allreduce 'grad/w' on rank 2: codec 'int8' does not apply: codecs "
                         "encode f32 values, not f64");
  op.dtype = DType::kF32;
  op.op = ReduceOp::kMin;
  EXPECT_EQ(Refusal(op), "allreduce 'grad/w' on rank 2: codec 'int8' does not apply: codecs sum "
                         "(sum, avg, premul_sum), not min");
  op.op = ReduceOp::kAvg;
  op.algorithm = "rhd";
  EXPECT_EQ(Refusal(op), "allreduce 'grad/w' on rank 2: codec 'int8' does not apply: compressed "
                         "ops run the ring algorithm ('ring' or 'hier'), not 'rhd'");
  op.algorithm = "";
  op.kind = CollectiveKind::kBroadcast;
  EXPECT_EQ(Refusal(op), "broadcast 'grad/w' on rank 2: codec 'int8' does not apply: codecs "
                         "compress allreduce and reduce_scatter only");
  op = Allreduce(100);
  op.codec = "bf16";
  EXPECT_EQ(Refusal(op), "allreduce 'grad/w' on rank 2: codec 'bf16' does not apply: 100 "
                         "elements per rank are fewer than one codec block (4096)");
  op.codec = "lz4";
  EXPECT_EQ(Refusal(op), "allreduce 'grad/w' on rank 2: unknown codec 'lz4' (codecs: none, bf16, "
                         "fp16, fp8e4m3 (or fp8), fp8e5m2, int8); or 'auto', or 'auto:' and a "
                         "list of codecs, or 'topk:RATIO'");
  // The job's codec and auto: whatever the op, no refusal.
  OpContext ctx = Ctx();
  ctx.job_codec = "int8";
  op = Allreduce(4);
  op.dtype = DType::kI32;
  s = ValidateOp(op, ctx);
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_EQ(CodecRequest::FromCode(s->codecs).ToString(), "int8 (job)");
  op.codec = "auto";
  EXPECT_TRUE(ValidateOp(op, ctx).ok());
}

TEST(ValidateOp, RequestedPlanMustRunTheCollective) {
  OpDesc op = Allreduce();
  op.algorithm = "bogus";
  EXPECT_EQ(Refusal(op).substr(0, 58),
            "allreduce 'grad/w' on rank 2: unknown algorithm 'bogus' (c");
  op.kind = CollectiveKind::kBroadcast;
  op.algorithm = "hier";
  EXPECT_EQ(Refusal(op),
            "broadcast 'grad/w' on rank 2: algorithm 'hier' does not implement broadcast "
            "(hierarchical: allreduce only)");
  // "auto" and "" defer to the job's algorithm, which is checked the same way.
  op.algorithm = "auto";
  OpContext ctx = Ctx();
  ctx.job_algorithm = "ps";
  EXPECT_EQ(Refusal(op, ctx),
            "broadcast 'grad/w' on rank 2: algorithm 'ps' does not implement broadcast "
            "(parameter server: allreduce only)");
}

TEST(ValidateOp, ChecksThePlanAgainstTheJobOnlyWhereItIsKnown) {
  OpDesc op = Allreduce();
  op.algorithm = "ps";
  OpContext ctx = Ctx();
  EXPECT_EQ(Refusal(op, ctx), "");  // the SDK: not known, the daemon decides
  ctx.has_ps = false;
  EXPECT_EQ(Refusal(op, ctx),
            "allreduce 'grad/w' on rank 2: algorithm 'ps' needs parameter-server shards; job "
            "'job-7' has none (create it with ps_shards > 0 and start gradsync-ps)");
  ctx.has_ps = true;
  EXPECT_EQ(Refusal(op, ctx), "");

  op.algorithm = "hier";
  EXPECT_EQ(Refusal(op, ctx), "");
  ctx.one_rank_per_daemon = true;
  EXPECT_EQ(Refusal(op, ctx),
            "allreduce 'grad/w' on rank 2: algorithm 'hier' needs ranks that share a daemon; job "
            "'job-7' has one rank per daemon");
  ctx.one_rank_per_daemon = false;
  absl::StatusOr<OpShape> s = ValidateOp(op, ctx);
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_EQ(s->plan_code, kHierarchicalPlanCode);
}

TEST(CheckOpBuffer, OffsetIsAMultipleOfTheElementSize) {
  OpDesc op = Allreduce(1);
  op.offset_bytes = 2;
  EXPECT_EQ(BufferRefusal(op, 4096),
            "allreduce 'grad/w' on rank 2: offset_bytes 2 is not a multiple of the f32 element "
            "size 4");
}

TEST(CheckOpBuffer, SaysHowManyElementsFit) {
  EXPECT_EQ(BufferRefusal(Allreduce(1025), 4096),
            "allreduce 'grad/w' on rank 2: count 1025 x 4-byte f32 (4100 bytes) at offset_bytes 0 "
            "does not fit in buffer 3 (4096 bytes; at most 1024 elements fit)");
  OpDesc op = Allreduce(1);
  op.offset_bytes = 4096;  // past the end
  EXPECT_EQ(BufferRefusal(op, 4096),
            "allreduce 'grad/w' on rank 2: count 1 x 4-byte f32 (4 bytes) at offset_bytes 4096 "
            "does not fit in buffer 3 (4096 bytes; at most 0 elements fit)");
  op.offset_bytes = 8192;
  EXPECT_NE(BufferRefusal(op, 4096), "");
  op = Allreduce(300);
  op.kind = CollectiveKind::kReduceScatter;
  EXPECT_EQ(BufferRefusal(op, 4096),
            "reduce_scatter 'grad/w' on rank 2: count 300 x 4 blocks x 4-byte f32 (4800 bytes) at "
            "offset_bytes 0 does not fit in buffer 3 (4096 bytes; at most 256 elements per block "
            "fit)");
  EXPECT_EQ(BufferRefusal(Allreduce(1024), 4096), "");
  op = Allreduce(1022);
  op.offset_bytes = 8;
  EXPECT_EQ(BufferRefusal(op, 4096), "");
}

TEST(SetOpEnums, NarrowsOnlyValidValuesWithValidateOpsWords) {
  OpDesc op = Allreduce();
  ASSERT_TRUE(SetOpEnums(4, 5, 3, Ctx(), &op).ok());
  EXPECT_EQ(op.kind, CollectiveKind::kBroadcast);
  EXPECT_EQ(op.dtype, DType::kI32);
  EXPECT_EQ(op.op, ReduceOp::kMin);
  // 257 would wrap to a valid byte (1) in a plain cast.
  absl::Status s = SetOpEnums(257, 1, 1, Ctx(), &op);
  EXPECT_EQ(s.message(),
            "op 'grad/w' on rank 2: collective 257 is not a valid value (1..11: allreduce "
            "reduce_scatter allgather broadcast reduce alltoall barrier gather scatter send recv)");
  s = SetOpEnums(1, 257, 1, Ctx(), &op);
  EXPECT_EQ(s.message(),
            "allreduce 'grad/w' on rank 2: dtype 257 is not a valid value (1..9: f32 f64 f16 bf16 "
            "i32 i64 u8 f8e4m3 f8e5m2)");
  s = SetOpEnums(1, 1, -1, Ctx(), &op);
  EXPECT_EQ(s.message(),
            "allreduce 'grad/w' on rank 2: reduce op -1 is not a valid value (1..6: sum avg min "
            "max prod premul_sum)");
  EXPECT_EQ(op.kind, CollectiveKind::kBroadcast);  // untouched by the refusals
}

}  // namespace
}  // namespace gradsync

namespace gradsync {
namespace {

// What RunCollective runs for callers without the SDK or the daemon: the
// same words, without a name when there is none.
TEST(CheckOpValues, IsValidateOpsFirstCheckWithOrWithoutAName) {
  OpContext ctx = Ctx();
  EXPECT_TRUE(CheckOpValues(CollectiveKind::kReduce, DType::kF16, ReduceOp::kMax, 3, ctx).ok());
  EXPECT_EQ(CheckOpValues(CollectiveKind::kReduce, DType::kF16, ReduceOp::kMax, 4, ctx).message(),
            "reduce on rank 2: root 4 out of range for world size 4 (expected 0..3)");
  EXPECT_EQ(CheckOpValues(CollectiveKind::kBarrier, static_cast<DType>(0), ReduceOp::kSum, 0, ctx,
                          "b")
                .message(),
            "barrier 'b' on rank 2: dtype 0 is not a valid value (1..9: f32 f64 f16 bf16 i32 i64 "
            "u8 f8e4m3 f8e5m2)");
  ctx.rank = -1;
  EXPECT_EQ(CheckOpValues(static_cast<CollectiveKind>(12), DType::kF32, ReduceOp::kSum, 0, ctx)
                .message(),
            "op: collective 12 is not a valid value (1..11: allreduce reduce_scatter allgather "
            "broadcast reduce alltoall barrier gather scatter send recv)");
}

}  // namespace
}  // namespace gradsync
