// Shared memory the daemon and a client both map: a sealed memfd the daemon
// created and hands to the client by descriptor (AllocateBuffer on a daemon
// with an fd socket), a named POSIX segment the daemon created (a daemon
// without one), or a range of a file the client passed by descriptor
// (RegisterFd, ipc/fd_registration.h).
#ifndef GRADSYNC_WORKER_SHM_SEGMENT_H_
#define GRADSYNC_WORKER_SHM_SEGMENT_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "common/net.h"

namespace gradsync {

class ShmSegment {
 public:
  // Creates (O_EXCL) and maps a segment of `size` bytes (at least one page is
  // mapped for size 0). Names look like "/gradsync.<pid>.<nonce>-<n>".
  // The file belongs to `owner_uid` (ipc::GiveSegmentTo; -1: to us).
  static absl::StatusOr<std::unique_ptr<ShmSegment>> Create(const std::string& name, size_t size,
                                                            int64_t owner_uid = -1);
  // Creates and maps a memfd of `size` bytes sealed against any size change
  // (ipc::kSegmentSeals), so the client it is handed to cannot make the
  // daemon's mapping fault. Its descriptor waits for TakeFd.
  static absl::StatusOr<std::unique_ptr<ShmSegment>> CreateSealed(const std::string& description,
                                                                  size_t size);
  // Maps `size` bytes of private anonymous memory that only the daemon sees
  // (the host side of a device buffer, worker/device_memory.h).
  static absl::StatusOr<std::unique_ptr<ShmSegment>> CreatePrivate(const std::string& description,
                                                                   size_t size);
  // Maps [offset, offset+size) of the file behind `fd` (a client's memfd),
  // after checking that it can be shared safely: a regular file opened
  // read-write, sealed against shrinking (F_SEAL_SHRINK: a file that shrank
  // under the mapping would fault the daemon with SIGBUS), at least
  // offset+size bytes long, `offset` page-aligned. The errors name the check
  // that failed. `description` names it in logs and status ("fd of pid 42").
  static absl::StatusOr<std::unique_ptr<ShmSegment>> MapFd(int fd, uint64_t offset, uint64_t size,
                                                           const std::string& description);
  ~ShmSegment();  // unmaps, and unlinks a segment it created

  const std::string& name() const { return name_; }
  size_t size() const { return size_; }
  char* data() const { return data_; }
  // A CreateSealed segment's descriptor, once (then invalid).
  UniqueFd TakeFd() { return std::move(fd_); }
  // Whether the client gets this segment by descriptor (CreateSealed).
  bool by_descriptor() const { return by_descriptor_; }
  bool holds_fd() const { return fd_.valid(); }
  // Whether this is the client's own memory (MapFd: a registered descriptor,
  // e.g. a tensor's storage the PyTorch backend adopted), whose contents keep
  // one identity while it is registered, unlike a buffer the daemon
  // allocated, which a client may reuse for anything (a staging pool).
  bool client_memory() const { return client_memory_; }
  // Unique among this process's segments, never reused.
  uint64_t serial() const { return serial_; }

 private:
  ShmSegment(std::string name, size_t size, char* data, size_t mapped, bool created)
      : name_(std::move(name)), size_(size), data_(data), mapped_(mapped), created_(created),
        serial_(NextSerial()) {}
  static uint64_t NextSerial();
  std::string name_;
  size_t size_;
  char* data_;
  size_t mapped_;
  bool created_;  // shm_open'ed here: unlinked with the mapping
  bool by_descriptor_ = false;
  bool client_memory_ = false;
  const uint64_t serial_;
  UniqueFd fd_;  // CreateSealed: until TakeFd
};

// Unlinks /dev/shm/gradsync.<pid>.* segments whose pid is no longer alive and
// that are untouched for a minute (left behind by a SIGKILLed daemon).
int SweepStaleSegments();

}  // namespace gradsync

#endif  // GRADSYNC_WORKER_SHM_SEGMENT_H_
