// `gradsync bench`: nccl-tests for gradsync. See docs/cli.md#bench.
#ifndef GRADSYNC_CLI_BENCH_H_
#define GRADSYNC_CLI_BENCH_H_

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/types.h"

namespace gradsync {

struct BenchOptions {
  CollectiveKind op = CollectiveKind::kAllreduce;
  int ranks = 4;               // embedded local cluster size
  int ranks_per_daemon = 1;    // embedded: clients sharing one gradsyncd (the node path)
  std::string coordinator;     // non-empty: use an existing cluster (one bench process per rank)
  std::string daemon = "unix:/run/gradsync/gradsyncd.sock";  // with --coordinator
  // With --coordinator: ranks of the bench job (0: $WORLD_SIZE,
  // $OMPI_COMM_WORLD_SIZE or $PMI_SIZE), this process's rank (-1: $RANK,
  // $OMPI_COMM_WORLD_RANK or $PMI_RANK, else the order of joining), the job id
  // shared by the bench processes ("": $GRADSYNC_JOB).
  int world_size = 0;
  int rank = -1;
  std::string job;
  uint64_t min_bytes = 8;
  uint64_t max_bytes = 64ull << 20;
  double step_factor = 2;
  DType dtype = DType::kF32;
  ReduceOp redop = ReduceOp::kSum;
  std::string algo = "auto";
  // The ops' wire codec ("" / "none", "bf16", ..., "auto", "auto:bf16,int8";
  // docs/compression.md). --check then allows each codec's error bound.
  std::string codec;
  int root = 0;
  int warmup = 5;
  int iters = 20;
  bool check = false;
  // Time every op alone (all local ranks released together, submit + wait),
  // and report the median over iterations of the slowest rank's time: how
  // MPI and Gloo benchmarks time an op. Default: --iters ops back to back,
  // elapsed / iters (a throughput figure for small ops).
  bool blocking = false;
  // With blocking: every rank sleeps this long before each op's barrier
  // (compute between a step's allreduces; the daemon's threads may sleep).
  int gap_us = 0;
  std::string csv;
  // Also time each size out of place: the input in memory of its own, copied
  // into the op's buffer before every op (gradsync's ops are in place).
  bool out_of_place = false;
  std::string plot;            // SVG of busbw vs size, the measured limit beside it
  bool timeline = false;       // the job's Chrome-trace timeline (gradsyncd --timeline_dir)
  int tcp_streams = 0;         // 0: gradsyncd's default
  int ps_shards = 0;           // parameter-server shards (embedded: started; the job uses them)
  bool limits = true;          // measure and print the link limits first
  std::vector<std::string> daemon_flags;  // embedded: extra gradsyncd flags (experiments)
  bool keep_logs = false;                 // embedded: keep the cluster's logs (path printed)
  int64_t timeout_ms = 120000;
};

// Runs the benchmark; prints the table to stdout. Returns the total number of
// wrong elements (with --check) plus failed sizes.
absl::StatusOr<uint64_t> RunBench(const BenchOptions& options);

// Fills world_size, rank and job of an existing-cluster run from the
// launcher's environment (torchrun, mpirun, srun-style PMI) where the flags
// left them unset; `env` looks a name up (std::getenv in the tool). Errors
// name the variable and the value.
absl::Status ResolveBenchLaunch(BenchOptions& options,
                                const std::function<const char*(const char*)>& env);

// busbw / algbw for `kind` on n ranks (nccl-tests definitions).
double BusBandwidthFactor(CollectiveKind kind, int n);

}  // namespace gradsync

#endif  // GRADSYNC_CLI_BENCH_H_
