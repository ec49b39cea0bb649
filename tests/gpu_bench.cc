// The GPU figures of scripts/gpu-check.sh, measured in one run on one GPU:
//   1. reduce kernel (dst OP= src) GB/s next to cudaMemcpy device-to-device
//      GB/s, both counting bytes read + written (reduce 3 x n, copy 2 x n);
//   2. the daemon's staging (DeviceMemory::StageIn + StageOut, what every op
//      on a device buffer pays over TCP) next to a plain pinned cudaMemcpy
//      device-to-host + host-to-device of the same bytes;
//   3. a 4-rank allreduce of device buffers on a local cluster (4 gradsyncd
//      on this GPU, TCP over loopback): busbw = 2(n-1)/n x bytes / time,
//      next to the same allreduce of host buffers.
// bazel run --config=cuda //tests:gpu_bench [-- --iters=20 --ranks=4]
#include <algorithm>
#include <cstdio>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "cli/local_cluster.h"
#include "cuda/cuda_memory.h"
#include "cuda/cuda_reduce.h"
#include "tests/cluster_util.h"
#include "worker/device_memory.h"

ABSL_FLAG(int, iters, 20, "timed repetitions of each measurement (after 3 warm-ups)");
ABSL_FLAG(int, ranks, 4, "ranks (daemons) of the device-buffer allreduce");
ABSL_FLAG(int, allreduce_mib, 64, "MiB per rank of the allreduce");

