#include "worker/shm_segment.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/stat.h>

#include <ctime>
#include <unistd.h>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "common/net.h"

namespace gradsync {

absl::StatusOr<std::unique_ptr<ShmSegment>> ShmSegment::Create(const std::string& name,
                                                               size_t size) {
  UniqueFd fd(::shm_open(name.c_str(), O_CREAT | O_EXCL | O_RDWR | O_CLOEXEC, 0600));
  if (!fd.valid()) {
    return absl::InternalError(absl::StrCat("shm_open(", name, "): ", ErrnoString(errno)));
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
  return std::unique_ptr<ShmSegment>(new ShmSegment(name, size, static_cast<char*>(p), mapped));
}

ShmSegment::~ShmSegment() {
  ::munmap(data_, mapped_);
  ::shm_unlink(name_.c_str());
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
