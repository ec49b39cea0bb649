#include "bench/bench_util.h"

#include <vector>

#include "gtest/gtest.h"

namespace gradsync {
namespace bench {
namespace {

TEST(ParseBytes, AcceptsBinarySuffixes) {
  EXPECT_EQ(*ParseBytes("8"), 8u);
  EXPECT_EQ(*ParseBytes("4K"), 4096u);
  EXPECT_EQ(*ParseBytes("4k"), 4096u);
  EXPECT_EQ(*ParseBytes("4KiB"), 4096u);
  EXPECT_EQ(*ParseBytes("4KB"), 4096u);
  EXPECT_EQ(*ParseBytes("64M"), 64u << 20);
  EXPECT_EQ(*ParseBytes("1G"), 1u << 30);
  EXPECT_EQ(*ParseBytes("12B"), 12u);
}

TEST(ParseBytes, RejectsGarbage) {
  EXPECT_FALSE(ParseBytes("").ok());
  EXPECT_FALSE(ParseBytes("K").ok());
  EXPECT_FALSE(ParseBytes("4X").ok());
  EXPECT_FALSE(ParseBytes("-4").ok());
  EXPECT_FALSE(ParseBytes("99999999999999G").ok());
}

TEST(MessageSizes, StepsFromMinToMaxIncludingMax) {
  SizeSpec spec;
  spec.min_bytes = "4K";
  spec.max_bytes = "64M";
  spec.step_factor = 4;
  std::vector<uint64_t> want = {4096, 16384, 65536, 262144, 1 << 20, 4 << 20, 16 << 20, 64 << 20};
  EXPECT_EQ(*MessageSizes(spec), want);
  spec.max_bytes = "20K";
  EXPECT_EQ(*MessageSizes(spec), (std::vector<uint64_t>{4096, 16384, 20480}));
}

TEST(MessageSizes, ExplicitListAndLatencyAreSortedAndUnique) {
  SizeSpec spec;
  spec.sizes = "64M, 1M,8,1M";
  spec.latency = true;
  EXPECT_EQ(*MessageSizes(spec), (std::vector<uint64_t>{8, 1 << 20, 64 << 20}));
}

TEST(MessageSizes, RejectsBadRanges) {
  SizeSpec spec;
  spec.min_bytes = "1M";
  spec.max_bytes = "4K";
  EXPECT_FALSE(MessageSizes(spec).ok());
  spec.max_bytes = "4M";
  spec.step_factor = 1;
  EXPECT_FALSE(MessageSizes(spec).ok());
  spec.sizes = "0";
  EXPECT_FALSE(MessageSizes(spec).ok());
}

TEST(Bandwidth, FollowsNcclTestsAllreduceDefinition) {
  // 1 GB in 1 s on 4 ranks: algbw 1 GB/s, busbw 2*3/4 = 1.5 GB/s.
  EXPECT_DOUBLE_EQ(AlgBwGBps(1000000000, 1.0), 1.0);
  EXPECT_DOUBLE_EQ(AllreduceBusBwGBps(1000000000, 1.0, 4), 1.5);
  EXPECT_DOUBLE_EQ(AllreduceBusBwGBps(1000000000, 1.0, 2), 1.0);
  EXPECT_DOUBLE_EQ(AllreduceBusBwGBps(1000000000, 0.0, 2), 0.0);
}

TEST(SlowestRank, TakesPerIterationMaximum) {
  auto out = SlowestRank({{1, 5, 3}, {2, 4, 6}});
  EXPECT_EQ(out, (std::vector<double>{2, 5, 6}));
  TimeStats st = Summarize(out);
  EXPECT_DOUBLE_EQ(st.mean_s, 13.0 / 3);
  EXPECT_DOUBLE_EQ(st.median_s, 5);
  EXPECT_DOUBLE_EQ(Summarize({4, 1, 3, 2}).median_s, 2.5);
  EXPECT_DOUBLE_EQ(st.min_s, 2);
  EXPECT_DOUBLE_EQ(st.max_s, 6);
}

TEST(ResultLine, IsCommaSeparatedKeyValues) {
  EXPECT_EQ(ResultLine("ring_limit", {{"ranks", "4"}, {"streams", "1"}, {"bytes", "8"},
                                      {"time_us", FormatUs(12.5e-6)},
                                      {"busbw_gbps", FormatGBps(0.000123456789)}}),
            "ring_limit,ranks=4,streams=1,bytes=8,time_us=12.50,busbw_gbps=0.000123457");
}

}  // namespace
}  // namespace bench
}  // namespace gradsync
