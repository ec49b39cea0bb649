// Device buffers end to end: CUDA memory the daemon allocates (the client
// opens its IPC handle) or the client's own cudaMalloc memory (the daemon
// opens it), in collectives across daemons, results bit-exact against the
// reference reduction. Where this process has no usable GPU the GPU cases
// skip with the reason (GRADSYNC_REQUIRE_CUDA=1 makes them fail), and the
// no-GPU case checks that every path says why and the daemon keeps serving.
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "cli/local_cluster.h"
#include "collective/reference.h"
#include "cuda/cuda_memory.h"
#include "cuda/cuda_reduce.h"
#include "gtest/gtest.h"
#include "kernels/codec.h"
#include <grpcpp/create_channel.h>

#include "proto/worker.grpc.pb.h"
#include "tests/cluster_util.h"

namespace gradsync {
namespace {

bool RequireCuda() {
  const char* v = std::getenv("GRADSYNC_REQUIRE_CUDA");
  return v != nullptr && std::string(v) == "1";
}

// Skips (or, with GRADSYNC_REQUIRE_CUDA=1, fails) a test that needs a GPU.
#define GPU_OR_SKIP()                                                                   \
  do {                                                                                  \
    const absl::Status usable = cuda::CudaUsable();                                     \
    if (!usable.ok()) {                                                                 \
      if (RequireCuda()) FAIL() << "GRADSYNC_REQUIRE_CUDA=1: " << usable.message();     \
      GTEST_SKIP() << "no usable GPU: " << usable.message();                            \
    }                                                                                   \
  } while (0)

// The test process fills and reads device buffers itself, through pinned
// host memory.
absl::Status ToDevice(void* dst, const std::vector<char>& src) {
  auto pinned = cuda::PinnedHost::Allocate(src.size());
  if (!pinned.ok()) return pinned.status();
  std::memcpy(pinned->data(), src.data(), src.size());
  absl::Status s = cuda::CopyAsync(dst, pinned->data(), src.size(), nullptr);
  return s.ok() ? cuda::CudaSynchronize(nullptr) : s;
}

absl::StatusOr<std::vector<char>> FromDevice(const void* src, size_t bytes) {
  auto pinned = cuda::PinnedHost::Allocate(bytes);
  if (!pinned.ok()) return pinned.status();
  absl::Status s = cuda::CopyAsync(pinned->data(), src, bytes, nullptr);
  if (s.ok()) s = cuda::CudaSynchronize(nullptr);
  if (!s.ok()) return s;
  return std::vector<char>(pinned->data(), pinned->data() + bytes);
}

TEST(DeviceBuffers, WithoutAGpuEveryPathSaysWhyAndTheDaemonKeepsServing) {
  if (cuda::CudaUsable().ok()) GTEST_SKIP() << "this process has a GPU; the GPU cases cover it";
  auto cluster = testing::StartCluster(1);
  ASSERT_NE(cluster, nullptr);
  auto ranks = testing::OpenJob(*cluster, "no-gpu", {0});
  ASSERT_TRUE(ranks.ok()) << ranks.status();
  client::Session& session = *(*ranks)[0].session;
  const std::string why = std::string(cuda::CudaUsable().message());

  auto allocated = session.AllocateDeviceBuffer(4096, 0);
  ASSERT_FALSE(allocated.ok());
  EXPECT_EQ(allocated.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_TRUE(absl::StrContains(allocated.status().message(),
                                "AllocateDeviceBuffer: device buffers need CUDA in this process"))
      << allocated.status();
  EXPECT_TRUE(absl::StrContains(allocated.status().message(), why)) << allocated.status();
  char host[64];
  auto registered = session.RegisterDeviceBuffer(host, sizeof(host));
  ASSERT_FALSE(registered.ok());
  EXPECT_TRUE(absl::StrContains(registered.status().message(), "RegisterDeviceBuffer: device buffers need CUDA"))
      << registered.status();

  // The daemon's own refusal, asked directly (a client with CUDA on a daemon without).
  auto stub = v1::Worker::NewStub(
      grpc::CreateChannel(cluster->daemon_target(0), grpc::InsecureChannelCredentials()));
  v1::OpenSessionRequest open;
  open.set_job_id("no-gpu-raw");
  open.set_world_size(1);
  open.set_rank(0);
  open.set_timeout_ms(20000);
  open.set_tenant_token(LabTenantToken());
  v1::OpenSessionResponse opened;
  {
    grpc::ClientContext ctx;
    ctx.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(30)));
    grpc::Status st = stub->OpenSession(&ctx, open, &opened);
    ASSERT_TRUE(st.ok()) << st.error_message();
  }
  {
    v1::AllocateBufferRequest req;
    req.set_session_id(opened.session_id());
    req.set_size_bytes(4096);
    req.set_gpu_uuid("GPU-00000000-0000-0000-0000-000000000000");
    v1::AllocateBufferResponse resp;
    grpc::ClientContext ctx;
    ctx.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(10)));
    grpc::Status st = stub->AllocateBuffer(&ctx, req, &resp);
    EXPECT_EQ(st.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
    EXPECT_TRUE(absl::StrContains(st.error_message(), "device buffers unavailable: ")) << st.error_message();
    EXPECT_TRUE(absl::StrContains(st.error_message(), why)) << st.error_message();
  }
  {
    v1::RegisterDeviceBufferRequest req;
    req.set_session_id(opened.session_id());
    req.set_gpu_uuid("GPU-00000000-0000-0000-0000-000000000000");
    req.set_cuda_ipc_handle(std::string(64, 'x'));
    req.set_size_bytes(4096);
    req.set_client_pid(::getpid());
    v1::RegisterDeviceBufferResponse resp;
    grpc::ClientContext ctx;
    ctx.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(10)));
    grpc::Status st = stub->RegisterDeviceBuffer(&ctx, req, &resp);
    EXPECT_EQ(st.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
    EXPECT_TRUE(absl::StrContains(st.error_message(), "device buffers unavailable: ")) << st.error_message();
  }
  EXPECT_TRUE(absl::StrContains(testing::ReadTextFile(cluster->daemon_log(0)), "device buffers unavailable: "));

  // Still serving: a host-memory allreduce on the first session.
  auto buf = session.AllocateBuffer(16 * sizeof(float));
  ASSERT_TRUE(buf.ok()) << buf.status();
  for (int i = 0; i < 16; ++i) (*buf)->as<float>()[i] = static_cast<float>(i);
  auto run = session.Run(testing::AllreduceSpec(buf->get(), 16, "after"));
  ASSERT_TRUE(run.ok()) << run.status();
  EXPECT_EQ((*buf)->as<float>()[7], 7.0f);
}

