// A stand-in for one rank of a training job, for trying out monitoring by
// hand (docs/operations.md): each step "computes" for --compute_ms (a sleep),
// then allreduces --bytes of f32 gradients (avg) and waits for the result.
// Give one rank a larger --compute_ms to make it the straggler. Runs --steps
// steps (0: until SIGINT/SIGTERM), then closes its session.
//
//   bazel-bin/tests/train_loop --daemon=unix:/run/gradsync/gradsyncd.sock
//       --job=resnet-42 --world_size=3 [--rank=R] [--compute_ms=300]
#include <algorithm>
#include <csignal>
#include <cstdio>
#include <string>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/time/clock.h"
#include "client/client.h"

ABSL_FLAG(std::string, daemon, "unix:/run/gradsync/gradsyncd.sock", "the local gradsyncd");
ABSL_FLAG(std::string, job, "train-loop", "job id, the same on every rank");
ABSL_FLAG(int32_t, world_size, 2, "ranks in the job");
ABSL_FLAG(int32_t, rank, -1, "this rank (-1: the coordinator assigns one in join order)");
ABSL_FLAG(int64_t, bytes, 4 << 20, "gradient bytes per step (f32)");
ABSL_FLAG(int32_t, compute_ms, 50, "simulated compute time per step");
ABSL_FLAG(int64_t, steps, 0, "steps to run (0: until SIGINT/SIGTERM)");
ABSL_FLAG(int32_t, report_every, 50, "print a line every this many steps");

namespace {
volatile std::sig_atomic_t g_stop = 0;
void OnSignal(int) { g_stop = 1; }
}  // namespace

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  using namespace gradsync;
  std::signal(SIGINT, OnSignal);
  std::signal(SIGTERM, OnSignal);
  auto c = client::Client::Connect(absl::GetFlag(FLAGS_daemon));
  if (!c.ok()) {
    std::fprintf(stderr, "train_loop: %s\n", c.status().ToString().c_str());
    return 1;
  }
  client::SessionOptions so;
  so.job_id = absl::GetFlag(FLAGS_job);
  so.world_size = absl::GetFlag(FLAGS_world_size);
  so.rank = absl::GetFlag(FLAGS_rank);
  so.timeout = absl::Seconds(300);
  auto s = (*c)->OpenSession(so);
  if (!s.ok()) {
    std::fprintf(stderr, "train_loop: %s\n", s.status().ToString().c_str());
    return 1;
  }
  const size_t count = static_cast<size_t>(absl::GetFlag(FLAGS_bytes)) / sizeof(float);
  auto b = (*s)->AllocateBuffer(count * sizeof(float));
  if (!b.ok()) {
    std::fprintf(stderr, "train_loop: %s\n", b.status().ToString().c_str());
    return 1;
  }
  const int rank = (*s)->rank();
  std::printf("rank %d of %d in job '%s': %zu f32 per step, compute %d ms\n", rank,
              so.world_size, so.job_id.c_str(), count, absl::GetFlag(FLAGS_compute_ms));
  std::fflush(stdout);
  const int64_t steps = absl::GetFlag(FLAGS_steps);
  const int every = std::max(1, absl::GetFlag(FLAGS_report_every));
  absl::Duration comm;
  int rc = 0;
  for (int64_t step = 1; (steps == 0 || step <= steps) && !g_stop; ++step) {
    float* g = (*b)->as<float>();
    for (size_t i = 0; i < count; ++i) g[i] = static_cast<float>(rank + 1);
    absl::SleepFor(absl::Milliseconds(absl::GetFlag(FLAGS_compute_ms)));
    const absl::Time t0 = absl::Now();
    auto r = (*s)->Allreduce(**b, 0, count, DType::kF32, ReduceOp::kAvg, "grads");
    comm += absl::Now() - t0;
    if (!r.ok()) {
      std::fprintf(stderr, "rank %d step %lld: %s\n", rank, static_cast<long long>(step),
                   r.status().ToString().c_str());
      rc = 1;
      break;
    }
    if (step % every == 0) {
      std::printf("rank %d step %lld: allreduce %.1f ms/step on average\n", rank,
                  static_cast<long long>(step), absl::ToDoubleMilliseconds(comm) / every);
      std::fflush(stdout);
      comm = absl::ZeroDuration();
    }
  }
  (void)(*s)->Close();
  return rc;
}
