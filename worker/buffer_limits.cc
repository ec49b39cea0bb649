#include "worker/buffer_limits.h"

#include <sys/statvfs.h>
#include <unistd.h>

#include <algorithm>

namespace gradsync {

uint64_t MachineBufferMemory() {
  const uint64_t physical = static_cast<uint64_t>(::sysconf(_SC_PHYS_PAGES)) *
                            static_cast<uint64_t>(::sysconf(_SC_PAGESIZE));
  struct statvfs shm {};
  if (::statvfs("/dev/shm", &shm) != 0 || shm.f_blocks == 0) return physical;
  return std::min(physical, static_cast<uint64_t>(shm.f_blocks) * shm.f_frsize);
}

BufferLimits DefaultBufferLimits(uint64_t machine) {
  BufferLimits l;
  l.session = machine / 2;
  l.account = machine / 2;
  l.total = machine / 4 * 3;
  return l;
}

}  // namespace gradsync
