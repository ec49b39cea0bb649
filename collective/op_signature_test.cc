#include "collective/op_signature.h"

#include "collective/codec_request.h"
#include "collective/signature_exchange.h"

#include <algorithm>
#include <cstring>
#include <functional>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "collective/reference.h"
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
  for (uint8_t kind : {0, 10, 255}) {  // 1..9 are the collectives
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

// The codec request is compared, the codec proposal is not (rank 0's wins).
TEST(OpSignature, CodecRequestsMustMatchCodecProposalsMayDiffer) {
  OpSignature a;
  a.seq = 4;
  a.name = "g";
  a.count = 8192;
  a.codecs = ParseCodecRequest("int8", false)->Code();
  OpSignature b = a;
  a.codec = static_cast<uint8_t>(CodecId::kInt8);
  b.codec = static_cast<uint8_t>(CodecId::kNone);
  EXPECT_TRUE(CompareSignatures(4, {a.Encode(), b.Encode()}).ok());
  EXPECT_EQ(SignatureCodec(a.Encode()), static_cast<uint8_t>(CodecId::kInt8));
  auto round = OpSignature::Decode(a.Encode());
  ASSERT_TRUE(round.ok());
  EXPECT_EQ(round->codec, static_cast<uint8_t>(CodecId::kInt8));
  EXPECT_EQ(round->codecs, a.codecs);
  b.codecs = 0;
  const absl::Status s = CompareSignatures(4, {a.Encode(), b.Encode()});
  EXPECT_EQ(s.message(),
            "op 4 does not match across ranks: rank 0 submitted allreduce 'g' f32[8192] sum "
            "codec int8, rank 1 submitted allreduce 'g' f32[8192] sum");
}

// Top-k parameters are compared: ranks asking for another ratio mismatch.
TEST(OpSignature, TopkParametersMustMatch) {
  OpSignature a;
  a.seq = 5;
  a.name = "bucket0";
  a.count = 8192;
  a.sparse = ParseSparseSpec("0.01,warmup=3")->Code();
  auto round = OpSignature::Decode(a.Encode());
  ASSERT_TRUE(round.ok());
  EXPECT_EQ(round->sparse, a.sparse);
  OpSignature b = a;
  b.sparse = ParseSparseSpec("0.02,warmup=3")->Code();
  EXPECT_FALSE(SameSignature(a.Encode(), b.Encode()));
  EXPECT_EQ(CompareSignatures(5, {a.Encode(), b.Encode()}).message(),
            "op 5 does not match across ranks: rank 0 submitted allreduce 'bucket0' f32[8192] sum "
            "codec topk:0.01,warmup=3, rank 1 submitted allreduce 'bucket0' f32[8192] sum codec "
            "topk:0.02,warmup=3");
}

constexpr SignaturePattern kPatterns[] = {SignaturePattern::kAllToAll,
                                          SignaturePattern::kRecursiveDoubling};

struct FusedCase {
  DType t;
  ReduceOp op;
  size_t count;
};

// Both patterns, every world size from 2 to 8: the data ride with the
// signatures and every rank ends with the same bits, in the pattern's order
// (random floats, so another order would show).
TEST(CheckSignatures, FusedAllreduceGivesEveryRankThePatternsBits) {
  const std::vector<FusedCase> cases = {{DType::kF32, ReduceOp::kSum, 13},
                                        {DType::kF64, ReduceOp::kAvg, 5},
                                        {DType::kBF16, ReduceOp::kSum, 1000},
                                        {DType::kI32, ReduceOp::kMax, 3},
                                        {DType::kF32, ReduceOp::kSum, kOneShotMaxBytes / 4}};
  for (int world = 2; world <= 8; ++world) {
   for (SignaturePattern pattern : kPatterns) {
    testing::Cluster c = testing::MakeCluster(world, absl::StrCat("fused-", world));
    std::vector<SignatureScratch> inboxes(world);
    uint64_t seq = 1;
    for (const FusedCase& fc : cases) {
      std::vector<std::vector<char>> in(world), out(world);
      for (int r = 0; r < world; ++r) in[r] = testing::RandomData(fc.t, fc.count, r, 7 + seq);
      const std::vector<char> want = testing::SignaturePatternReference(pattern, in, fc.t, fc.op, fc.count);
      std::vector<int> arrivals(world, 0);
      std::vector<uint8_t> agreed(world, 0);
      std::vector<absl::Status> st = testing::RunOnRanks(world, [&](int r) -> absl::Status {
        OpSignature sig;
        sig.seq = seq;
        sig.name = "g";
        sig.dtype = fc.t;
        sig.op = fc.op;
        sig.count = fc.count;
        sig.proposal = static_cast<uint8_t>(20 + r);
        out[r] = in[r];
        FusedAllreduce fused{out[r].data(), fc.t, fc.op, fc.count};
        int seen = 0;
        absl::Status s = CheckSignatures(
            *c.contexts[r], sig, pattern, absl::Now() + absl::Seconds(20), [&](int) { ++seen; },
            &agreed[r], &fused, &inboxes[r]);
        arrivals[r] = seen;
        return s;
      });
      for (int r = 0; r < world; ++r) {
        ASSERT_TRUE(st[r].ok()) << "world " << world << " rank " << r << ": " << st[r];
        EXPECT_EQ(out[r], want) << SignaturePatternName(pattern) << " world " << world << " rank " << r << " "
                                << DTypeName(fc.t) << " " << ReduceOpName(fc.op);
        EXPECT_EQ(arrivals[r], world - 1) << "world " << world << " rank " << r;
        EXPECT_EQ(agreed[r], 20) << "rank 0's proposal wins";
      }
      ++seq;
    }
   }
  }
}

// A mismatch among several groups of ranks, some of which carry data and some
// not (their ops differ across the oneshot cap), is the same InvalidArgument
// on every rank, and the next exchange on the same streams works.
TEST(CheckSignatures, MismatchIsNamedAlikeEverywhereAndTheStreamsStayInStep) {
  for (int world : {3, 4, 5, 8}) {  // recursive doubling folds at 3 and 5
   for (SignaturePattern pattern : kPatterns) {
    testing::Cluster c = testing::MakeCluster(world, absl::StrCat("sig-mismatch-", world));
    const absl::Time deadline = absl::Now() + absl::Seconds(20);
    std::vector<SignatureScratch> inboxes(world);
    const int odd = world - 1;  // submits a bigger op, which carries no data
    std::vector<absl::Status> st = testing::RunOnRanks(world, [&](int r) -> absl::Status {
      OpSignature sig;
      sig.seq = 1;
      sig.name = r == 1 ? "h" : "g";
      sig.count = r == odd ? 70000 : 2;
      float mine[2] = {1, 2};
      FusedAllreduce fused{mine, DType::kF32, ReduceOp::kSum, 2};
      absl::Status s = CheckSignatures(*c.contexts[r], sig, pattern, deadline, nullptr, nullptr,
                                       r == odd ? nullptr : &fused, &inboxes[r]);
      if (mine[0] != 1 || mine[1] != 2) return absl::InternalError("data changed on failure");
      return s;
    });
    std::string others;
    for (int r = 0; r < world; ++r) {
      if (r != 1 && r != odd) absl::StrAppend(&others, others.empty() ? "" : ",", r);
    }
    // Smaller groups first, then by their lowest rank.
    const std::string want =
        world == 3 ? "op 1 does not match across ranks: rank 0 submitted allreduce 'g' f32[2] sum, "
                     "rank 1 submitted allreduce 'h' f32[2] sum, rank 2 submitted allreduce 'g' "
                     "f32[70000] sum"
                   : absl::StrCat("op 1 does not match across ranks: rank 1 submitted allreduce "
                                  "'h' f32[2] sum, rank ", odd, " submitted allreduce 'g' "
                                  "f32[70000] sum, ranks ", others,
                                  " submitted allreduce 'g' f32[2] sum");
    for (int r = 0; r < world; ++r) {
      EXPECT_TRUE(absl::IsInvalidArgument(st[r])) << st[r];
      EXPECT_EQ(st[r].message(), want) << SignaturePatternName(pattern) << " world " << world << " rank " << r;
    }
    // Op 2 on the same streams: plain signatures, rank 0's proposal wins.
    st = testing::RunOnRanks(world, [&](int r) -> absl::Status {
      OpSignature sig;
      sig.seq = 2;
      sig.name = "after";
      uint8_t agreed = 0;
      sig.proposal = static_cast<uint8_t>(10 + r);
      absl::Status s = CheckSignatures(*c.contexts[r], sig, pattern, deadline, nullptr, &agreed);
      if (s.ok() && agreed != 10) return absl::InternalError("rank 0's proposal should win");
      return s;
    });
    for (int r = 0; r < world; ++r) EXPECT_TRUE(st[r].ok()) << "rank " << r << ": " << st[r];
    // Equal signatures, but one rank carries no data: named, not misread.
    const int bare = world / 2;
    st = testing::RunOnRanks(world, [&](int r) -> absl::Status {
      OpSignature sig;
      sig.seq = 3;
      sig.name = "g";
      sig.count = 1;
      float mine = 1;
      FusedAllreduce fused{&mine, DType::kF32, ReduceOp::kSum, 1};
      return CheckSignatures(*c.contexts[r], sig, pattern, deadline, nullptr, nullptr,
                             r == bare ? nullptr : &fused, &inboxes[r]);
    });
    for (int r = 0; r < world; ++r) {
      EXPECT_TRUE(absl::IsInvalidArgument(st[r])) << st[r];
      const std::string expect =
          r == bare ? absl::StrCat("op 3 (allreduce 'g' f32[1] sum): rank 0 sent 4 bytes of data "
                                   "with its signature; rank ", bare, " expected 0")
                    : absl::StrCat("op 3 (allreduce 'g' f32[1] sum): rank ", bare,
                                   " sent 0 bytes of data with its signature; rank ", r,
                                   " expected 4");
      EXPECT_EQ(st[r].message(), expect + " (the ranks disagree on whether the op runs oneshot)")
          << SignaturePatternName(pattern) << " world " << world << " rank " << r;
    }
    // And the streams are still in step.
    st = testing::RunOnRanks(world, [&](int r) -> absl::Status {
      OpSignature sig;
      sig.seq = 4;
      sig.name = "last";
      int32_t mine = r;
      FusedAllreduce fused{&mine, DType::kI32, ReduceOp::kSum, 1};
      absl::Status s = CheckSignatures(*c.contexts[r], sig, pattern, deadline, nullptr, nullptr, &fused,
                                       &inboxes[r]);
      if (s.ok() && mine != world * (world - 1) / 2) return absl::InternalError("wrong sum");
      return s;
    });
    for (int r = 0; r < world; ++r) EXPECT_TRUE(st[r].ok()) << "rank " << r << ": " << st[r];
   }
  }
}

// The stream count proposal is not compared either: every rank gets rank 0's.
TEST(CheckSignatures, EveryRankGetsRankZerosStreamProposal) {
  for (SignaturePattern pattern : kPatterns) {
    for (int world : {3, 5}) {
      testing::Cluster c = testing::MakeCluster(world, absl::StrCat("streams-", world));
      std::vector<uint8_t> agreed(world, 0), streams(world, 0), codecs(world, 0);
      std::vector<absl::Status> st = testing::RunOnRanks(world, [&](int r) -> absl::Status {
        OpSignature sig;
        sig.seq = 1;
        sig.name = "big";
        sig.count = 1 << 24;
        sig.proposal = static_cast<uint8_t>(Algorithm::kRing);
        sig.streams = static_cast<uint8_t>(r == 0 ? 1 : 2);
        sig.codec = static_cast<uint8_t>(r == 0 ? CodecId::kBf16 : CodecId::kInt8);
        return CheckSignatures(*c.contexts[r], sig, pattern, absl::Now() + absl::Seconds(20),
                               nullptr, &agreed[r], nullptr, nullptr, &streams[r], nullptr,
                               &codecs[r]);
      });
      for (int r = 0; r < world; ++r) {
        ASSERT_TRUE(st[r].ok()) << st[r];
        EXPECT_EQ(streams[r], 1) << SignaturePatternName(pattern) << " world " << world;
        EXPECT_EQ(agreed[r], static_cast<uint8_t>(Algorithm::kRing));
        EXPECT_EQ(codecs[r], static_cast<uint8_t>(CodecId::kBf16)) << "rank 0's codec";
      }
    }
  }
}

// The pattern follows the world size and where the ranks are: one host
// (messages cost as much as rounds) from 3 ranks, several hosts from 8.
TEST(DefaultSignaturePattern, RecursiveDoublingFromThreeRanksOnOneHostAndEightAcrossHosts) {
  for (int world = 1; world <= 16; ++world) {
    EXPECT_EQ(DefaultSignaturePattern(world, /*one_host=*/true),
              world >= 3 ? SignaturePattern::kRecursiveDoubling : SignaturePattern::kAllToAll)
        << world;
    EXPECT_EQ(DefaultSignaturePattern(world, /*one_host=*/false),
              world >= 8 ? SignaturePattern::kRecursiveDoubling : SignaturePattern::kAllToAll)
        << world;
  }
}

// Ranks 0..ranks-1 of `c` check op 1 ("g", f32[8] sum) by recursive doubling
// at once; the other ranks never show up. Each rank's status, and (when
// `arrived` is set) the ranks its on_arrival reported, in order.
std::vector<absl::Status> CheckByRecursiveDoubling(testing::Cluster& c, int ranks,
                                                   absl::Duration timeout,
                                                   std::vector<std::vector<int>>* arrived) {
  std::vector<absl::Status> st(ranks);
  if (arrived != nullptr) arrived->assign(ranks, {});
  std::vector<std::thread> threads;
  for (int r = 0; r < ranks; ++r) {
    threads.emplace_back([&, r] {
      OpSignature sig;
      sig.seq = 1;
      sig.name = "g";
      sig.count = 8;
      std::function<void(int)> on_arrival;
      if (arrived != nullptr) on_arrival = [&, r](int rank) { (*arrived)[r].push_back(rank); };
      st[r] = CheckSignatures(*c.contexts[r], sig, SignaturePattern::kRecursiveDoubling,
                              absl::Now() + timeout, on_arrival);
    });
  }
  for (auto& t : threads) t.join();
  return st;
}

// With recursive doubling a rank that waits hears of the missing rank only
// through its partner: it names every rank it has not heard from, and the
// partner they come through; the missing rank's own partner names it alone.
TEST(CheckSignatures, RecursiveDoublingDeadlineNamesTheUnheardRanksAndTheRelay) {
  testing::Cluster c = testing::MakeCluster(4, "rd-timeout");
  // rank 3 never shows up
  const std::vector<absl::Status> st =
      CheckByRecursiveDoubling(c, 3, absl::Milliseconds(400), nullptr);
  for (int r = 0; r < 3; ++r) EXPECT_TRUE(absl::IsDeadlineExceeded(st[r])) << st[r];
  // Rank 2 waits for rank 3 in the first round; rank 0's second-round
  // message is in already, so rank 2 knows that 0 and 1 submitted.
  EXPECT_EQ(st[2].message(),
            "timed out at rank 2 waiting for rank(s) 3 to submit op 1 (allreduce 'g' f32[8] sum)");
  // Ranks 0 and 1 wait in the second round, for ranks 2 and 3.
  for (int r = 0; r < 2; ++r) {
    EXPECT_EQ(st[r].message(),
              absl::StrCat("timed out at rank ", r, " waiting for rank(s) 2,3 to submit op 1 "
                           "(allreduce 'g' f32[8] sum); their signatures come through rank ",
                           r + 2, " (recursive doubling), so some of them may have submitted "
                           "and wait for the others"));
  }
}

// What a rank waits for, as the status shows it (on_arrival): a message of a
// later round that is in already names ranks that submitted, even while an
// earlier round still waits. At 3 ranks rank 2 folds into rank 0; with rank
// 2 missing, rank 0 waits in the fold-in but has rank 1's message.
TEST(CheckSignatures, RecursiveDoublingReportsRanksHeardThroughALaterRound) {
  testing::Cluster c = testing::MakeCluster(3, "rd-arrivals");
  std::vector<std::vector<int>> arrived;
  // rank 2 never shows up
  const std::vector<absl::Status> st =
      CheckByRecursiveDoubling(c, 2, absl::Milliseconds(400), &arrived);
  for (int r = 0; r < 2; ++r) EXPECT_TRUE(absl::IsDeadlineExceeded(st[r])) << st[r];
  EXPECT_EQ(arrived[0], std::vector<int>{1});
  EXPECT_EQ(st[0].message(),
            "timed out at rank 0 waiting for rank(s) 2 to submit op 1 (allreduce 'g' f32[8] sum)");
  // Rank 1 hears from rank 0 only after the fold-in, which never comes.
  EXPECT_TRUE(arrived[1].empty());
}

// Each rank is reported once, however many messages name it: at 8 ranks every
// rank hears of the other 7 over 3 rounds.
TEST(CheckSignatures, RecursiveDoublingReportsEveryRankOnce) {
  for (int world : {3, 5, 8}) {
    testing::Cluster c = testing::MakeCluster(world, absl::StrCat("rd-once-", world));
    std::vector<std::vector<int>> arrived;
    const std::vector<absl::Status> st =
        CheckByRecursiveDoubling(c, world, absl::Seconds(10), &arrived);
    for (int r = 0; r < world; ++r) {
      ASSERT_TRUE(st[r].ok()) << st[r];
      std::vector<int> got = arrived[r];
      std::sort(got.begin(), got.end());
      std::vector<int> want;
      for (int o = 0; o < world; ++o) {
        if (o != r) want.push_back(o);
      }
      EXPECT_EQ(got, want) << "world " << world << " rank " << r;
    }
  }
}

// A rank that never submits: in either pattern, every other rank's exchange
// ends at its deadline naming it (recursive doubling may also name the ranks
// whose signatures come through it).
TEST(CheckSignatures, DeadlineNamesTheRankThatNeverSubmittedInEitherPattern) {
  for (SignaturePattern pattern : kPatterns) {
    const int world = 4;
    testing::Cluster c = testing::MakeCluster(world, "missing");
    std::vector<absl::Status> st(3);
    std::vector<std::thread> threads;
    for (int r = 0; r < 3; ++r) {  // rank 3 stays away
      threads.emplace_back([&, r] {
        OpSignature sig;
        sig.seq = 9;
        sig.name = "late";
        sig.count = 1;
        st[r] = CheckSignatures(*c.contexts[r], sig, pattern,
                                absl::Now() + absl::Milliseconds(300));
      });
    }
    for (auto& t : threads) t.join();
    for (int r = 0; r < 3; ++r) {
      EXPECT_TRUE(absl::IsDeadlineExceeded(st[r])) << st[r];
      EXPECT_TRUE(absl::StrContains(st[r].message(), "waiting for rank(s) 3 to submit op 9") ||
                  (pattern == SignaturePattern::kRecursiveDoubling &&
                   absl::StrContains(st[r].message(), "waiting for rank(s) 2,3 to submit op 9")))
          << SignaturePatternName(pattern) << " rank " << r << ": " << st[r];
    }
  }
}

}  // namespace
}  // namespace gradsync
