// gradsyncd's default bounds on client buffer memory, sized from the
// machine: buffers are shared memory (memfds, or named /dev/shm segments
// without the fd socket), so what the node can back is the smaller of its
// physical memory and /dev/shm's size.
#ifndef GRADSYNC_WORKER_BUFFER_LIMITS_H_
#define GRADSYNC_WORKER_BUFFER_LIMITS_H_

#include <cstdint>

namespace gradsync {

// min(physical memory, size of /dev/shm); physical memory if /dev/shm
// cannot be read.
uint64_t MachineBufferMemory();

struct BufferLimits {
  uint64_t session = 0;  // one session
  uint64_t account = 0;  // one tenant, or one uid without tenants
  uint64_t total = 0;    // every session of the daemon together
};

// The defaults for `machine` bytes: a session and an account half of it,
// all sessions together three quarters.
BufferLimits DefaultBufferLimits(uint64_t machine);

}  // namespace gradsync

#endif  // GRADSYNC_WORKER_BUFFER_LIMITS_H_
