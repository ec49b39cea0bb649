// `gradsync demo`: an embedded local cluster doing real, checked allreduces.
#ifndef GRADSYNC_CLI_DEMO_H_
#define GRADSYNC_CLI_DEMO_H_

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace gradsync {

struct DemoOptions {
  int ranks = 4;
  uint64_t max_bytes = 64ull << 20;
  int warmup = 1;
  int iters = 3;
  int64_t timeout_ms = 60000;
  bool keep_logs = false;
  int ps_shards = 2;  // gradsync-ps shards for the parameter-server rows
};

// Runs the demo, printing the table to stdout. Returns the number of failed
// rows (0 = every result matched the reference).
absl::StatusOr<int> RunDemo(const DemoOptions& options);

// "64M", "4k", "1G", "1000" -> bytes (binary multiples).
absl::StatusOr<uint64_t> ParseBytes(absl::string_view s);

}  // namespace gradsync

#endif  // GRADSYNC_CLI_DEMO_H_
