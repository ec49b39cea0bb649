// POSIX shared-memory segment owned by the daemon and mapped by a client.
#ifndef GRADSYNC_WORKER_SHM_SEGMENT_H_
#define GRADSYNC_WORKER_SHM_SEGMENT_H_

#include <cstddef>
#include <memory>
#include <string>

#include "absl/status/statusor.h"

namespace gradsync {

class ShmSegment {
 public:
  // Creates (O_EXCL) and maps a segment of `size` bytes (at least one page is
  // mapped for size 0). Names look like "/gradsync.<pid>.<nonce>-<n>".
  static absl::StatusOr<std::unique_ptr<ShmSegment>> Create(const std::string& name, size_t size);
  ~ShmSegment();  // unmaps and unlinks

  const std::string& name() const { return name_; }
  size_t size() const { return size_; }
  char* data() const { return data_; }

 private:
  ShmSegment(std::string name, size_t size, char* data, size_t mapped)
      : name_(std::move(name)), size_(size), data_(data), mapped_(mapped) {}
  std::string name_;
  size_t size_;
  char* data_;
  size_t mapped_;
};

// Unlinks /dev/shm/gradsync.<pid>.* segments whose pid is no longer alive and
// that are untouched for a minute (left behind by a SIGKILLed daemon).
int SweepStaleSegments();

}  // namespace gradsync

#endif  // GRADSYNC_WORKER_SHM_SEGMENT_H_
