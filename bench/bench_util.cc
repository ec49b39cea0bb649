#include "bench/bench_util.h"

#include <algorithm>
#include <cctype>
#include <cstdio>

#include "absl/status/status.h"
#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"

namespace gradsync {
namespace bench {

absl::StatusOr<uint64_t> ParseBytes(absl::string_view s) {
  absl::string_view t = absl::StripAsciiWhitespace(s);
  size_t digits = 0;
  while (digits < t.size() && std::isdigit(static_cast<unsigned char>(t[digits]))) ++digits;
  uint64_t value = 0;
  if (digits == 0 || !absl::SimpleAtoi(t.substr(0, digits), &value)) {
    return absl::InvalidArgumentError(absl::StrCat("bad byte size '", s, "' (e.g. 4096, 4K, 64M, 1G)"));
  }
  std::string unit = absl::AsciiStrToUpper(t.substr(digits));
  if (unit.size() >= 2 && unit.substr(unit.size() - 2) == "IB") unit.resize(unit.size() - 2);
  else if (unit.size() == 2 && unit.back() == 'B') unit.resize(1);
  int shift = 0;
  if (unit.empty() || unit == "B") shift = 0;
  else if (unit == "K") shift = 10;
  else if (unit == "M") shift = 20;
  else if (unit == "G") shift = 30;
  else return absl::InvalidArgumentError(absl::StrCat("bad unit in byte size '", s, "' (K, M or G)"));
  if (value > (UINT64_MAX >> shift)) {
    return absl::InvalidArgumentError(absl::StrCat("byte size '", s, "' is too large"));
  }
  return value << shift;
}

std::string FormatBytes(uint64_t b) {
  static const char* kUnits[] = {"B", "KiB", "MiB", "GiB"};
  int u = 0;
  while (u < 3 && b >= 1024 && b % 1024 == 0) {
    b /= 1024;
    ++u;
  }
  return absl::StrCat(b, " ", kUnits[u]);
}

absl::StatusOr<std::vector<uint64_t>> MessageSizes(const SizeSpec& spec) {
  std::vector<uint64_t> out;
  if (!spec.sizes.empty()) {
    for (absl::string_view part : absl::StrSplit(spec.sizes, ',', absl::SkipWhitespace())) {
      auto b = ParseBytes(part);
      if (!b.ok()) return b.status();
      out.push_back(*b);
    }
  } else {
    auto lo = ParseBytes(spec.min_bytes);
    if (!lo.ok()) return lo.status();
    auto hi = ParseBytes(spec.max_bytes);
    if (!hi.ok()) return hi.status();
    if (*lo == 0 || *lo > *hi) {
      return absl::InvalidArgumentError(absl::StrCat("need 0 < min_bytes (", spec.min_bytes,
                                                     ") <= max_bytes (", spec.max_bytes, ")"));
    }
    if (spec.step_factor < 2) {
      return absl::InvalidArgumentError(
          absl::StrCat("step_factor must be at least 2, got ", spec.step_factor));
    }
    for (uint64_t b = *lo; b <= *hi; ) {
      out.push_back(b);
      if (b > *hi / static_cast<uint64_t>(spec.step_factor)) break;
      b *= static_cast<uint64_t>(spec.step_factor);
    }
    if (out.back() != *hi) out.push_back(*hi);
  }
  if (spec.latency) out.push_back(8);
  std::sort(out.begin(), out.end());
  out.erase(std::unique(out.begin(), out.end()), out.end());
  if (out.empty()) return absl::InvalidArgumentError("no message sizes");
  if (out.front() == 0) return absl::InvalidArgumentError("message size 0");
  return out;
}

TimeStats Summarize(const std::vector<double>& samples) {
  TimeStats st;
  if (samples.empty()) return st;
  double sum = 0;
  st.min_s = samples[0];
  st.max_s = samples[0];
  for (double s : samples) {
    sum += s;
    st.min_s = std::min(st.min_s, s);
    st.max_s = std::max(st.max_s, s);
  }
  st.mean_s = sum / static_cast<double>(samples.size());
  std::vector<double> sorted = samples;
  std::sort(sorted.begin(), sorted.end());
  const size_t mid = sorted.size() / 2;
  st.median_s = sorted.size() % 2 ? sorted[mid] : (sorted[mid - 1] + sorted[mid]) / 2;
  return st;
}

std::vector<double> SlowestRank(const std::vector<std::vector<double>>& per_rank) {
  std::vector<double> out;
  if (per_rank.empty()) return out;
  out = per_rank[0];
  for (size_t r = 1; r < per_rank.size(); ++r) {
    for (size_t i = 0; i < out.size() && i < per_rank[r].size(); ++i) {
      out[i] = std::max(out[i], per_rank[r][i]);
    }
  }
  return out;
}

double AlgBwGBps(uint64_t bytes, double seconds) {
  return seconds > 0 ? static_cast<double>(bytes) / seconds / 1e9 : 0.0;
}

double AllreduceBusBwGBps(uint64_t bytes, double seconds, int ranks) {
  if (ranks <= 1) return 0.0;
  return AlgBwGBps(bytes, seconds) * 2.0 * (ranks - 1) / ranks;
}

std::string ResultLine(absl::string_view name,
                       const std::vector<std::pair<std::string, std::string>>& kv) {
  std::string line(name);
  for (const auto& [k, v] : kv) absl::StrAppend(&line, ",", k, "=", v);
  return line;
}

std::string FormatUs(double seconds) {
  char buf[64];
  std::snprintf(buf, sizeof(buf), "%.2f", seconds * 1e6);
  return buf;
}

std::string FormatGBps(double gbps) {
  char buf[64];
  std::snprintf(buf, sizeof(buf), "%.6g", gbps);
  return buf;
}

}  // namespace bench
}  // namespace gradsync
