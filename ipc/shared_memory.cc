#include "ipc/shared_memory.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "absl/strings/str_cat.h"

namespace gradsync {
namespace ipc {
namespace {

std::string ErrnoText(int err) { return absl::StrCat(std::strerror(err), " (errno ", err, ")"); }

}  // namespace

absl::StatusOr<void*> MapSharedFile(int fd, size_t size, const std::string& name) {
  struct stat st;
  if (::fstat(fd, &st) != 0) {
    const int err = errno;
    return absl::InternalError(absl::StrCat("fstat of '", name, "': ", ErrnoText(err)));
  }
  if (static_cast<uint64_t>(st.st_size) < size) {
    return absl::FailedPreconditionError(absl::StrCat(
        "shared-memory segment '", name, "' has ", st.st_size, " bytes, expected ", size));
  }
  void* p = ::mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (p == MAP_FAILED) {
    const int err = errno;
    return absl::Status(absl::ErrnoToStatusCode(err),
                        absl::StrCat("cannot map shared-memory segment '", name, "' (", size,
                                     " bytes): ", ErrnoText(err)));
  }
  return p;
}

absl::StatusOr<UniqueFd> CreateSealedMemfd(const std::string& description, size_t size) {
  UniqueFd fd(::memfd_create(description.c_str(), MFD_CLOEXEC | MFD_ALLOW_SEALING));
  if (!fd.valid()) {
    const int err = errno;
    return absl::Status(absl::ErrnoToStatusCode(err),
                        absl::StrCat("memfd_create(", description, "): ", ErrnoText(err)));
  }
  if (::ftruncate(fd.get(), static_cast<off_t>(size)) != 0) {
    const int err = errno;
    return absl::ResourceExhaustedError(absl::StrCat("cannot size shared memory ", description,
                                                     " to ", size, " bytes: ", ErrnoText(err)));
  }
  if (::fcntl(fd.get(), F_ADD_SEALS, kSegmentSeals) != 0) {
    const int err = errno;
    return absl::InternalError(
        absl::StrCat("cannot seal shared memory ", description, ": ", ErrnoText(err)));
  }
  return fd;
}

absl::StatusOr<std::unique_ptr<SharedMemory>> SharedMemory::CreateSealed(
    const std::string& description, size_t size) {
  if (size == 0) return absl::InvalidArgumentError("shared memory of 0 bytes");
  absl::StatusOr<UniqueFd> fd = CreateSealedMemfd(description, size);
  if (!fd.ok()) return fd.status();
  absl::StatusOr<void*> p = MapSharedFile(fd->get(), size, description);
  if (!p.ok()) return p.status();
  std::unique_ptr<SharedMemory> mem(new SharedMemory(description, *p, size, /*owner=*/false));
  mem->fd_ = *std::move(fd);
  return mem;
}

absl::StatusOr<std::unique_ptr<SharedMemory>> SharedMemory::MapFd(int fd, size_t size,
                                                                  const std::string& description) {
  if (size == 0) return absl::InvalidArgumentError("shared memory of 0 bytes");
  absl::StatusOr<void*> p = MapSharedFile(fd, size, description);
  if (!p.ok()) return p.status();
  return std::unique_ptr<SharedMemory>(new SharedMemory(description, *p, size, /*owner=*/false));
}

absl::Status GiveSegmentTo(int fd, int64_t owner_uid, const std::string& name) {
  if (owner_uid < 0 || static_cast<uid_t>(owner_uid) == ::geteuid()) return absl::OkStatus();
  if (::fchown(fd, static_cast<uid_t>(owner_uid), static_cast<gid_t>(-1)) == 0) {
    return absl::OkStatus();
  }
  const int err = errno;
  return absl::PermissionDeniedError(absl::StrCat(
      "cannot give shared memory ", name, " to uid ", owner_uid, " (", ErrnoText(err),
      "): a gradsyncd that is not root serves other uids' buffers and op queues only by "
      "descriptor (its fd socket)"));
}

absl::StatusOr<std::unique_ptr<SharedMemory>> SharedMemory::Create(const std::string& name,
                                                                   size_t size, int64_t owner_uid) {
  if (size == 0) return absl::InvalidArgumentError("shared memory of 0 bytes");
  const int fd = ::shm_open(name.c_str(), O_CREAT | O_EXCL | O_RDWR | O_CLOEXEC, 0600);
  if (fd < 0) {
    const int err = errno;
    return absl::Status(absl::ErrnoToStatusCode(err),
                        absl::StrCat("shm_open(", name, ", O_CREAT|O_EXCL): ", ErrnoText(err)));
  }
  if (absl::Status s = GiveSegmentTo(fd, owner_uid, name); !s.ok()) {
    ::close(fd);
    ::shm_unlink(name.c_str());
    return s;
  }
  if (::ftruncate(fd, static_cast<off_t>(size)) != 0) {
    const int err = errno;
    ::close(fd);
    ::shm_unlink(name.c_str());
    return absl::ResourceExhaustedError(
        absl::StrCat("cannot size shared memory ", name, " to ", size, " bytes: ", ErrnoText(err)));
  }
  void* p = ::mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  const int err = errno;
  ::close(fd);
  if (p == MAP_FAILED) {
    ::shm_unlink(name.c_str());
    return absl::ResourceExhaustedError(
        absl::StrCat("cannot map ", size, " bytes of shared memory ", name, ": ", ErrnoText(err)));
  }
  return std::unique_ptr<SharedMemory>(new SharedMemory(name, p, size, /*owner=*/true));
}

absl::StatusOr<std::unique_ptr<SharedMemory>> SharedMemory::Open(const std::string& name,
                                                                 size_t size) {
  if (size == 0) return absl::InvalidArgumentError("shared memory of 0 bytes");
  const int fd = ::shm_open(name.c_str(), O_RDWR | O_CLOEXEC, 0);
  if (fd < 0) {
    const int err = errno;
    return absl::Status(absl::ErrnoToStatusCode(err),
                        absl::StrCat("cannot open shared-memory segment '", name,
                                     "': ", ErrnoText(err)));
  }
  absl::StatusOr<void*> p = MapSharedFile(fd, size, name);
  ::close(fd);
  if (!p.ok()) return p.status();
  return std::unique_ptr<SharedMemory>(new SharedMemory(name, *p, size, /*owner=*/false));
}

absl::StatusOr<std::unique_ptr<SharedMemory>> SharedMemory::Anonymous(size_t size) {
  if (size == 0) return absl::InvalidArgumentError("shared memory of 0 bytes");
  void* p = ::mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) {
    const int err = errno;
    return absl::ResourceExhaustedError(
        absl::StrCat("cannot map ", size, " bytes of anonymous shared memory: ", ErrnoText(err)));
  }
  return std::unique_ptr<SharedMemory>(new SharedMemory("", p, size, /*owner=*/false));
}

void SharedMemory::Unlink() {
  if (!unlink_on_close_) return;
  unlink_on_close_ = false;
  ::shm_unlink(name_.c_str());
}

SharedMemory::~SharedMemory() {
  ::munmap(data_, size_);
  Unlink();
}

}  // namespace ipc
}  // namespace gradsync
