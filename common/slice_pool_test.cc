#include "common/slice_pool.h"

#include <atomic>
#include <vector>

#include "gtest/gtest.h"

namespace gradsync {
namespace {

TEST(SlicePool, EverySliceRunsOnceAndRunWaitsForAll) {
  SlicePool pool(3);
  EXPECT_EQ(pool.width(), 3);
  for (int round = 0; round < 50; ++round) {
    std::vector<std::atomic<int>> hits(17);
    pool.Run(17, [&](int i) { hits[i].fetch_add(1); });
    for (int i = 0; i < 17; ++i) ASSERT_EQ(hits[i].load(), 1) << "round " << round << " slice " << i;
  }
}

TEST(SlicePool, RangesCoverTheBufferExactlyOnce) {
  SlicePool pool(2);
  for (size_t count : {size_t{0}, size_t{1}, size_t{1000}, size_t{1000003}}) {
    std::vector<std::atomic<int>> seen(count);
    pool.ForRanges(count, 4, 1024, [&](size_t b, size_t e) {
      for (size_t i = b; i < e; ++i) seen[i].fetch_add(1);
    });
    for (size_t i = 0; i < count; ++i) ASSERT_EQ(seen[i].load(), 1) << count << " element " << i;
  }
}

TEST(SlicePool, AWidthOfOneRunsOnTheCaller) {
  SlicePool pool(1);
  int n = 0;
  pool.Run(5, [&](int) { ++n; });
  EXPECT_EQ(n, 5);
}

}  // namespace
}  // namespace gradsync
