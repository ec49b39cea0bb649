#include "cli/bench_limits.h"

#include <stdio.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <string>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "cli/local_cluster.h"

namespace gradsync {
namespace {

// On stderr, so the table on stdout stays clean: the limits take seconds.
void Progress(const std::string& what) {
  std::fprintf(stderr, "[bench] measuring %s ...\n", what.c_str());
}

double Number(const std::string& s) {
  double v = 0;
  return absl::SimpleAtod(s, &v) ? v : 0;
}

// Runs `cmd` (bounded by `timeout`), returns its lines that look like
// "name,key=value,...".
std::vector<std::string> ResultLines(const std::string& cmd) {
  std::vector<std::string> out;
  FILE* p = ::popen(cmd.c_str(), "r");
  if (p == nullptr) return out;
  char line[1024];
  while (std::fgets(line, sizeof(line), p) != nullptr) {
    std::string s(line);
    while (!s.empty() && (s.back() == '\n' || s.back() == '\r')) s.pop_back();
    if (s.find(",") != std::string::npos && s.find("=") != std::string::npos &&
        s.find(' ') == std::string::npos) {
      out.push_back(s);
    }
  }
  ::pclose(p);
  return out;
}

std::string Field(const std::string& line, const std::string& key) {
  for (absl::string_view kv : absl::StrSplit(line, ',')) {
    std::pair<std::string, std::string> p = absl::StrSplit(kv, absl::MaxSplits('=', 1));
    if (p.first == key) return p.second;
  }
  return "";
}

}  // namespace

std::vector<PlotLimit> MeasureLimits(int n, uint64_t bytes, int streams) {
  std::vector<PlotLimit> limits;
  const std::string ring = FindBinary("gradsync-ring-limit");
  const std::string membw = FindBinary("gradsync-membw");
  std::printf("# limits measured in this run (same host, same moment):\n");
  if (::access(ring.c_str(), X_OK) != 0) {
    std::printf("#   gradsync-ring-limit not found: TCP limits not measured\n");
  } else {
    for (int s : {1, std::max(1, streams)}) {
      Progress(absl::StrCat("loopback TCP one-way throughput, ", s, " stream(s)"));
      auto lines = ResultLines(absl::StrCat("timeout 120 ", ring,
                                            " --single_stream_throughput --streams=", s,
                                            " --min_bytes=", bytes, " --max_bytes=", bytes,
                                            " --iters=3 --warmup=1 2>/dev/null"));
      for (const auto& l : lines) {
        if (l.rfind("tcp_link,", 0) != 0 || Field(l, "streams") != absl::StrCat(s)) continue;
        std::printf("#   loopback TCP one-way throughput, %s stream(s), %s bytes: %s GB/s\n",
                    Field(l, "streams").c_str(), Field(l, "bytes").c_str(), Field(l, "gbps").c_str());
        if (n == 1 && s == std::max(1, streams)) {
          limits.push_back({absl::StrCat("TCP one-way, ", s, " stream(s)"), Number(Field(l, "gbps"))});
        }
      }
      if (s == std::max(1, streams)) break;
    }
    if (n > 1) {
      Progress(absl::StrCat("a plain TCP ring of ", n, " processes"));
      auto lines = ResultLines(absl::StrCat("timeout 300 ", ring, " --ranks=", n, " --streams=",
                                            std::max(1, streams), " --min_bytes=", bytes,
                                            " --max_bytes=", bytes, " --iters=3 --warmup=1 2>/dev/null"));
      for (const auto& l : lines) {
        std::printf("#   plain TCP ring of %d processes (%d stream(s)), %s bytes, no reduction: "
                    "busbw %s GB/s\n", n, std::max(1, streams), Field(l, "bytes").c_str(),
                    Field(l, "busbw_gbps").c_str());
        limits.push_back({absl::StrCat("plain TCP ring of ", n, ", no reduction"),
                          Number(Field(l, "busbw_gbps"))});
      }
    }
  }
  if (::access(membw.c_str(), X_OK) != 0) {
    std::printf("#   gradsync-membw not found: memory bandwidth not measured\n");
  } else {
    Progress("memory bandwidth");
    auto lines = ResultLines(absl::StrCat("timeout 60 ", membw, " --min_bytes=", bytes,
                                          " --max_bytes=", bytes, " 2>/dev/null"));
    for (const auto& l : lines) {
      std::printf("#   memory bandwidth, %s over %s bytes: %s GB/s\n", Field(l, "op").c_str(),
                  Field(l, "bytes").c_str(), Field(l, "gbps").c_str());
    }
  }
  std::fflush(stdout);
  return limits;
}


}  // namespace gradsync
