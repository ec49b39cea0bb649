#include "collective/cost_model.h"

#include <cmath>

#include "collective/algorithm.h"
#include "gtest/gtest.h"

namespace gradsync {
namespace {

LinkParams Link() {
  LinkParams l;
  l.alpha_us = 50;            // 50 us per message
  l.beta_us_per_byte = 1e-4;  // 10 GB/s
  l.reduce_us_per_byte = 1e-4;
  return l;
}

// The same link with the signatures exchanged by recursive doubling.
LinkParams Doubling(LinkParams l) {
  l.signatures = SignaturePattern::kRecursiveDoubling;
  return l;
}

constexpr size_t kSizes[] = {0, 1, 8, 4096, 1 << 20, 256u << 20};

TEST(Algorithm, NamesRoundTripAndParseIsCaseInsensitive) {
  for (Algorithm a : kAllAlgorithms) {
    auto parsed = ParseAlgorithm(AlgorithmName(a));
    ASSERT_TRUE(parsed.ok()) << parsed.status();
    EXPECT_EQ(*parsed, a);
  }
  EXPECT_EQ(*ParseAlgorithm("RHD"), Algorithm::kRecursiveHalvingDoubling);
  auto bad = ParseAlgorithm("butterfly");
  EXPECT_TRUE(absl::IsInvalidArgument(bad.status()));
  EXPECT_EQ(bad.status().message(),
            "unknown algorithm 'butterfly' (choose one of ring, rhd, rd, tree, pairwise, oneshot)");
}

TEST(Algorithm, EveryCollectiveHasAnAlgorithm) {
  for (CollectiveKind k : kAllCollectives) EXPECT_FALSE(ImplementingAlgorithms(k).empty());
  EXPECT_EQ(ImplementingAlgorithms(CollectiveKind::kAllreduce), "ring, rhd, rd, tree, oneshot");
  EXPECT_EQ(ImplementingAlgorithms(CollectiveKind::kBarrier), "rd, tree, pairwise, oneshot");
  EXPECT_EQ(ImplementingAlgorithms(CollectiveKind::kAlltoall), "pairwise");
}

TEST(CostModel, ImplementedPairsAreFiniteAndOthersInfinite) {
  for (CollectiveKind k : kAllCollectives) {
    for (Algorithm a : kAllAlgorithms) {
      for (int world = 1; world <= 17; ++world) {
        for (size_t bytes : kSizes) {
          const double t = PredictMicros(k, a, bytes, world, Link());
          if (Implements(a, k) && !(a == Algorithm::kOneShot && k == CollectiveKind::kAllreduce &&
                                     bytes > kOneShotMaxBytes)) {
            EXPECT_TRUE(std::isfinite(t) && t >= 0)
                << AlgorithmName(a) << " " << CollectiveName(k) << " world " << world;
          } else if (Implements(a, k)) {  // oneshot above its cap (a world of one is free)
            EXPECT_TRUE(std::isinf(t) || world == 1);
          } else {
            EXPECT_TRUE(std::isinf(t));
          }
        }
      }
    }
  }
}

TEST(CostModel, PredictionsGrowWithBytes) {
  for (CollectiveKind k : kAllCollectives) {
    for (Algorithm a : kAllAlgorithms) {
      if (!Implements(a, k)) continue;
      for (int world : {2, 3, 8, 13}) {
        double last = 0;
        for (size_t bytes : kSizes) {
          const double t = PredictMicros(k, a, bytes, world, Link());
          EXPECT_GE(t, last) << AlgorithmName(a) << " " << CollectiveName(k) << " " << bytes;
          last = t;
        }
      }
    }
  }
}

TEST(CostModel, UnimplementedPairsAreNeverChosenNorRanked) {
  for (CollectiveKind k : kAllCollectives) {
    for (int world = 1; world <= 17; ++world) {
      for (size_t bytes : kSizes) {
        EXPECT_TRUE(Implements(ChooseAlgorithm(k, bytes, world, Link()), k));
        const auto ranked = RankAlgorithms(k, bytes, world, Link());
        size_t implemented = 0;
        for (Algorithm a : kAllAlgorithms) implemented += Implements(a, k) ? 1 : 0;
        EXPECT_EQ(ranked.size(), implemented);
        for (size_t i = 0; i < ranked.size(); ++i) {
          EXPECT_TRUE(Implements(ranked[i].first, k));
          if (i > 0) {
            EXPECT_LE(ranked[i - 1].second, ranked[i].second);
          }
        }
      }
    }
  }
}

TEST(CostModel, SmallMessagesGoToLatencyOptimalAlgorithms) {
  for (int world = 2; world <= 16; ++world) {
    // oneshot rides on the signature round: nothing beats it for 8 bytes.
    EXPECT_EQ(ChooseAlgorithm(CollectiveKind::kAllreduce, 8, world, Link()), Algorithm::kOneShot)
        << "world " << world;
    EXPECT_EQ(ChooseAlgorithm(CollectiveKind::kBarrier, 0, world, Link()), Algorithm::kOneShot);
    // Without it, a latency-optimal algorithm with log2(n) steps.
    const Algorithm ar = ChooseAlgorithm(CollectiveKind::kAllreduce, 8, world, Link(),
                                         /*allow_oneshot=*/false);
    EXPECT_TRUE(ar == Algorithm::kRecursiveDoubling || ar == Algorithm::kBinomialTree)
        << "world " << world << ": " << AlgorithmName(ar);
    // Every choice is the cheapest (up to the tie margin, where the order of
    // kAllAlgorithms decides: at 3 ranks a ring allgather takes as many
    // steps as recursive doubling).
    for (CollectiveKind k : kAllCollectives) {
      const double best = RankAlgorithms(k, 8, world, Link()).front().second;
      const Algorithm chosen = ChooseAlgorithm(k, 8, world, Link());
      EXPECT_LE(PredictMicros(k, chosen, 8, world, Link()), best * (1 + kTieFraction));
    }
  }
  for (int world : {8, 16}) {
    const Algorithm ag = ChooseAlgorithm(CollectiveKind::kAllgather, 8, world, Link());
    EXPECT_TRUE(ag == Algorithm::kRecursiveDoubling || ag == Algorithm::kRecursiveHalvingDoubling)
        << AlgorithmName(ag);
    EXPECT_EQ(ChooseAlgorithm(CollectiveKind::kAllreduce, 8, world, Link(), false),
              Algorithm::kRecursiveDoubling);
    EXPECT_EQ(ChooseAlgorithm(CollectiveKind::kBroadcast, 8, world, Link()),
              Algorithm::kBinomialTree);
    EXPECT_EQ(ChooseAlgorithm(CollectiveKind::kReduce, 8, world, Link()), Algorithm::kBinomialTree);
    EXPECT_EQ(ChooseAlgorithm(CollectiveKind::kBarrier, 0, world, Link(), false),
              Algorithm::kRecursiveDoubling);
    EXPECT_EQ(ChooseAlgorithm(CollectiveKind::kReduceScatter, 8 * world, world, Link()),
              Algorithm::kRecursiveHalvingDoubling);
  }
  // Non-powers of two: Bruck's allgather needs no folding.
  EXPECT_EQ(ChooseAlgorithm(CollectiveKind::kAllgather, 8, 7, Link()),
            Algorithm::kRecursiveDoubling);
}

TEST(CostModel, OneShotUntilItsBytesOutweighTheStepsItSaves) {
  // oneshot rides on the signature exchange, so it only pays for its bytes:
  // at 4 ranks 3 B (b+g) all-to-all or 2 B (b+g) by recursive doubling,
  // against rd's 2 (a + B (b+g)) and rhd's 4a + 1.5 B b + 0.75 B g. With
  // a = 50 us and b = g = 1e-4 us/B oneshot wins up to kOneShotMaxBytes, and
  // is never chosen above it.
  for (const LinkParams& link : {Link(), Doubling(Link())}) {
    EXPECT_EQ(ChooseAlgorithm(CollectiveKind::kAllreduce, kOneShotMaxBytes, 4, link),
              Algorithm::kOneShot);
    EXPECT_NE(ChooseAlgorithm(CollectiveKind::kAllreduce, kOneShotMaxBytes + 4, 4, link),
              Algorithm::kOneShot);
    EXPECT_TRUE(std::isinf(PredictMicros(CollectiveKind::kAllreduce, Algorithm::kOneShot,
                                         kOneShotMaxBytes + 4, 4, link)));
  }
  // A slower link per byte and a short latency move the crossover below the
  // cap. All-to-all at 3 ranks: oneshot 2 B (b+g) = 4e-3 B against ring's
  // 4a + 4/3 B b + 2/3 B g = 40 + 2.6e-3 B: oneshot up to B ~ 28 KB.
  LinkParams slow = Link();
  slow.alpha_us = 10;
  slow.beta_us_per_byte = 1.9e-3;
  EXPECT_EQ(ChooseAlgorithm(CollectiveKind::kAllreduce, 16 << 10, 3, slow), Algorithm::kOneShot);
  EXPECT_EQ(ChooseAlgorithm(CollectiveKind::kAllreduce, 32 << 10, 3, slow), Algorithm::kRing);
  // Recursive doubling at 8 ranks: oneshot 3 B (b+g) = 6e-3 B against rhd's
  // 6a + 7/4 B b + 7/8 B g = 60 + 3.4e-3 B: oneshot up to B ~ 23 KB.
  EXPECT_EQ(ChooseAlgorithm(CollectiveKind::kAllreduce, 16 << 10, 8, Doubling(slow)),
            Algorithm::kOneShot);
  EXPECT_EQ(ChooseAlgorithm(CollectiveKind::kAllreduce, 32 << 10, 8, Doubling(slow)),
            Algorithm::kRecursiveHalvingDoubling);
  // All-to-all at 8 ranks: 7 B (b+g) = 1.4e-2 B, past rd's 3 (a + B (b+g))
  // = 30 + 6e-3 B from B ~ 3.8 KB.
  EXPECT_EQ(ChooseAlgorithm(CollectiveKind::kAllreduce, 2 << 10, 8, slow), Algorithm::kOneShot);
  EXPECT_EQ(ChooseAlgorithm(CollectiveKind::kAllreduce, 4 << 10, 8, slow),
            Algorithm::kRecursiveDoubling);
}

// oneshot's bytes cost what the probe's all-to-all bursts cost, when known.
TEST(CostModel, OneShotUsesTheBurstBandwidthWhenMeasured) {
  LinkParams link = Link();
  link.beta_us_per_byte = 8e-3;  // a slow ring round: ring looks cheaper than oneshot at 64 KiB
  EXPECT_EQ(ChooseAlgorithm(CollectiveKind::kAllreduce, 64 << 10, 3, link), Algorithm::kRing);
  link.burst_us_per_byte = 5e-4;  // but small bursts move fast
  EXPECT_DOUBLE_EQ(PredictMicros(CollectiveKind::kAllreduce, Algorithm::kOneShot, 64 << 10, 3, link),
                   2.0 * (64 << 10) * (5e-4 + 1e-4));
  EXPECT_EQ(ChooseAlgorithm(CollectiveKind::kAllreduce, 64 << 10, 3, link), Algorithm::kOneShot);
  // All-to-all: n-1 contributions in. Recursive doubling: log2 n rounds of
  // B; a non-power of two folds B in and out.
  EXPECT_DOUBLE_EQ(PredictMicros(CollectiveKind::kAllreduce, Algorithm::kOneShot, 1000, 8, link),
                   7 * 1000 * (5e-4 + 1e-4));
  link.signatures = SignaturePattern::kRecursiveDoubling;
  EXPECT_DOUBLE_EQ(PredictMicros(CollectiveKind::kAllreduce, Algorithm::kOneShot, 1000, 8, link),
                   3 * 1000 * (5e-4 + 1e-4));
  EXPECT_DOUBLE_EQ(PredictMicros(CollectiveKind::kAllreduce, Algorithm::kOneShot, 1000, 6, link),
                   2 * 1000 * (5e-4 + 1e-4) + 2 * 1000 * 5e-4 + 1000 * 1e-4);
}

TEST(CostModel, LargeAllreduceGoesToRing) {
  for (int world = 2; world <= 16; ++world) {
    EXPECT_EQ(ChooseAlgorithm(CollectiveKind::kAllreduce, 256u << 20, world, Link()),
              Algorithm::kRing)
        << "world " << world;
    EXPECT_EQ(ChooseAlgorithm(CollectiveKind::kReduceScatter, 256u << 20, world, Link()),
              Algorithm::kRing)
        << "world " << world;
  }
}

TEST(CostModel, MidSizesOnPowersOfTwoGoToHalvingDoubling) {
  EXPECT_EQ(ChooseAlgorithm(CollectiveKind::kAllreduce, 1 << 20, 8, Link()),
            Algorithm::kRecursiveHalvingDoubling);
}

TEST(CostModel, NonPowersOfTwoPayForFolding) {
  for (Algorithm a : {Algorithm::kRecursiveHalvingDoubling, Algorithm::kRecursiveDoubling}) {
    EXPECT_GT(PredictMicros(CollectiveKind::kAllreduce, a, 1 << 20, 7, Link()),
              PredictMicros(CollectiveKind::kAllreduce, a, 1 << 20, 8, Link()))
        << AlgorithmName(a);
  }
}

TEST(CostModel, OneRankCostsNothing) {
  for (CollectiveKind k : kAllCollectives) {
    for (const auto& [a, t] : RankAlgorithms(k, 1 << 20, 1, Link()))
      EXPECT_EQ(t, 0) << AlgorithmName(a);
  }
}

TEST(CostModel, ObservedTransfersMoveTheBandwidthEstimateOneFifthOfTheWay) {
  LinkParams link;
  link.alpha_us = 10;
  link.beta_us_per_byte = 1e-3;  // 1 GB/s
  link.reduce_us_per_byte = 0;
  const size_t B = 64 << 20;
  const int n = 4;
  // A ring allreduce that ran at 0.5 GB/s on the wire.
  const double wire_us = 2.0 * (n - 1) / n * B * 2e-3;
  const double took = 2 * (n - 1) * link.alpha_us + wire_us;
  LinkParams out = RefineFromObservation(link, CollectiveKind::kAllreduce, Algorithm::kRing, B, n, took);
  EXPECT_NEAR(out.beta_us_per_byte, 0.8e-3 + 0.2 * 2e-3, 1e-9);
  EXPECT_EQ(out.alpha_us, link.alpha_us);
  // Small, non-allreduce or latency-bound ops leave it alone.
  EXPECT_EQ(RefineFromObservation(link, CollectiveKind::kAllreduce, Algorithm::kRing, 1024, n, took)
                .beta_us_per_byte, link.beta_us_per_byte);
  EXPECT_EQ(RefineFromObservation(link, CollectiveKind::kBroadcast, Algorithm::kRing, B, n, took)
                .beta_us_per_byte, link.beta_us_per_byte);
  EXPECT_EQ(RefineFromObservation(link, CollectiveKind::kAllreduce, Algorithm::kRecursiveDoubling, B,
                                  n, took).beta_us_per_byte, link.beta_us_per_byte);
}

TEST(CostModel, FastestSmallOpsMoveTheLatencyEstimateOneFifthOfTheWay) {
  LinkParams link;
  link.alpha_us = 50;
  link.beta_us_per_byte = 1e-3;
  link.reduce_us_per_byte = 1e-4;
  // oneshot of 8 bytes on 3 ranks (one all-to-all round) that took 20 us:
  // alpha = 20 - 2*8*1.1e-3.
  LinkParams out = RefineAlphaFromObservation(link, CollectiveKind::kAllreduce,
                                              Algorithm::kOneShot, 8, 3, 20);
  EXPECT_NEAR(out.alpha_us, 0.8 * 50 + 0.2 * (20 - 2 * 8 * 1.1e-3), 1e-9);
  EXPECT_EQ(out.beta_us_per_byte, link.beta_us_per_byte);
  // With recursive doubling the exchange is 3 rounds on 8 ranks.
  link.signatures = SignaturePattern::kRecursiveDoubling;
  out = RefineAlphaFromObservation(link, CollectiveKind::kAllreduce, Algorithm::kOneShot, 8, 8, 30);
  EXPECT_NEAR(out.alpha_us, 0.8 * 50 + 0.2 * (30 - 3 * 8 * 1.1e-3) / 3, 1e-9);
  // rd on 4 ranks: a 2-round exchange + 2 steps = 4 alphas (1 + 2 all-to-all).
  EXPECT_NEAR(RefineAlphaFromObservation(Link(), CollectiveKind::kAllreduce,
                                         Algorithm::kRecursiveDoubling, 1024, 4, 90).alpha_us,
              0.8 * 50 + 0.2 * (90 - 2 * 1024 * 2e-4) / 3, 1e-9);
  out = RefineAlphaFromObservation(link, CollectiveKind::kAllreduce,
                                   Algorithm::kRecursiveDoubling, 1024, 4, 90);
  EXPECT_NEAR(out.alpha_us, 0.8 * 50 + 0.2 * (90 - 2 * 1024 * 1.1e-3) / 4, 1e-9);
  // rd on 6 ranks folds, in the exchange and in the steps: (2 + 2) + (2 + 2) rounds.
  out = RefineAlphaFromObservation(link, CollectiveKind::kAllreduce,
                                   Algorithm::kRecursiveDoubling, 8, 6, 100);
  EXPECT_NEAR(out.alpha_us,
              0.8 * 50 + 0.2 * (100 - 2 * 8 * 1.1e-3 - 2 * 8 * 1e-3 - 8 * 1e-4) / 8, 1e-9);
  // Bandwidth-bound, other algorithms, other collectives: unchanged.
  EXPECT_EQ(RefineAlphaFromObservation(link, CollectiveKind::kAllreduce, Algorithm::kRing, 8, 4, 20)
                .alpha_us, 50);
  EXPECT_EQ(RefineAlphaFromObservation(link, CollectiveKind::kAllreduce, Algorithm::kOneShot,
                                       kOneShotMaxBytes + 4, 4, 20).alpha_us, 50);
  EXPECT_EQ(RefineAlphaFromObservation(link, CollectiveKind::kBroadcast, Algorithm::kBinomialTree,
                                       8, 4, 20).alpha_us, 50);
}

TEST(AlgorithmMemo, AnswersAsTheModelDoesAcrossShapesLinksAndEvictions) {
  AlgorithmMemo memo;
  LinkParams slow;
  slow.alpha_us = 200;
  LinkParams fast;
  fast.alpha_us = 2;
  fast.beta_us_per_byte = 1e-5;
  const CollectiveKind kinds[] = {CollectiveKind::kAllreduce, CollectiveKind::kAllgather,
                                  CollectiveKind::kReduceScatter, CollectiveKind::kBroadcast};
  // More shapes than the memo holds, asked in rounds, with the link changing
  // between rounds: every answer must be the model's own.
  int checked = 0;
  for (int round = 0; round < 4; ++round) {
    const LinkParams& link = round % 2 == 0 ? slow : fast;
    for (int world : {2, 4, 8}) {
      for (size_t bytes = 8; bytes <= (64u << 20); bytes *= 8) {
        for (CollectiveKind kind : kinds) {
          for (bool oneshot : {true, false}) {
            ASSERT_EQ(memo.Choose(kind, bytes, world, link, oneshot),
                      ChooseAlgorithm(kind, bytes, world, link, oneshot))
                << CollectiveName(kind) << " " << bytes << " B at " << world << " ranks, round "
                << round;
            ++checked;
          }
        }
      }
    }
  }
  EXPECT_GT(checked, 4 * AlgorithmMemo::kEntries);
  // The link matters for some of those shapes, so a memo that ignored it
  // would have answered wrongly above.
  int differ = 0;
  for (int world : {2, 4, 8}) {
    for (size_t bytes = 8; bytes <= (64u << 20); bytes *= 8) {
      differ += ChooseAlgorithm(CollectiveKind::kAllreduce, bytes, world, slow) !=
                ChooseAlgorithm(CollectiveKind::kAllreduce, bytes, world, fast);
    }
  }
  EXPECT_GT(differ, 0);
}

}  // namespace
}  // namespace gradsync
