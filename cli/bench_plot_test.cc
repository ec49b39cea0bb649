#include "cli/bench_plot.h"

#include <unistd.h>

#include <fstream>
#include <sstream>
#include <string>

#include "gtest/gtest.h"

namespace gradsync {
namespace {

int Count(const std::string& s, const std::string& what) {
  int n = 0;
  for (size_t at = s.find(what); at != std::string::npos; at = s.find(what, at + 1)) ++n;
  return n;
}

TEST(BusBandwidthSvg, OnePointPerSizeAndOneDashedLinePerLimit) {
  const std::string svg = BusBandwidthSvg(
      "allreduce f32 sum, 4 ranks", {{8, 0.001}, {1024, 0.1}, {1 << 20, 1.5}, {64 << 20, 2.5}},
      {{"plain TCP ring", 3.0}, {"TCP one-way", 4.0}});
  EXPECT_EQ(svg.rfind("<?xml", 0), 0u);
  EXPECT_NE(svg.find("</svg>"), std::string::npos);
  EXPECT_EQ(Count(svg, "<circle"), 4);
  EXPECT_EQ(Count(svg, "class=\"limit\""), 2);
  EXPECT_NE(svg.find("plain TCP ring: 3 GB/s"), std::string::npos) << svg;
  EXPECT_NE(svg.find("64 MiB: 2.500 GB/s"), std::string::npos);
  EXPECT_NE(svg.find(">8 B<"), std::string::npos);  // the smallest size is labelled
  // The polyline has the four points in order, rising with busbw (SVG y grows downwards).
  const size_t at = svg.find("class=\"busbw\"");
  ASSERT_NE(at, std::string::npos);
  const size_t p = svg.find("points=\"", at) + 8;
  std::istringstream pts(svg.substr(p, svg.find('"', p) - p));
  double lastx = -1, lasty = 1e9, x, y;
  char comma;
  int n = 0;
  while (pts >> x >> comma >> y) {
    EXPECT_GT(x, lastx);
    EXPECT_LT(y, lasty);
    lastx = x, lasty = y, ++n;
  }
  EXPECT_EQ(n, 4);
}

TEST(BusBandwidthSvg, LabelsAreEscaped) {
  const std::string svg = BusBandwidthSvg("a<b & \"c\"", {{8, 1}}, {{"x<y", 1}});
  EXPECT_NE(svg.find("a&lt;b &amp; &quot;c&quot;"), std::string::npos);
  EXPECT_NE(svg.find("x&lt;y"), std::string::npos);
  EXPECT_EQ(svg.find("a<b"), std::string::npos);
}

TEST(WriteBusBandwidthPlot, OnlySvgAndTheErrorSaysSo) {
  absl::Status s = WriteBusBandwidthPlot("/tmp/plot.png", "t", {{8, 1}}, {});
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("name the file *.svg"), absl::string_view::npos) << s;
  const char* tmp = std::getenv("TEST_TMPDIR");
  const std::string path = std::string(tmp != nullptr ? tmp : "/tmp") + "/plot.svg";
  ASSERT_TRUE(WriteBusBandwidthPlot(path, "t", {{8, 1}, {16, 2}}, {{"l", 3}}).ok());
  std::ifstream in(path);
  std::stringstream all;
  all << in.rdbuf();
  EXPECT_EQ(Count(all.str(), "<circle"), 2);
  EXPECT_FALSE(WriteBusBandwidthPlot("/nonexistent-dir/p.svg", "t", {}, {}).ok());
}

TEST(SizeLabel, PowersOfTwoInBinaryUnits) {
  EXPECT_EQ(SizeLabel(8), "8 B");
  EXPECT_EQ(SizeLabel(65536), "64 KiB");
  EXPECT_EQ(SizeLabel(1 << 20), "1 MiB");
  EXPECT_EQ(SizeLabel(3000), "3000 B");
}

}  // namespace
}  // namespace gradsync
