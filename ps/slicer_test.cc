#include "ps/slicer.h"

#include <vector>

#include "gtest/gtest.h"

namespace gradsync::ps {
namespace {

std::vector<uint64_t> ShardBytes(const std::vector<Partition>& parts, int shards) {
  std::vector<uint64_t> bytes(shards);
  for (const Partition& p : parts) bytes[p.shard] += p.bytes;
  return bytes;
}

TEST(BalancedSlicer, CutsFixedSizePartitionsAtElementBoundariesAndALastRemainder) {
  const std::vector<Partition> parts = BalancedSlicer().Slice(4 * 1023, 4, 1000, 2);
  // 1000 bytes = 250 floats; 1023 floats = 4 x 250 + 23.
  ASSERT_EQ(parts.size(), 5u);
  for (size_t i = 0; i < parts.size(); ++i) {
    EXPECT_EQ(parts[i].id, i);
    EXPECT_EQ(parts[i].offset_bytes, i * 1000);
    EXPECT_EQ(parts[i].bytes, i < 4 ? 1000u : 92u);
  }
}

TEST(BalancedSlicer, RoundsThePartitionSizeDownToWholeElementsAndAtLeastOne) {
  std::vector<Partition> parts = BalancedSlicer().Slice(8 * 10, 8, 20, 1);  // 20 B = 2.5 doubles
  ASSERT_EQ(parts.size(), 5u);
  EXPECT_EQ(parts[0].bytes, 16u);
  parts = BalancedSlicer().Slice(4 * 3, 4, 1, 1);  // smaller than one element
  ASSERT_EQ(parts.size(), 3u);
  EXPECT_EQ(parts[2].offset_bytes, 8u);
  EXPECT_EQ(parts[2].bytes, 4u);
}

TEST(BalancedSlicer, EqualPartitionsGoRoundRobinFromShardZero) {
  const std::vector<Partition> parts = BalancedSlicer().Slice(700, 1, 100, 3);
  ASSERT_EQ(parts.size(), 7u);
  const int want[] = {0, 1, 2, 0, 1, 2, 0};
  for (size_t i = 0; i < parts.size(); ++i) EXPECT_EQ(parts[i].shard, want[i]) << i;
}

TEST(BalancedSlicer, TheSmallLastPartitionGoesToTheLeastLoadedShard) {
  // 4 x 100 + 30 over 3 shards: 0,1,2,0 then the 30 bytes to shard 1 (100 < 200).
  const std::vector<Partition> parts = BalancedSlicer().Slice(430, 1, 100, 3);
  ASSERT_EQ(parts.size(), 5u);
  EXPECT_EQ(parts[3].shard, 0);
  EXPECT_EQ(parts[4].shard, 1);
  EXPECT_EQ(ShardBytes(parts, 3), (std::vector<uint64_t>{200, 130, 100}));
}

TEST(BalancedSlicer, ShardLoadsDifferByAtMostOnePartition) {
  for (int shards : {1, 2, 3, 5, 8}) {
    for (uint64_t bytes : {1ull, 999ull, 4096ull, 100003ull * 2}) {
      const std::vector<Partition> parts = BalancedSlicer().Slice(bytes, 1, 1000, shards);
      const std::vector<uint64_t> load = ShardBytes(parts, shards);
      const auto [lo, hi] = std::minmax_element(load.begin(), load.end());
      EXPECT_LE(*hi - *lo, 1000u) << shards << " shards, " << bytes << " bytes";
    }
  }
}

TEST(BalancedSlicer, IsDeterministicSoEveryWorkerAndStepGetsTheSameAssignment) {
  const BalancedSlicer a, b;
  EXPECT_EQ(a.Slice(123457 * 2, 2, 4096, 3), b.Slice(123457 * 2, 2, 4096, 3));
  EXPECT_EQ(a.Slice(123457 * 2, 2, 4096, 3), a.Slice(123457 * 2, 2, 4096, 3));
}

TEST(BalancedSlicer, CapsPartitionsAtTheFrameLimit) {
  const std::vector<Partition> parts = BalancedSlicer().Slice(200ull << 20, 4, 1ull << 40, 2);
  ASSERT_EQ(parts.size(), 4u);
  EXPECT_EQ(parts[0].bytes, kMaxPartitionBytes);
  EXPECT_EQ(parts[3].bytes, 8ull << 20);
}

TEST(BalancedSlicer, EmptyForEmptyTensorsAndInvalidArguments) {
  EXPECT_TRUE(BalancedSlicer().Slice(0, 4, 100, 2).empty());
  EXPECT_TRUE(BalancedSlicer().Slice(100, 0, 100, 2).empty());
  EXPECT_TRUE(BalancedSlicer().Slice(100, 4, 100, 0).empty());
  EXPECT_TRUE(BalancedSlicer().Slice(102, 4, 100, 1).empty());  // not whole elements
  EXPECT_TRUE(BalancedSlicer().Slice(uint64_t{kMaxPartitions} + 1, 1, 1, 1).empty());
  EXPECT_EQ(BalancedSlicer().Slice(kMaxPartitions, 1, 1, 1).size(), kMaxPartitions);
}

}  // namespace
}  // namespace gradsync::ps
