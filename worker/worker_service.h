// gRPC edge of gradsyncd: gradsync.v1.Worker over the daemon core. It also
// owns the sessions' shared-memory op queues (worker/op_queue_server.h): the
// queues live as long as this service, and stop when their session closes.
#ifndef GRADSYNC_WORKER_WORKER_SERVICE_H_
#define GRADSYNC_WORKER_WORKER_SERVICE_H_

#include <sys/socket.h>

#include <functional>
#include <optional>
#include <string>

#include "ipc/fd_registration.h"
#include "proto/worker.grpc.pb.h"
#include "worker/daemon.h"
#include "worker/op_queue_server.h"

namespace gradsync {

class WorkerService final : public v1::Worker::Service {
 public:
  // `fd_socket`: the daemon's fd socket (worker/buffer_fd_server.h) that
  // OpenSession announces to clients; "" = none. With one, buffers and op
  // queues are sealed memfds the clients fetch there (FetchSegment); without
  // one, named POSIX segments.
  explicit WorkerService(Daemon* daemon, OpQueueServerOptions queue_options = {},
                         std::string fd_socket = "");
  // Stops every op queue (each tells its client the daemon is shutting down).
  ~WorkerService() override;

  grpc::Status OpenSession(grpc::ServerContext* ctx, const v1::OpenSessionRequest* req,
                           v1::OpenSessionResponse* resp) override;
  grpc::Status AllocateBuffer(grpc::ServerContext* ctx, const v1::AllocateBufferRequest* req,
                              v1::AllocateBufferResponse* resp) override;
  grpc::Status FreeBuffer(grpc::ServerContext* ctx, const v1::FreeBufferRequest* req,
                          v1::FreeBufferResponse* resp) override;
  grpc::Status RegisterDeviceBuffer(grpc::ServerContext* ctx,
                                    const v1::RegisterDeviceBufferRequest* req,
                                    v1::RegisterDeviceBufferResponse* resp) override;
  grpc::Status Submit(grpc::ServerContext* ctx, const v1::SubmitRequest* req,
                      v1::SubmitResponse* resp) override;
  grpc::Status Wait(grpc::ServerContext* ctx, const v1::WaitRequest* req,
                    v1::WaitResponse* resp) override;
  grpc::Status CloseSession(grpc::ServerContext* ctx, const v1::CloseSessionRequest* req,
                            v1::CloseSessionResponse* resp) override;
  grpc::Status OpenOpQueue(grpc::ServerContext* ctx, const v1::OpenOpQueueRequest* req,
                           v1::OpenOpQueueResponse* resp) override;

  // Where the caller's credentials come from (LocalClientSocket::PeerOf);
  // unset: no uids (a TCP --listen). Set before any call can arrive
  // (LocalClientSocket::StartAccepting).
  void SetPeerCredentials(std::function<std::optional<ucred>(const std::string& peer)> lookup) {
    peer_credentials_ = std::move(lookup);
  }

  // The fd socket's fetch (BufferFdServer::FetchHandler): the descriptor of a
  // buffer or of the op queue of the session whose token the request holds.
  absl::StatusOr<ipc::FetchedSegment> FetchSegment(const ipc::FetchRequest& request,
                                                   const ucred& peer);

 private:
  // The caller's uid (-1: unknown).
  int64_t CallerUid(const grpc::ServerContext& ctx) const;
  // The caller's pid (0: unknown).
  int64_t CallerPid(const grpc::ServerContext& ctx) const;
  // The session, if the caller may use it: PERMISSION_DENIED naming both
  // uids when the session belongs to another uid.
  absl::StatusOr<std::shared_ptr<Session>> OwnSession(const grpc::ServerContext& ctx,
                                                      const std::string& session_id,
                                                      absl::string_view call) const;

  Daemon* daemon_;
  OpQueueServer queues_;
  const std::string fd_socket_;
  std::function<std::optional<ucred>(const std::string& peer)> peer_credentials_;
};

}  // namespace gradsync

#endif  // GRADSYNC_WORKER_WORKER_SERVICE_H_
