// Throughput of the CPU reduction kernels against two baselines, at buffer
// sizes from L1-resident to DRAM-bound.
//
//   bazel run -c opt //kernels:cpu_reduce_benchmark -- --benchmark_min_time=0.05
//
// Sizes (the benchmark argument) are bytes per buffer. bytes_per_second counts
// memory traffic as the program sees it:
//   * ReduceInto (dst = dst OP src): dst read + src read + dst write = 3 x size;
//   * memcpy: src read + dst write = 2 x size.
// Dividing a reduction's bytes_per_second by memcpy's at the same size gives
// how close the kernel runs to the machine's copy bandwidth (write-allocate
// traffic is not counted for either).
//
// Baselines: memcpy, and a plain scalar `a[i] += b[i]` f32 loop compiled with
// the vectorizer off -- what an unvectorized kernel would achieve. The
// "portable" rows force the baseline-ISA kernels (SSE2 on x86-64).
#include <benchmark/benchmark.h>

#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "common/fp8.h"
#include "common/types.h"
#include "kernels/cpu_reduce.h"

namespace gradsync {
namespace {

constexpr int64_t kSizes[] = {4 << 10, 256 << 10, 4 << 20, 64 << 20};

// Small values of both signs: sums stay finite and far from subnormals over
// millions of iterations.
std::vector<uint8_t> MakeData(DType t, size_t n, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
  const size_t sz = DTypeSize(t);
  std::vector<uint8_t> v(n * sz);
  for (size_t i = 0; i < n; ++i) {
    const float f = dist(rng);
    uint8_t* p = &v[i * sz];
    switch (t) {
      case DType::kF32: std::memcpy(p, &f, 4); break;
      case DType::kF64: {
        const double d = f;
        std::memcpy(p, &d, 8);
        break;
      }
      case DType::kF16: {
        const uint16_t h = FloatToHalf(f);
        std::memcpy(p, &h, 2);
        break;
      }
      case DType::kBF16: {
        const uint16_t b = FloatToBFloat16(f);
        std::memcpy(p, &b, 2);
        break;
      }
      case DType::kI32: {
        const int32_t x = static_cast<int32_t>(f * 1000);
        std::memcpy(p, &x, 4);
        break;
      }
      case DType::kI64: {
        const int64_t x = static_cast<int64_t>(f * 1000);
        std::memcpy(p, &x, 8);
        break;
      }
      case DType::kU8: *p = static_cast<uint8_t>(rng()); break;
      case DType::kF8E4M3: *p = FloatToFp8E4M3(f); break;
      case DType::kF8E5M2: *p = FloatToFp8E5M2(f); break;
    }
  }
  return v;
}

void BM_ReduceInto(benchmark::State& state, DType t, ReduceOp op, bool portable) {
  const size_t bytes = static_cast<size_t>(state.range(0));
  const size_t n = bytes / DTypeSize(t);
  std::vector<uint8_t> dst = MakeData(t, n, 1);
  const std::vector<uint8_t> src = MakeData(t, n, 2);
  for (auto _ : state) {
    if (portable) {
      internal::ReduceIntoWith(internal::Isa::kPortable, t, op, dst.data(), src.data(), n);
    } else {
      ReduceInto(t, op, dst.data(), src.data(), n);
    }
    benchmark::ClobberMemory();
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations()) * 3 * bytes);
  state.SetLabel(portable ? internal::IsaName(internal::Isa::kPortable)
                          : internal::IsaName(internal::ActiveIsa()));
}

void BM_Memcpy(benchmark::State& state) {
  const size_t bytes = static_cast<size_t>(state.range(0));
  std::vector<uint8_t> dst(bytes, 1);
  const std::vector<uint8_t> src(bytes, 2);
  for (auto _ : state) {
    std::memcpy(dst.data(), src.data(), bytes);
    benchmark::ClobberMemory();
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations()) * 2 * bytes);
}

// The unvectorized baseline: one element per instruction.
__attribute__((noinline, optimize("no-tree-vectorize"))) void ScalarAdd(float* a, const float* b,
                                                                        size_t n) {
  for (size_t i = 0; i < n; ++i) a[i] += b[i];
}

void BM_ScalarF32Add(benchmark::State& state) {
  const size_t bytes = static_cast<size_t>(state.range(0));
  const size_t n = bytes / sizeof(float);
  std::vector<uint8_t> dst = MakeData(DType::kF32, n, 1);
  const std::vector<uint8_t> src = MakeData(DType::kF32, n, 2);
  for (auto _ : state) {
    ScalarAdd(reinterpret_cast<float*>(dst.data()), reinterpret_cast<const float*>(src.data()), n);
    benchmark::ClobberMemory();
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations()) * 3 * bytes);
}

void Apply(benchmark::internal::Benchmark* b) {
  for (int64_t size : kSizes) b->Arg(size);
}

int RegisterAll() {
  Apply(benchmark::RegisterBenchmark("memcpy", BM_Memcpy));
  Apply(benchmark::RegisterBenchmark("scalar_f32_add", BM_ScalarF32Add));
  struct Case {
    DType t;
    ReduceOp op;
    bool portable;
  };
  const Case cases[] = {
      {DType::kF32, ReduceOp::kSum, false}, {DType::kBF16, ReduceOp::kSum, false},
      {DType::kF16, ReduceOp::kSum, false}, {DType::kF64, ReduceOp::kSum, false},
      {DType::kI32, ReduceOp::kSum, false}, {DType::kF32, ReduceOp::kMax, false},
      {DType::kF32, ReduceOp::kSum, true},  {DType::kBF16, ReduceOp::kSum, true},
      {DType::kF16, ReduceOp::kSum, true},  {DType::kF8E4M3, ReduceOp::kSum, false},
  };
  for (const Case& c : cases) {
    const std::string name = std::string("ReduceInto/") + DTypeName(c.t) + "_" +
                             ReduceOpName(c.op) + (c.portable ? "_portable" : "");
    Apply(benchmark::RegisterBenchmark(name.c_str(), BM_ReduceInto, c.t, c.op, c.portable));
  }
  return 0;
}

const int registered = RegisterAll();

}  // namespace
}  // namespace gradsync

BENCHMARK_MAIN();
