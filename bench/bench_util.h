// Shared pieces of the comparison benchmarks (gradsync-ring-limit, gradsync-membw):
// byte-size parsing, the list of message sizes, timing summaries, the bus
// bandwidth formula and the one-line machine-readable result format.
//
// Result lines look like `name,key=value,key=value,...` (no spaces, keys in a
// fixed order per benchmark); human-readable lines start with "# ". See
// bench/README.md. Everything here is pure and thread-compatible.
#ifndef GRADSYNC_BENCH_BENCH_UTIL_H_
#define GRADSYNC_BENCH_BENCH_UTIL_H_

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace gradsync {
namespace bench {

// "4096", "4K", "64M", "1G", "4KiB", "4KB" (binary units: K = 1024).
absl::StatusOr<uint64_t> ParseBytes(absl::string_view s);

// "64 MiB", "4 KiB", "8 B".
std::string FormatBytes(uint64_t bytes);

struct SizeSpec {
  std::string sizes;      // comma-separated list; when set, min/max/step are ignored
  std::string min_bytes = "4K";
  std::string max_bytes = "64M";
  int64_t step_factor = 4;
  bool latency = false;   // also measure 8 bytes, first
};

// The message sizes to run, ascending, without duplicates: min, min*f, ... up
// to max (max is included even when not on the grid).
absl::StatusOr<std::vector<uint64_t>> MessageSizes(const SizeSpec& spec);

struct TimeStats {
  double mean_s = 0;
  double median_s = 0;
  double min_s = 0;
  double max_s = 0;
};
// Mean/median/min/max of samples (seconds). Empty input gives zeros.
TimeStats Summarize(const std::vector<double>& samples_s);

// Per-iteration slowest rank: out[i] = max over ranks of per_rank[r][i].
// All inner vectors must have the same length.
std::vector<double> SlowestRank(const std::vector<std::vector<double>>& per_rank);

// nccl-tests definitions for allreduce: algbw = bytes / time,
// busbw = algbw * 2 (n - 1) / n. GB/s with G = 1e9.
double AlgBwGBps(uint64_t bytes, double seconds);
double AllreduceBusBwGBps(uint64_t bytes, double seconds, int ranks);

// `name,k1=v1,k2=v2` — the machine-readable result line.
std::string ResultLine(absl::string_view name,
                       const std::vector<std::pair<std::string, std::string>>& kv);
// Number formats shared by every result line (the Python and C peers use the
// same printf formats): time in microseconds "%.2f", bandwidth "%.6g".
std::string FormatUs(double seconds);
std::string FormatGBps(double gbps);

}  // namespace bench
}  // namespace gradsync

#endif  // GRADSYNC_BENCH_BENCH_UTIL_H_
