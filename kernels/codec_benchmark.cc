// Throughput of the wire codecs (kernels/codec.h) on one core, against
// memcpy of the same f32 bytes.
//
//   bazel run -c opt //kernels:codec_benchmark -- --benchmark_min_time=0.1
//
// bytes_per_second counts the f32 bytes a call covers (the input of Encode,
// the output of DecodeAdd); memcpy's counts the bytes copied. The codecs'
// target: one Encode plus one DecodeAdd at no less than half of memcpy's
// rate ("EncodeDecodeAdd" rows; docs/performance.md).
#include <benchmark/benchmark.h>

#include <cstring>
#include <random>
#include <vector>

#include "kernels/codec.h"

namespace gradsync {
namespace {

std::vector<float> Gradients(size_t n) {
  std::mt19937 rng(1);
  std::normal_distribution<float> dist(0.0f, 0.01f);
  std::vector<float> v(n);
  for (float& x : v) x = dist(rng);
  return v;
}

void BM_Memcpy(benchmark::State& state) {
  const size_t n = static_cast<size_t>(state.range(0)) / sizeof(float);
  std::vector<float> in = Gradients(n), out(n);
  for (auto _ : state) {
    std::memcpy(out.data(), in.data(), n * sizeof(float));
    benchmark::DoNotOptimize(out.data());
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations()) * n * sizeof(float));
}

template <int kWhat>  // 0: Encode, 1: DecodeAdd, 2: both
void BM_Codec(benchmark::State& state) {
  const Codec& c = *CodecFor(static_cast<CodecId>(state.range(1)));
  const size_t n = static_cast<size_t>(state.range(0)) / sizeof(float);
  std::vector<float> in = Gradients(n), acc(n, 0.0f);
  std::vector<char> enc(c.EncodedBytes(n));
  c.Encode(in.data(), n, enc.data());
  for (auto _ : state) {
    if (kWhat != 1) c.Encode(in.data(), n, enc.data());
    if (kWhat != 0) c.DecodeAdd(enc.data(), n, acc.data());
    benchmark::DoNotOptimize(enc.data());
    benchmark::DoNotOptimize(acc.data());
  }
  state.SetLabel(c.name());
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations()) * n * sizeof(float));
}

void Args(benchmark::internal::Benchmark* b) {
  for (int64_t size : {int64_t{4} << 20, int64_t{64} << 20}) {
    for (CodecId id : kAllCodecs) {
      if (id != CodecId::kNone) b->Args({size, static_cast<int64_t>(id)});
    }
  }
}

BENCHMARK(BM_Memcpy)->Arg(4 << 20)->Arg(64 << 20);
BENCHMARK_TEMPLATE(BM_Codec, 0)->Name("Encode")->Apply(Args);
BENCHMARK_TEMPLATE(BM_Codec, 1)->Name("DecodeAdd")->Apply(Args);
BENCHMARK_TEMPLATE(BM_Codec, 2)->Name("EncodeDecodeAdd")->Apply(Args);

}  // namespace
}  // namespace gradsync

BENCHMARK_MAIN();
