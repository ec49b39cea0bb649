// A mapped POSIX shared-memory region (RAII): created by the daemon
// (shm_open O_CREAT|O_EXCL, mode 0600), opened by a client, or anonymous
// (MAP_SHARED|MAP_ANONYMOUS, shared with children across fork; for tests).
//
// Not synchronized; the bytes are the caller's business.
#ifndef GRADSYNC_IPC_SHARED_MEMORY_H_
#define GRADSYNC_IPC_SHARED_MEMORY_H_

#include <cstddef>
#include <memory>
#include <string>

#include "absl/status/statusor.h"

namespace gradsync {
namespace ipc {

class SharedMemory {
 public:
  // Creates and maps a zero-filled segment of `size` (> 0) bytes under
  // `name` ("/gradsync...."). AlreadyExists if the name is taken.
  static absl::StatusOr<std::unique_ptr<SharedMemory>> Create(const std::string& name, size_t size);
  // Opens and maps an existing segment read-write. Fails (FailedPrecondition)
  // if it is smaller than `size`.
  static absl::StatusOr<std::unique_ptr<SharedMemory>> Open(const std::string& name, size_t size);
  // An anonymous shared mapping (no name; survives fork).
  static absl::StatusOr<std::unique_ptr<SharedMemory>> Anonymous(size_t size);

  SharedMemory(const SharedMemory&) = delete;
  SharedMemory& operator=(const SharedMemory&) = delete;
  // Unmaps; a created segment is also unlinked if Unlink() was not called.
  ~SharedMemory();

  // Removes the name (the mapping stays valid). Idempotent; only for Create.
  void Unlink();

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
};

}  // namespace ipc
}  // namespace gradsync

#endif  // GRADSYNC_IPC_SHARED_MEMORY_H_
