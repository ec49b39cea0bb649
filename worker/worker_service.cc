#include "worker/worker_service.h"

#include <errno.h>
#include <sys/stat.h>

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "collective/algorithm.h"
#include "common/grpc_status.h"
#include "common/logging.h"
#include "common/net.h"
#include "common/status_macros.h"
#include "worker/submit_validation.h"

namespace gradsync {
namespace {

absl::Duration UntilDeadline(grpc::ServerContext* ctx) {
  return absl::FromChrono(ctx->deadline()) - absl::Now();
}

// A Session as the op queue server sees it.
class SessionBackend final : public OpQueueBackend {
 public:
  explicit SessionBackend(std::shared_ptr<Session> session) : session_(std::move(session)) {}

  const std::string& session_id() const override { return session_->info().session_id; }
  int64_t owner_uid() const override { return session_->info().owner_uid; }

  absl::StatusOr<uint64_t> Submit(const OpDesc& op) override { return session_->Submit(op); }

  void SetCompletionListener(Listener listener) override {
    if (!listener) {
      session_->SetCompletionListener(nullptr);
      return;
    }
    session_->SetCompletionListener(
        [listener = std::move(listener)](uint64_t op_id, const OpOutcome& outcome) {
          ipc::OpCompletion c;
          static_cast<OpResult&>(c) = outcome;
          c.op_id = op_id;
          return listener(op_id, c);
        });
  }

  bool SetSubmissionFeed(std::shared_ptr<SubmissionFeed> feed) override {
    session_->SetSubmissionFeed(std::move(feed));
    return true;
  }

  void Touch() override { session_->Touch(); }
  absl::Status refusal() const override { return session_->Refusal(); }
  bool closed() const override { return session_->closed(); }
  absl::Status health() const override { return session_->health(); }

 private:
  const std::shared_ptr<Session> session_;
};

}  // namespace

namespace {
OpQueueServerOptions WithDescriptors(OpQueueServerOptions o, bool by_descriptor) {
  o.by_descriptor = by_descriptor;
  return o;
}
}  // namespace

int64_t WorkerService::CallerUid(const grpc::ServerContext& ctx) const {
  if (!peer_credentials_) return -1;
  std::optional<ucred> cred = peer_credentials_(ctx.peer());
  return cred.has_value() ? static_cast<int64_t>(cred->uid) : -1;
}

int64_t WorkerService::CallerPid(const grpc::ServerContext& ctx) const {
  if (!peer_credentials_) return 0;
  std::optional<ucred> cred = peer_credentials_(ctx.peer());
  return cred.has_value() ? static_cast<int64_t>(cred->pid) : 0;
}

absl::StatusOr<std::shared_ptr<Session>> WorkerService::OwnSession(const grpc::ServerContext& ctx,
                                                                   const std::string& session_id,
                                                                   absl::string_view call) const {
  ASSIGN_OR_RETURN(std::shared_ptr<Session> session, daemon_->FindSession(session_id));
  RETURN_IF_ERROR(CheckOwner(session->info(), CallerUid(ctx), absl::StrCat("call ", call, " on")));
  return session;
}

WorkerService::WorkerService(Daemon* daemon, OpQueueServerOptions queue_options,
                             std::string fd_socket)
    : daemon_(daemon),
      queues_(WithDescriptors(std::move(queue_options), !fd_socket.empty())),
      fd_socket_(std::move(fd_socket)) {
  // A session the daemon closed on its own (client exited, lease) takes its
  // op queue with it now: the queue holds the session, and the session its
  // job's executor (thread, connections).
  daemon_->SetSessionClosedListener([this](const std::string& id, const absl::Status& why) {
    queues_.CloseSession(id, why);
  });
}

WorkerService::~WorkerService() { daemon_->SetSessionClosedListener(nullptr); }

absl::StatusOr<ipc::FetchedSegment> WorkerService::FetchSegment(const ipc::FetchRequest& request,
                                                                const ucred& peer) {
  ASSIGN_OR_RETURN(std::shared_ptr<Session> session,
                   daemon_->AuthorizeFdRequest(request.session_id, request.token));
  if (absl::Status s = CheckOwner(session->info(), peer.uid, "fetch a segment of"); !s.ok()) {
    return s;
  }
  ipc::FetchedSegment out;
  if (request.kind == ipc::SegmentKind::kOpQueue) {
    ASSIGN_OR_RETURN(out.fd, queues_.TakeQueueFd(request.session_id));
  } else {
    ASSIGN_OR_RETURN(out.fd, session->TakeBufferFd(request.id));
  }
  struct stat st;
  if (::fstat(out.fd.get(), &st) != 0) {
    return absl::InternalError(absl::StrCat("fstat of a segment: ", ErrnoString(errno)));
  }
  out.size = static_cast<uint64_t>(st.st_size);
  GS_LOG(DEBUG) << "session " << request.session_id << ": segment handed to pid " << peer.pid;
  return out;
}

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
  a.codec = req->options().codec();
  a.timeline = req->options().timeline();
  a.ps_shards = req->options().ps_shards();
  a.client_name = req->client_name();
  a.tenant_token = req->tenant_token();
  a.owner_uid = CallerUid(*ctx);
  a.client_pid = CallerPid(*ctx);
  a.expected_coordinator = req->expected_coordinator();
  auto s = daemon_->OpenSession(a);
  if (!s.ok()) return ToGrpcStatus(s.status());
  const SessionInfo& info = (*s)->info();
  resp->set_session_id(info.session_id);
  if (!fd_socket_.empty()) {
    resp->set_fd_socket(fd_socket_);
    resp->set_registration_token(info.registration_token);
  }
  resp->set_rank(info.rank);
  resp->set_world_size(info.world_size);
  resp->set_epoch(info.epoch);
  resp->set_job_algorithm(info.job_algorithm);
  resp->set_job_codec(info.job_codec);
  resp->set_op_timeout_ms(absl::ToInt64Milliseconds(info.default_op_timeout));
  resp->set_ps_shards(static_cast<int32_t>(info.ps_shards.size()));
  resp->set_coordinator(daemon_->coordinator());
  resp->set_transport(info.transport);
  return grpc::Status::OK;
}

