#include "cli/demo.h"

#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <condition_variable>
#include <cstdio>
#include <cstring>
#include <mutex>
#include <thread>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "cli/barrier.h"
#include "cli/expected.h"
#include "cli/local_cluster.h"
#include "client/client.h"
#include "common/types.h"

namespace gradsync {
namespace {

struct Case {
  DType dtype;
  ReduceOp op;
  uint64_t count;
  std::string algo = "";  // "" = the cost model's choice
};

// A reusable barrier for the rank threads.

std::string FormatBytes(uint64_t b) {
  if (b >= (1ull << 30) && b % (1ull << 30) == 0) return absl::StrCat(b >> 30, "G");
  if (b >= (1ull << 20) && b % (1ull << 20) == 0) return absl::StrCat(b >> 20, "M");
  if (b >= (1ull << 10) && b % (1ull << 10) == 0) return absl::StrCat(b >> 10, "K");
  return absl::StrCat(b);
}

std::mutex g_cluster_mu;
LocalCluster* g_cluster = nullptr;

void WatchStopSignals(sigset_t set) {
  int sig = 0;
  if (sigwait(&set, &sig) != 0) return;
  std::fprintf(stderr, "\ngradsync demo: %s, stopping the local cluster\n",
               sig == SIGINT ? "interrupted" : "terminated");
  // Exit while still holding the lock: the main thread, whose ops now fail,
  // must not get to report and return its own status first.
  std::lock_guard<std::mutex> l(g_cluster_mu);
  if (g_cluster != nullptr) {
    (void)g_cluster->StopAll(absl::Seconds(3));
  }
  std::fflush(stdout);
  _exit(128 + sig);
}

}  // namespace

absl::StatusOr<uint64_t> ParseBytes(absl::string_view s) {
  std::string t = absl::AsciiStrToLower(absl::StripAsciiWhitespace(s));
  uint64_t mult = 1;
  if (!t.empty() && t.back() == 'b') t.pop_back();
  if (!t.empty()) {
    switch (t.back()) {
      case 'k': mult = 1ull << 10; break;
      case 'm': mult = 1ull << 20; break;
      case 'g': mult = 1ull << 30; break;
      default: break;
    }
    if (mult != 1) t.pop_back();
  }
  uint64_t v = 0;
  if (!absl::SimpleAtoi(t, &v) || v > (1ull << 40) / mult) {
    return absl::InvalidArgumentError(
        absl::StrCat("bad size '", s, "' (expected a number with an optional K, M or G suffix)"));
  }
  return v * mult;
}

absl::StatusOr<int> RunDemo(const DemoOptions& o) {
  if (o.ranks < 1 || o.ranks > 64) {
    return absl::InvalidArgumentError(absl::StrCat("--ranks ", o.ranks, " out of range [1, 64]"));
  }
  if (o.iters < 1 || o.warmup < 0) {
    return absl::InvalidArgumentError("--iters must be >= 1 and --warmup >= 0");
  }
  // Cases: f32 sum over sizes up to max_bytes, an awkward count, then every
  // other dtype with a few reduce ops at 1 MiB.
  std::vector<Case> cases;
  for (uint64_t b = 4 << 10; b <= o.max_bytes; b *= 4) cases.push_back({DType::kF32, ReduceOp::kSum, b / 4});
  if (o.max_bytes >= (64ull << 20) && cases.back().count * 4 != o.max_bytes) {
    cases.push_back({DType::kF32, ReduceOp::kSum, o.max_bytes / 4});
  }
  const uint64_t mid = std::min<uint64_t>(o.max_bytes, 1 << 20);
  cases.push_back({DType::kF32, ReduceOp::kAvg, std::min<uint64_t>(1000003, o.max_bytes / 4)});
  cases.push_back({DType::kF64, ReduceOp::kSum, mid / 8});
  cases.push_back({DType::kF16, ReduceOp::kSum, mid / 2});
  cases.push_back({DType::kBF16, ReduceOp::kAvg, mid / 2});
  cases.push_back({DType::kI32, ReduceOp::kMax, mid / 4});
  cases.push_back({DType::kI64, ReduceOp::kMin, mid / 8});
  cases.push_back({DType::kU8, ReduceOp::kSum, mid});
  cases.push_back({DType::kF32, ReduceOp::kProd, 7});
  if (o.ps_shards > 0) {  // a parameter-server round through gradsync-ps shards
    cases.push_back({DType::kF32, ReduceOp::kSum, std::min<uint64_t>(o.max_bytes, 16 << 20) / 4, "ps"});
    cases.push_back({DType::kBF16, ReduceOp::kAvg, mid / 2, "ps"});
  }

  sigset_t stop;
  sigemptyset(&stop);
  sigaddset(&stop, SIGINT);
  sigaddset(&stop, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &stop, nullptr);
  std::thread(WatchStopSignals, stop).detach();

  LocalClusterOptions co;
  co.daemons = o.ranks;
  co.ps_shards = o.ps_shards;
  co.keep_logs = o.keep_logs;
  auto started = LocalCluster::Start(co);
  if (!started.ok()) return started.status();
  std::unique_ptr<LocalCluster> cluster = std::move(*started);
  {
    std::lock_guard<std::mutex> l(g_cluster_mu);
    g_cluster = cluster.get();
  }
  const std::string job = absl::StrCat("demo-", ::getpid());
  std::printf("gradsync demo: %d ranks on loopback (1 gradsync-coordinator at %s, %d gradsyncd, "
              "one client each), job '%s'\n", o.ranks, cluster->coordinator_address().c_str(),
              o.ranks, job.c_str());
  std::printf("  time = slowest rank, mean of %d iterations after %d warm-up; busbw = algbw * "
              "2(n-1)/n (nccl-tests); results checked element by element\n\n", o.iters, o.warmup);
  std::printf("%18s %10s %5s %6s %12s %12s %12s %6s %6s\n", "bytes", "count", "type", "redop",
              "time(us)", "algbw(GB/s)", "busbw(GB/s)", "algo", "check");
  std::fflush(stdout);

  const int n = o.ranks;
  uint64_t max_case_bytes = 0;
  for (const Case& c : cases) max_case_bytes = std::max(max_case_bytes, c.count * DTypeSize(c.dtype));
  Barrier barrier(n);
  std::vector<std::vector<double>> times(cases.size(), std::vector<double>(n, 0));
  std::vector<std::vector<std::string>> errors(cases.size(), std::vector<std::string>(n));
  std::vector<std::string> algos(cases.size());
  std::vector<std::string> setup_errors(n);
  int printed = 0;
  std::mutex print_mu;
  int failures = 0;
  auto print_row = [&](size_t ci) {
    const Case& c = cases[ci];
    const uint64_t bytes = c.count * DTypeSize(c.dtype);
    double t = *std::max_element(times[ci].begin(), times[ci].end());
    std::string err;
    for (int r = 0; r < n; ++r) {
      if (!errors[ci][r].empty() && err.empty()) err = absl::StrCat("rank ", r, ": ", errors[ci][r]);
    }
    const double algbw = t > 0 ? bytes / t / 1e3 : 0;  // bytes/us -> GB/s
    const double busbw = algbw * (n > 1 ? 2.0 * (n - 1) / n : 1.0);
    std::printf("%18s %10llu %5s %6s %12.1f %12.3f %12.3f %6s %6s\n",
                absl::StrCat(bytes, " (", FormatBytes(bytes), ")").c_str(),
                static_cast<unsigned long long>(c.count), DTypeName(c.dtype), ReduceOpName(c.op),
                t, algbw, busbw, algos[ci].empty() ? "-" : algos[ci].c_str(),
                err.empty() ? "OK" : "FAIL");
    if (!err.empty()) {
      std::printf("             %s\n", err.c_str());
      ++failures;
    }
    std::fflush(stdout);
  };

  std::vector<std::thread> threads;
  for (int r = 0; r < n; ++r) {
    threads.emplace_back([&, r] {
      std::unique_ptr<client::Client> cl;
      std::unique_ptr<client::Session> session;
      std::unique_ptr<client::Buffer> buf;
      auto setup = [&]() -> absl::Status {
        auto c = client::Client::Connect(cluster->daemon_target(r), absl::Seconds(10));
        if (!c.ok()) return c.status();
        cl = std::move(*c);
        client::SessionOptions so;
        so.job_id = job;
        so.world_size = n;
        so.rank = r;
        so.timeout = absl::Seconds(30);
        so.op_timeout_ms = o.timeout_ms;
        so.client_name = absl::StrCat("demo-rank", r);
        so.ps_shards = o.ps_shards;
        auto s = cl->OpenSession(so);
        if (!s.ok()) return s.status();
        session = std::move(*s);
        auto b = session->AllocateBuffer(max_case_bytes);
        if (!b.ok()) return b.status();
        buf = std::move(*b);
        return absl::OkStatus();
      };
      absl::Status st = setup();
      if (!st.ok()) setup_errors[r] = std::string(st.message());
      barrier.Wait();
      bool any_setup_error = false;
      for (const auto& e : setup_errors) any_setup_error |= !e.empty();
      if (any_setup_error) return;
      for (size_t ci = 0; ci < cases.size(); ++ci) {
        const Case& c = cases[ci];
        char* data = static_cast<char*>(buf->data());
        double total_us = 0;
        for (int it = 0; it < o.warmup + o.iters && errors[ci][r].empty(); ++it) {
          FillInput(CollectiveKind::kAllreduce, c.dtype, r, n, c.count, data);
          barrier.Wait();
          const absl::Time t0 = absl::Now();
          client::CollectiveSpec spec;
          spec.buffer = buf.get();
          spec.count = c.count;
          spec.dtype = c.dtype;
          spec.op = c.op;
          spec.algorithm = c.algo;
          spec.name = absl::StrCat("demo.", DTypeName(c.dtype), ".", c.count);
          spec.timeout = absl::Milliseconds(o.timeout_ms);
          auto res = session->Run(spec);
          const double us = absl::ToDoubleMicroseconds(absl::Now() - t0);
          if (!res.ok()) {
            errors[ci][r] = std::string(res.status().message());
            break;
          }
          if (r == 0) algos[ci] = res->algorithm;
          if (it >= o.warmup) total_us += us;
        }
        times[ci][r] = total_us / o.iters;
        if (errors[ci][r].empty()) {
          const uint64_t wrong =
              CountWrong(CollectiveKind::kAllreduce, c.dtype, c.op, 0, r, n, c.count, data);
          if (wrong > 0) {
            errors[ci][r] = absl::StrCat(wrong, " elements differ from the reference");
          }
        }
        barrier.Wait();  // every rank finished and checked this case
        if (r == 0) {
          std::lock_guard<std::mutex> l(print_mu);
          print_row(ci);
          ++printed;
        }
        // A failed op breaks the job's epoch: stop after the first failure.
        barrier.Wait();
        bool failed = false;
        for (int q = 0; q < n; ++q) failed |= !errors[ci][q].empty();
        if (failed) return;
      }
      (void)session->Close();
    });
  }
  for (auto& t : threads) t.join();
  for (int r = 0; r < n; ++r) {
    if (!setup_errors[r].empty()) {
      std::printf("rank %d could not start: %s\n", r, setup_errors[r].c_str());
      ++failures;
    }
  }
  if (printed < static_cast<int>(cases.size()) && failures == 0) ++failures;
  absl::Status stopped;
  {
    std::lock_guard<std::mutex> l(g_cluster_mu);
    stopped = cluster->StopAll();
    if (failures > 0) cluster->KeepLogs();
    g_cluster = nullptr;
  }
  const std::string work_dir = cluster->work_dir();
  cluster.reset();
  if (!stopped.ok()) {
    std::printf("\n%s\n", std::string(stopped.message()).c_str());
    ++failures;
  }
  std::printf("\n%s: %zu of %zu checks passed%s\n", failures == 0 ? "OK" : "FAILED",
              static_cast<size_t>(printed) - std::min<size_t>(printed, failures), cases.size(),
              failures == 0 ? "" : absl::StrCat("; logs kept in ", work_dir).c_str());
  return failures;
}

}  // namespace gradsync
