#include "worker/worker_service.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "common/grpc_status.h"

namespace gradsync {
namespace {

absl::Duration UntilDeadline(grpc::ServerContext* ctx) {
  return absl::FromChrono(ctx->deadline()) - absl::Now();
}

}  // namespace

grpc::Status WorkerService::OpenSession(grpc::ServerContext* ctx,
                                        const v1::OpenSessionRequest* req,
                                        v1::OpenSessionResponse* resp) {
  OpenSessionArgs a;
  a.job_id = req->job_id();
  a.world_size = req->world_size();
  a.rank = req->rank();
  absl::Duration timeout =
      req->timeout_ms() > 0 ? absl::Milliseconds(req->timeout_ms()) : absl::Seconds(60);
  a.timeout = std::min(timeout, UntilDeadline(ctx));
  a.heartbeat_timeout_ms = req->options().heartbeat_timeout_ms();
  a.op_timeout_ms = req->options().op_timeout_ms();
  a.tcp_streams = req->options().tcp_streams();
  a.algorithm = req->options().algorithm();
  a.client_name = req->client_name();
  auto s = daemon_->OpenSession(a);
  if (!s.ok()) return ToGrpcStatus(s.status());
  const SessionInfo& info = (*s)->info();
  resp->set_session_id(info.session_id);
  resp->set_rank(info.rank);
  resp->set_world_size(info.world_size);
  resp->set_epoch(info.epoch);
  return grpc::Status::OK;
}

grpc::Status WorkerService::AllocateBuffer(grpc::ServerContext*,
                                           const v1::AllocateBufferRequest* req,
                                           v1::AllocateBufferResponse* resp) {
  auto s = daemon_->FindSession(req->session_id());
  if (!s.ok()) return ToGrpcStatus(s.status());
  auto b = (*s)->AllocateBuffer(req->size_bytes());
  if (!b.ok()) return ToGrpcStatus(b.status());
  resp->set_buffer_id(b->id);
  resp->set_shm_name(b->shm_name);
  resp->set_size_bytes(b->size);
  return grpc::Status::OK;
}

grpc::Status WorkerService::FreeBuffer(grpc::ServerContext*, const v1::FreeBufferRequest* req,
                                       v1::FreeBufferResponse*) {
  auto s = daemon_->FindSession(req->session_id());
  if (!s.ok()) return ToGrpcStatus(s.status());
  return ToGrpcStatus((*s)->FreeBuffer(req->buffer_id()));
}

grpc::Status WorkerService::Submit(grpc::ServerContext*, const v1::SubmitRequest* req,
                                   v1::SubmitResponse* resp) {
  auto s = daemon_->FindSession(req->session_id());
  if (!s.ok()) return ToGrpcStatus(s.status());
  if (!IsValidCollective(req->collective())) {
    return ToGrpcStatus(absl::InvalidArgumentError(
        absl::StrCat("invalid collective type ", req->collective(), " for op '", req->name(), "'")));
  }
  if (!IsValidDType(req->dtype())) {
    return ToGrpcStatus(absl::InvalidArgumentError(
        absl::StrCat("invalid dtype ", req->dtype(), " for op '", req->name(), "'")));
  }
  if (!IsValidReduceOp(req->reduce_op())) {
    return ToGrpcStatus(absl::InvalidArgumentError(
        absl::StrCat("invalid reduce op ", req->reduce_op(), " for op '", req->name(), "'")));
  }
  SubmitArgs a;
  a.kind = static_cast<CollectiveKind>(req->collective());
  a.root = req->root();
  a.algorithm = req->algorithm();
  a.name = req->name();
  a.dtype = static_cast<DType>(req->dtype());
  a.op = static_cast<ReduceOp>(req->reduce_op());
  a.count = req->count();
  a.buffer_id = req->buffer_id();
  a.offset_bytes = req->offset_bytes();
  if (req->timeout_ms() < 0) {
    return ToGrpcStatus(absl::InvalidArgumentError("timeout_ms must not be negative"));
  }
  a.timeout = absl::Milliseconds(req->timeout_ms());
  auto id = (*s)->Submit(a);
  if (!id.ok()) return ToGrpcStatus(id.status());
  resp->set_op_id(*id);
  resp->set_sequence(*id);
  return grpc::Status::OK;
}

grpc::Status WorkerService::Wait(grpc::ServerContext* ctx, const v1::WaitRequest* req,
                                 v1::WaitResponse* resp) {
  auto s = daemon_->FindSession(req->session_id());
  if (!s.ok()) return ToGrpcStatus(s.status());
  absl::Duration timeout = std::max(absl::ZeroDuration(), absl::Milliseconds(req->timeout_ms()));
  // Leave a margin so the reply beats the client's RPC deadline.
  timeout = std::min(timeout, UntilDeadline(ctx) - absl::Milliseconds(50));
  auto out = (*s)->Wait(req->op_id(), std::max(timeout, absl::ZeroDuration()));
  if (!out.ok()) return ToGrpcStatus(out.status());
  if (out->done && !out->status.ok()) return ToGrpcStatus(out->status);
  resp->set_done(out->done);
  resp->set_algorithm(out->algorithm);
  resp->set_queued_us(absl::ToInt64Microseconds(out->queued_time));
  resp->set_run_us(absl::ToInt64Microseconds(out->run_time));
  return grpc::Status::OK;
}

grpc::Status WorkerService::CloseSession(grpc::ServerContext*,
                                         const v1::CloseSessionRequest* req,
                                         v1::CloseSessionResponse*) {
  return ToGrpcStatus(daemon_->CloseSession(req->session_id()));
}

}  // namespace gradsync
