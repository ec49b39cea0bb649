// `gradsync timeline merge`: the Chrome-trace files the daemons write for a
// job with a timeline (<job>.epoch<E>.rank<R>.trace.json, one per rank) made
// into one trace with every rank as its own row, for chrome://tracing or
// ui.perfetto.dev.
#ifndef GRADSYNC_CLI_TIMELINE_MERGE_H_
#define GRADSYNC_CLI_TIMELINE_MERGE_H_

#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace gradsync {

struct TimelineMergeResult {
  int files = 0;
  int events = 0;
  std::vector<std::string> rows;  // the rows' names, top to bottom
  std::vector<std::string> warnings;  // e.g. a file still being written
};

// Merges `inputs` (trace files, or directories whose *.trace.json are taken)
// into `out`. Rows are ordered by job, epoch and rank; a row is named
// "rank R" when every file is of one job epoch, else "JOB epoch E rank R".
// Timestamps are kept (each daemon's wall clock, in microseconds).
absl::StatusOr<TimelineMergeResult> MergeTimelines(const std::vector<std::string>& inputs,
                                                   const std::string& out);

}  // namespace gradsync

#endif  // GRADSYNC_CLI_TIMELINE_MERGE_H_