class DeviceBuffersOnAGpu : public ::testing::Test {
 protected:
  static constexpr int kRanks = 4;
  static void SetUpTestSuite() {
    if (!cuda::CudaUsable().ok()) return;
    cluster_ = testing::StartCluster(kRanks).release();
  }
  static void TearDownTestSuite() {
    delete cluster_;
    cluster_ = nullptr;
  }
  static LocalCluster* cluster_;
};
LocalCluster* DeviceBuffersOnAGpu::cluster_ = nullptr;

// Every dtype (sum), then every op (f32), on buffers the daemons allocated
// for ranks 0 and 2 and memory the test holds for ranks 1 and 3, with a
// count that splits unevenly over 4 ranks.
// The GPU of rank r: spread over every visible GPU (all on GPU 0 with one),
// so a host with several runs the ranks on several, and co-located ranks on
// different GPUs go through peer access.
int Gpu(int r) {
  auto devices = cuda::ListCudaDevices();
  return devices.ok() && !devices->empty() ? r % static_cast<int>(devices->size()) : 0;
}

// Rank r on daemon daemons[r] (default: rank r on daemon r), its buffer on Gpu(r).
void FourRankAllreduceIsBitExact(LocalCluster& cluster, const std::string& job,
                                 std::vector<int> daemons = testing::FirstN(4)) {
  constexpr int kRanks = 4;
  auto ranks = testing::OpenJob(cluster, job, daemons);
  ASSERT_TRUE(ranks.ok()) << ranks.status();
  constexpr size_t kCount = (1 << 20) + 3;
  std::vector<std::unique_ptr<client::Buffer>> bufs(kRanks);
  std::vector<cuda::DeviceBuffer> own(kRanks);
  for (int r = 0; r < kRanks; ++r) {
    client::Session& s = *(*ranks)[r].session;
    if (r % 2 == 0) {
      auto b = s.AllocateDeviceBuffer(kCount * 8, Gpu(r));
      ASSERT_TRUE(b.ok()) << "rank " << r << ": " << b.status();
      bufs[r] = std::move(*b);
    } else {
      ASSERT_TRUE(cuda::SetDevice(Gpu(r)).ok());
      auto mem = cuda::DeviceBuffer::Allocate(kCount * 8 + 256);
      ASSERT_TRUE(mem.ok()) << mem.status();
      own[r] = std::move(*mem);
      // An interior pointer: the daemon opens the allocation and offsets into it.
      auto b = s.RegisterDeviceBuffer(static_cast<char*>(own[r].data()) + 256, kCount * 8);
      ASSERT_TRUE(b.ok()) << "rank " << r << ": " << b.status();
      bufs[r] = std::move(*b);
    }
    EXPECT_TRUE(bufs[r]->on_device());
    EXPECT_TRUE(absl::StartsWith(bufs[r]->gpu_uuid(), "GPU-")) << bufs[r]->gpu_uuid();
  }
  struct Case {
    DType dtype;
    ReduceOp op;
  };
  std::vector<Case> cases;
  for (DType t : kAllDTypes) cases.push_back({t, ReduceOp::kSum});
  for (ReduceOp op : {ReduceOp::kAvg, ReduceOp::kMin, ReduceOp::kMax, ReduceOp::kProd}) {
    cases.push_back({DType::kF32, op});
  }
  for (const Case& c : cases) {
    SCOPED_TRACE(absl::StrCat(DTypeName(c.dtype), " ", ReduceOpName(c.op)));
    std::vector<std::vector<char>> inputs(kRanks);
    for (int r = 0; r < kRanks; ++r) {
      inputs[r] = testing::IntegerValuedData(c.dtype, kCount, r, 17, c.op);
      ASSERT_TRUE(ToDevice(bufs[r]->data(), inputs[r]).ok());
    }
    const std::vector<char> expected = testing::RingOrderReference(inputs, c.dtype, c.op, kCount);
    testing::OnEveryRank(kRanks, [&](int r) {
      client::CollectiveSpec spec = testing::AllreduceSpec(bufs[r].get(), kCount, "grad", c.dtype);
      spec.op = c.op;
      auto run = (*ranks)[r].session->Run(spec);
      EXPECT_TRUE(run.ok()) << "rank " << r << ": " << run.status();
    });
    for (int r = 0; r < kRanks; ++r) {
      auto got = FromDevice(bufs[r]->data(), expected.size());
      ASSERT_TRUE(got.ok()) << got.status();
      EXPECT_TRUE(*got == expected) << "rank " << r << " differs from the reference";
    }
  }
  // Free before the test's own allocations go (the daemons have them open).
  for (int r = 0; r < kRanks; ++r) EXPECT_TRUE((*ranks)[r].session->FreeBuffer(std::move(bufs[r])).ok());
}

