#include "worker/client_watch.h"

#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cerrno>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/logging.h"
#include "common/process.h"

namespace gradsync {
namespace {

constexpr uint64_t kStopKey = 0;  // the stop eventfd's cookie; entries start at 1

int PidfdOpen(int64_t pid) {
#ifdef SYS_pidfd_open
  return static_cast<int>(::syscall(SYS_pidfd_open, static_cast<pid_t>(pid), 0));
#else
  errno = ENOSYS;
  return -1;
#endif
}

}  // namespace

absl::StatusOr<std::unique_ptr<ClientWatch>> ClientWatch::Start(OnExit on_exit) {
  UniqueFd epoll(::epoll_create1(EPOLL_CLOEXEC));
  if (!epoll.valid()) return absl::InternalError("epoll_create1: " + ErrnoString(errno));
  UniqueFd stop(::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK));
  if (!stop.valid()) return absl::InternalError("eventfd: " + ErrnoString(errno));
  epoll_event ev{};
  ev.events = EPOLLIN;
  ev.data.u64 = kStopKey;
  if (::epoll_ctl(epoll.get(), EPOLL_CTL_ADD, stop.get(), &ev) != 0) {
    return absl::InternalError("epoll_ctl: " + ErrnoString(errno));
  }
  std::unique_ptr<ClientWatch> w(new ClientWatch(std::move(epoll), std::move(stop), std::move(on_exit)));
  w->thread_ = std::thread([p = w.get()] { p->Loop(); });
  NameThread(w->thread_, "gs-client-watch");
  return w;
}

ClientWatch::ClientWatch(UniqueFd epoll, UniqueFd stop, OnExit on_exit)
    : epoll_(std::move(epoll)), stop_(std::move(stop)), on_exit_(std::move(on_exit)) {}

ClientWatch::~ClientWatch() {
  const uint64_t one = 1;
  (void)!::write(stop_.get(), &one, sizeof(one));
  if (thread_.joinable()) thread_.join();
}

absl::Status ClientWatch::Watch(const std::string& session_id, int64_t pid) {
  if (pid <= 0) return absl::InvalidArgumentError(absl::StrCat("client pid ", pid));
  UniqueFd pidfd(PidfdOpen(pid));
  if (!pidfd.valid()) {
    if (errno == ESRCH) {
      return absl::NotFoundError(absl::StrCat("client pid ", pid, " has already exited"));
    }
    if (errno == ENOSYS) {
      return absl::UnimplementedError("pidfd_open: the kernel has none (Linux 5.3 or later)");
    }
    return absl::InternalError(absl::StrCat("pidfd_open(", pid, "): ", ErrnoString(errno)));
  }
  absl::MutexLock l(&mu_);
  UnwatchLocked(session_id);
  const uint64_t key = next_key_++;
  epoll_event ev{};
  ev.events = EPOLLIN;
  ev.data.u64 = key;
  if (::epoll_ctl(epoll_.get(), EPOLL_CTL_ADD, pidfd.get(), &ev) != 0) {
    return absl::InternalError(absl::StrCat("epoll_ctl(pidfd of ", pid, "): ", ErrnoString(errno)));
  }
  entries_[key] = Entry{session_id, pid, std::move(pidfd)};
  key_of_[session_id] = key;
  return absl::OkStatus();
}

void ClientWatch::Unwatch(const std::string& session_id) {
  absl::MutexLock l(&mu_);
  UnwatchLocked(session_id);
}

void ClientWatch::UnwatchLocked(const std::string& session_id) {
  auto k = key_of_.find(session_id);
  if (k == key_of_.end()) return;
  auto e = entries_.find(k->second);
  (void)::epoll_ctl(epoll_.get(), EPOLL_CTL_DEL, e->second.pidfd.get(), nullptr);
  entries_.erase(e);
  key_of_.erase(k);
}

size_t ClientWatch::watched() const {
  absl::MutexLock l(&mu_);
  return entries_.size();
}

void ClientWatch::Loop() {
  epoll_event events[16];
  while (true) {
    const int n = ::epoll_wait(epoll_.get(), events, 16, -1);
    if (n < 0) {
      if (errno == EINTR) continue;
      GS_LOG(ERROR) << "client watch: epoll_wait: " << ErrnoString(errno);
      return;
    }
    std::vector<std::pair<std::string, int64_t>> exited;
    {
      absl::MutexLock l(&mu_);
      for (int i = 0; i < n; ++i) {
        if (events[i].data.u64 == kStopKey) return;
        auto e = entries_.find(events[i].data.u64);
        if (e == entries_.end()) continue;  // unwatched meanwhile
        const std::string session_id = e->second.session_id;
        exited.emplace_back(session_id, e->second.pid);
        UnwatchLocked(session_id);
      }
    }
    for (const auto& [session_id, pid] : exited) on_exit_(session_id, pid);
  }
}

}  // namespace gradsync
