#include "collective/ring_plan.h"

#include <vector>

#include "gtest/gtest.h"

namespace gradsync {
namespace {

TEST(RingPlan, ChunksCoverCountDisjointlyAndDifferByAtMostOne) {
  for (size_t count : {0ul, 1ul, 7ul, 1023ul, 1000003ul}) {
    for (int world : {1, 2, 3, 4, 5, 8}) {
      RingPlan plan(count, world, 0, 4, 1 << 20);
      size_t next = 0, lo = count, hi = 0;
      for (int c = 0; c < world; ++c) {
        ElementRange ch = plan.Chunk(c);
        EXPECT_EQ(ch.begin, next) << "count=" << count << " world=" << world << " chunk=" << c;
        next += ch.count;
        lo = std::min(lo, ch.count);
        hi = std::max(hi, ch.count);
      }
      EXPECT_EQ(next, count);
      EXPECT_LE(hi - lo, 1u);
    }
  }
}

TEST(RingPlan, SegmentsTileEachChunkAndRespectSegmentBytes) {
  RingPlan plan(1000003, 3, 1, 4, 64 << 10);
  EXPECT_GT(plan.segments(), 1u);
  for (int c = 0; c < 3; ++c) {
    size_t next = plan.Chunk(c).begin;
    for (size_t k = 0; k < plan.segments(); ++k) {
      ElementRange s = plan.Segment(c, k);
      EXPECT_EQ(s.begin, next);
      EXPECT_LE(s.count * 4, 64u << 10);
      next += s.count;
    }
    EXPECT_EQ(next, plan.Chunk(c).begin + plan.Chunk(c).count);
  }
}

TEST(RingPlan, CountSmallerThanWorldGivesEmptyChunks) {
  RingPlan plan(1, 4, 0, 8, 1 << 20);
  int nonempty = 0;
  for (int c = 0; c < 4; ++c) nonempty += plan.Chunk(c).count > 0;
  EXPECT_EQ(nonempty, 1);
  EXPECT_EQ(plan.segments(), 1u);
  EXPECT_EQ(plan.num_messages(), 6u);
}

// Simulates the schedule: every rank's sends match its right neighbour's
// receives message by message, and after reduce-scatter rank r has received
// every contribution to chunk r+1; after allgather, every chunk.
TEST(RingPlan, ScheduleMatchesNeighboursAndCompletesEveryChunk) {
  for (int world : {2, 3, 4, 5, 8}) {
    const size_t count = 1023;
    std::vector<RingPlan> plans;
    for (int r = 0; r < world; ++r) plans.emplace_back(count, world, r, 4, 256);
    // contributions[r][c] = set of ranks summed into rank r's copy of chunk c (bitmask)
    std::vector<std::vector<unsigned>> have(world, std::vector<unsigned>(world));
    for (int r = 0; r < world; ++r)
      for (int c = 0; c < world; ++c) have[r][c] = 1u << r;
    const size_t total = plans[0].num_messages();
    const size_t nseg = plans[0].segments();
    for (size_t step = 0; step < total / nseg; ++step) {
      std::vector<std::vector<unsigned>> next = have;
      for (int r = 0; r < world; ++r) {
        const int right = (r + 1) % world;
        RingMessage s = plans[r].Send(step * nseg);
        RingMessage v = plans[right].Recv(step * nseg);
        ASSERT_EQ(s.chunk, v.chunk) << "world " << world << " step " << step;
        ASSERT_EQ(s.reduce, v.reduce);
        next[right][v.chunk] = v.reduce ? have[right][v.chunk] | have[r][s.chunk] : have[r][s.chunk];
      }
      have = next;
      if (step + 1 == static_cast<size_t>(world - 1)) {
        for (int r = 0; r < world; ++r) {
          EXPECT_EQ(have[r][plans[r].OwnedChunk()], (1u << world) - 1) << "rank " << r;
        }
      }
    }
    for (int r = 0; r < world; ++r)
      for (int c = 0; c < world; ++c) EXPECT_EQ(have[r][c], (1u << world) - 1);
  }
}

}  // namespace
}  // namespace gradsync