TEST_F(DeviceBuffersOnAGpu, FourRankAllreduceIsBitExactForEveryDTypeAndOp) {
  GPU_OR_SKIP();
  ASSERT_NE(cluster_, nullptr);
  // In place on the GPU (the default --device_ops): staged through host
  // blocks, reduced by the CUDA kernels.
  FourRankAllreduceIsBitExact(*cluster_, "device-allreduce");
  for (int d = 0; d < kRanks; ++d) {
    EXPECT_TRUE(absl::StrContains(testing::ReadTextFile(cluster_->daemon_log(d)),
                                  "run in place, staged through page-locked host blocks"))
        << "daemon " << d;
  }
}

// Two ranks on each of two daemons: combined on the GPU (hierarchical path
// in place), then across the daemons.
TEST(DeviceBuffersColocated, TwoRanksPerDaemonAllreduceIsBitExactForEveryDTypeAndOp) {
  GPU_OR_SKIP();
  auto cluster = testing::StartCluster(2);
  ASSERT_NE(cluster, nullptr);
  FourRankAllreduceIsBitExact(*cluster, "device-colocated", {0, 0, 1, 1});
  EXPECT_TRUE(absl::StrContains(testing::ReadTextFile(cluster->daemon_log(0)), "run in place"));
}

TEST(DeviceBuffersOnHostTwins, FourRankAllreduceIsBitExactForEveryDTypeAndOp) {
  GPU_OR_SKIP();
  auto cluster = testing::StartCluster(4, {"--device_ops=host_twin"});
  ASSERT_NE(cluster, nullptr);
  FourRankAllreduceIsBitExact(*cluster, "device-allreduce-twins");
}

