// The limits `gradsync bench` prints before its table: loopback TCP one-way
// throughput (gradsync-ring-limit --single_stream_throughput), a plain TCP
// ring of the same processes with no reduction (gradsync-ring-limit --ranks),
// and memory bandwidth (gradsync-membw), measured on this host in this run.
#ifndef GRADSYNC_CLI_BENCH_LIMITS_H_
#define GRADSYNC_CLI_BENCH_LIMITS_H_

#include <cstdint>
#include <vector>

#include "cli/bench_plot.h"

namespace gradsync {

// Prints "# limits ..." lines to stdout and progress ("[bench] measuring ...")
// to stderr; returns the bus-bandwidth limits to draw beside the table's
// curve (the plain TCP ring; with one process, the one-way TCP throughput).
std::vector<PlotLimit> MeasureLimits(int processes, uint64_t bytes, int streams);

}  // namespace gradsync

#endif  // GRADSYNC_CLI_BENCH_LIMITS_H_
