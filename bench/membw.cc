// gradsync-membw: single-thread memory bandwidth, the ceiling of any CPU
// reduction in the ring.
//
// For each size B (one thread, buffers allocated and touched before timing):
//   * add_f32: one pass of a[i] += b[i] over B bytes of f32 (a and b are B bytes
//     each). It moves 3*B bytes (read a, read b, write a); gbps = 3*B / time.
//     This is the shape of the ring's reduce step (dst = dst OP src). The loop is
//     compiled for AVX2 when the CPU has it (as kernels/cpu_reduce.cc is), else
//     for the baseline ISA.
//   * memcpy: one std::memcpy of B bytes; it moves 2*B bytes (read + write);
//     gbps = 2*B / time.
// Small buffers live in cache, so a timed sample repeats the pass enough times
// to move at least --min_sample_bytes; time_us is per pass (mean over --iters
// samples, after --warmup untimed ones).
//
// Output, one line per size and op:
//   membw,op=add_f32,bytes=67108864,time_us=12000.00,gbps=16.7772
//   membw,op=memcpy,bytes=67108864,time_us=9000.00,gbps=14.9131
// plus human-readable lines starting with "# ".

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/strings/str_cat.h"
#include "bench/bench_util.h"
#include "common/build_info.h"

ABSL_FLAG(std::string, sizes, "", "comma-separated buffer sizes, e.g. 4K,1M,64M (overrides min/max)");
ABSL_FLAG(std::string, min_bytes, "4K", "smallest buffer (K/M/G suffixes)");
ABSL_FLAG(std::string, max_bytes, "64M", "largest buffer (K/M/G suffixes)");
ABSL_FLAG(int64_t, step_factor, 4, "size multiplier from one buffer size to the next");
ABSL_FLAG(int32_t, iters, 10, "timed samples per size");
ABSL_FLAG(int32_t, warmup, 2, "untimed samples per size");
ABSL_FLAG(std::string, min_sample_bytes, "1M",
          "a timed sample repeats the pass until it has touched at least this many bytes of B");
ABSL_FLAG(std::string, ops, "add_f32,memcpy", "which measurements: add_f32, memcpy");