// A compressed allreduce of device buffers runs in place on the GPU (the
// codecs' CUDA kernels encode and decode; only encoded bytes are staged)
// and gives the same bits as the same op on host twins (the CPU codecs; the
// collective tests check those against the codec's arithmetic and bound).
void CompressedAllreduce(LocalCluster& cluster, const std::string& job, CodecId codec,
                         std::vector<float>* result, std::string* plan) {
  constexpr int kRanks = 4;
  constexpr size_t kCount = (1 << 18) + 5;
  auto ranks = testing::OpenJob(cluster, job, testing::FirstN(kRanks));
  ASSERT_TRUE(ranks.ok()) << ranks.status();
  std::vector<std::unique_ptr<client::Buffer>> bufs(kRanks);
  for (int r = 0; r < kRanks; ++r) {
    auto b = (*ranks)[r].session->AllocateDeviceBuffer(kCount * 4, Gpu(r));
    ASSERT_TRUE(b.ok()) << "rank " << r << ": " << b.status();
    bufs[r] = std::move(*b);
    std::vector<char> in(kCount * 4);
    for (size_t i = 0; i < kCount; ++i) {
      const float v = std::sin(0.001f * static_cast<float>(i) + static_cast<float>(r)) *
                      std::ldexp(1.0f, static_cast<int>(i % 23) - 11);
      std::memcpy(&in[i * 4], &v, 4);
    }
    ASSERT_TRUE(ToDevice(bufs[r]->data(), in).ok());
  }
  std::vector<std::string> plans(kRanks);
  testing::OnEveryRank(kRanks, [&](int r) {
    client::CollectiveSpec spec = testing::AllreduceSpec(bufs[r].get(), kCount, "", DType::kF32);
    spec.codec = CodecName(codec);
    auto run = (*ranks)[r].session->Run(spec);
    ASSERT_TRUE(run.ok()) << "rank " << r << ": " << run.status();
    plans[r] = run->algorithm;
  });
  *plan = plans[0];
  std::vector<std::vector<char>> out(kRanks);
  for (int r = 0; r < kRanks; ++r) {
    auto got = FromDevice(bufs[r]->data(), kCount * 4);
    ASSERT_TRUE(got.ok()) << got.status();
    out[r] = std::move(*got);
    EXPECT_TRUE(out[r] == out[0]) << "rank " << r << " differs from rank 0";
  }
  result->resize(kCount);
  std::memcpy(result->data(), out[0].data(), kCount * 4);
  for (int r = 0; r < kRanks; ++r) EXPECT_TRUE((*ranks)[r].session->FreeBuffer(std::move(bufs[r])).ok());
}

