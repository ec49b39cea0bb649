// In-process parameter-server throughput: W worker threads, K shards on
// 127.0.0.1, f32 sum of `mib` MiB per worker.
//
//   bazel run -c opt //ps:ps_bench -- [workers=4] [mib=64] [partition_kib=1024] [iters=5]
//       [shard counts=1,2,4] [aggregation threads=4] [max_inflight=8]
//
// Prints the time per step and the per-worker rate (tensor bytes / step time).
#include <cstdio>
#include <cstdlib>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "ps/shard.h"
#include "ps/slicer.h"
#include "ps/worker_client.h"

namespace gradsync::ps {
namespace {

int Arg(int argc, char** argv, int i, int dflt) {
  int v = dflt;
  if (i < argc && !absl::SimpleAtoi(argv[i], &v)) {
    std::fprintf(stderr, "bad argument '%s'\n", argv[i]);
    std::exit(2);
  }
  return v;
}

int Main(int argc, char** argv) {
  const int workers = Arg(argc, argv, 1, 4);
  const int mib = Arg(argc, argv, 2, 64);
  const int partition_kib = Arg(argc, argv, 3, 1024);
  const int iters = Arg(argc, argv, 4, 5);
  std::vector<int> shard_counts = {1, 2, 4};
  if (argc > 5) {
    shard_counts.clear();
    for (absl::string_view s : absl::StrSplit(argv[5], ',')) {
      int k = 0;
      if (!absl::SimpleAtoi(s, &k) || k < 1) return 2;
      shard_counts.push_back(k);
    }
  }
  const int threads = Arg(argc, argv, 6, 4);
  const int inflight = Arg(argc, argv, 7, 8);
  const size_t count = static_cast<size_t>(mib) << 18;  // floats
  std::printf(
      "# %d workers, %d MiB f32 sum each, %d KiB partitions, %d aggregation threads, "
      "%d in flight per shard, %u cores\n",
      workers, mib, partition_kib, threads, inflight, std::thread::hardware_concurrency());
  std::printf("%6s %12s %14s\n", "shards", "step ms", "GB/s/worker");
  for (int K : shard_counts) {
    std::vector<std::unique_ptr<PsShard>> shards;
    std::vector<HostPort> addrs;
    for (int k = 0; k < K; ++k) {
      PsShardOptions o;
      o.listen = {"127.0.0.1", 0};
      o.threads = threads;
      auto s = PsShard::Start(o);
      if (!s.ok()) {
        std::fprintf(stderr, "%s\n", s.status().ToString().c_str());
        return 1;
      }
      addrs.push_back({"127.0.0.1", (*s)->port()});
      shards.push_back(std::move(*s));
    }
    std::vector<std::unique_ptr<PsWorker>> ws;
    std::vector<std::vector<float>> bufs(workers, std::vector<float>(count, 1.0f));
    for (int r = 0; r < workers; ++r) {
      PsWorkerOptions o;
      o.job_id = "bench";
      o.epoch = 1;
      o.shards = addrs;
      o.max_inflight = inflight;
      ws.push_back(std::move(*PsWorker::Create(o)));
    }
    const BalancedSlicer slicer;
    double best = 1e30, total = 0;
    for (int it = 0; it <= iters; ++it) {  // iteration 0 warms up
      std::vector<std::thread> th;
      std::vector<absl::Status> st(workers);
      const absl::Time start = absl::Now();
      for (int r = 0; r < workers; ++r) {
        th.emplace_back([&, r] {
          st[r] = ws[r]->PushPull(it + 1, bufs[r].data(), count, DType::kF32, ReduceOp::kSum,
                                  workers, r, uint64_t{static_cast<uint64_t>(partition_kib)} << 10,
                                  slicer, absl::Now() + absl::Seconds(120));
        });
      }
      for (auto& t : th) t.join();
      const double secs = absl::ToDoubleSeconds(absl::Now() - start);
      for (const auto& s : st) {
        if (!s.ok()) {
          std::fprintf(stderr, "%s\n", s.ToString().c_str());
          return 1;
        }
      }
      if (it == 0) continue;
      best = std::min(best, secs);
      total += secs;
    }
    const double avg = total / iters;
    std::printf("%6d %12.1f %14.2f   (best %.1f ms, %.2f GB/s)\n", K, avg * 1e3,
                count * 4.0 / avg / 1e9, best * 1e3, count * 4.0 / best / 1e9);
  }
  return 0;
}

}  // namespace
}  // namespace gradsync::ps

int main(int argc, char** argv) { return gradsync::ps::Main(argc, argv); }
