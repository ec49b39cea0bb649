// gradsyncd's client socket: a unix stream socket whose connections the
// daemon accepts itself, reads the caller's credentials from (SO_PEERCRED)
// and then hands to gRPC (grpc::AddInsecureChannelFromFd), so every call
// knows the uid and gid of the process that made it. A session belongs to
// the uid that opened it (worker/worker_service.h).
//
// A path socket is created with mode 0660 and, with `group`, chowned to it:
// only the owner, that group and root can connect at all. An abstract socket
// cannot carry a group (worker/socket_group.h).
#ifndef GRADSYNC_WORKER_LOCAL_CLIENT_SOCKET_H_
#define GRADSYNC_WORKER_LOCAL_CLIENT_SOCKET_H_

#include <sys/socket.h>

#include <map>
#include <memory>
#include <optional>
#include <string>
#include <thread>

#include <grpcpp/server.h>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "common/net.h"

namespace gradsync {

class LocalClientSocket {
 public:
  // Listens on "unix:PATH" or "unix-abstract:NAME" for connections to feed
  // `server` (a started grpc::Server, not owned, outliving this object).
  // `group`: the path socket's group ("": the daemon's). InvalidArgument for
  // an unknown group or address, or a group with an abstract socket. Connections wait in the backlog until
  // StartAccepting().
  static absl::StatusOr<std::unique_ptr<LocalClientSocket>> Listen(const std::string& address,
                                                                   const std::string& group,
                                                                   grpc::Server* server);
  // Accepts connections from now on and hands each to the server. Call once,
  // after what the server's calls look up here (PeerOf, through
  // WorkerService::SetPeerCredentials) is in place.
  void StartAccepting();
  // Accepts no more connections (live ones stay with gRPC, and PeerOf still
  // answers for them: destroy this only once the server has stopped).
  void StopAccepting();
  ~LocalClientSocket();  // StopAccepting()
  LocalClientSocket(const LocalClientSocket&) = delete;
  LocalClientSocket& operator=(const LocalClientSocket&) = delete;

  // The credentials of the connection a call came over (`peer` as gRPC's
  // ServerContext::peer() names it, "fd:N"); nullopt for other peers.
  std::optional<ucred> PeerOf(const std::string& peer) const;

 private:
  LocalClientSocket(UniqueFd listener, grpc::Server* server);
  void AcceptLoop();

  UniqueFd listener_;
  std::string path_;  // the socket file ("" for an abstract name), removed at the end
  UniqueFd stop_;  // eventfd: wakes the accept loop to stop
  grpc::Server* const server_;
  std::thread thread_;
  mutable absl::Mutex mu_;
  std::map<int, ucred> peers_ ABSL_GUARDED_BY(mu_);  // by descriptor number
};

}  // namespace gradsync

#endif  // GRADSYNC_WORKER_LOCAL_CLIENT_SOCKET_H_
