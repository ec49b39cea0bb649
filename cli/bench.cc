#include "cli/bench.h"

#include <signal.h>
#include <stdio.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <mutex>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "common/status_macros.h"
#include "cli/barrier.h"
#include "cli/bench_limits.h"
#include "cli/bench_plot.h"
#include "cli/timeline_merge.h"
#include "cli/expected.h"
#include "cli/local_cluster.h"
#include "client/client.h"
#include "collective/codec_request.h"
#include "kernels/codec.h"

namespace gradsync {
namespace {

// Op timing reads the monotonic clock through the vDSO: absl::Now() (Debian's
// Abseil) takes a process-wide SpinLock, which the bench's rank threads would
// contend on right as a barrier releases them all (common/clock.h), and the
// wall clock may be stepped mid-run.
double ElapsedMicros(std::chrono::steady_clock::time_point since) {
  return std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - since).count();
}

struct Row {
  uint64_t bytes = 0;
  uint64_t count = 0;  // per rank (per block for blocked collectives)
  std::string algo;
  double time_us = 0;
  std::vector<double> op_us;  // --blocking: each iteration's time
  double oop_time_us = 0;     // --out_of_place: the same, each op copying its input first
  std::vector<double> oop_op_us;
  std::vector<double> queued_us, run_us;  // --blocking: the daemon's split of each op
  uint64_t wrong = 0;
  std::string error;
  std::string split;  // --blocking: the daemon's queued/running medians
};

// An int from the first of `names` that is set: its value, its name.
absl::Status IntFromEnvironment(const std::function<const char*(const char*)>& env,
                                std::initializer_list<const char*> names, int& value,
                                std::string& from) {
  for (const char* name : names) {
    const char* v = env(name);
    if (v == nullptr || *v == '\0') continue;
    if (!absl::SimpleAtoi(v, &value)) {
      return absl::InvalidArgumentError(absl::StrCat("$", name, "='", v, "' is not an integer"));
    }
    from = absl::StrCat("$", name);
    return absl::OkStatus();
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status ResolveBenchLaunch(BenchOptions& o,
                                const std::function<const char*(const char*)>& env) {
  std::string from;
  if (o.world_size == 0) {
    RETURN_IF_ERROR(IntFromEnvironment(env, {"WORLD_SIZE", "OMPI_COMM_WORLD_SIZE", "PMI_SIZE"},
                                       o.world_size, from));
  }
  if (o.rank < 0) {
    RETURN_IF_ERROR(IntFromEnvironment(env, {"RANK", "OMPI_COMM_WORLD_RANK", "PMI_RANK"}, o.rank,
                                       from));
  }
  if (o.job.empty()) {
    if (const char* job = env("GRADSYNC_JOB"); job != nullptr) o.job = job;
  }
  if (o.world_size == 0) {
    return absl::InvalidArgumentError(
        "--world_size is required with --coordinator (or $WORLD_SIZE from torchrun, "
        "$OMPI_COMM_WORLD_SIZE from mpirun, $PMI_SIZE): the ranks of the bench job, the same on "
        "every rank");
  }
  if (o.rank >= o.world_size || o.rank < -1) {
    return absl::InvalidArgumentError(absl::StrCat("rank ", o.rank, " (", from.empty() ? "--rank" : from,
                                                   ") is outside [0, ", o.world_size, ")"));
  }
  if (o.job.empty()) {
    return absl::InvalidArgumentError(
        "--job (or $GRADSYNC_JOB) is required with --coordinator: the job id every bench "
        "process of the run passes");
  }
  return absl::OkStatus();
}

namespace {

// While the rendezvous waits for the other ranks, says so on stderr every 5 s.
class WaitingNotice {
 public:
  WaitingNotice(std::string what, absl::Duration limit)
      : thread_([this, what = std::move(what), limit] {
          const absl::Time start = absl::Now();
          std::unique_lock<std::mutex> l(mu_);
          while (!cv_.wait_for(l, std::chrono::seconds(5), [this] { return done_; })) {
            std::fprintf(stderr, "[bench] still waiting for %s (%s of %s)\n", what.c_str(),
                         absl::FormatDuration(absl::Trunc(absl::Now() - start, absl::Seconds(1))).c_str(),
                         absl::FormatDuration(limit).c_str());
          }
        }) {}
  ~WaitingNotice() {
    {
      std::lock_guard<std::mutex> l(mu_);
      done_ = true;
    }
    cv_.notify_all();
    thread_.join();
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  bool done_ = false;
  std::thread thread_;
};

}  // namespace

double BusBandwidthFactor(CollectiveKind kind, int n) {
  if (n < 1) return 0.0;
  switch (kind) {  // 0 for the exchanging collectives at 1 rank: nothing crosses a link
    case CollectiveKind::kAllreduce: return 2.0 * (n - 1) / n;
    case CollectiveKind::kReduceScatter:
    case CollectiveKind::kAllgather:
    case CollectiveKind::kAlltoall:
    case CollectiveKind::kGather:
    case CollectiveKind::kScatter: return static_cast<double>(n - 1) / n;
    case CollectiveKind::kBroadcast:
    case CollectiveKind::kReduce: return 1.0;
    case CollectiveKind::kBarrier: return 0.0;
    case CollectiveKind::kSend:
    case CollectiveKind::kRecv: return 1.0;
  }
  return 1.0;
}

absl::StatusOr<uint64_t> RunBench(const BenchOptions& o) {
  const bool external = !o.coordinator.empty();
  const int n = external ? o.world_size : o.ranks;
  if (external && o.world_size == 0) {
    return absl::InvalidArgumentError(
        "--world_size (or $WORLD_SIZE) is required with --coordinator: the ranks of the bench "
        "job (every rank passes the same)");
  }
  if (external && o.job.empty()) {
    return absl::InvalidArgumentError(
        "--job (or $GRADSYNC_JOB) is required with --coordinator: the job id every bench "
        "process of the run passes");
  }
  if (!o.plot.empty() && !absl::EndsWith(o.plot, ".svg")) {
    return absl::InvalidArgumentError(
        absl::StrCat("--plot '", o.plot, "': the plot is written as SVG; name the file *.svg"));
  }
  if (n < 1 || n > 64) {
    return absl::InvalidArgumentError(absl::StrCat(external ? "--world_size " : "--ranks ", n,
                                                   " out of range [1, 64]"));
  }
  if (o.step_factor <= 1.0) return absl::InvalidArgumentError("--step_factor must be > 1");
  if (o.min_bytes > o.max_bytes) return absl::InvalidArgumentError("--min_bytes > --max_bytes");
  if (o.iters < 1 || o.warmup < 0) return absl::InvalidArgumentError("--iters >= 1, --warmup >= 0");
  if (IsRootedCollective(o.op) && (o.root < 0 || o.root >= n)) {
    return absl::InvalidArgumentError(absl::StrCat("--root ", o.root, " out of range"));
  }
  const size_t es = DTypeSize(o.dtype);
  const uint64_t unit = es * (IsBlockedCollective(o.op) ? n : 1);
  std::vector<uint64_t> sizes;
  if (o.op == CollectiveKind::kBarrier) {
    sizes.push_back(0);
  } else {
    for (double b = static_cast<double>(std::max<uint64_t>(o.min_bytes, unit));
         b <= static_cast<double>(o.max_bytes) + 0.5; b *= o.step_factor) {
      const uint64_t bytes = static_cast<uint64_t>(b) / unit * unit;
      if (sizes.empty() || sizes.back() != bytes) sizes.push_back(bytes);
    }
  }
  if (sizes.empty()) return absl::InvalidArgumentError("no sizes in [--min_bytes, --max_bytes]");
  // --check under a codec: each of the n quantizations of an element errs by
  // at most the codec's bound of its block's largest partial sum, which the
  // bench's inputs keep at or below kMaxInputMagnitude * n.
  double tolerance = 0;
  {
    absl::StatusOr<CodecRequest> codecs = ParseCodecRequest(o.codec, /*job=*/false);
    if (!codecs.ok()) return absl::InvalidArgumentError(absl::StrCat("--codec: ", codecs.status().message()));
    if (codecs->topk.on() && o.check) {
      return absl::InvalidArgumentError(
          "--check compares each result with the dense sum, and a topk result is the ranks' "
          "selections (the error feedback sends the rest with later ops): drop --check");
    }
    for (CodecId id : kAllCodecs) {
      if (id == CodecId::kNone || !codecs->allows(id)) continue;
      tolerance = std::max(tolerance, n * CodecFor(id)->RelativeBound() * kMaxInputMagnitude * n);
    }
  }

  std::unique_ptr<LocalCluster> cluster;
  int local_ranks = n;
  if (external) {
    local_ranks = 1;
  } else {
    if (o.ranks_per_daemon < 1 || n % o.ranks_per_daemon != 0) {
      return absl::InvalidArgumentError(absl::StrCat("--ranks_per_daemon ", o.ranks_per_daemon,
                                                     " must divide --ranks ", n));
    }
    LocalClusterOptions co;
    co.daemons = n / o.ranks_per_daemon;
    co.ps_shards = o.ps_shards;
    co.daemon_flags = o.daemon_flags;
    co.keep_logs = o.keep_logs;
    auto c = LocalCluster::Start(co);
    if (!c.ok()) return c.status();
    cluster = std::move(*c);
    if (o.keep_logs) std::printf("# cluster logs: %s\n", cluster->work_dir().c_str());
  }
  const std::string job = o.job.empty() ? absl::StrCat("bench-", ::getpid()) : o.job;
  if (external) {
    std::printf("# this process: rank %s of %d, job '%s', through gradsyncd %s\n",
                o.rank >= 0 ? absl::StrCat(o.rank).c_str() : "(in joining order)", n, job.c_str(),
                o.daemon.c_str());
  }
  std::printf("# gradsync bench: %s, %d ranks (%s, %d per daemon), dtype %s, redop %s, algo %s, "
              "codec %s, %d warm-up + %d timed iterations per size\n", CollectiveName(o.op), n,
              external ? absl::StrCat("existing cluster, coordinator ", o.coordinator).c_str()
                       : "embedded local cluster on loopback",
              external ? 1 : o.ranks_per_daemon,
              DTypeName(o.dtype), ReduceOpName(o.redop), o.algo.c_str(),
              o.codec.empty() ? "none" : o.codec.c_str(), o.warmup, o.iters);
  if (tolerance > 0 && o.check) {
    std::printf("# --check with codec %s: #wrong counts f32 results off by more than %g\n",
                o.codec.c_str(), tolerance);
  }
  std::printf("# time = %s\n", o.blocking
                  ? "median over the iterations of the slowest rank's submit + wait, each op alone "
                    "(ranks released together)"
                  : "elapsed time of --iters ops submitted back to back (the slowest rank) / iters");
  std::printf("# bytes = whole buffer per rank; algbw = bytes / time; busbw = algbw * %.3f "
              "(nccl-tests definition for %s on %d ranks)\n",
              BusBandwidthFactor(o.op, n), CollectiveName(o.op), n);
  std::vector<PlotLimit> limits;
  if (o.limits && !external) {
    limits = MeasureLimits(o.ranks_per_daemon > 1 ? n / o.ranks_per_daemon : n, sizes.back(),
                o.tcp_streams > 0 ? o.tcp_streams : 2);
  }

  const uint64_t max_bytes = std::max<uint64_t>(sizes.back(), es * (IsBlockedCollective(o.op) ? n : 1));
  std::vector<std::unique_ptr<client::Client>> clients(local_ranks);
  std::vector<std::unique_ptr<client::Session>> sessions(local_ranks);
  std::vector<std::unique_ptr<client::Buffer>> buffers(local_ranks);
  std::vector<absl::Status> setup(local_ranks);
  {
    std::unique_ptr<WaitingNotice> notice;
    if (external) {
      std::fprintf(stderr, "[bench] joining job '%s' (%d ranks) at coordinator %s; waiting up to %s for "
                   "every rank\n", job.c_str(), n, o.coordinator.c_str(),
                   absl::FormatDuration(absl::Milliseconds(o.timeout_ms)).c_str());
      notice = std::make_unique<WaitingNotice>(absl::StrCat("the other ranks of job '", job, "'"),
                                               absl::Milliseconds(o.timeout_ms));
    }
    std::vector<std::thread> threads;
    for (int r = 0; r < local_ranks; ++r) {
      threads.emplace_back([&, r] {
        auto c = client::Client::Connect(external ? o.daemon
                                                  : cluster->daemon_target(r / o.ranks_per_daemon));
        if (!c.ok()) return void(setup[r] = c.status());
        clients[r] = std::move(*c);
        client::SessionOptions so;
        so.job_id = job;
        so.world_size = n;
        so.rank = external ? o.rank : r;
        so.timeout = absl::Milliseconds(std::max<int64_t>(o.timeout_ms, 1000));
        so.coordinator = external ? o.coordinator : "";
        so.timeline = o.timeline;
        so.op_timeout_ms = o.timeout_ms;
        so.tcp_streams = o.tcp_streams;
        so.ps_shards = o.ps_shards;
        auto s = clients[r]->OpenSession(so);
        if (!s.ok()) return void(setup[r] = s.status());
        sessions[r] = std::move(*s);
        auto b = sessions[r]->AllocateBuffer(max_bytes);
        if (!b.ok()) return void(setup[r] = b.status());
        buffers[r] = std::move(*b);
      });
    }
    for (auto& t : threads) t.join();
  }
  for (int r = 0; r < local_ranks; ++r) {
    if (!setup[r].ok()) return setup[r];
  }
  const bool print = !external || sessions[0]->rank() == 0;
  if (print) {
    // Every daemon of an epoch decides alike; rank 0's says it for the job.
    std::printf("# transport: %s\n",
                sessions[0]->transport().empty() ? "(not reported by the daemon)"
                                                 : sessions[0]->transport().c_str());
    std::printf("%12s %12s %5s %6s %9s %12s %11s %11s%s %7s\n", "bytes", "count", "type", "redop",
                "algo", "time(us)", "algbw(GB/s)", "busbw(GB/s)",
                o.out_of_place ? absl::StrFormat(" %12s %11s", "oop_time(us)", "oop_busbw").c_str() : "",
                "#wrong");
  }
  std::FILE* csv = nullptr;
  if (!o.csv.empty() && print) {
    csv = std::fopen(o.csv.c_str(), "w");
    if (csv == nullptr) return absl::InvalidArgumentError(absl::StrCat("cannot write --csv ", o.csv));
    std::fprintf(csv, "op,ranks,bytes,count,dtype,redop,algo,time_us,algbw_gbps,busbw_gbps,wrong%s\n",
                 o.out_of_place ? ",oop_time_us,oop_busbw_gbps" : "");
  }
  if (!print && (!o.csv.empty() || !o.plot.empty())) {
    std::fprintf(stderr, "[bench] rank %d: --csv and --plot are written by rank 0, which prints the "
                 "table\n", sessions[0]->rank());
  }
  std::vector<PlotPoint> points;

  Barrier barrier(local_ranks);
  uint64_t total_wrong = 0;
  double busbw_sum = 0;  // of the sizes that ran, for the summary line
  int busbw_rows = 0;
  const absl::Time start = absl::Now();
  for (size_t si = 0; si < sizes.size(); ++si) {
    const uint64_t bytes = sizes[si];
    const uint64_t count = bytes / unit;
    std::vector<Row> rows(local_ranks);
    std::vector<std::thread> threads;
    for (int r = 0; r < local_ranks; ++r) {
      threads.emplace_back([&, r] {
        Row& row = rows[r];
        client::Session& s = *sessions[r];
        const int rank = s.rank();
        client::CollectiveSpec spec;
        spec.kind = o.op;
        spec.buffer = o.op == CollectiveKind::kBarrier ? nullptr : buffers[r].get();
        spec.count = count;
        spec.dtype = o.dtype;
        spec.op = o.redop;
        spec.root = o.root;
        spec.algorithm = o.algo == "auto" ? "" : o.algo;
        spec.codec = o.codec;
        spec.name = absl::StrCat("bench.", CollectiveName(o.op), ".", bytes);
        spec.timeout = absl::Milliseconds(o.timeout_ms);
        char* data = static_cast<char*>(buffers[r]->data());
        // Ops go out back to back, at most kWindow unreported at a time (the
        // daemon keeps at most 4096 per session).
        constexpr int kWindow = 1024;
        // Out of place: the input lives in memory of its own (as a training
        // process's gradient tensor) and is copied into the op's buffer
        // before every op; gradsync's ops are in place.
        std::vector<char> send(o.out_of_place ? bytes : 0);
        auto run_batch = [&](int k, const char* copy_from = nullptr) -> absl::Status {
          std::deque<client::OpHandle> hs;
          for (int i = 0; i < k || !hs.empty();) {
            // Out of place, each copy waits for the op before it (the buffer is reused).
            if (i < k && static_cast<int>(hs.size()) < (copy_from != nullptr ? 1 : kWindow)) {
              if (copy_from != nullptr) std::memcpy(data, copy_from, bytes);
              auto h = s.SubmitAsync(spec);
              if (!h.ok()) return h.status();
              hs.push_back(*h);
              ++i;
              continue;
            }
            auto res = s.Wait(hs.front(), absl::Milliseconds(o.timeout_ms) + absl::Seconds(5));
            if (!res.ok()) return res.status();
            row.algo = res->algorithm;
            if (o.blocking) {
              row.queued_us.push_back(absl::ToDoubleMicroseconds(res->queued_time));
              row.run_us.push_back(absl::ToDoubleMicroseconds(res->run_time));
            }
            hs.pop_front();
          }
          return absl::OkStatus();
        };
        absl::Status st;
        if (o.check) {
          FillInput(o.op, o.dtype, rank, n, count, data);
          barrier.Wait();
          st = run_batch(1);
          if (st.ok()) {
            row.wrong = CountWrong(o.op, o.dtype, o.redop, o.root, rank, n, count, data, tolerance);
          }
          if (st.ok() && o.out_of_place) {  // the result of a copied input, over stale data
            FillInput(o.op, o.dtype, rank, n, count, data);
            std::memcpy(send.data(), data, bytes);
            std::memset(data, 0x5a, bytes);
            barrier.Wait();
            st = run_batch(1, send.data());
            if (st.ok()) {
              row.wrong +=
                  CountWrong(o.op, o.dtype, o.redop, o.root, rank, n, count, data, tolerance);
            }
          }
        }
        if (st.ok() && o.warmup > 0) {
          barrier.Wait();
          st = run_batch(o.warmup);
        }
        auto timed = [&](const char* copy_from, double& time_us, std::vector<double>& op_us) {
          if (o.blocking) {
            for (int i = 0; i < o.iters; ++i) {
              if (o.gap_us > 0) absl::SleepFor(absl::Microseconds(o.gap_us));
              barrier.Wait();  // every rank, even after a failure: the others wait here too
              const auto t0 = std::chrono::steady_clock::now();
              if (st.ok()) st = run_batch(1, copy_from);
              op_us.push_back(ElapsedMicros(t0));
            }
          } else {
            barrier.Wait();
            const auto t0 = std::chrono::steady_clock::now();
            if (st.ok()) st = run_batch(o.iters, copy_from);
            time_us = ElapsedMicros(t0) / o.iters;
          }
        };
        timed(nullptr, row.time_us, row.op_us);
        if (o.out_of_place) timed(send.data(), row.oop_time_us, row.oop_op_us);
        if (!st.ok()) row.error = std::string(st.message());
        barrier.Wait();
      });
    }
    for (auto& t : threads) t.join();
    Row agg = rows[0];
    if (o.blocking) {  // per iteration the slowest rank, then the median
      auto median_of_slowest = [&](std::vector<double> Row::*times) {
        std::vector<double> slowest(o.iters, 0);
        for (const Row& row : rows) {
          const std::vector<double>& t = row.*times;
          for (size_t i = 0; i < t.size() && i < slowest.size(); ++i) slowest[i] = std::max(slowest[i], t[i]);
        }
        std::sort(slowest.begin(), slowest.end());
        return slowest.empty() ? 0
               : slowest.size() % 2 ? slowest[slowest.size() / 2]
                                    : (slowest[slowest.size() / 2 - 1] + slowest[slowest.size() / 2]) / 2;
      };
      agg.time_us = median_of_slowest(&Row::op_us);
      agg.oop_time_us = median_of_slowest(&Row::oop_op_us);
      for (Row& row : rows) row.time_us = agg.time_us, row.oop_time_us = agg.oop_time_us;
      // Where the time went, as the daemons saw it (all ranks' ops pooled).
      std::vector<double> queued, run;
      for (const Row& row : rows) {
        queued.insert(queued.end(), row.queued_us.begin(), row.queued_us.end());
        run.insert(run.end(), row.run_us.begin(), row.run_us.end());
      }
      auto median = [](std::vector<double> v) {
        if (v.empty()) return 0.0;
        std::nth_element(v.begin(), v.begin() + v.size() / 2, v.end());
        return v[v.size() / 2];
      };
      agg.split = absl::StrFormat(
          "# %llu bytes: daemon-side medians over all ranks' ops: %.1f us queued (submission to "
          "start), %.1f us running",
          static_cast<unsigned long long>(bytes), median(queued), median(run));
    }
    for (const Row& row : rows) {
      agg.time_us = std::max(agg.time_us, row.time_us);
      agg.oop_time_us = std::max(agg.oop_time_us, row.oop_time_us);
      if (agg.error.empty()) agg.error = row.error;
      agg.wrong = std::max(agg.wrong, row.wrong);
    }
    for (const Row& row : rows) total_wrong += row.wrong;
    const double algbw = agg.time_us > 0 ? bytes / agg.time_us / 1e3 : 0;
    const double busbw = algbw * BusBandwidthFactor(o.op, n);
    const double oop_busbw =
        agg.oop_time_us > 0 ? bytes / agg.oop_time_us / 1e3 * BusBandwidthFactor(o.op, n) : 0;
    // The out-of-place columns: "" without --out_of_place.
    const std::string oop_cells =
        !o.out_of_place ? "" : !agg.error.empty() ? absl::StrFormat(" %12s %11s", "-", "-")
                                                  : absl::StrFormat(" %12.1f %11.3f", agg.oop_time_us, oop_busbw);
    if (agg.error.empty()) {
      busbw_sum += busbw;
      ++busbw_rows;
      points.push_back({bytes, busbw});
    }
    if (print && !agg.error.empty()) {  // no figures for a size that failed
      std::printf("%12llu %12llu %5s %6s %9s %12s %11s %11s%s %7s\n",
                  static_cast<unsigned long long>(bytes), static_cast<unsigned long long>(count),
                  DTypeName(o.dtype), ReduceOpName(o.redop), agg.algo.empty() ? "-" : agg.algo.c_str(),
                  "-", "-", "-", oop_cells.c_str(), "-");
    } else if (print) {
      std::printf("%12llu %12llu %5s %6s %9s %12.1f %11.3f %11.3f%s %7s\n",
                  static_cast<unsigned long long>(bytes), static_cast<unsigned long long>(count),
                  DTypeName(o.dtype), ReduceOpName(o.redop), agg.algo.empty() ? "-" : agg.algo.c_str(),
                  agg.time_us, algbw, busbw, oop_cells.c_str(),
                  o.check ? absl::StrCat(agg.wrong).c_str() : "-");
      if (csv != nullptr) {
        std::fprintf(csv, "%s,%d,%llu,%llu,%s,%s,%s,%.3f,%.6f,%.6f,%llu%s\n", CollectiveName(o.op), n,
                     static_cast<unsigned long long>(bytes), static_cast<unsigned long long>(count),
                     DTypeName(o.dtype), ReduceOpName(o.redop), agg.algo.c_str(), agg.time_us,
                     algbw, busbw, static_cast<unsigned long long>(agg.wrong),
                     o.out_of_place ? absl::StrFormat(",%.3f,%.6f", agg.oop_time_us, oop_busbw).c_str() : "");
      }
      if (!agg.split.empty()) std::printf("%s\n", agg.split.c_str());
      if (absl::Now() - start > absl::Seconds(2)) {
        std::fprintf(stderr, "[bench] %zu/%zu sizes done, %s elapsed\n", si + 1, sizes.size(),
                     absl::FormatDuration(absl::Trunc(absl::Now() - start, absl::Seconds(1))).c_str());
      }
      std::fflush(stdout);
    }
    if (!agg.error.empty()) {
      if (print) std::printf("# FAILED at %llu bytes: %s\n", static_cast<unsigned long long>(bytes), agg.error.c_str());
      if (csv != nullptr) std::fclose(csv);
      return absl::InternalError(agg.error);
    }
  }
  if (csv != nullptr) std::fclose(csv);
  if (print && !o.plot.empty()) {
    absl::Status plotted = WriteBusBandwidthPlot(
        o.plot,
        absl::StrFormat("gradsync bench: %s %s %s, %d ranks", CollectiveName(o.op), DTypeName(o.dtype),
                        ReduceOpName(o.redop), n),
        points, limits);
    if (!plotted.ok()) return plotted;
    std::printf("# plot: %s\n", o.plot.c_str());
  }
  for (auto& s : sessions) (void)s->Close();
  if (cluster != nullptr) {
    absl::Status stopped = cluster->StopAll();  // the daemons close their traces
    if (!stopped.ok()) std::printf("# %s\n", std::string(stopped.message()).c_str());
    if (o.timeline) {
      const std::string out = absl::StrCat(job, ".timeline.json");
      auto merged = MergeTimelines({cluster->work_dir() + "/timeline"}, out);
      if (!merged.ok()) return merged.status();
      std::printf("# timeline: %s (%d events, every rank its own row; ui.perfetto.dev)\n",
                  out.c_str(), merged->events);
    }
  } else if (o.timeline && print) {
    std::printf("# timeline: each rank's gradsyncd wrote <its --timeline_dir>/%s.epoch*.rank*.trace.json; "
                "gather them and run `gradsync timeline merge`\n", job.c_str());
  }
  if (o.check && print) std::printf("# %s: %llu wrong elements\n", total_wrong == 0 ? "OK" : "FAILED",
                                    static_cast<unsigned long long>(total_wrong));
  // nccl-tests' summary line, over the sizes of the table.
  if (print && busbw_rows > 0) std::printf("# Avg bus bandwidth    : %.3f\n", busbw_sum / busbw_rows);
  return total_wrong;
}

}  // namespace gradsync
