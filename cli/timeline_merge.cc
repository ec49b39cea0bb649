#include "cli/timeline_merge.h"

#include <algorithm>
#include <cctype>
#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>
#include <tuple>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "absl/strings/strip.h"
#include "common/json_escape.h"

namespace gradsync {
namespace {

struct TraceFile {
  std::string path;
  std::string job;  // "" when the name is not the daemon's pattern
  int64_t epoch = 0;
  int rank = 0;
};

// "<job>.epoch<E>.rank<R>.trace.json" (a tenant's "t/j" is written "t+j").
TraceFile Describe(const std::string& path) {
  TraceFile f;
  f.path = path;
  std::string name = std::filesystem::path(path).filename().string();
  absl::string_view n = name;
  if (!absl::ConsumeSuffix(&n, ".trace.json")) return f;
  const size_t r = n.rfind(".rank");
  const size_t e = n.rfind(".epoch", r);
  if (r == absl::string_view::npos || e == absl::string_view::npos) return f;
  if (!absl::SimpleAtoi(n.substr(r + 5), &f.rank) ||
      !absl::SimpleAtoi(n.substr(e + 6, r - e - 6), &f.epoch)) {
    return f;
  }
  f.job = absl::StrReplaceAll(n.substr(0, e), {{"+", "/"}});
  return f;
}


// Rewrites every "pid":N of one event to the row's pid.
std::string WithPid(const std::string& event, int pid) {
  std::string out;
  size_t at = 0;
  for (size_t p = event.find("\"pid\":"); p != std::string::npos; p = event.find("\"pid\":", at)) {
    out.append(event, at, p + 6 - at);
    size_t q = p + 6;
    while (q < event.size() && std::isdigit(static_cast<unsigned char>(event[q]))) ++q;
    out += std::to_string(pid);
    at = q;
  }
  out.append(event, at, std::string::npos);
  return out;
}

}  // namespace

absl::StatusOr<TimelineMergeResult> MergeTimelines(const std::vector<std::string>& inputs,
                                                   const std::string& out) {
  if (inputs.empty()) return absl::InvalidArgumentError("no trace files or directories given");
  std::vector<TraceFile> files;
  for (const std::string& in : inputs) {
    std::error_code ec;
    if (std::filesystem::is_directory(in, ec)) {
      size_t before = files.size();
      for (const auto& e : std::filesystem::directory_iterator(in, ec)) {
        if (absl::EndsWith(e.path().string(), ".trace.json")) files.push_back(Describe(e.path().string()));
      }
      if (files.size() == before) {
        return absl::NotFoundError(absl::StrCat("no *.trace.json in directory '", in, "'"));
      }
    } else if (std::filesystem::is_regular_file(in, ec)) {
      files.push_back(Describe(in));
    } else {
      return absl::NotFoundError(absl::StrCat("'", in, "' is neither a trace file nor a directory"));
    }
  }
  std::sort(files.begin(), files.end(), [](const TraceFile& a, const TraceFile& b) {
    return std::tie(a.job, a.epoch, a.rank, a.path) < std::tie(b.job, b.epoch, b.rank, b.path);
  });
  std::set<std::pair<std::string, int64_t>> epochs;
  for (const TraceFile& f : files) epochs.insert({f.job, f.epoch});
  const bool one_epoch = epochs.size() == 1 && !files.front().job.empty();

  TimelineMergeResult result;
  std::string body;
  auto add = [&body](const std::string& event) {
    if (!body.empty()) body += ",\n";
    body += event;
  };
  for (size_t i = 0; i < files.size(); ++i) {
    const TraceFile& f = files[i];
    std::ifstream in(f.path);
    std::stringstream all;
    all << in.rdbuf();
    if (!in) return absl::NotFoundError(absl::StrCat("cannot read '", f.path, "'"));
    std::string text = all.str();
    const size_t open = text.find('[');
    if (open == std::string::npos) {
      return absl::InvalidArgumentError(absl::StrCat("'", f.path, "' is not a Chrome trace (no '[')"));
    }
    size_t close = text.rfind(']');
    if (close == std::string::npos || close < open) {  // a daemon still writing it
      close = text.rfind('}') == std::string::npos ? open : text.rfind('}') + 1;
      result.warnings.push_back(absl::StrCat(f.path, ": not closed (its session is still open); "
                                             "its complete events are taken"));
    }
    const std::string row = f.job.empty() ? std::filesystem::path(f.path).filename().string()
                            : one_epoch   ? absl::StrCat("rank ", f.rank)
                                          : absl::StrCat(f.job, " epoch ", f.epoch, " rank ", f.rank);
    const int pid = static_cast<int>(i);
    add(absl::StrCat(R"({"name":"process_name","ph":"M","pid":)", pid,
                     R"(,"tid":0,"args":{"name":)", absl::StrCat("\"", JsonEscape(row), "\""), "}}"));
    add(absl::StrCat(R"({"name":"process_sort_index","ph":"M","pid":)", pid,
                     R"(,"tid":0,"args":{"sort_index":)", pid, "}}"));
    result.rows.push_back(row);
    // The writer puts one event per line; a line cut short by a crash is skipped.
    std::istringstream lines(text.substr(open + 1, close - open - 1));
    std::string line;
    while (std::getline(lines, line)) {
      absl::string_view ev = absl::StripAsciiWhitespace(line);
      absl::ConsumeSuffix(&ev, ",");
      if (ev.empty()) continue;
      if (ev.front() != '{' || ev.back() != '}') {
        result.warnings.push_back(absl::StrCat(f.path, ": skipped an incomplete event"));
        continue;
      }
      if (absl::StrContains(ev, R"("name":"process_name")")) continue;  // replaced by the row's
      add(WithPid(std::string(ev), pid));
      ++result.events;
    }
    ++result.files;
  }
  std::ofstream o(out, std::ios::trunc);
  o << "{\"traceEvents\":[\n" << body << "\n],\"displayTimeUnit\":\"ms\"}\n";
  o.close();
  if (!o) return absl::InvalidArgumentError(absl::StrCat("cannot write '", out, "'"));
  return result;
}

}  // namespace gradsync
