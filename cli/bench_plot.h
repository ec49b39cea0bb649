// `gradsync bench --plot FILE.svg`: busbw against message size (log scale),
// with the link limits measured in the same run drawn beside it.
#ifndef GRADSYNC_CLI_BENCH_PLOT_H_
#define GRADSYNC_CLI_BENCH_PLOT_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"

namespace gradsync {

struct PlotPoint {
  uint64_t bytes = 0;
  double busbw_gbps = 0;
};
// A horizontal line: a limit measured in the run (e.g. the plain TCP ring).
struct PlotLimit {
  std::string label;
  double gbps = 0;
};

// A standalone SVG document. `points` in increasing bytes; labels are escaped.
std::string BusBandwidthSvg(const std::string& title, const std::vector<PlotPoint>& points,
                            const std::vector<PlotLimit>& limits);

// Writes BusBandwidthSvg to `path`, which must end in ".svg" (the error says so).
absl::Status WriteBusBandwidthPlot(const std::string& path, const std::string& title,
                                   const std::vector<PlotPoint>& points,
                                   const std::vector<PlotLimit>& limits);

// "8 B", "64 KiB", "1 MiB", "2 GiB" (powers of two; otherwise bytes).
std::string SizeLabel(uint64_t bytes);

}  // namespace gradsync

#endif  // GRADSYNC_CLI_BENCH_PLOT_H_
