#include "collective/op_signature.h"

#include <cstring>
#include <vector>

#include "absl/strings/str_cat.h"
#include "collective/test_cluster.h"
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

// oneshot's data rides with the signatures; a rank that carried data while
// another did not (their ops differ in size across the oneshot cap, say) is
// still a clean mismatch, and the next exchange on the same streams works.
TEST(CheckSignatures, EagerDataArrivesAndAMismatchLeavesTheStreamsAligned) {
  constexpr int kWorld = 3;
  testing::Cluster c = testing::MakeCluster(kWorld, "sig-eager");
  const absl::Time deadline = absl::Now() + absl::Seconds(20);
  std::vector<std::vector<char>> inboxes(kWorld);
  // Op 1: every rank sends 12 bytes with its signature.
  std::vector<absl::Status> st = testing::RunOnRanks(kWorld, [&](int r) -> absl::Status {
    OpSignature sig;
    sig.seq = 1;
    sig.name = "g";
    sig.count = 3;
    const std::vector<int32_t> mine = {r, 10 * r, 100 * r};
    EagerData eager;
    eager.data = mine.data();
    eager.bytes = 12;
    absl::Status s = CheckSignatures(*c.contexts[r], sig, deadline, nullptr, nullptr, &eager,
                                     &inboxes[r]);
    if (!s.ok()) return s;
    for (int p = 0; p < kWorld; ++p) {
      if (p == r) {
        if (eager.received[p] != nullptr) return absl::InternalError("own slot set");
        continue;
      }
      int32_t got[3];
      std::memcpy(got, eager.received[p], sizeof(got));
      if (got[0] != p || got[1] != 10 * p || got[2] != 100 * p) {
        return absl::InternalError(absl::StrCat("rank ", r, ": wrong data from rank ", p));
      }
    }
    return absl::OkStatus();
  });
  for (int r = 0; r < kWorld; ++r) ASSERT_TRUE(st[r].ok()) << "rank " << r << ": " << st[r];
  // Op 2: rank 1 submitted a bigger op and carries no data; ranks 0 and 2
  // carry 8 bytes.
  st = testing::RunOnRanks(kWorld, [&](int r) -> absl::Status {
    OpSignature sig;
    sig.seq = 2;
    sig.name = "g";
    sig.count = r == 1 ? 70000 : 2;
    const int64_t mine = r;
    EagerData eager;
    eager.data = &mine;
    eager.bytes = 8;
    return CheckSignatures(*c.contexts[r], sig, deadline, nullptr, nullptr,
                           r == 1 ? nullptr : &eager, &inboxes[r]);
  });
  for (int r = 0; r < kWorld; ++r) {
    EXPECT_TRUE(absl::IsInvalidArgument(st[r])) << st[r];
    EXPECT_EQ(st[r].message(),
              "op 2 does not match across ranks: rank 1 submitted allreduce 'g' f32[70000] sum, "
              "ranks 0,2 submitted allreduce 'g' f32[2] sum");
  }
  // Op 3: plain signatures again, on the same streams.
  st = testing::RunOnRanks(kWorld, [&](int r) -> absl::Status {
    OpSignature sig;
    sig.seq = 3;
    sig.name = "after";
    uint8_t agreed = 0;
    sig.proposal = static_cast<uint8_t>(10 + r);
    absl::Status s = CheckSignatures(*c.contexts[r], sig, deadline, nullptr, &agreed);
    if (s.ok() && agreed != 10) return absl::InternalError("rank 0's proposal should win");
    return s;
  });
  for (int r = 0; r < kWorld; ++r) EXPECT_TRUE(st[r].ok()) << "rank " << r << ": " << st[r];
  // Equal signatures but one rank carrying no data: named, not misread.
  st = testing::RunOnRanks(kWorld, [&](int r) -> absl::Status {
    OpSignature sig;
    sig.seq = 4;
    sig.name = "g";
    sig.count = 1;
    const float mine = 1;
    EagerData eager;
    eager.data = &mine;
    eager.bytes = 4;
    return CheckSignatures(*c.contexts[r], sig, deadline, nullptr, nullptr,
                           r == 2 ? nullptr : &eager, &inboxes[r]);
  });
  EXPECT_TRUE(absl::IsInvalidArgument(st[0])) << st[0];
  EXPECT_EQ(st[0].message(),
            "op 4 (allreduce 'g' f32[1] sum): rank 2 sent 0 bytes of data with its signature; "
            "rank 0 expected 4 (the ranks disagree on whether the op runs oneshot)");
  EXPECT_TRUE(absl::IsInvalidArgument(st[2])) << st[2];
  // Received data is 16-byte aligned whatever the op name's length.
  st = testing::RunOnRanks(kWorld, [&](int r) -> absl::Status {
    OpSignature sig;
    sig.seq = 5;
    sig.name = "odd";  // 32 + 3 bytes of signature
    sig.dtype = DType::kF64;
    sig.count = 2;
    const double mine[2] = {1.5 * r, -2.0 * r};
    EagerData eager;
    eager.data = mine;
    eager.bytes = sizeof(mine);
    absl::Status s = CheckSignatures(*c.contexts[r], sig, deadline, nullptr, nullptr, &eager,
                                     &inboxes[r]);
    if (!s.ok()) return s;
    for (int p = 0; p < kWorld; ++p) {
      if (p == r) continue;
      if (reinterpret_cast<uintptr_t>(eager.received[p]) % 16 != 0) {
        return absl::InternalError(absl::StrCat("rank ", r, ": data from ", p, " not aligned"));
      }
      const double* d = reinterpret_cast<const double*>(eager.received[p]);
      if (d[0] != 1.5 * p || d[1] != -2.0 * p) return absl::InternalError("wrong data");
    }
    return absl::OkStatus();
  });
  for (int r = 0; r < kWorld; ++r) EXPECT_TRUE(st[r].ok()) << "rank " << r << ": " << st[r];
}

}  // namespace
}  // namespace gradsync
