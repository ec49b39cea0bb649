#include "worker/session_buffers.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cstring>
#include <memory>
#include <vector>

#include "absl/strings/str_cat.h"
#include "cuda/cuda_memory.h"
#include "cuda/cuda_reduce.h"
#include "cuda/cuda_testing.h"
#include "gtest/gtest.h"

namespace gradsync {
namespace {

constexpr uint64_t kPage = 4096;

SessionBuffers::Options Opts(const std::string& session_id, uint64_t limit = 0,
                             const std::string& tenant = "") {
  SessionBuffers::Options o;
  o.session_id = session_id;
  o.job_id = "j";
  o.rank = 2;
  o.memory_limit_bytes = limit;
  o.tenant = tenant;
  return o;
}

// A pattern no two offsets of a page share with their neighbours.
std::vector<uint8_t> Pattern(size_t n, uint8_t seed) {
  std::vector<uint8_t> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = static_cast<uint8_t>(i * 31 + seed);
  return v;
}

// A memfd of `bytes` bytes sealed against shrinking, as the SDK makes it.
UniqueFd SealedMemfd(size_t bytes) {
  UniqueFd fd(::memfd_create("session_buffers_test", MFD_ALLOW_SEALING | MFD_CLOEXEC));
  EXPECT_TRUE(fd.valid());
  EXPECT_EQ(::ftruncate(fd.get(), static_cast<off_t>(bytes)), 0);
  EXPECT_EQ(::fcntl(fd.get(), F_ADD_SEALS, F_SEAL_SHRINK), 0);
  return fd;
}

TEST(SessionBuffers, RefusesABufferOverTheLargestSizeNamingIt) {
  SessionBuffers b(Opts("s1"), nullptr);
  const uint64_t over = SessionBuffers::kMaxBufferBytes + 1;
  EXPECT_EQ(b.Allocate(over, false).status(),
            absl::InvalidArgumentError(
                "buffer of 68719476737 bytes exceeds the limit of 68719476736 bytes"));
  EXPECT_EQ(b.Register(-1, 0, over, "fd").status(),
            absl::InvalidArgumentError(
                "a registered range of 68719476737 bytes exceeds the limit of 68719476736 bytes"));
  EXPECT_EQ(b.AllocateDevice("GPU-x", over).status(),
            absl::InvalidArgumentError(
                "device buffer of 68719476737 bytes exceeds the limit of 68719476736 bytes"));
  EXPECT_EQ(b.bytes(), 0u);
}

TEST(SessionBuffers, TheSessionQuotaRefusesTheBufferThatWouldExceedIt) {
  SessionBuffers b(Opts("s1", 2 * kPage), nullptr);
  absl::StatusOr<BufferInfo> named = b.Allocate(kPage, false);
  ASSERT_TRUE(named.ok()) << named.status();
  EXPECT_EQ(named->id, 1u);
  EXPECT_EQ(named->size, kPage);
  EXPECT_FALSE(named->by_descriptor);
  EXPECT_EQ(named->shm_name.rfind("/gradsync.", 0), 0u) << named->shm_name;
  absl::StatusOr<BufferInfo> sealed = b.Allocate(kPage, true);
  ASSERT_TRUE(sealed.ok()) << sealed.status();
  EXPECT_EQ(sealed->id, 2u);
  EXPECT_TRUE(sealed->by_descriptor);
  EXPECT_EQ(b.bytes(), 2 * kPage);

  EXPECT_EQ(b.Allocate(1, false).status(),
            absl::ResourceExhaustedError(
                "session s1 (job 'j' rank 2): allocating a buffer of 1 bytes would exceed the "
                "session's buffer quota of 8192 bytes (8192 in use; gradsyncd "
                "--session_memory_limit_mb)"));
  UniqueFd fd = SealedMemfd(kPage);
  EXPECT_EQ(b.Register(fd.get(), 0, kPage, "fd of pid 42").status(),
            absl::ResourceExhaustedError(
                "session s1 (job 'j' rank 2): registering a buffer of 4096 bytes would exceed the "
                "session's buffer quota of 8192 bytes (8192 in use; gradsyncd "
                "--session_memory_limit_mb)"));
  // Checked before any GPU is asked for.
  EXPECT_EQ(b.AllocateDevice("GPU-x", kPage).status().code(), absl::StatusCode::kResourceExhausted);

  ASSERT_TRUE(b.Free(1).ok());
  EXPECT_EQ(b.bytes(), kPage);
  absl::StatusOr<BufferInfo> again = b.Allocate(kPage, false);
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ(again->id, 3u);  // ids are never reused
}

// State the daemon keeps for the session's ops (error feedback) shares the
// quotas with its buffers, both ways, and goes back when released.
TEST(SessionBuffers, KeptOpStateCountsInTheSameQuotas) {
  auto tenants = std::make_shared<TenantMemory>(3 * kPage);
  SessionBuffers b(Opts("s1", 2 * kPage, "vision"), tenants);
  ASSERT_TRUE(b.Allocate(kPage, false).ok());
  ASSERT_TRUE(b.ChargeState(kPage, "error feedback of op 'g'").ok());
  EXPECT_EQ(b.state_bytes(), kPage);
  EXPECT_EQ(tenants->used("tenant 'vision'"), 2 * kPage);
  EXPECT_EQ(b.ChargeState(1, "error feedback of op 'h'"),
            absl::ResourceExhaustedError(
                "session s1 (job 'j' rank 2): error feedback of op 'h': 1 bytes would exceed the "
                "session's buffer quota of 8192 bytes (8192 in use; gradsyncd "
                "--session_memory_limit_mb)"));
  EXPECT_EQ(b.Allocate(1, false).status().code(), absl::StatusCode::kResourceExhausted);
  b.ReleaseState(kPage);
  EXPECT_EQ(b.state_bytes(), 0u);
  EXPECT_EQ(tenants->used("tenant 'vision'"), kPage);
  // The account's quota refuses too, naming it.
  SessionBuffers other(Opts("s2", 0, "vision"), tenants);
  ASSERT_TRUE(other.Allocate(kPage, false).ok());
  const absl::Status s = other.ChargeState(2 * kPage, "error feedback of op 'g'");
  EXPECT_EQ(s.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_NE(s.message().find("tenant 'vision'"), std::string::npos) << s;
}

TEST(SessionBuffers, TheAccountsQuotaIsSharedByItsSessions) {
  auto tenants = std::make_shared<TenantMemory>(2 * kPage);
  SessionBuffers s1(Opts("s1", 0, "vision"), tenants);
  SessionBuffers s2(Opts("s2", 0, "vision"), tenants);
  SessionBuffers other(Opts("s3", 0, "speech"), tenants);
  ASSERT_TRUE(s1.Allocate(2 * kPage, false).ok());
  EXPECT_EQ(tenants->used("tenant 'vision'"), 2 * kPage);
  EXPECT_EQ(s2.Allocate(kPage, false).status(),
            absl::ResourceExhaustedError(
                "session s2: allocating a buffer of 4096 bytes would exceed tenant 'vision''s "
                "buffer quota on this daemon of 8192 bytes (8192 held by its sessions; gradsyncd "
                "--tenant_memory_limit_mb)"));
  EXPECT_TRUE(other.Allocate(2 * kPage, false).ok());  // another account

  ASSERT_TRUE(s1.Free(1).ok());
  EXPECT_EQ(tenants->used("tenant 'vision'"), 0u);
  ASSERT_TRUE(s2.Allocate(kPage, true).ok());
  EXPECT_EQ(tenants->used("tenant 'vision'"), kPage);
  s2.FreeAll();
  EXPECT_EQ(tenants->used("tenant 'vision'"), 0u);
  EXPECT_EQ(tenants->used("tenant 'speech'"), 2 * kPage);
}

TEST(SessionBuffers, TheDescriptorIsHandedOutOnceAndMapsTheSameMemory) {
  SessionBuffers b(Opts("s1"), nullptr);
  absl::StatusOr<BufferInfo> sealed = b.Allocate(kPage, true);
  absl::StatusOr<BufferInfo> named = b.Allocate(kPage, false);
  ASSERT_TRUE(sealed.ok() && named.ok());

  absl::StatusOr<UniqueFd> fd = b.TakeFd(sealed->id);
  ASSERT_TRUE(fd.ok()) << fd.status();
  ASSERT_TRUE(fd->valid());
  EXPECT_EQ(b.TakeFd(sealed->id).status(),
            absl::FailedPreconditionError(
                "the descriptor of buffer 1 of session s1 was already fetched (each is handed "
                "out once)"));
  EXPECT_EQ(b.TakeFd(named->id).status(),
            absl::FailedPreconditionError(
                "buffer 2 of session s1 is not handed out by descriptor"));
  EXPECT_EQ(b.TakeFd(9).status(), absl::NotFoundError("session s1 has no buffer 9"));

  // What the client writes through its descriptor is what an op sees.
  void* client = ::mmap(nullptr, kPage, PROT_READ | PROT_WRITE, MAP_SHARED, fd->get(), 0);
  ASSERT_NE(client, MAP_FAILED);
  const std::vector<uint8_t> want = Pattern(kPage, 7);
  std::memcpy(client, want.data(), kPage);
  absl::StatusOr<BufferRef> ref = b.Find(sealed->id);
  ASSERT_TRUE(ref.ok()) << ref.status();
  EXPECT_EQ(ref->device, nullptr);
  EXPECT_EQ(std::memcmp(ref->segment->data(), want.data(), kPage), 0);
  ::munmap(client, kPage);
}

TEST(SessionBuffers, AtMostSixteenDescriptorsWaitToBeFetched) {
  SessionBuffers b(Opts("s1"), nullptr);
  for (size_t i = 0; i < SessionBuffers::kMaxUnfetchedBuffers; ++i) {
    ASSERT_TRUE(b.Allocate(kPage, true).ok());
  }
  const absl::Status full = absl::ResourceExhaustedError(
      "session s1: 16 buffers were allocated and their descriptors never fetched on the fd "
      "socket; at most 16 may wait");
  EXPECT_EQ(b.Allocate(kPage, true).status(), full);
  EXPECT_TRUE(b.Allocate(kPage, false).ok());  // named buffers hold no descriptor

  ASSERT_TRUE(b.TakeFd(1).ok());  // fetched: one may wait again
  ASSERT_TRUE(b.Allocate(kPage, true).ok());
  EXPECT_EQ(b.Allocate(kPage, true).status(), full);
  ASSERT_TRUE(b.Free(1).ok());  // fetched already: frees no slot
  EXPECT_EQ(b.Allocate(kPage, true).status(), full);
  ASSERT_TRUE(b.Free(2).ok());  // never fetched: frees one
  EXPECT_TRUE(b.Allocate(kPage, true).ok());
}

TEST(SessionBuffers, ARegisteredRangeIsTheClientsMemoryInPlace) {
  SessionBuffers b(Opts("s1"), nullptr);
  UniqueFd fd = SealedMemfd(3 * kPage);
  const std::vector<uint8_t> want = Pattern(kPage, 3);
  ASSERT_EQ(::pwrite(fd.get(), want.data(), kPage, kPage), static_cast<ssize_t>(kPage));
  absl::StatusOr<BufferInfo> info = b.Register(fd.get(), kPage, kPage, "fd of pid 42");
  ASSERT_TRUE(info.ok()) << info.status();
  EXPECT_EQ(info->size, kPage);
  EXPECT_FALSE(info->by_descriptor);
  absl::StatusOr<BufferRef> ref = b.Find(info->id);
  ASSERT_TRUE(ref.ok()) << ref.status();
  EXPECT_EQ(std::memcmp(ref->segment->data(), want.data(), kPage), 0);
  // The daemon's result lands in the client's file.
  const std::vector<uint8_t> result = Pattern(kPage, 99);
  std::memcpy(ref->segment->data(), result.data(), kPage);
  std::vector<uint8_t> got(kPage);
  ASSERT_EQ(::pread(fd.get(), got.data(), kPage, kPage), static_cast<ssize_t>(kPage));
  EXPECT_EQ(got, result);
  // A registered buffer has no descriptor to hand out.
  EXPECT_EQ(b.TakeFd(info->id).status().code(), absl::StatusCode::kFailedPrecondition);
  // MapFd's checks come through.
  EXPECT_EQ(b.Register(fd.get(), 1, kPage, "fd").status(),
            absl::InvalidArgumentError("offset 1 is not a multiple of the page size (4096 bytes)"));
}

TEST(SessionBuffers, FreeForgetsTheBufferButAnOpsReferenceKeepsItMapped) {
  SessionBuffers b(Opts("s1"), nullptr);
  absl::StatusOr<BufferInfo> info = b.Allocate(kPage, false);
  ASSERT_TRUE(info.ok()) << info.status();
  absl::StatusOr<BufferRef> held = b.Find(info->id);
  ASSERT_TRUE(held.ok());
  ASSERT_TRUE(b.Free(info->id).ok());
  EXPECT_EQ(b.bytes(), 0u);
  const absl::Status gone = absl::NotFoundError("buffer 1 does not exist in session s1");
  EXPECT_EQ(b.Find(info->id).status(), gone);
  EXPECT_EQ(b.Free(info->id), gone);
  const std::vector<uint8_t> data = Pattern(kPage, 5);
  std::memcpy(held->segment->data(), data.data(), kPage);  // still mapped
  EXPECT_EQ(std::memcmp(held->segment->data(), data.data(), kPage), 0);
}

TEST(SessionBuffers, CloseRefusesNewBuffersAndFreeAllReturnsTheMemory) {
  auto tenants = std::make_shared<TenantMemory>(0);
  SessionBuffers b(Opts("s1", 0, "vision"), tenants);
  ASSERT_TRUE(b.Allocate(kPage, true).ok());
  ASSERT_TRUE(b.Allocate(2 * kPage, false).ok());
  b.Close();
  EXPECT_EQ(b.Allocate(kPage, false).status(),
            absl::FailedPreconditionError("session is closing"));
  EXPECT_TRUE(b.Find(1).ok());  // until FreeAll
  EXPECT_EQ(tenants->used("tenant 'vision'"), 3 * kPage);
  b.FreeAll();
  EXPECT_EQ(b.bytes(), 0u);
  EXPECT_EQ(tenants->used("tenant 'vision'"), 0u);
  EXPECT_EQ(b.Find(1).status().code(), absl::StatusCode::kNotFound);
}

TEST(SessionBuffers, WithoutAGpuDeviceBuffersSayWhy) {
  if (cuda::CudaUsable().ok()) GTEST_SKIP() << "this process has a GPU; DeviceBuffersOnAGpu covers it";
  SessionBuffers b(Opts("s1"), nullptr);
  absl::Status s = b.AllocateDevice("GPU-00000000-0000-0000-0000-000000000000", kPage).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
  EXPECT_EQ(s.message().rfind("device buffers unavailable: ", 0), 0u) << s;
  EXPECT_EQ(s.message(), absl::StrCat("device buffers unavailable: ",
                                      cuda::CudaUsable().message()));
  EXPECT_EQ(b.bytes(), 0u);
}

class DeviceBuffersOnAGpu : public cuda::CudaGpuTest {};

TEST_F(DeviceBuffersOnAGpu, AllocatedBufferHasAHostTwinThatStagesBitExactly) {
  absl::StatusOr<std::string> uuid = cuda::DeviceUuid(0);
  ASSERT_TRUE(uuid.ok()) << uuid.status();
  auto tenants = std::make_shared<TenantMemory>(0);
  SessionBuffers b(Opts("s1", 0, "vision"), tenants);
  constexpr uint64_t kBytes = 1 << 20;
  absl::StatusOr<BufferInfo> info = b.AllocateDevice(*uuid, kBytes);
  ASSERT_TRUE(info.ok()) << info.status();
  EXPECT_EQ(info->gpu_uuid, *uuid);
  EXPECT_FALSE(info->cuda_ipc_handle.empty());
  EXPECT_EQ(info->shm_name, "device buffer on " + *uuid);
  EXPECT_EQ(info->size, kBytes);
  EXPECT_EQ(b.bytes(), kBytes);
  EXPECT_EQ(tenants->used("tenant 'vision'"), kBytes);
  EXPECT_EQ(b.TakeFd(info->id).status().code(), absl::StatusCode::kFailedPrecondition);

  absl::StatusOr<BufferRef> ref = b.Find(info->id);
  ASSERT_TRUE(ref.ok()) << ref.status();
  ASSERT_NE(ref->device, nullptr);
  EXPECT_EQ(ref->segment, ref->device->host());  // ops map the twin
  // host -> GPU -> host, through the GPU memory.
  const std::vector<uint8_t> want = Pattern(kBytes, 11);
  std::memcpy(ref->segment->data(), want.data(), kBytes);
  ASSERT_TRUE(ref->device->StageOut(0, kBytes).ok());
  std::memset(ref->segment->data(), 0, kBytes);
  ASSERT_TRUE(ref->device->StageIn(0, kBytes).ok());
  EXPECT_EQ(std::memcmp(ref->segment->data(), want.data(), kBytes), 0);

  ref = absl::NotFoundError("dropped");  // the op is done with it
  ASSERT_TRUE(b.Free(info->id).ok());
  EXPECT_EQ(b.bytes(), 0u);
  EXPECT_EQ(tenants->used("tenant 'vision'"), 0u);
}

}  // namespace
}  // namespace gradsync
