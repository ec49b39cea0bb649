// Notices at once that a local client process exited, so its session closes
// then (failing its job's pending op on every rank) instead of at the end of
// its lease.
//
// The signal is a pidfd (pidfd_open(2)) of the pid the client socket read
// with SO_PEERCRED when the session was opened: it becomes readable the
// moment the process exits, SIGKILL included, whatever its gRPC connection,
// fd-socket requests and shared-memory op queue were doing. A client's gRPC
// connection is no such signal: the channel may reconnect, or be shared by
// several sessions, while the process lives on.
//
// One thread ("gs-client-watch") waits on every watched pidfd (epoll).
// Thread-safe. `on_exit` runs on that thread, once per watched session whose
// process exited, with no lock of this class held; it may call Watch and
// Unwatch. No call of it starts after the destructor returns.
#ifndef GRADSYNC_WORKER_CLIENT_WATCH_H_
#define GRADSYNC_WORKER_CLIENT_WATCH_H_

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "common/net.h"

namespace gradsync {

class ClientWatch {
 public:
  using OnExit = std::function<void(const std::string& session_id, int64_t pid)>;

  // Internal when epoll or the eventfd cannot be made.
  static absl::StatusOr<std::unique_ptr<ClientWatch>> Start(OnExit on_exit);
  ~ClientWatch();  // stops and joins the thread (never call it from on_exit)
  ClientWatch(const ClientWatch&) = delete;
  ClientWatch& operator=(const ClientWatch&) = delete;

  // Watches process `pid` for `session_id` (one process per session; a
  // second call replaces the first). NotFound if the process has already
  // exited (the caller closes the session itself); Unimplemented on a kernel
  // without pidfd_open (before 5.3); InvalidArgument for pid <= 0.
  absl::Status Watch(const std::string& session_id, int64_t pid);
  // Stops watching for `session_id` (closed by other means). No-op if not
  // watched.
  void Unwatch(const std::string& session_id);
  size_t watched() const;

 private:
  ClientWatch(UniqueFd epoll, UniqueFd stop, OnExit on_exit);
  void Loop();
  void UnwatchLocked(const std::string& session_id) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  struct Entry {
    std::string session_id;
    int64_t pid = 0;
    UniqueFd pidfd;
  };
  const UniqueFd epoll_;
  const UniqueFd stop_;  // eventfd: ends Loop
  const OnExit on_exit_;
  mutable absl::Mutex mu_;
  // By key (the epoll cookie; never reused, so a late event of an entry that
  // was unwatched finds nothing).
  std::map<uint64_t, Entry> entries_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, uint64_t> key_of_ ABSL_GUARDED_BY(mu_);
  uint64_t next_key_ ABSL_GUARDED_BY(mu_) = 1;
  std::thread thread_;
};

}  // namespace gradsync

#endif  // GRADSYNC_WORKER_CLIENT_WATCH_H_
