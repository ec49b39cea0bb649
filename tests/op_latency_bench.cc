// Round-trip latency of an 8-byte allreduce (SubmitAsync + Wait, i.e.
// Session::Allreduce) through gradsyncd, over the shared-memory op queue and
// over gRPC Submit/Wait (GRADSYNC_OP_CHANNEL=grpc), for each world size.
// Starts its own LocalCluster (one daemon per rank, loopback TCP between them).
//
//   bazel run -c opt //tests:op_latency_bench -- --iters=1000 --worlds=1,2
//
// Prints one line per (world, channel): median, p90, p99 and max of rank 0's
// latencies, in microseconds, and the median time the daemon itself reports
// for the op (queued + run): the rest is the client <-> daemon path.
#include <stdlib.h>

#include <algorithm>
#include <cstdio>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "cli/local_cluster.h"
#include "tests/cluster_util.h"

ABSL_FLAG(int32_t, iters, 1000, "timed allreduces per (world, channel)");
ABSL_FLAG(int32_t, warmup, 200, "untimed allreduces first");
ABSL_FLAG(std::string, worlds, "1,2", "world sizes to run (one daemon per rank)");

namespace gradsync {
namespace {

struct Stats {
  double median = 0, p90 = 0, p99 = 0, max = 0;
};

Stats Summarize(std::vector<double> us) {
  Stats s;
  if (us.empty()) return s;
  std::sort(us.begin(), us.end());
  auto at = [&](double q) { return us[std::min(us.size() - 1, static_cast<size_t>(q * us.size()))]; };
  s.median = at(0.5);
  s.p90 = at(0.9);
  s.p99 = at(0.99);
  s.max = us.back();
  return s;
}

struct Samples {
  std::vector<double> total_us;   // submit + wait, measured by the client
  std::vector<double> daemon_us;  // queued + run, as the daemon reports them
};

// Runs warmup + iters allreduces of 2 x f32 on every rank; returns rank 0's
// latencies in microseconds.
absl::StatusOr<Samples> Measure(LocalCluster& cluster, int world, bool grpc,
                                            int warmup, int iters) {
  static int job_no = 0;
  if (grpc) ::setenv("GRADSYNC_OP_CHANNEL", "grpc", 1);
  auto job = testing::OpenJob(cluster, absl::StrCat("latency-", job_no++), testing::FirstN(world));
  ::unsetenv("GRADSYNC_OP_CHANNEL");
  if (!job.ok()) return job.status();
  Samples lat;
  std::vector<absl::Status> st(world);
  testing::OnEveryRank(world, [&](int r) {
    auto& s = *(*job)[r].session;
    auto buf = s.AllocateBuffer(8);
    if (!buf.ok()) return void(st[r] = buf.status());
    float* x = (*buf)->as<float>();
    Samples mine;
    for (int i = 0; i < warmup + iters; ++i) {
      x[0] = 1.0f;
      x[1] = 2.0f;
      const absl::Time t0 = absl::Now();
      auto res = s.Allreduce(**buf, 0, 2, DType::kF32, ReduceOp::kSum, "tiny");
      const absl::Time t1 = absl::Now();
      if (!res.ok()) return void(st[r] = res.status());
      if (x[0] != static_cast<float>(world)) {
        return void(st[r] = absl::InternalError(absl::StrCat("wrong sum ", x[0])));
      }
      if (i >= warmup) {
        mine.total_us.push_back(absl::ToDoubleMicroseconds(t1 - t0));
        mine.daemon_us.push_back(absl::ToDoubleMicroseconds(res->queued_time + res->run_time));
      }
    }
    if (r == 0) lat = std::move(mine);
  });
  for (int r = 0; r < world; ++r) {
    if (!st[r].ok()) return absl::Status(st[r].code(), absl::StrCat("rank ", r, ": ", st[r].message()));
  }
  for (auto& h : *job) (void)h.session->Close();
  return lat;
}

int Main() {
  std::vector<int> worlds;
  for (absl::string_view w : absl::StrSplit(absl::GetFlag(FLAGS_worlds), ',')) {
    int n = 0;
    if (!absl::SimpleAtoi(w, &n) || n < 1) {
      std::fprintf(stderr, "bad --worlds entry '%s'\n", std::string(w).c_str());
      return 2;
    }
    worlds.push_back(n);
  }
  const int max_world = *std::max_element(worlds.begin(), worlds.end());
  LocalClusterOptions o;
  o.daemons = max_world;
  auto cluster = LocalCluster::Start(o);
  if (!cluster.ok()) {
    std::fprintf(stderr, "cannot start the local cluster: %s\n", cluster.status().ToString().c_str());
    return 1;
  }
  const int iters = absl::GetFlag(FLAGS_iters);
  const int warmup = absl::GetFlag(FLAGS_warmup);
  std::printf("8-byte allreduce (f32[2] sum) round trip, submit + wait, rank 0, %d iterations\n",
              iters);
  std::printf("%-6s %-8s %10s %10s %10s %10s %17s\n", "world", "channel", "median_us", "p90_us",
              "p99_us", "max_us", "daemon_median_us");
  int rc = 0;
  for (int world : worlds) {
    for (bool grpc : {false, true}) {
      auto lat = Measure(**cluster, world, grpc, warmup, iters);
      if (!lat.ok()) {
        std::fprintf(stderr, "world %d %s: %s\n", world, grpc ? "grpc" : "queue",
                     lat.status().ToString().c_str());
        rc = 1;
        continue;
      }
      const Stats s = Summarize(lat->total_us);
      const Stats d = Summarize(lat->daemon_us);
      std::printf("%-6d %-8s %10.1f %10.1f %10.1f %10.1f %17.1f\n", world, grpc ? "grpc" : "queue",
                  s.median, s.p90, s.p99, s.max, d.median);
      std::fflush(stdout);
    }
  }
  absl::Status stopped = (*cluster)->StopAll();
  if (!stopped.ok()) std::fprintf(stderr, "stopping the cluster: %s\n", stopped.ToString().c_str());
  return rc;
}

}  // namespace
}  // namespace gradsync

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  return gradsync::Main();
}