namespace gradsync {
namespace bench {
namespace {

// a[i] += b[i]. Not inlined, so repeated passes are not merged.
__attribute__((noinline, target("avx2"))) void AddF32Avx2(float* __restrict a,
                                                         const float* __restrict b, size_t n) {
  for (size_t i = 0; i < n; ++i) a[i] += b[i];
}
__attribute__((noinline)) void AddF32Base(float* __restrict a, const float* __restrict b,
                                          size_t n) {
  for (size_t i = 0; i < n; ++i) a[i] += b[i];
}

using AddFn = void (*)(float*, const float*, size_t);

AddFn PickAdd(const char** name) {
  __builtin_cpu_init();
  if (__builtin_cpu_supports("avx2")) {
    *name = "avx2";
    return AddF32Avx2;
  }
  *name = "baseline";
  return AddF32Base;
}

void* AllocTouched(size_t bytes, int fill) {
  const size_t rounded = (bytes + 63) / 64 * 64;
  void* p = std::aligned_alloc(64, rounded == 0 ? 64 : rounded);
  if (p == nullptr) {
    std::fprintf(stderr, "gradsync-membw: cannot allocate %zu bytes\n", bytes);
    std::exit(1);
  }
  std::memset(p, fill, rounded);
  return p;
}

template <typename Fn>
TimeStats Measure(int warmup, int iters, int reps, Fn&& pass) {
  std::vector<double> t;
  for (int it = 0; it < warmup + iters; ++it) {
    const auto t0 = std::chrono::steady_clock::now();
    for (int r = 0; r < reps; ++r) {
      pass();
      asm volatile("" ::: "memory");
    }
    const auto t1 = std::chrono::steady_clock::now();
    if (it >= warmup) t.push_back(std::chrono::duration<double>(t1 - t0).count() / reps);
  }
  return Summarize(t);
}

void Print(const char* op, uint64_t bytes, uint64_t moved, const TimeStats& st) {
  const double gbps = AlgBwGBps(moved, st.mean_s);
  std::printf("%s\n", ResultLine("membw", {{"op", op},
                                           {"bytes", absl::StrCat(bytes)},
                                           {"time_us", FormatUs(st.mean_s)},
                                           {"gbps", FormatGBps(gbps)}})
                          .c_str());
  std::printf("# membw %-8s %10s: %11.3f us/pass (median %.3f, min %.3f, max %.3f)  %8.3f GB/s\n",
              op, FormatBytes(bytes).c_str(), st.mean_s * 1e6, st.median_s * 1e6, st.min_s * 1e6,
              st.max_s * 1e6, gbps);
  std::fflush(stdout);
}

int Main() {
  SizeSpec spec;
  spec.sizes = absl::GetFlag(FLAGS_sizes);
  spec.min_bytes = absl::GetFlag(FLAGS_min_bytes);
  spec.max_bytes = absl::GetFlag(FLAGS_max_bytes);
  spec.step_factor = absl::GetFlag(FLAGS_step_factor);
  auto sizes = MessageSizes(spec);
  auto min_sample = ParseBytes(absl::GetFlag(FLAGS_min_sample_bytes));
  const int iters = absl::GetFlag(FLAGS_iters), warmup = absl::GetFlag(FLAGS_warmup);
  if (!sizes.ok() || !min_sample.ok() || iters < 1 || warmup < 0) {
    std::fprintf(stderr, "gradsync-membw: %s\n",
                 !sizes.ok() ? std::string(sizes.status().message()).c_str()
                 : !min_sample.ok() ? std::string(min_sample.status().message()).c_str()
                                    : "--iters must be >= 1 and --warmup >= 0");
    return 2;
  }
  const std::string ops = absl::GetFlag(FLAGS_ops);
  const bool do_add = ops.find("add_f32") != std::string::npos;
  const bool do_copy = ops.find("memcpy") != std::string::npos;
  if (!do_add && !do_copy) {
    std::fprintf(stderr, "gradsync-membw: --ops must name add_f32 and/or memcpy\n");
    return 2;
  }
  const char* isa = "";
  const AddFn add = PickAdd(&isa);
  const uint64_t max_bytes = sizes->back();
  char* a = static_cast<char*>(AllocTouched(max_bytes, 0));
  char* b = static_cast<char*>(AllocTouched(max_bytes, 0));
  {
    // b = 1.0f everywhere, a = 0: sums stay small, finite and normal.
    float* bf = reinterpret_cast<float*>(b);
    for (uint64_t i = 0; i < max_bytes / sizeof(float); ++i) bf[i] = 1.0f;
  }
  std::printf("# membw: single thread, add_f32 = one pass of a += b (%s), counts 3*B bytes; "
              "memcpy counts 2*B bytes; %d samples + %d warmup, >= %s per sample\n",
              isa, iters, warmup, FormatBytes(*min_sample).c_str());
  std::fflush(stdout);
  for (uint64_t bytes : *sizes) {
    const int reps = static_cast<int>(std::max<uint64_t>(1, (*min_sample + bytes - 1) / bytes));
    if (do_add) {
      const size_t n = bytes / sizeof(float);
      float* af = reinterpret_cast<float*>(a);
      const float* bf = reinterpret_cast<const float*>(b);
      std::fill(af, af + n, 0.0f);
      const TimeStats st = Measure(warmup, iters, reps, [&] { add(af, bf, n); });
      Print("add_f32", n * sizeof(float), 3 * n * sizeof(float), st);
    }
    if (do_copy) {
      const TimeStats st = Measure(warmup, iters, reps, [&] { std::memcpy(a, b, bytes); });
      Print("memcpy", bytes, 2 * bytes, st);
    }
  }
  std::free(a);
  std::free(b);
  return 0;
}

}  // namespace
}  // namespace bench
}  // namespace gradsync

int main(int argc, char** argv) {
  gradsync::InitFlagsUsage("gradsync-membw", 
      "gradsync-membw [--min_bytes 4K --max_bytes 64M --step_factor 4 | --sizes 4K,64M] "
      "[--iters I --warmup W]\n"
      "Single-thread memory bandwidth: `membw,op=add_f32|memcpy,bytes=B,time_us=T,gbps=G`.", __FILE__);
  std::vector<char*> rest = absl::ParseCommandLine(argc, argv);
  if (rest.size() > 1) {
    std::fprintf(stderr, "gradsync-membw: unexpected argument '%s'\n", rest[1]);
    return 2;
  }
  return gradsync::bench::Main();
}
