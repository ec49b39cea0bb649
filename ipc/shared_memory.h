// A mapped shared-memory region (RAII): a sealed memfd the daemon made and
// hands to one client by descriptor (CreateSealed / MapFd), a named POSIX
// segment (shm_open O_CREAT|O_EXCL, mode 0600; for daemons without an fd
// socket), or anonymous (MAP_SHARED|MAP_ANONYMOUS, shared with children
// across fork; for tests).
//
// Not synchronized; the bytes are the caller's business.
#ifndef GRADSYNC_IPC_SHARED_MEMORY_H_
#define GRADSYNC_IPC_SHARED_MEMORY_H_

#include <fcntl.h>

#include <cstddef>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "common/net.h"

namespace gradsync {
namespace ipc {

// The seals of a daemon-made memfd: its size is fixed (a file that shrank
// under a mapping would fault whoever touches the lost pages with SIGBUS; a
// client must not be able to do that to the daemon), and no seal can be
// added later (F_SEAL_SEAL).
inline constexpr int kSegmentSeals = F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL;

// A zero-filled memfd of `size` bytes (close-on-exec) sealed with
// kSegmentSeals. `description` names it in /proc/PID/fd and errors.
absl::StatusOr<UniqueFd> CreateSealedMemfd(const std::string& description, size_t size);

// Maps `size` bytes of the file behind `fd` read-write and shared, after
// checking the file holds them (FailedPrecondition naming `name` if not).
// The caller unmaps; `fd` stays the caller's.
absl::StatusOr<void*> MapSharedFile(int fd, size_t size, const std::string& name);

// Makes a named segment (mode 0600) the file of `owner_uid`, so only that
// uid (and root) can open it. No-op for owner_uid < 0 or our own euid;
// PERMISSION_DENIED naming the segment and the uid when we may not chown
// (a daemon that does not run as root can serve other uids only through
// descriptors).
absl::Status GiveSegmentTo(int fd, int64_t owner_uid, const std::string& name);

class SharedMemory {
 public:
  // Creates and maps a zero-filled segment of `size` (> 0) bytes under
  // `name` ("/gradsync...."), owned by `owner_uid` (GiveSegmentTo).
  // AlreadyExists if the name is taken.
  static absl::StatusOr<std::unique_ptr<SharedMemory>> Create(const std::string& name, size_t size,
                                                              int64_t owner_uid = -1);
  // Opens and maps an existing segment read-write. Fails (FailedPrecondition)
  // if it is smaller than `size`.
  static absl::StatusOr<std::unique_ptr<SharedMemory>> Open(const std::string& name, size_t size);
  // Creates and maps a sealed memfd (CreateSealedMemfd) and keeps its
  // descriptor for TakeFd.
  static absl::StatusOr<std::unique_ptr<SharedMemory>> CreateSealed(const std::string& description,
                                                                    size_t size);
  // Maps `size` bytes of the file behind `fd` (a descriptor fetched from the
  // daemon) read-write; FailedPrecondition if it is smaller. `fd` stays the
  // caller's.
  static absl::StatusOr<std::unique_ptr<SharedMemory>> MapFd(int fd, size_t size,
                                                             const std::string& description);
  // An anonymous shared mapping (no name; survives fork).
  static absl::StatusOr<std::unique_ptr<SharedMemory>> Anonymous(size_t size);

  SharedMemory(const SharedMemory&) = delete;
  SharedMemory& operator=(const SharedMemory&) = delete;
  // Unmaps; a created segment is also unlinked if Unlink() was not called.
  ~SharedMemory();

  // Removes the name (the mapping stays valid). Idempotent; only for Create.
  void Unlink();

  // The descriptor of a CreateSealed segment, handed out once (to the client
  // over the fd socket); invalid for the other kinds and afterwards.
  UniqueFd TakeFd() { return std::move(fd_); }

  void* data() const { return data_; }
  size_t size() const { return size_; }
  const std::string& name() const { return name_; }

 private:
  SharedMemory(std::string name, void* data, size_t size, bool owner)
      : name_(std::move(name)), data_(data), size_(size), unlink_on_close_(owner) {}

  const std::string name_;
  void* const data_;
  const size_t size_;
  bool unlink_on_close_;
  UniqueFd fd_;  // CreateSealed: until TakeFd
};

}  // namespace ipc
}  // namespace gradsync

#endif  // GRADSYNC_IPC_SHARED_MEMORY_H_