namespace gradsync {
namespace {

#define CHECK_OK(expr)                                                           \
  do {                                                                           \
    const absl::Status _s = (expr);                                              \
    if (!_s.ok()) {                                                              \
      std::fprintf(stderr, "%s:%d: %s\n", __FILE__, __LINE__, _s.ToString().c_str()); \
      std::exit(1);                                                              \
    }                                                                            \
  } while (0)

template <class T>
T Must(absl::StatusOr<T> v) {
  CHECK_OK(v.status());
  return *std::move(v);
}

constexpr size_t kMiB = 1 << 20;

// Milliseconds per call of `body` on `stream`, timed with events.
template <class F>
double TimeMs(void* stream, int iters, F body) {
  for (int i = 0; i < 3; ++i) CHECK_OK(body());
  cuda::StreamTimer t = Must(cuda::StreamTimer::Create());
  CHECK_OK(t.Start(stream));
  for (int i = 0; i < iters; ++i) CHECK_OK(body());
  CHECK_OK(t.Stop(stream));
  return Must(t.ElapsedMs()) / iters;
}

double GBps(double bytes, double ms) { return bytes / (ms * 1e6); }

void KernelTable(int iters) {
  std::printf("\n## Reduce kernel vs cudaMemcpy device-to-device (bytes read + written)\n\n");
  std::printf("| dtype | op | size | reduce GB/s | memcpy D2D GB/s | reduce / memcpy |\n");
  std::printf("|---|---|---|---|---|---|\n");
  cuda::Stream stream = Must(cuda::Stream::Create());
  struct Row {
    DType dtype;
    ReduceOp op;
    size_t bytes;
  };
  std::vector<Row> rows;
  for (size_t mib : {1, 16, 64, 256, 1024}) rows.push_back({DType::kF32, ReduceOp::kSum, mib * kMiB});
  for (DType t : {DType::kF64, DType::kF16, DType::kBF16, DType::kF8E4M3, DType::kF8E5M2, DType::kI32}) {
    rows.push_back({t, ReduceOp::kSum, 256 * kMiB});
  }
  for (ReduceOp op : {ReduceOp::kMax, ReduceOp::kProd}) rows.push_back({DType::kF32, op, 256 * kMiB});
  for (const Row& r : rows) {
    cuda::DeviceBuffer a = Must(cuda::DeviceBuffer::Allocate(r.bytes));
    cuda::DeviceBuffer b = Must(cuda::DeviceBuffer::Allocate(r.bytes));
    CHECK_OK(a.Fill(0));
    CHECK_OK(b.Fill(0));
    const size_t count = r.bytes / DTypeSize(r.dtype);
    const double reduce_ms = TimeMs(stream.get(), iters, [&] {
      return cuda::CudaReduceInto(r.dtype, r.op, a.data(), b.data(), count, stream.get());
    });
    const double copy_ms = TimeMs(stream.get(), iters, [&] {
      return cuda::CopyAsync(a.data(), b.data(), r.bytes, stream.get());
    });
    const double red = GBps(3.0 * r.bytes, reduce_ms), cpy = GBps(2.0 * r.bytes, copy_ms);
    std::printf("| %s | %s | %zu MiB | %.0f | %.0f | %.0f%% |\n", DTypeName(r.dtype), ReduceOpName(r.op),
                r.bytes / kMiB, red, cpy, 100.0 * red / cpy);
  }
}

void StagingTable(const std::string& uuid, int iters) {
  std::printf("\n## Staging a device buffer (device -> host twin -> device) vs pinned cudaMemcpy\n\n");
  std::printf("| size | daemon staging GB/s | pinned memcpy D2H+H2D GB/s | staging / pinned |\n");
  std::printf("|---|---|---|---|\n");
  cuda::Stream stream = Must(cuda::Stream::Create());
  for (size_t mib : {4, 64, 256}) {
    const size_t bytes = mib * kMiB;
    std::shared_ptr<DeviceMemory> dev = Must(DeviceMemory::Allocate(uuid, bytes));
    for (int i = 0; i < 3; ++i) {
      CHECK_OK(dev->StageIn(0, bytes));
      CHECK_OK(dev->StageOut(0, bytes));
    }
    const absl::Time t0 = absl::Now();
    for (int i = 0; i < iters; ++i) {
      CHECK_OK(dev->StageIn(0, bytes));
      CHECK_OK(dev->StageOut(0, bytes));
    }
    const double staging_ms = absl::ToDoubleMilliseconds(absl::Now() - t0) / iters;
    cuda::DeviceBuffer d = Must(cuda::DeviceBuffer::Allocate(bytes));
    cuda::PinnedHost h = Must(cuda::PinnedHost::Allocate(bytes));
    const double pinned_ms = TimeMs(stream.get(), iters, [&] {
      absl::Status s = cuda::CopyAsync(h.data(), d.data(), bytes, stream.get());
      return s.ok() ? cuda::CopyAsync(d.data(), h.data(), bytes, stream.get()) : s;
    });
    const double st = GBps(2.0 * bytes, staging_ms), pn = GBps(2.0 * bytes, pinned_ms);
    std::printf("| %zu MiB | %.1f | %.1f | %.0f%% |\n", mib, st, pn, 100.0 * st / pn);
  }
}

// Seconds per allreduce of `bytes` per rank, device or host buffers.
double AllreduceSeconds(LocalCluster& cluster, int ranks, size_t bytes, bool device, int iters) {
  const std::string job = device ? "bench-device" : "bench-host";
  auto handles = Must(testing::OpenJob(cluster, job, testing::FirstN(ranks), 120000));
  std::vector<std::unique_ptr<client::Buffer>> bufs(ranks);
  for (int r = 0; r < ranks; ++r) {
    bufs[r] = Must(device ? handles[r].session->AllocateDeviceBuffer(bytes, 0)
                          : handles[r].session->AllocateBuffer(bytes));
  }
  const size_t count = bytes / 4;
  auto round = [&](int n) {
    testing::OnEveryRank(ranks, [&](int r) {
      for (int i = 0; i < n; ++i) {
        CHECK_OK(handles[r].session->Run(testing::AllreduceSpec(bufs[r].get(), count, "g")).status());
      }
    });
  };
  round(2);
  const absl::Time t0 = absl::Now();
  round(iters);
  return absl::ToDoubleSeconds(absl::Now() - t0) / iters;
}

void AllreduceTable(int ranks, size_t bytes, int iters) {
  std::printf("\n## %d-rank allreduce, f32 sum, %zu MiB per rank (local cluster, TCP loopback)\n\n",
              ranks, bytes / kMiB);
  std::printf("| buffers | time per op | busbw GB/s |\n|---|---|---|\n");
  // Device buffers in place (staged per message, reduced on the GPU) and on
  // host twins (whole-range copies around a host op), then host buffers.
  for (const char* mode : {"in_place", "host_twin"}) {
    auto cluster = testing::StartCluster(ranks, {absl::StrCat("--device_ops=", mode)});
    if (cluster == nullptr) std::exit(1);
    for (bool device : {true, false}) {
      if (!device && std::string(mode) != "in_place") continue;
      const double s = AllreduceSeconds(*cluster, ranks, bytes, device, iters);
      const double busbw = 2.0 * (ranks - 1) / ranks * bytes / s / 1e9;
      std::printf("| %s | %.1f ms | %.2f |\n",
                  device ? absl::StrCat("device (cuda:0), ", mode).c_str() : "host", s * 1e3,
                  busbw);
    }
    CHECK_OK(cluster->StopAll());
  }
}

}  // namespace
}  // namespace gradsync

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  std::setvbuf(stdout, nullptr, _IOLBF, 0);  // every line out before a crash
  using namespace gradsync;
  // The bench's own streams and buffers share the context with its device
  // buffers; a reset when the last of those goes would destroy them.
  GpuContexts::Process().set_reset_when_unused(false);
  auto devices = cuda::ListCudaDevices();
  if (!devices.ok()) {
    std::printf("gpu_bench: no GPU: %s\n", std::string(devices.status().message()).c_str());
    return 2;
  }
  for (const auto& d : *devices) {
    std::printf("GPU %d: %s, %.0f GiB, compute capability %d.%d\n", d.index, d.name.c_str(),
                d.total_memory / double(1ull << 30), d.cc_major, d.cc_minor);
  }
  CHECK_OK(cuda::SetDevice(0));
  const std::string uuid = Must(cuda::DeviceUuid(0));
  const int iters = absl::GetFlag(FLAGS_iters);
  KernelTable(iters);
  StagingTable(uuid, iters);
  AllreduceTable(absl::GetFlag(FLAGS_ranks), absl::GetFlag(FLAGS_allreduce_mib) * kMiB,
                 std::max(3, iters / 4));
  return 0;
}