grpc::Status WorkerService::AllocateBuffer(grpc::ServerContext* ctx,
                                           const v1::AllocateBufferRequest* req,
                                           v1::AllocateBufferResponse* resp) {
  auto s = OwnSession(*ctx, req->session_id(), "AllocateBuffer");
  if (!s.ok()) return ToGrpcStatus(s.status());
  auto b = req->gpu_uuid().empty()
               ? (*s)->AllocateBuffer(req->size_bytes(), /*by_descriptor=*/!fd_socket_.empty())
               : (*s)->AllocateDeviceBuffer(req->gpu_uuid(), req->size_bytes());
  if (!b.ok()) return ToGrpcStatus(b.status());
  resp->set_buffer_id(b->id);
  if (!b->gpu_uuid.empty()) {
    resp->set_gpu_uuid(b->gpu_uuid);
    resp->set_cuda_ipc_handle(b->cuda_ipc_handle);
  } else if (b->by_descriptor) {
    resp->set_by_descriptor(true);
  } else {
    resp->set_shm_name(b->shm_name);
  }
  resp->set_size_bytes(b->size);
  return grpc::Status::OK;
}

grpc::Status WorkerService::FreeBuffer(grpc::ServerContext* ctx, const v1::FreeBufferRequest* req,
                                       v1::FreeBufferResponse*) {
  auto s = OwnSession(*ctx, req->session_id(), "FreeBuffer");
  if (!s.ok()) return ToGrpcStatus(s.status());
  return ToGrpcStatus((*s)->FreeBuffer(req->buffer_id()));
}

grpc::Status WorkerService::RegisterDeviceBuffer(grpc::ServerContext* ctx,
                                                 const v1::RegisterDeviceBufferRequest* req,
                                                 v1::RegisterDeviceBufferResponse* resp) {
  auto s = OwnSession(*ctx, req->session_id(), "RegisterDeviceBuffer");
  if (!s.ok()) return ToGrpcStatus(s.status());
  auto b = (*s)->RegisterDeviceBuffer(req->gpu_uuid(), req->cuda_ipc_handle(), req->offset_bytes(),
                                      req->size_bytes(), req->client_pid());
  if (!b.ok()) return ToGrpcStatus(b.status());
  resp->set_buffer_id(b->id);
  resp->set_size_bytes(b->size);
  return grpc::Status::OK;
}

grpc::Status WorkerService::Submit(grpc::ServerContext* ctx, const v1::SubmitRequest* req,
                                   v1::SubmitResponse* resp) {
  auto s = OwnSession(*ctx, req->session_id(), "Submit");
  if (!s.ok()) return ToGrpcStatus(s.status());
  absl::StatusOr<OpDesc> op = OpDescFromRequest(*req, (*s)->info().rank);
  if (!op.ok()) return ToGrpcStatus(op.status());
  auto id = (*s)->Submit(*op);
  if (!id.ok()) return ToGrpcStatus(id.status());
  resp->set_op_id(*id);
  resp->set_sequence(*id);
  return grpc::Status::OK;
}

grpc::Status WorkerService::Wait(grpc::ServerContext* ctx, const v1::WaitRequest* req,
                                 v1::WaitResponse* resp) {
  auto s = OwnSession(*ctx, req->session_id(), "Wait");
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
  resp->set_source(out->source);
  return grpc::Status::OK;
}

grpc::Status WorkerService::CloseSession(grpc::ServerContext* ctx,
                                         const v1::CloseSessionRequest* req,
                                         v1::CloseSessionResponse*) {
  if (auto own = OwnSession(*ctx, req->session_id(), "CloseSession"); !own.ok()) {
    return ToGrpcStatus(own.status());
  }
  absl::Status s = daemon_->CloseSession(req->session_id());
  // The poller would notice within its poll interval; stop it now.
  queues_.CloseSession(req->session_id(),
                       absl::FailedPreconditionError(absl::StrCat(
                           "session ", req->session_id(), " was closed by its client")));
  return ToGrpcStatus(s);
}

grpc::Status WorkerService::OpenOpQueue(grpc::ServerContext* ctx, const v1::OpenOpQueueRequest* req,
                                        v1::OpenOpQueueResponse* resp) {
  auto s = OwnSession(*ctx, req->session_id(), "OpenOpQueue");
  if (!s.ok()) return ToGrpcStatus(s.status());
  auto info = queues_.Open(std::make_shared<SessionBackend>(*s), req->capacity());
  if (!info.ok()) return ToGrpcStatus(info.status());
  if (info->by_descriptor) {
    resp->set_by_descriptor(true);
  } else {
    resp->set_shm_name(info->shm_name);
  }
  resp->set_size_bytes(info->size_bytes);
  resp->set_capacity(info->capacity);
  return grpc::Status::OK;
}

}  // namespace gradsync
