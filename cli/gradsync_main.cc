// gradsync: the command-line tool. Subcommands: demo.
#include <cstdio>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "cli/demo.h"

ABSL_FLAG(int32_t, ranks, 4, "demo: number of ranks (gradsyncd processes)");
ABSL_FLAG(std::string, max_bytes, "64M", "demo: largest allreduce (K/M/G suffixes)");
ABSL_FLAG(int32_t, iters, 3, "demo: timed iterations per size");
ABSL_FLAG(int32_t, warmup, 1, "demo: untimed iterations per size");
ABSL_FLAG(int64_t, timeout_ms, 60000, "deadline of each collective");
ABSL_FLAG(bool, keep_logs, false, "keep the local cluster's logs even when all is well");

namespace {
constexpr char kUsage[] =
    "gradsync <command> [flags]\n"
    "commands:\n"
    "  demo    start a local cluster (1 coordinator + --ranks daemons) on loopback, run\n"
    "          allreduces over several sizes and dtypes, check every result, print a table;\n"
    "          exits 0 only if every check passed\n";
}  // namespace

int main(int argc, char** argv) {
  absl::SetProgramUsageMessage(kUsage);
  std::vector<char*> args = absl::ParseCommandLine(argc, argv);
  if (args.size() < 2) {
    std::fputs(kUsage, stderr);
    return 2;
  }
  const std::string cmd = args[1];
  if (cmd == "demo") {
    gradsync::DemoOptions o;
    o.ranks = absl::GetFlag(FLAGS_ranks);
    auto max_bytes = gradsync::ParseBytes(absl::GetFlag(FLAGS_max_bytes));
    if (!max_bytes.ok()) {
      std::fprintf(stderr, "gradsync demo: --max_bytes: %s\n",
                   std::string(max_bytes.status().message()).c_str());
      return 2;
    }
    o.max_bytes = *max_bytes;
    o.iters = absl::GetFlag(FLAGS_iters);
    o.warmup = absl::GetFlag(FLAGS_warmup);
    o.timeout_ms = absl::GetFlag(FLAGS_timeout_ms);
    o.keep_logs = absl::GetFlag(FLAGS_keep_logs);
    auto failures = gradsync::RunDemo(o);
    if (!failures.ok()) {
      std::fprintf(stderr, "gradsync demo: %s\n", std::string(failures.status().message()).c_str());
      return 1;
    }
    return *failures == 0 ? 0 : 1;
  }
  std::fprintf(stderr, "gradsync: unknown command '%s'\n%s", cmd.c_str(), kUsage);
  return 2;
}