TEST_F(DeviceBuffersOnAGpu, CompressedAllreduceRunsOnTheGpuAndMatchesTheHostTwins) {
  GPU_OR_SKIP();
  ASSERT_NE(cluster_, nullptr);
  auto twins = testing::StartCluster(4, {"--device_ops=host_twin"});
  ASSERT_NE(twins, nullptr);
  for (CodecId codec : {CodecId::kBf16, CodecId::kFp16, CodecId::kFp8E4M3, CodecId::kInt8}) {
    SCOPED_TRACE(CodecName(codec));
    std::vector<float> on_gpu, on_host;
    std::string gpu_plan, host_plan;
    CompressedAllreduce(*cluster_, absl::StrCat("device-codec-", CodecName(codec)), codec, &on_gpu,
                        &gpu_plan);
    CompressedAllreduce(*twins, absl::StrCat("twin-codec-", CodecName(codec)), codec, &on_host,
                        &host_plan);
    EXPECT_EQ(gpu_plan, absl::StrCat("ring+", CodecName(codec)));
    EXPECT_EQ(host_plan, gpu_plan);
    ASSERT_EQ(on_gpu.size(), on_host.size());
    EXPECT_EQ(std::memcmp(on_gpu.data(), on_host.data(), on_gpu.size() * 4), 0)
        << "the GPU's codec kernels and the CPU's gave different results";
  }
}

// Allgather and broadcast over device buffers, each forced algorithm that
// implements them.
TEST_F(DeviceBuffersOnAGpu, AllgatherAndBroadcastLandInDeviceMemory) {
  GPU_OR_SKIP();
  ASSERT_NE(cluster_, nullptr);
  auto ranks = testing::OpenJob(*cluster_, "device-gather", testing::FirstN(kRanks));
  ASSERT_TRUE(ranks.ok()) << ranks.status();
  constexpr size_t kBlock = 70001;  // i32 elements per rank
  std::vector<std::unique_ptr<client::Buffer>> bufs(kRanks);
  for (int r = 0; r < kRanks; ++r) {
    auto b = (*ranks)[r].session->AllocateDeviceBuffer(kBlock * kRanks * 4, 0);
    ASSERT_TRUE(b.ok()) << b.status();
    bufs[r] = std::move(*b);
  }
  // Allgather: rank r's block r holds r*1e6 + i.
  for (int r = 0; r < kRanks; ++r) {
    std::vector<char> v(kBlock * kRanks * 4, 0);
    int32_t* p = reinterpret_cast<int32_t*>(v.data()) + r * kBlock;
    for (size_t i = 0; i < kBlock; ++i) p[i] = r * 1000000 + static_cast<int32_t>(i);
    ASSERT_TRUE(ToDevice(bufs[r]->data(), v).ok());
  }
  testing::OnEveryRank(kRanks, [&](int r) {
    client::CollectiveSpec spec;
    spec.kind = CollectiveKind::kAllgather;
    spec.buffer = bufs[r].get();
    spec.count = kBlock;
    spec.dtype = DType::kI32;
    spec.name = "gather";
    auto run = (*ranks)[r].session->Run(spec);
    EXPECT_TRUE(run.ok()) << "rank " << r << ": " << run.status();
  });
  for (int r = 0; r < kRanks; ++r) {
    auto got = FromDevice(bufs[r]->data(), kBlock * kRanks * 4);
    ASSERT_TRUE(got.ok());
    const int32_t* p = reinterpret_cast<const int32_t*>(got->data());
    for (int q = 0; q < kRanks; ++q) {
      EXPECT_EQ(p[q * kBlock + 5], q * 1000000 + 5) << "rank " << r << " block " << q;
      EXPECT_EQ(p[q * kBlock + kBlock - 1], q * 1000000 + static_cast<int32_t>(kBlock - 1));
    }
  }
  // Broadcast from rank 2.
  std::vector<char> root(kBlock * 4);
  for (size_t i = 0; i < kBlock; ++i) reinterpret_cast<int32_t*>(root.data())[i] = -static_cast<int32_t>(i);
  ASSERT_TRUE(ToDevice(bufs[2]->data(), root).ok());
  testing::OnEveryRank(kRanks, [&](int r) {
    client::CollectiveSpec spec;
    spec.kind = CollectiveKind::kBroadcast;
    spec.buffer = bufs[r].get();
    spec.count = kBlock;
    spec.dtype = DType::kI32;
    spec.root = 2;
    spec.name = "bcast";
    auto run = (*ranks)[r].session->Run(spec);
    EXPECT_TRUE(run.ok()) << "rank " << r << ": " << run.status();
  });
  for (int r = 0; r < kRanks; ++r) {
    auto got = FromDevice(bufs[r]->data(), kBlock * 4);
    ASSERT_TRUE(got.ok());
    EXPECT_TRUE(*got == root) << "rank " << r;
  }
}

