// The current time without absl::Now()'s shared state.
//
// absl::Now() (Debian's Abseil 20220623) keeps one process-wide time sample
// behind a SpinLock; several threads polling in a loop (each rank's client
// waiting for an 8-byte op, the daemon's spinning threads) contend on it:
// in a 4-rank node-local `gradsync bench --blocking` profile its SpinLoop
// was the largest single entry (13% of the CPU). clock_gettime through the
// vDSO reads the kernel's clock with no lock and no system call. Use this on
// paths that run per op or per poll; absl::Now() elsewhere.
#ifndef GRADSYNC_COMMON_CLOCK_H_
#define GRADSYNC_COMMON_CLOCK_H_

#include <time.h>

#include "absl/time/time.h"

namespace gradsync {

inline absl::Time FastNow() {
  struct timespec ts;
  ::clock_gettime(CLOCK_REALTIME, &ts);
  return absl::TimeFromTimespec(ts);
}

}  // namespace gradsync

#endif  // GRADSYNC_COMMON_CLOCK_H_
