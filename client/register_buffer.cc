// Session::RegisterBuffer: client memory handed to the daemon by descriptor.
#include <errno.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cstring>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "client/client.h"
#include "client/malloc_mapping.h"
#include "client/op_channel.h"
#include "common/net.h"
#include "common/status_macros.h"
#include "ipc/fd_registration.h"
#include "proto/worker.grpc.pb.h"

namespace gradsync {
namespace client {
namespace {

constexpr absl::Duration kRegisterTimeout = absl::Seconds(10);

// Adds F_SEAL_SHRINK unless the file has it already.
absl::Status SealAgainstShrinking(int fd) {
  const int seals = ::fcntl(fd, F_GET_SEALS);
  if (seals >= 0 && (seals & F_SEAL_SHRINK) != 0) return absl::OkStatus();
  if (seals >= 0 && ::fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK) == 0) return absl::OkStatus();
  const int err = errno;
  return absl::FailedPreconditionError(absl::StrCat(
      "RegisterBuffer: cannot seal fd ", fd, " against shrinking (", ErrnoString(err),
      "); the daemon maps only files that cannot shrink under it: register a memfd made with "
      "memfd_create(name, MFD_ALLOW_SEALING) whose seals are not locked (F_SEAL_SEAL)"));
}

}  // namespace

absl::StatusOr<std::unique_ptr<Buffer>> Session::RegisterBuffer(int fd, size_t bytes,
                                                                uint64_t offset) {
  RETURN_IF_ERROR(CheckOpen());
  if (bytes == 0) return absl::InvalidArgumentError("RegisterBuffer: bytes must be > 0, got 0");
  if (fd < 0) return absl::InvalidArgumentError(absl::StrCat("RegisterBuffer: bad fd ", fd));
  const uint64_t page = static_cast<uint64_t>(::sysconf(_SC_PAGESIZE));
  if (offset % page != 0) {
    return absl::InvalidArgumentError(absl::StrCat("RegisterBuffer: offset ", offset,
                                                   " is not a multiple of the page size (", page,
                                                   " bytes)"));
  }
  if (job_.fd_socket.empty()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "RegisterBuffer: gradsyncd at ", conn_->target,
        " has no fd socket (it serves clients over TCP, or runs with --fd_socket=''); "
        "registering memory needs the client on the daemon's node, talking to it over a unix "
        "socket"));
  }
  RETURN_IF_ERROR(SealAgainstShrinking(fd));
  void* data = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd,
                      static_cast<off_t>(offset));
  if (data == MAP_FAILED) {
    const int err = errno;
    return absl::Status(absl::ErrnoToStatusCode(err),
                        absl::StrCat("RegisterBuffer: cannot map [", offset, ", +", bytes,
                                     ") of fd ", fd, ": ", ErrnoString(err)));
  }
  ipc::RegisterRequest request;
  request.session_id = id_;
  request.token = job_.registration_token;
  request.offset = offset;
  request.size = bytes;
  absl::StatusOr<ipc::RegisterResponse> response =
      ipc::RegisterFd(job_.fd_socket, request, fd, absl::Now() + kRegisterTimeout);
  absl::Status error = response.ok() ? response->status : response.status();
  if (error.ok() && response->size != bytes) {
    error = absl::InternalError(absl::StrCat("gradsyncd registered ", response->size,
                                             " bytes of a ", bytes, "-byte request"));
  }
  if (!error.ok()) {
    ::munmap(data, bytes);
    return absl::Status(error.code(), absl::StrCat("RegisterBuffer: ", error.message()));
  }
  return std::unique_ptr<Buffer>(
      new Buffer(id_, response->buffer_id, absl::StrCat("fd ", fd), data, bytes));
}

absl::StatusOr<std::unique_ptr<Buffer>> Session::AdoptMemory(void* ptr, size_t bytes,
                                                             size_t* offset) {
  RETURN_IF_ERROR(CheckOpen());
  if (offset == nullptr) return absl::InvalidArgumentError("AdoptMemory: offset is null");
  ASSIGN_OR_RETURN(const MallocMapping m, MallocMappingOf(ptr, bytes));
  const int fd = ::memfd_create("gradsync-adopted", MFD_CLOEXEC | MFD_ALLOW_SEALING);
  if (fd < 0) {
    const int err = errno;
    return absl::Status(absl::ErrnoToStatusCode(err),
                        absl::StrCat("AdoptMemory: memfd_create: ", ErrnoString(err)));
  }
  // The allocation's bytes into the file, then the file registered, then its
  // pages mapped over the allocation's (MAP_FIXED replaces them atomically).
  absl::Status s;
  if (::ftruncate(fd, static_cast<off_t>(m.length)) != 0) {
    const int err = errno;
    s = absl::Status(absl::ErrnoToStatusCode(err), absl::StrCat("AdoptMemory: ftruncate: ",
                                                                ErrnoString(err)));
  }
  for (size_t done = 0; s.ok() && done < m.length;) {
    const ssize_t n = ::pwrite(fd, m.start + done, m.length - done, static_cast<off_t>(done));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      const int err = n < 0 ? errno : EIO;
      s = absl::Status(absl::ErrnoToStatusCode(err),
                       absl::StrCat("AdoptMemory: copying the allocation into its memfd: ",
                                    ErrnoString(err)));
      break;
    }
    done += static_cast<size_t>(n);
  }
  absl::StatusOr<std::unique_ptr<Buffer>> buffer =
      s.ok() ? RegisterBuffer(fd, m.length, 0) : absl::StatusOr<std::unique_ptr<Buffer>>(s);
  if (buffer.ok()) {
    void* at = ::mmap(m.start, m.length, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_FIXED, fd, 0);
    if (at != m.start) {
      const int err = errno;
      FreeBuffer(std::move(*buffer)).IgnoreError();
      buffer = absl::Status(absl::ErrnoToStatusCode(err),
                            absl::StrCat("AdoptMemory: cannot map the memfd over the allocation: ",
                                         ErrnoString(err)));
    }
  }
  ::close(fd);  // the mappings (this process's two, the daemon's) keep the file
  if (buffer.ok()) *offset = static_cast<size_t>(static_cast<char*>(ptr) - m.start);
  return buffer;
}

}  // namespace client
}  // namespace gradsync