// A handle of memory already freed is refused with the reason, and a GPU
// the daemon cannot see is named.
TEST_F(DeviceBuffersOnAGpu, StaleHandlesAndUnknownGpusAreRefusedClearly) {
  GPU_OR_SKIP();
  ASSERT_NE(cluster_, nullptr);
  auto ranks = testing::OpenJob(*cluster_, "device-refusals", {0});
  ASSERT_TRUE(ranks.ok()) << ranks.status();
  client::Session& s = *(*ranks)[0].session;
  auto stub = v1::Worker::NewStub(
      grpc::CreateChannel(cluster_->daemon_target(0), grpc::InsecureChannelCredentials()));
  ASSERT_TRUE(cuda::SetDevice(0).ok());
  auto uuid = cuda::DeviceUuid(0);
  ASSERT_TRUE(uuid.ok());
  std::string stale_handle;
  {
    auto mem = cuda::DeviceBuffer::Allocate(1 << 20);
    ASSERT_TRUE(mem.ok());
    auto exported = cuda::ExportIpc(mem->data());
    ASSERT_TRUE(exported.ok()) << exported.status();
    stale_handle = exported->handle;
  }  // freed
  auto call = [&](const std::string& gpu, const std::string& handle, int64_t pid) {
    v1::RegisterDeviceBufferRequest req;
    req.set_session_id(s.id());
    req.set_gpu_uuid(gpu);
    req.set_cuda_ipc_handle(handle);
    req.set_size_bytes(1 << 20);
    req.set_client_pid(pid);
    v1::RegisterDeviceBufferResponse resp;
    grpc::ClientContext ctx;
    ctx.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(10)));
    return stub->RegisterDeviceBuffer(&ctx, req, &resp);
  };
  grpc::Status st = call("GPU-00000000-0000-0000-0000-000000000000", stale_handle, ::getpid());
  EXPECT_EQ(st.error_code(), grpc::StatusCode::NOT_FOUND) << st.error_message();
  EXPECT_TRUE(absl::StrContains(st.error_message(), "is not visible to this process")) << st.error_message();
  st = call(*uuid, stale_handle, ::getpid());
  EXPECT_EQ(st.error_code(), grpc::StatusCode::FAILED_PRECONDITION) << st.error_message();
  EXPECT_TRUE(absl::StrContains(st.error_message(), "cudaIpcOpenMemHandle")) << st.error_message();
  st = call(*uuid, stale_handle, 0x3fffffff);  // no such process
  EXPECT_TRUE(absl::StrContains(st.error_message(), "is gone")) << st.error_message();
  // The session still works after the refusals.
  auto b = s.AllocateDeviceBuffer(4096, 0);
  ASSERT_TRUE(b.ok()) << b.status();
  ASSERT_TRUE(ToDevice((*b)->data(), std::vector<char>(4096, 1)).ok());
  auto run = s.Run(testing::AllreduceSpec(b->get(), 1024, "after", DType::kI32));
  ASSERT_TRUE(run.ok()) << run.status();
  EXPECT_TRUE(s.FreeBuffer(std::move(*b)).ok());
}

}  // namespace
}  // namespace gradsync
