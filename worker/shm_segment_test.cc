// ShmSegment: the sealed segments the daemon makes (CreateSealed), and
// which client descriptors it maps (MapFd) and what it says about the ones
// it refuses.
#include "worker/shm_segment.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cstring>

#include "absl/strings/str_cat.h"
#include "common/net.h"
#include "gtest/gtest.h"

namespace gradsync {
namespace {

const size_t kPage = static_cast<size_t>(::sysconf(_SC_PAGESIZE));

// A memfd of `bytes` bytes, sealed against shrinking unless told otherwise.
UniqueFd Memfd(size_t bytes, bool seal = true) {
  UniqueFd fd(::memfd_create("shm_segment_test", MFD_ALLOW_SEALING | MFD_CLOEXEC));
  EXPECT_TRUE(fd.valid());
  EXPECT_EQ(::ftruncate(fd.get(), static_cast<off_t>(bytes)), 0);
  if (seal) {
    EXPECT_EQ(::fcntl(fd.get(), F_ADD_SEALS, F_SEAL_SHRINK), 0);
  }
  return fd;
}

// The descriptor handed to the client maps the daemon's bytes, cannot
// change size or take seals, and is handed out once.
TEST(ShmSegmentCreateSealed, HandsOutOneDescriptorThatCannotResize) {
  auto seg = ShmSegment::CreateSealed("shm_segment_test", 3 * kPage + 5);
  ASSERT_TRUE(seg.ok()) << seg.status();
  EXPECT_TRUE((*seg)->by_descriptor());
  std::memset((*seg)->data(), 0x5a, 3 * kPage + 5);
  UniqueFd fd = (*seg)->TakeFd();
  ASSERT_TRUE(fd.valid());
  EXPECT_FALSE((*seg)->TakeFd().valid());
  EXPECT_FALSE((*seg)->holds_fd());
  EXPECT_EQ(::fcntl(fd.get(), F_GET_SEALS), F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL);
  EXPECT_EQ(::ftruncate(fd.get(), 0), -1);
  EXPECT_EQ(errno, EPERM);
  EXPECT_EQ(::ftruncate(fd.get(), static_cast<off_t>(8 * kPage)), -1);
  EXPECT_EQ(::fcntl(fd.get(), F_ADD_SEALS, F_SEAL_WRITE), -1);
  void* p = ::mmap(nullptr, 3 * kPage + 5, PROT_READ | PROT_WRITE, MAP_SHARED, fd.get(), 0);
  ASSERT_NE(p, MAP_FAILED);
  EXPECT_EQ(static_cast<unsigned char*>(p)[3 * kPage + 4], 0x5a);
  static_cast<char*>(p)[0] = 1;
  EXPECT_EQ((*seg)->data()[0], 1);
  ::munmap(p, 3 * kPage + 5);
}

TEST(ShmSegmentMapFd, MapsTheRangeSharedWithTheFile) {
  UniqueFd fd = Memfd(3 * kPage);
  auto seg = ShmSegment::MapFd(fd.get(), kPage, 2 * kPage, "fd of pid 1");
  ASSERT_TRUE(seg.ok()) << seg.status();
  EXPECT_EQ((*seg)->size(), 2 * kPage);
  EXPECT_EQ((*seg)->name(), "fd of pid 1");
  // Writes through the segment land in the file at the offset, and back.
  std::memcpy((*seg)->data(), "gradsync", 8);
  char got[8] = {};
  ASSERT_EQ(::pread(fd.get(), got, 8, static_cast<off_t>(kPage)), 8);
  EXPECT_EQ(std::memcmp(got, "gradsync", 8), 0);
  ASSERT_EQ(::pwrite(fd.get(), "GS", 2, static_cast<off_t>(2 * kPage)), 2);
  EXPECT_EQ(std::memcmp((*seg)->data() + kPage, "GS", 2), 0);
  // The seal holds: the file can no longer shrink under the mapping.
  EXPECT_NE(::ftruncate(fd.get(), 0), 0);
  EXPECT_EQ(errno, EPERM);
  // The segment outlives the caller's descriptor (the mapping holds the file).
  fd.Reset();
  EXPECT_EQ(std::memcmp((*seg)->data(), "gradsync", 8), 0);
}

TEST(ShmSegmentMapFd, RefusesAnUnsealedFile) {
  UniqueFd fd = Memfd(kPage, /*seal=*/false);
  auto seg = ShmSegment::MapFd(fd.get(), 0, kPage, "x");
  ASSERT_FALSE(seg.ok());
  EXPECT_EQ(seg.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(seg.status().message().find("not sealed against shrinking (F_SEAL_SHRINK)"),
            std::string::npos)
      << seg.status();
}

TEST(ShmSegmentMapFd, RefusesAFileThatCannotBeSealed) {
  // A plain shm_open segment (tmpfs without sealing support in this form).
  const std::string name = absl::StrCat("/gradsync-test-unsealable-", ::getpid());
  UniqueFd fd(::shm_open(name.c_str(), O_RDWR | O_CREAT | O_EXCL, 0600));
  ASSERT_TRUE(fd.valid());
  ::shm_unlink(name.c_str());
  ASSERT_EQ(::ftruncate(fd.get(), static_cast<off_t>(kPage)), 0);
  auto seg = ShmSegment::MapFd(fd.get(), 0, kPage, "x");
  ASSERT_FALSE(seg.ok());
  EXPECT_EQ(seg.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(seg.status().message().find("F_SEAL_SHRINK"), std::string::npos) << seg.status();
}

TEST(ShmSegmentMapFd, RefusesARangeBeyondTheEnd) {
  UniqueFd fd = Memfd(2 * kPage);
  auto seg = ShmSegment::MapFd(fd.get(), kPage, 2 * kPage, "x");
  ASSERT_FALSE(seg.ok());
  EXPECT_EQ(seg.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(seg.status().message().find(absl::StrCat("the file has ", 2 * kPage, " bytes")),
            std::string::npos)
      << seg.status();
  // Offset + size overflowing 64 bits is the same refusal, not a wrap-around.
  auto wrap = ShmSegment::MapFd(fd.get(), kPage, ~uint64_t{0} - kPage + 2, "x");
  ASSERT_FALSE(wrap.ok());
  EXPECT_EQ(wrap.status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(ShmSegmentMapFd, RefusesUnalignedOffsetsAndEmptyRanges) {
  UniqueFd fd = Memfd(2 * kPage);
  auto unaligned = ShmSegment::MapFd(fd.get(), 8, kPage, "x");
  ASSERT_FALSE(unaligned.ok());
  EXPECT_NE(unaligned.status().message().find("offset 8 is not a multiple of the page size"),
            std::string::npos)
      << unaligned.status();
  auto empty = ShmSegment::MapFd(fd.get(), 0, 0, "x");
  ASSERT_FALSE(empty.ok());
  EXPECT_NE(empty.status().message().find("must not be empty"), std::string::npos);
}

TEST(ShmSegmentMapFd, RefusesReadOnlyAndWriteSealedFiles) {
  UniqueFd fd = Memfd(kPage);
  UniqueFd read_only(::open(absl::StrCat("/proc/self/fd/", fd.get()).c_str(), O_RDONLY));
  ASSERT_TRUE(read_only.valid());
  auto ro = ShmSegment::MapFd(read_only.get(), 0, kPage, "x");
  ASSERT_FALSE(ro.ok());
  EXPECT_EQ(ro.status().code(), absl::StatusCode::kPermissionDenied);
  EXPECT_NE(ro.status().message().find("not open for reading and writing"), std::string::npos);
  ASSERT_EQ(::fcntl(fd.get(), F_ADD_SEALS, F_SEAL_WRITE), 0);
  auto sealed = ShmSegment::MapFd(fd.get(), 0, kPage, "x");
  ASSERT_FALSE(sealed.ok());
  EXPECT_NE(sealed.status().message().find("sealed against writing"), std::string::npos)
      << sealed.status();
}

TEST(ShmSegmentMapFd, RefusesWhatIsNotARegularFile) {
  int p[2];
  ASSERT_EQ(::pipe2(p, O_CLOEXEC), 0);
  UniqueFd r(p[0]), w(p[1]);
  auto seg = ShmSegment::MapFd(w.get(), 0, kPage, "x");
  ASSERT_FALSE(seg.ok());
  EXPECT_NE(seg.status().message().find("not a regular file"), std::string::npos) << seg.status();
}

}  // namespace
}  // namespace gradsync
