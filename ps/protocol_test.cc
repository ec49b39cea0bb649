#include "ps/protocol.h"

#include <string>

#include "gtest/gtest.h"

namespace gradsync::ps {
namespace {

StepHeader Example() {
  StepHeader h;
  h.step = 7;
  h.dtype = DType::kBF16;
  h.op = ReduceOp::kAvg;
  h.workers = 3;
  h.rank = 1;
  h.shards = 2;
  h.shard = 1;
  h.tensor_bytes = 2000;
  h.partition_bytes = 600;
  h.partitions = 4;
  h.table = {Partition{1, 600, 600, 1}, Partition{3, 1800, 200, 1}};
  return h;
}

TEST(PsProtocol, StepHeaderRoundTrips) {
  const StepHeader h = Example();
  const std::string wire = EncodeStepHeader(h);
  EXPECT_EQ(wire.size(), sizeof(StepHeaderWire) + 2 * sizeof(PartitionEntryWire));
  absl::StatusOr<StepHeader> back = DecodeStepHeader(7, wire);
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_TRUE(SameStep(h, *back));
  EXPECT_EQ(back->rank, 1);
  EXPECT_EQ(back->table, h.table);
  EXPECT_EQ(DescribeStepHeader(h).rfind("bf16 avg of 2000 bytes in 4 partitions of 600 bytes over "
                                        "2 shards by 3 workers (2 partitions here, table ",
                                        0),
            0u)
      << DescribeStepHeader(h);
}

TEST(PsProtocol, SameStepIgnoresOnlyTheRank) {
  StepHeader a = Example(), b = Example();
  b.rank = 2;
  EXPECT_TRUE(SameStep(a, b));
  b.table[1].bytes = 100;
  EXPECT_FALSE(SameStep(a, b));
  EXPECT_NE(DescribeStepHeader(a), DescribeStepHeader(b));
  b = Example();
  b.op = ReduceOp::kSum;
  EXPECT_FALSE(SameStep(a, b));
}

TEST(PsProtocol, DecodeRefusesBadHeaders) {
  auto refused = [](StepHeader h, const std::string& why) {
    const absl::StatusOr<StepHeader> d = DecodeStepHeader(1, EncodeStepHeader(h));
    EXPECT_TRUE(absl::IsInvalidArgument(d.status())) << why;
    if (!d.ok()) EXPECT_NE(d.status().message().find(why), std::string::npos) << d.status();
  };
  StepHeader h = Example();
  h.rank = 3;
  refused(h, "rank 3 of 3 workers");
  h = Example();
  h.shard = 2;
  refused(h, "shard 2 of 2");
  h = Example();
  h.tensor_bytes = kMaxTensorBytes + 2;
  refused(h, "tensor of");
  h = Example();
  h.tensor_bytes = 2001;  // not whole bf16 elements
  refused(h, "tensor of 2001 bytes");
  h = Example();
  h.table[1].bytes = 400;  // past the end
  refused(h, "partition 3 [1800, +400)");
  h = Example();
  h.table[1].id = 1;  // ids must increase
  refused(h, "ids must increase");
  h = Example();
  h.table.clear();
  refused(h, "0 of 4 partitions");
  h = Example();
  h.partitions = kMaxPartitions + 1;
  refused(h, "partitions (at most");

  const std::string wire = EncodeStepHeader(Example());
  EXPECT_FALSE(DecodeStepHeader(1, wire.substr(0, wire.size() - 1)).ok());
  EXPECT_FALSE(DecodeStepHeader(1, wire.substr(0, 10)).ok());
  std::string bad_magic = wire;
  bad_magic[0] ^= 1;
  EXPECT_FALSE(DecodeStepHeader(1, bad_magic).ok());
}

TEST(PsProtocol, AbortFramesCarryTheStatusCodeAndACappedMessage) {
  std::string payload;
  const transport::FrameHeader h =
      MakeAbortFrame(1, 2, 9, absl::DeadlineExceededError(std::string(5000, 'x')), &payload);
  EXPECT_EQ(h.type, static_cast<uint8_t>(transport::FrameType::kAbort));
  EXPECT_EQ(h.op_seq, 9u);
  EXPECT_EQ(payload.size(), transport::kMaxAbortBytes);
  EXPECT_TRUE(transport::ValidateFrameHeader(h).ok());
  const absl::Status s = AbortStatus(h, payload);
  EXPECT_TRUE(absl::IsDeadlineExceeded(s));
  transport::FrameHeader odd = h;
  odd.offset = 999;
  EXPECT_TRUE(absl::IsAborted(AbortStatus(odd, "x")));
}

TEST(PsProtocol, PsJobIdsArePrefixedAndBounded) {
  EXPECT_EQ(*PsJobId("train"), "ps/train");
  EXPECT_EQ(JobOfPsJobId("ps/train"), "train");
  EXPECT_EQ(PsJobId(std::string(kMaxJobIdBytes, 'a'))->size(), transport::kMaxJobIdBytes);
  EXPECT_FALSE(PsJobId(std::string(kMaxJobIdBytes + 1, 'a')).ok());
  EXPECT_FALSE(PsJobId("").ok());
}

}  // namespace
}  // namespace gradsync::ps
