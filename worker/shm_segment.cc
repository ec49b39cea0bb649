#include "worker/shm_segment.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/stat.h>

#include <atomic>
#include <ctime>
#include <unistd.h>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "common/net.h"
#include "ipc/shared_memory.h"

namespace gradsync {

absl::StatusOr<std::unique_ptr<ShmSegment>> ShmSegment::Create(const std::string& name,
                                                               size_t size, int64_t owner_uid) {
  UniqueFd fd(::shm_open(name.c_str(), O_CREAT | O_EXCL | O_RDWR | O_CLOEXEC, 0600));
  if (!fd.valid()) {
    return absl::InternalError(absl::StrCat("shm_open(", name, "): ", ErrnoString(errno)));
  }
  if (absl::Status s = ipc::GiveSegmentTo(fd.get(), owner_uid, name); !s.ok()) {
    ::shm_unlink(name.c_str());
    return s;
  }
  const size_t mapped = size == 0 ? 1 : size;
  if (::ftruncate(fd.get(), static_cast<off_t>(mapped)) != 0) {
    int err = errno;
    ::shm_unlink(name.c_str());
    return absl::ResourceExhaustedError(
        absl::StrCat("cannot size shared memory ", name, " to ", size, " bytes: ", ErrnoString(err)));
  }
  void* p = ::mmap(nullptr, mapped, PROT_READ | PROT_WRITE, MAP_SHARED, fd.get(), 0);
  if (p == MAP_FAILED) {
    int err = errno;
    ::shm_unlink(name.c_str());
    return absl::ResourceExhaustedError(
        absl::StrCat("cannot map ", size, " bytes of shared memory ", name, ": ", ErrnoString(err)));
  }
  return std::unique_ptr<ShmSegment>(
      new ShmSegment(name, size, static_cast<char*>(p), mapped, true));
}

absl::StatusOr<std::unique_ptr<ShmSegment>> ShmSegment::CreateSealed(
    const std::string& description, size_t size) {
  const size_t mapped = size == 0 ? 1 : size;
  absl::StatusOr<UniqueFd> fd = ipc::CreateSealedMemfd(description, mapped);
  if (!fd.ok()) return fd.status();
  void* p = ::mmap(nullptr, mapped, PROT_READ | PROT_WRITE, MAP_SHARED, fd->get(), 0);
  if (p == MAP_FAILED) {
    return absl::ResourceExhaustedError(absl::StrCat("cannot map ", size, " bytes of shared memory ",
                                                     description, ": ", ErrnoString(errno)));
  }
  std::unique_ptr<ShmSegment> segment(
      new ShmSegment(description, size, static_cast<char*>(p), mapped, false));
  segment->by_descriptor_ = true;
  segment->fd_ = *std::move(fd);
  return segment;
}

absl::StatusOr<std::unique_ptr<ShmSegment>> ShmSegment::CreatePrivate(
    const std::string& description, size_t size) {
  const size_t mapped = size == 0 ? 1 : size;
  void* p = ::mmap(nullptr, mapped, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) {
    return absl::ResourceExhaustedError(absl::StrCat("cannot map ", size, " bytes for ", description,
                                                     ": ", ErrnoString(errno)));
  }
  return std::unique_ptr<ShmSegment>(new ShmSegment(description, size, static_cast<char*>(p), mapped, false));
}

absl::StatusOr<std::unique_ptr<ShmSegment>> ShmSegment::MapFd(int fd, uint64_t offset,
                                                              uint64_t size,
                                                              const std::string& description) {
  const uint64_t page = static_cast<uint64_t>(::sysconf(_SC_PAGESIZE));
  if (size == 0) return absl::InvalidArgumentError("a registered range must not be empty");
  if (offset % page != 0) {
    return absl::InvalidArgumentError(absl::StrCat("offset ", offset,
                                                   " is not a multiple of the page size (", page,
                                                   " bytes)"));
  }
  struct stat st;
  if (::fstat(fd, &st) != 0) {
    return absl::InvalidArgumentError(absl::StrCat("fstat of the fd: ", ErrnoString(errno)));
  }
  if (!S_ISREG(st.st_mode)) {
    return absl::InvalidArgumentError(
        "the fd is not a regular file (pass a memfd or a file on tmpfs, not a socket, pipe or "
        "device)");
  }
  const int flags = ::fcntl(fd, F_GETFL);
  if (flags < 0 || (flags & O_ACCMODE) != O_RDWR) {
    return absl::PermissionDeniedError(
        "the fd is not open for reading and writing (the daemon writes results in place)");
  }
  const int seals = ::fcntl(fd, F_GET_SEALS);
  if (seals < 0 || (seals & F_SEAL_SHRINK) == 0) {
    return absl::FailedPreconditionError(absl::StrCat(
        "the fd is not sealed against shrinking (F_SEAL_SHRINK",
        seals < 0 ? ": the file cannot be sealed" : "",
        "); a file that shrank under the daemon's mapping would crash it, so only sealed files "
        "are mapped: pass a memfd made with MFD_ALLOW_SEALING (the SDK adds the seal)"));
  }
  int write_seals = F_SEAL_WRITE;
#ifdef F_SEAL_FUTURE_WRITE
  write_seals |= F_SEAL_FUTURE_WRITE;
#endif
  if ((seals & write_seals) != 0) {
    return absl::FailedPreconditionError(
        "the fd is sealed against writing (F_SEAL_WRITE); the daemon writes results in place");
  }
  if (offset > static_cast<uint64_t>(st.st_size) ||
      size > static_cast<uint64_t>(st.st_size) - offset) {
    return absl::InvalidArgumentError(absl::StrCat("the file has ", st.st_size,
                                                   " bytes; registering [", offset, ", +", size,
                                                   ") needs ", offset + size));
  }
  void* p =
      ::mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, static_cast<off_t>(offset));
  if (p == MAP_FAILED) {
    return absl::ResourceExhaustedError(
        absl::StrCat("cannot map ", size, " bytes of the fd: ", ErrnoString(errno)));
  }
  std::unique_ptr<ShmSegment> seg(
      new ShmSegment(description, size, static_cast<char*>(p), size, false));
  seg->client_memory_ = true;
  return seg;
}

uint64_t ShmSegment::NextSerial() {
  static std::atomic<uint64_t> next{1};
  return next.fetch_add(1, std::memory_order_relaxed);
}

ShmSegment::~ShmSegment() {
  ::munmap(data_, mapped_);
  if (created_) ::shm_unlink(name_.c_str());
}

int SweepStaleSegments() {
  DIR* d = ::opendir("/dev/shm");
  if (d == nullptr) return 0;
  int removed = 0;
  while (struct dirent* e = ::readdir(d)) {
    std::vector<std::string> parts = absl::StrSplit(e->d_name, '.');
    int pid = 0;
    if (parts.size() != 3 || parts[0] != "gradsync" || !absl::SimpleAtoi(parts[1], &pid) ||
        pid <= 0) {
      continue;
    }
    // Only segments untouched for a minute: in another pid namespace sharing
    // /dev/shm the pid may be alive (and the segment in use).
    const std::string path = absl::StrCat("/dev/shm/", e->d_name);
    struct stat st;
    if (::stat(path.c_str(), &st) != 0 || ::time(nullptr) - st.st_mtime < 60) continue;
    if (::kill(pid, 0) != 0 && errno == ESRCH) {
      if (::shm_unlink(absl::StrCat("/", e->d_name).c_str()) == 0) ++removed;
    }
  }
  ::closedir(d);
  return removed;
}

}  // namespace gradsync
