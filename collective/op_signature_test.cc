#include "collective/op_signature.h"

#include "gtest/gtest.h"

namespace gradsync {
namespace {

OpSignature Sig(CollectiveKind kind, int root = 0) {
  OpSignature s;
  s.seq = 9;
  s.kind = kind;
  s.dtype = DType::kF32;
  s.op = ReduceOp::kSum;
  s.count = 10;
  s.root = root;
  s.name = "w";
  return s;
}

TEST(OpSignature, DescribeShowsWhatEachCollectiveUses) {
  EXPECT_EQ(Sig(CollectiveKind::kAllreduce).Describe(), "allreduce 'w' f32[10] sum");
  EXPECT_EQ(Sig(CollectiveKind::kReduceScatter).Describe(), "reduce_scatter 'w' f32[10] sum");
  EXPECT_EQ(Sig(CollectiveKind::kAllgather).Describe(), "allgather 'w' f32[10]");
  EXPECT_EQ(Sig(CollectiveKind::kBroadcast, 2).Describe(), "broadcast 'w' f32[10] root 2");
  EXPECT_EQ(Sig(CollectiveKind::kReduce, 3).Describe(), "reduce 'w' f32[10] sum root 3");
  EXPECT_EQ(Sig(CollectiveKind::kAlltoall).Describe(), "alltoall 'w' f32[10]");
  EXPECT_EQ(Sig(CollectiveKind::kBarrier).Describe(), "barrier 'w'");
}

TEST(OpSignature, EncodeDecodeRoundTripsEveryKindAndTheRoot) {
  for (CollectiveKind k : kAllCollectives) {
    OpSignature s = Sig(k, 5);
    s.name = std::string(kMaxOpNameBytes, 'n');
    auto d = OpSignature::Decode(s.Encode());
    ASSERT_TRUE(d.ok()) << d.status();
    EXPECT_TRUE(*d == s) << d->Describe();
    EXPECT_EQ(d->root, 5);
  }
}

TEST(OpSignature, DecodeRejectsMalformedSignatures) {
  std::string good = Sig(CollectiveKind::kBroadcast, 1).Encode();
  EXPECT_TRUE(OpSignature::Decode(good).ok());
  EXPECT_FALSE(OpSignature::Decode(good.substr(0, 10)).ok());
  EXPECT_FALSE(OpSignature::Decode(good + "x").ok());
  for (uint8_t kind : {0, 8, 255}) {
    std::string bad = good;
    bad[16] = static_cast<char>(kind);  // PackedSignature::kind
    EXPECT_FALSE(OpSignature::Decode(bad).ok()) << int{kind};
  }
  OpSignature longname = Sig(CollectiveKind::kAllreduce);
  longname.name = std::string(kMaxOpNameBytes + 1, 'n');
  EXPECT_FALSE(OpSignature::Decode(longname.Encode()).ok());
}

TEST(OpSignature, RootTakesPartInEquality) {
  EXPECT_FALSE(Sig(CollectiveKind::kBroadcast, 1) == Sig(CollectiveKind::kBroadcast, 2));
}

TEST(OpSignature, ProposalsMayDifferButForcedAlgorithmsMustMatch) {
  OpSignature a;
  a.seq = 3;
  a.name = "g";
  a.count = 8;
  OpSignature b = a;
  a.proposal = static_cast<uint8_t>(Algorithm::kRing);
  b.proposal = static_cast<uint8_t>(Algorithm::kRecursiveDoubling);
  EXPECT_TRUE(CompareSignatures(3, {a.Encode(), b.Encode()}).ok());
  EXPECT_EQ(SignatureProposal(b.Encode()), static_cast<uint8_t>(Algorithm::kRecursiveDoubling));
  b.forced = static_cast<uint8_t>(Algorithm::kBinomialTree);
  absl::Status s = CompareSignatures(3, {a.Encode(), b.Encode()});
  EXPECT_TRUE(absl::IsInvalidArgument(s)) << s;
  EXPECT_EQ(s.message(),
            "op 3 does not match across ranks: rank 0 submitted allreduce 'g' f32[8] sum, "
            "rank 1 submitted allreduce 'g' f32[8] sum algo tree");
  auto round = OpSignature::Decode(b.Encode());
  ASSERT_TRUE(round.ok());
  EXPECT_EQ(round->forced, b.forced);
  EXPECT_EQ(round->proposal, b.proposal);
}

}  // namespace
}  // namespace gradsync
