// gradsyncd's fd socket: where local clients register memory they already
// hold by passing its file descriptor, and fetch the descriptors of the
// sealed segments (buffers, op queue) the daemon made for their session
// (ipc/fd_registration.h).
//
// One thread serves the socket: a registration is one message each way. It
// polls every connection that has not sent its request yet and answers each
// as its request arrives, so a silent connection delays nobody else; it is
// dropped after kRequestTimeout. One uid holds at most kMaxConnectionsPerUid
// such connections and all uids kMaxConnections; a connection beyond either,
// once the held connections whose request has arrived are served, is closed
// at once. Refusals are logged with the peer's pid and uid and
// counted; the daemon goes on serving.
#ifndef GRADSYNC_WORKER_BUFFER_FD_SERVER_H_
#define GRADSYNC_WORKER_BUFFER_FD_SERVER_H_

#include <sys/socket.h>
#include <sys/types.h>

#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/connection_limits.h"
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
  // Hands out the descriptor of the segment a fetch names.
  using FetchHandler =
      std::function<absl::StatusOr<ipc::FetchedSegment>(const ipc::FetchRequest& request,
                                                        const ucred& peer)>;
  static constexpr absl::Duration kRequestTimeout = absl::Seconds(1);
  static constexpr int kMaxConnectionsPerUid = 16;
  static constexpr int kMaxConnections = 512;

  // Listens on `address` ("unix:PATH", mode 0660 and, with `group`, in that
  // group; or "unix-abstract:NAME", which refuses a group:
  // worker/socket_group.h). `observer` (may be null; outlives the server)
  // hears every result.
  static absl::StatusOr<std::unique_ptr<BufferFdServer>> Start(const std::string& address,
                                                               const std::string& group,
                                                               Handler handler,
                                                               FetchHandler fetch,
                                                               DaemonObserver* observer);
  ~BufferFdServer();  // stops the thread, removes a path socket

  const std::string& address() const { return address_.text; }

  // The fd socket gradsyncd derives from its client address: "unix:P" ->
  // "unix:P.fd", "unix-abstract:N" -> "unix-abstract:N.fd"; "" for a TCP
  // address (clients of a TCP address may be on another node).
  static std::string DefaultAddress(const std::string& listen);

 private:
  BufferFdServer(ipc::UnixAddress address, UniqueFd listener, UniqueFd wake, Handler handler,
                 FetchHandler fetch, DaemonObserver* observer);
  // An accepted connection waiting for its request.
  struct Pending {
    UniqueFd conn;
    ucred peer;
    absl::Time deadline;
  };
  void Loop();
  void Accept(std::vector<Pending>* pending);
  // Serves (and drops) every pending connection whose request has arrived
  // or that hung up; returns how many.
  int ServeArrived(std::vector<Pending>* pending);
  void Serve(int conn, const ucred& peer, absl::Time deadline);
  void ServeRegistration(int conn, absl::string_view bytes, UniqueFd fd, const ucred& peer);
  void ServeFetch(int conn, absl::string_view bytes, bool carried_fd, const ucred& peer);

  const ipc::UnixAddress address_;
  const UniqueFd listener_;
  const UniqueFd wake_;  // eventfd: stop
  const Handler handler_;
  const FetchHandler fetch_;
  DaemonObserver* const observer_;
  ino_t inode_ = 0;  // of the socket file bound at a path
  ConnectionLimits limits_{kMaxConnectionsPerUid, kMaxConnections};  // by uid; Loop's only
  std::thread thread_;
};

}  // namespace gradsync

#endif  // GRADSYNC_WORKER_BUFFER_FD_SERVER_H_
