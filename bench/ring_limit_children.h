// gradsync-ring-limit's child processes (one per rank): reaping them by a
// deadline and saying how the ones that ended early ended.
#ifndef GRADSYNC_BENCH_RING_LIMIT_CHILDREN_H_
#define GRADSYNC_BENCH_RING_LIMIT_CHILDREN_H_

#include <errno.h>
#include <signal.h>
#include <sys/types.h>
#include <sys/wait.h>

#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "common/net.h"

namespace gradsync::bench {

struct Child {
  pid_t pid = -1;
  UniqueFd result;  // parent's end of the child's result socketpair
};

inline void KillAndReap(std::vector<Child>& children, absl::Time deadline) {
  // First let them finish on their own until the deadline, then SIGKILL.
  for (auto& c : children) {
    if (c.pid <= 0) continue;
    while (true) {
      int st = 0;
      pid_t r = ::waitpid(c.pid, &st, WNOHANG);
      if (r == c.pid || (r < 0 && errno != EINTR)) break;
      if (absl::Now() >= deadline) {
        ::kill(c.pid, SIGKILL);
        while (::waitpid(c.pid, &st, 0) < 0 && errno == EINTR) {}
        break;
      }
      absl::SleepFor(absl::Milliseconds(5));
    }
    c.pid = -1;
  }
}

inline std::string DescribeExits(std::vector<Child>& children) {
  std::string out;
  for (size_t r = 0; r < children.size(); ++r) {
    if (children[r].pid <= 0) continue;
    int st = 0;
    pid_t got = ::waitpid(children[r].pid, &st, WNOHANG);
    if (got == children[r].pid) {
      if (WIFEXITED(st)) absl::StrAppend(&out, " rank ", r, " exited ", WEXITSTATUS(st), ";");
      if (WIFSIGNALED(st)) absl::StrAppend(&out, " rank ", r, " killed by signal ", WTERMSIG(st), ";");
      children[r].pid = -1;
    }
  }
  return out;
}

}  // namespace gradsync::bench

#endif  // GRADSYNC_BENCH_RING_LIMIT_CHILDREN_H_
