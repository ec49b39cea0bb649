// gRPC edge of gradsyncd: gradsync.v1.Worker over the daemon core.
#ifndef GRADSYNC_WORKER_WORKER_SERVICE_H_
#define GRADSYNC_WORKER_WORKER_SERVICE_H_

#include "proto/worker.grpc.pb.h"
#include "worker/daemon.h"

namespace gradsync {

class WorkerService final : public v1::Worker::Service {
 public:
  explicit WorkerService(Daemon* daemon) : daemon_(daemon) {}

  grpc::Status OpenSession(grpc::ServerContext* ctx, const v1::OpenSessionRequest* req,
                           v1::OpenSessionResponse* resp) override;
  grpc::Status AllocateBuffer(grpc::ServerContext* ctx, const v1::AllocateBufferRequest* req,
                              v1::AllocateBufferResponse* resp) override;
  grpc::Status FreeBuffer(grpc::ServerContext* ctx, const v1::FreeBufferRequest* req,
                          v1::FreeBufferResponse* resp) override;
  grpc::Status Submit(grpc::ServerContext* ctx, const v1::SubmitRequest* req,
                      v1::SubmitResponse* resp) override;
  grpc::Status Wait(grpc::ServerContext* ctx, const v1::WaitRequest* req,
                    v1::WaitResponse* resp) override;
  grpc::Status CloseSession(grpc::ServerContext* ctx, const v1::CloseSessionRequest* req,
                            v1::CloseSessionResponse* resp) override;

 private:
  Daemon* daemon_;
};

}  // namespace gradsync

#endif  // GRADSYNC_WORKER_WORKER_SERVICE_H_
