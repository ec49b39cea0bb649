// Test helpers that look at another thread of this process through /proc, so
// a test can wait until that thread is really asleep in a blocking call
// (poll, futex) instead of sleeping for "long enough" and hoping it got there.
#ifndef GRADSYNC_COMMON_THREAD_TESTING_H_
#define GRADSYNC_COMMON_THREAD_TESTING_H_

#include <sys/syscall.h>
#include <sys/types.h>
#include <unistd.h>

#include <fstream>
#include <initializer_list>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"

namespace gradsync::testing {

// The calling thread's kernel thread id.
inline pid_t ThisThreadId() { return static_cast<pid_t>(::syscall(SYS_gettid)); }

// Whether thread `tid` of this process is asleep (state S in
// /proc/self/task/<tid>/stat) inside one of the system calls `nrs`
// (/proc/self/task/<tid>/syscall, e.g. SYS_poll or SYS_futex).
inline bool AsleepInSyscall(pid_t tid, std::initializer_list<long> nrs) {
  const std::string dir = absl::StrCat("/proc/self/task/", tid, "/");
  std::ifstream stat(dir + "stat");
  std::string line;
  if (!std::getline(stat, line)) return false;
  const size_t paren = line.rfind(')');  // the name may hold spaces and parentheses
  if (paren == std::string::npos || paren + 2 >= line.size() || line[paren + 2] != 'S') return false;
  std::ifstream syscall(dir + "syscall");
  long nr = -1;
  if (!(syscall >> nr)) return false;  // "running"
  for (long want : nrs) {
    if (nr == want) return true;
  }
  return false;
}

// Polls AsleepInSyscall every millisecond until it holds or `timeout` passes;
// returns whether it held.
inline bool WaitUntilAsleepInSyscall(pid_t tid, std::initializer_list<long> nrs,
                                     absl::Duration timeout = absl::Seconds(20)) {
  const absl::Time deadline = absl::Now() + timeout;
  while (!AsleepInSyscall(tid, nrs)) {
    if (absl::Now() >= deadline) return false;
    absl::SleepFor(absl::Milliseconds(1));
  }
  return true;
}

}  // namespace gradsync::testing

#endif  // GRADSYNC_COMMON_THREAD_TESTING_H_
