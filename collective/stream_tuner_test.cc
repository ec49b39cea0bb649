#include "collective/stream_tuner.h"

#include "gtest/gtest.h"

namespace gradsync {
namespace {

constexpr size_t kBig = 64 << 20;

TEST(StreamTuner, TriesTheProbesChoiceThenTheOtherAndKeepsTheFaster) {
  StreamTuner t(/*streams=*/2, /*probe_choice=*/2);
  EXPECT_EQ(t.Propose(), 2);
  t.Observe(2, kBig, 300000);  // the job's first large op, cold: not counted
  EXPECT_EQ(t.Propose(), 2);
  t.Observe(2, kBig, 110000);  // all streams: 110 ms
  EXPECT_EQ(t.Propose(), 1);
  t.Observe(1, kBig, 100000);  // one stream: 100 ms
  EXPECT_EQ(t.choice(), 1);
  EXPECT_EQ(t.Propose(), 1);
  EXPECT_DOUBLE_EQ(t.one_us_per_byte(), 100000.0 / kBig);
  EXPECT_DOUBLE_EQ(t.all_us_per_byte(), 110000.0 / kBig);
}

// Runs `n` large ops on the tuner's proposal, each taking `micros`.
void RunOps(StreamTuner& t, int n, double micros) {
  for (int i = 0; i < n; ++i) t.Observe(t.Propose(), kBig, micros);
}

TEST(StreamTuner, AProbeChoiceOfOneStreamIsTrustedUntilTheNextExploration) {
  StreamTuner t(2, 1);
  EXPECT_EQ(t.Propose(), 1);
  RunOps(t, StreamTuner::kReexploreEvery - 1, 100000);
  EXPECT_EQ(t.Propose(), 1);
  EXPECT_EQ(t.all_us_per_byte(), 0);  // never tried
  RunOps(t, 1, 100000);  // the kReexploreEvery-th: both are tried now, one first
  EXPECT_EQ(t.Propose(), 1);
}

TEST(StreamTuner, AllStreamsMustWinByTheMargin) {
  StreamTuner a(2, 1);
  RunOps(a, StreamTuner::kReexploreEvery, 100000);
  a.Observe(1, kBig, 100000);
  EXPECT_EQ(a.Propose(), 2);
  a.Observe(2, kBig, 97000);  // 3% faster: not enough
  EXPECT_EQ(a.choice(), 1);
  StreamTuner b(2, 2);
  b.Observe(2, kBig, 300000);  // cold
  b.Observe(2, kBig, 80000);  // 20% faster than one
  b.Observe(1, kBig, 100000);
  EXPECT_EQ(b.choice(), 2);
  EXPECT_EQ(b.Propose(), 2);
}

TEST(StreamTuner, OpsOnAnotherCountThanProposedAreNotCounted) {
  StreamTuner t(4, 4);
  t.Observe(4, kBig, 300000);  // cold
  t.Observe(1, kBig, 100000);  // rank 0 proposed 1 where this rank proposed 4
  EXPECT_EQ(t.Propose(), 4);
  t.Observe(4, kBig, 100000);
  EXPECT_EQ(t.Propose(), 1);
}

TEST(StreamTuner, ExploresAgainAfterAWhileAndFollowsAChange) {
  StreamTuner t(2, 2);
  t.Observe(2, kBig, 300000);  // cold
  t.Observe(2, kBig, 120000);
  t.Observe(1, kBig, 100000);
  ASSERT_EQ(t.choice(), 1);
  for (int i = 0; i < StreamTuner::kReexploreEvery - 1; ++i) {
    EXPECT_EQ(t.Propose(), 1);
    t.Observe(1, kBig, 100000);
  }
  t.Observe(1, kBig, 100000);  // the kReexploreEvery-th: a new exploration starts
  EXPECT_EQ(t.Propose(), 1);
  t.Observe(1, kBig, 100000);
  EXPECT_EQ(t.Propose(), 2);
  t.Observe(2, kBig, 50000);  // the link changed: two streams are much faster now
  EXPECT_EQ(t.choice(), 2);
}

TEST(StreamTuner, OneStreamJobsHaveNothingToTune) {
  StreamTuner t(1, 1);
  EXPECT_EQ(t.Propose(), 1);
  t.Observe(1, kBig, 100000);
  EXPECT_EQ(t.Propose(), 1);
  EXPECT_FALSE(StreamTuner::Large(StreamTuner::kMinBytes - 1));
  EXPECT_TRUE(StreamTuner::Large(StreamTuner::kMinBytes));
}

// The first large op of a job runs cold (buffers to fault in, TCP windows to
// grow): counting it would favour whatever runs second.
TEST(StreamTuner, TheJobsFirstLargeOpIsNotCounted) {
  StreamTuner t(2, 2);
  t.Observe(2, kBig, 300000);  // cold: 3x slower than the steady state
  EXPECT_EQ(t.Propose(), 2);
  t.Observe(2, kBig, 90000);
  EXPECT_EQ(t.Propose(), 1);
  t.Observe(1, kBig, 100000);
  EXPECT_EQ(t.choice(), 2);  // all streams 10% faster, warm against warm
  EXPECT_DOUBLE_EQ(t.all_us_per_byte(), 90000.0 / kBig);
  // Re-explorations later in the job have no warm-up op.
  RunOps(t, StreamTuner::kReexploreEvery, 90000);
  EXPECT_EQ(t.Propose(), 2);
  t.Observe(2, kBig, 90000);
  EXPECT_EQ(t.Propose(), 1);
}

}  // namespace
}  // namespace gradsync
