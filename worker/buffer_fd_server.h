// gradsyncd's fd socket: where local clients register memory they already
// hold by passing its file descriptor (ipc/fd_registration.h).
//
// One thread serves the socket, one connection at a time: a registration is
// one message each way, and a connection that has not sent its request
// within kRequestTimeout is dropped, so a silent client holds the socket for
// at most that long. Refusals are logged with the peer's pid and uid and
// counted; the daemon goes on serving.
#ifndef GRADSYNC_WORKER_BUFFER_FD_SERVER_H_
#define GRADSYNC_WORKER_BUFFER_FD_SERVER_H_

#include <sys/socket.h>

#include <functional>
#include <memory>
#include <string>
#include <thread>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/net.h"
#include "ipc/fd_registration.h"
#include "worker/daemon_observer.h"
#include "worker/session.h"

namespace gradsync {

class BufferFdServer {
 public:
  // Registers the memory behind `fd` for the request's session.
  using Handler = std::function<absl::StatusOr<BufferInfo>(const ipc::RegisterRequest& request,
                                                           int fd, const ucred& peer)>;
  static constexpr absl::Duration kRequestTimeout = absl::Seconds(1);

  // Listens on `address` ("unix:PATH", mode 0660, or "unix-abstract:NAME").
  // `observer` (may be null; outlives the server) hears every result.
  static absl::StatusOr<std::unique_ptr<BufferFdServer>> Start(const std::string& address,
                                                               Handler handler,
                                                               DaemonObserver* observer);
  ~BufferFdServer();  // stops the thread, removes a path socket

  const std::string& address() const { return address_.text; }

  // The fd socket gradsyncd derives from its client address: "unix:P" ->
  // "unix:P.fd", "unix-abstract:N" -> "unix-abstract:N.fd"; "" for a TCP
  // address (clients of a TCP address may be on another node).
  static std::string DefaultAddress(const std::string& listen);

 private:
  BufferFdServer(ipc::UnixAddress address, UniqueFd listener, UniqueFd wake, Handler handler,
                 DaemonObserver* observer);
  void Loop();
  void Serve(int conn);

  const ipc::UnixAddress address_;
  const UniqueFd listener_;
  const UniqueFd wake_;  // eventfd: stop
  const Handler handler_;
  DaemonObserver* const observer_;
  std::thread thread_;
};

}  // namespace gradsync

#endif  // GRADSYNC_WORKER_BUFFER_FD_SERVER_H_
