// DeviceStaging: device paths made once per GPU (a failed one remembered),
// peer access, and host twins. The path and peer-access calls go through
// DeviceStaging::Gpus, which the tests replace (no GPU needed); the host
// twin cases need a real GPU and skip without one (GRADSYNC_REQUIRE_CUDA=1
// makes them fail instead).
#include "worker/device_staging.h"

#include <cstring>
#include <memory>
#include <vector>

#include "absl/strings/match.h"
#include "cuda/cuda_memory.h"
#include "cuda/cuda_testing.h"
#include "gtest/gtest.h"
#include "worker/device_memory.h"
#include "worker/session.h"

namespace gradsync {
namespace {

JobPlacement Local(int ranks) {
  JobPlacement p;
  p.world = ranks;
  p.node_of_rank.assign(ranks, 0);
  p.ranks_of_node.resize(1);
  for (int r = 0; r < ranks; ++r) p.ranks_of_node[0].push_back(r);
  p.node_names = {"here:1"};
  return p;
}

struct Calls {
  std::vector<int> made;                      // make_path's GPUs
  std::vector<std::pair<int, int>> peers;     // enable_peer_access's pairs
  absl::Status peer_status = absl::OkStatus();
};

DeviceStaging::Gpus Fake(Calls* calls) {
  DeviceStaging::Gpus g;
  g.make_path = [calls](int gpu) -> absl::StatusOr<std::unique_ptr<DevicePath>> {
    calls->made.push_back(gpu);
    return absl::UnavailableError("no streams left on this GPU");
  };
  g.enable_peer_access = [calls](int gpu, int peer) {
    calls->peers.emplace_back(gpu, peer);
    return calls->peer_status;
  };
  return g;
}

TEST(DeviceStaging, AGpuWhosePathFailedIsRememberedAndNotAskedAgain) {
  const JobPlacement p = Local(1);
  Calls calls;
  DeviceStaging staging("job", p, RingOptions{}, nullptr, false, Fake(&calls));
  EXPECT_FALSE(staging.failed(0));
  EXPECT_EQ(staging.PathForGpus({0}), nullptr);
  EXPECT_TRUE(staging.failed(0));
  EXPECT_EQ(staging.PathForGpus({0}), nullptr);
  EXPECT_EQ(calls.made, std::vector<int>{0});  // asked once
  // Another GPU is asked on its own.
  EXPECT_EQ(staging.PathForGpus({1}), nullptr);
  EXPECT_EQ(calls.made, (std::vector<int>{0, 1}));
  EXPECT_FALSE(staging.failed(2));
}

TEST(DeviceStaging, PeerAccessIsEnabledOncePerGpuAndAFailureFallsBackWithoutBlame) {
  const JobPlacement p = Local(3);
  Calls calls;
  DeviceStaging staging("job", p, RingOptions{}, nullptr, false, Fake(&calls));
  calls.peer_status = absl::FailedPreconditionError("no P2P between GPUs 0 and 1");
  EXPECT_EQ(staging.PathForGpus({0, 1, 1}), nullptr);
  EXPECT_TRUE(calls.made.empty());  // the op runs on host twins, no path asked for
  EXPECT_FALSE(staging.failed(0));
  EXPECT_EQ(staging.PathForGpus({0, 1}), nullptr);
  EXPECT_EQ(calls.peers.size(), 2u);  // a failure is asked again next time
  calls.peer_status = absl::OkStatus();
  EXPECT_EQ(staging.PathForGpus({0, 1, 2}), nullptr);  // the path itself fails here
  EXPECT_EQ(calls.peers.size(), 4u);  // 0->1 and 0->2
  EXPECT_EQ(calls.peers[2], std::make_pair(0, 1));
  EXPECT_EQ(calls.peers[3], std::make_pair(0, 2));
  EXPECT_EQ(calls.made, std::vector<int>{0});
}

TEST(DeviceStaging, HostBuffersHaveNoDevicePathAndNothingToStage) {
  const JobPlacement p = Local(2);
  Calls calls;
  DeviceStaging staging("job", p, RingOptions{}, nullptr, false, Fake(&calls));
  auto seg = ShmSegment::CreatePrivate("host", 64);
  ASSERT_TRUE(seg.ok()) << seg.status();
  std::memset((*seg)->data(), 0x5a, 64);
  QueuedOp a, b;
  a.buffer = std::move(*seg);
  std::vector<QueuedOp*> ops{&a, &b};
  EXPECT_EQ(staging.PathFor(ops), nullptr);
  EXPECT_TRUE(calls.made.empty());
  EXPECT_TRUE(staging.StageIn(ops, 64).ok());
  EXPECT_TRUE(staging.StageOut(ops, 64).ok());
  for (int i = 0; i < 64; ++i) ASSERT_EQ(a.data()[i], 0x5a);
}

TEST(DeviceStaging, WithoutCudaThePathSaysWhyOnceAndTheOpRunsOnHostTwins) {
  if (cuda::CudaAvailable()) GTEST_SKIP() << "this process has a GPU";
  const JobPlacement p = Local(1);
  DeviceStaging staging("job", p, RingOptions{}, nullptr, false);  // the real GPU calls
  EXPECT_EQ(staging.PathForGpus({0}), nullptr);
  EXPECT_TRUE(staging.failed(0));
}

// Host twins on a real GPU: device -> twin -> device, bit for bit, at an
// offset; the untouched bytes stay as they were.
class DeviceStagingGpu : public cuda::CudaGpuTest {};

absl::Status Fill(char* device, const std::vector<char>& bytes) {
  auto pinned = cuda::PinnedHost::Allocate(bytes.size());
  if (!pinned.ok()) return pinned.status();
  std::memcpy(pinned->data(), bytes.data(), bytes.size());
  absl::Status s = cuda::CopyAsync(device, pinned->data(), bytes.size(), nullptr);
  return s.ok() ? cuda::CudaSynchronize(nullptr) : s;
}

absl::StatusOr<std::vector<char>> Read(const char* device, size_t n) {
  auto pinned = cuda::PinnedHost::Allocate(n);
  if (!pinned.ok()) return pinned.status();
  absl::Status s = cuda::CopyAsync(pinned->data(), device, n, nullptr);
  if (s.ok()) s = cuda::CudaSynchronize(nullptr);
  if (!s.ok()) return s;
  return std::vector<char>(pinned->data(), pinned->data() + n);
}

TEST_F(DeviceStagingGpu, HostTwinsInAndOutAreBitExact) {
  absl::StatusOr<std::string> uuid = cuda::DeviceUuid(0);
  ASSERT_TRUE(uuid.ok()) << uuid.status();
  constexpr size_t kSize = 1 << 16, kOffset = 4096, kBytes = 8192;
  auto memory = DeviceMemory::Allocate(*uuid, kSize);
  ASSERT_TRUE(memory.ok()) << memory.status();
  std::vector<char> pattern(kSize);
  for (size_t i = 0; i < kSize; ++i) pattern[i] = static_cast<char>(i * 131 + 7);
  ASSERT_TRUE(Fill((*memory)->device_data(), pattern).ok());
  QueuedOp op;
  op.device = *memory;
  op.buffer = (*memory)->host();
  op.offset = kOffset;
  std::memset(op.buffer->data(), 0, kSize);
  const JobPlacement p = Local(1);
  DeviceStaging staging("job", p, RingOptions{}, nullptr, false);
  std::vector<QueuedOp*> ops{&op};
  ASSERT_TRUE(staging.StageIn(ops, kBytes).ok());
  EXPECT_EQ(std::memcmp(op.data(), pattern.data() + kOffset, kBytes), 0);
  EXPECT_EQ(op.buffer->data()[kOffset - 1], 0);  // outside the op's range: untouched
  for (size_t i = 0; i < kBytes; ++i) op.data()[i] = static_cast<char>(~op.data()[i]);
  ASSERT_TRUE(staging.StageOut(ops, kBytes).ok());
  auto back = Read((*memory)->device_data(), kSize);
  ASSERT_TRUE(back.ok()) << back.status();
  for (size_t i = 0; i < kSize; ++i) {
    const char want = i >= kOffset && i < kOffset + kBytes ? static_cast<char>(~pattern[i]) : pattern[i];
    ASSERT_EQ((*back)[i], want) << "byte " << i;
  }
}

}  // namespace
}  // namespace gradsync
