#include "server/coordinator_service.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <utility>

#include <grpcpp/health_check_service_interface.h>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "absl/time/clock.h"
#include "common/grpc_status.h"
#include "common/logging.h"

namespace gradsync {
namespace {

// How often a WatchJob handler checks for client cancellation between events.
constexpr absl::Duration kWatchPollInterval = absl::Milliseconds(100);

absl::Time RpcDeadline(const grpc::ServerContextBase& ctx) {
  const auto deadline = ctx.deadline();
  if (deadline == std::chrono::system_clock::time_point::max()) return absl::InfiniteFuture();
  return absl::FromChrono(deadline);
}

template <typename T>
grpc::Status Reply(absl::StatusOr<T> result, T* response) {
  if (!result.ok()) return ToGrpcStatus(result.status());
  *response = *std::move(result);
  return grpc::Status::OK;
}

// The request with its member key bound to the caller's certificate (with
// TLS): a key only matches when the member's own daemon presents it. A key of
// the wrong length is left for the registry to refuse.
template <typename Request>
Request WithBoundKey(const grpc::ServerContextBase& ctx, const Request& request) {
  Request bound = request;
  const size_t n = request.member_key().size();
  if (n >= kMinMemberKeyBytes && n <= kMaxMemberKeyBytes) {
    bound.set_member_key(BindToIdentity(IdentityOf(ctx), request.member_key()));
  }
  return bound;
}

// A tenant's view of a job's status: the id without its namespace.
void Unscope(const CallScope& scope, v1::JobStatus* status) {
  status->set_job_id(scope.FromRegistry(status->job_id()));
}

}  // namespace

std::string CallScope::ToRegistry(absl::string_view job_id) const {
  return all ? std::string(job_id) : ScopedJobId(tenant, job_id);
}
bool CallScope::Sees(absl::string_view scoped_id) const {
  return all || JobNamespace(scoped_id) == tenant;
}
std::string CallScope::FromRegistry(absl::string_view scoped_id) const {
  return all ? std::string(scoped_id) : std::string(UnscopedJobId(scoped_id));
}

absl::StatusOr<CallScope> CoordinatorService::Scope(const grpc::ServerContextBase& ctx,
                                                    absl::string_view call,
                                                    absl::string_view job_id,
                                                    bool member_call) const {
  if (member_call && job_id.find('/') != absl::string_view::npos) {
    return absl::InvalidArgumentError(absl::StrCat(
        call, " of job '", absl::CHexEscape(job_id),
        "': job ids must not contain '/' (allowed are letters, digits, '.', '_' and '-')"));
  }
  CallScope scope;
  if (tenants_ == nullptr) {
    scope.all = true;  // one namespace; roles alone decide
    return scope;
  }
  absl::StatusOr<std::optional<Tenant>> tenant = TenantOf(ctx, *tenants_);
  if (!tenant.ok()) {
    return absl::UnauthenticatedError(
        absl::StrCat(call, " of job '", job_id, "': ", tenant.status().message()));
  }
  if (tenant->has_value()) {
    scope.tenant = (*tenant)->name;
    // Each tenant's fair share of every table, so no tenant can fill one.
    const int tenants = std::max(1, tenants_->size());
    scope.limits.max_jobs = static_cast<int>(kMaxJobs) / tenants;
    if ((*tenant)->max_jobs > 0) {
      scope.limits.max_jobs = std::min(scope.limits.max_jobs, (*tenant)->max_jobs);
    }
    scope.limits.max_forming_jobs = (*tenant)->max_forming_jobs;
    scope.limits.max_forming_ranks = kMaxFormingRanks / tenants;
    scope.limits.max_pending_joins = static_cast<int>(kMaxPendingJoins) / tenants;
    return scope;
  }
  if (member_call) {
    return absl::UnauthenticatedError(absl::StrCat(
        call, " of job '", job_id,
        "': this coordinator has tenants (--tenants_file), so the call needs a tenant token "
        "(the session's tenant_token, or GRADSYNC_TENANT_TOKEN for the client)"));
  }
  const PeerIdentity id = IdentityOf(ctx);
  if (tls_ && id.role != "operator") {
    return absl::PermissionDeniedError(absl::StrCat(
        call, ": ", id.ToString(),
        " sent no tenant token; only operators may read every tenant's jobs"));
  }
  scope.all = true;
  return scope;
}

const char* CoordinatorRpcName(CoordinatorRpc rpc) {
  switch (rpc) {
    case CoordinatorRpc::kCreateJob:
      return "CreateJob";
    case CoordinatorRpc::kJoinJob:
      return "JoinJob";
    case CoordinatorRpc::kHeartbeat:
      return "Heartbeat";
    case CoordinatorRpc::kLeaveJob:
      return "LeaveJob";
    case CoordinatorRpc::kGetJobStatus:
      return "GetJobStatus";
    case CoordinatorRpc::kListJobs:
      return "ListJobs";
  }
  return "unknown";
}

// Records an RPC's duration once: at Done(), or when it goes out of scope.
// A callback RPC calls Done() before it finishes its call, so the client
// never sees the answer before the RPC is counted.
class CoordinatorService::Timer {
 public:
  Timer(RpcObserver* observer, CoordinatorRpc rpc)
      : observer_(observer), rpc_(rpc), start_(observer ? absl::Now() : absl::InfinitePast()) {}
  ~Timer() { Done(); }
  Timer(const Timer&) = delete;
  Timer& operator=(const Timer&) = delete;
  void Done() {
    if (observer_ != nullptr && !done_.exchange(true)) {
      observer_->OnRpcDone(rpc_, absl::Now() - start_);
    }
  }

 private:
  RpcObserver* const observer_;
  const CoordinatorRpc rpc_;
  const absl::Time start_;
  std::atomic<bool> done_{false};
};

grpc::Status CoordinatorService::CreateJob(grpc::ServerContext* ctx,
                                           const v1::CreateJobRequest* request,
                                           v1::CreateJobResponse* response) {
  if (grpc::Status denied = RequireRole(*ctx, tls_, "node", "CreateJob"); !denied.ok()) {
    return denied;
  }
  Timer timer(rpc_observer_, CoordinatorRpc::kCreateJob);
  absl::StatusOr<CallScope> scope = Scope(*ctx, "CreateJob", request->job_id(), true);
  if (!scope.ok()) return ToGrpcStatus(scope.status());
  v1::CreateJobRequest scoped = *request;
  scoped.set_job_id(scope->ToRegistry(request->job_id()));
  return Reply(registry_->CreateJob(scoped, scope->limits), response);
}

// Ends its call when the registry answers the join; a cancelled call
// cancels the join. Deletes itself when gRPC is done with the call.
class CoordinatorService::JoinReactor final : public grpc::ServerUnaryReactor {
 public:
  explicit JoinReactor(JobRegistry* registry) : registry_(registry) {}
  // Set before JoinJob returns the reactor, so before OnCancel can run.
  void set_join(uint64_t id) { join_ = id; }
  void OnCancel() override {
    if (join_ != 0) registry_->CancelJoin(join_);
  }
  void OnDone() override { delete this; }

 private:
  JobRegistry* const registry_;
  uint64_t join_ = 0;
};

grpc::ServerUnaryReactor* CoordinatorService::JoinJob(grpc::CallbackServerContext* ctx,
                                                      const v1::JoinJobRequest* request,
                                                      v1::JoinJobResponse* response) {
  auto* reactor = new JoinReactor(registry_);
  if (grpc::Status denied = RequireRole(*ctx, tls_, "node", "JoinJob"); !denied.ok()) {
    reactor->Finish(denied);
    return reactor;
  }
  auto timer = std::make_shared<Timer>(rpc_observer_, CoordinatorRpc::kJoinJob);
  absl::StatusOr<CallScope> scope = Scope(*ctx, "JoinJob", request->job_id(), true);
  if (!scope.ok()) {
    timer->Done();
    reactor->Finish(ToGrpcStatus(scope.status()));
    return reactor;
  }
  v1::JoinJobRequest scoped = WithBoundKey(*ctx, *request);
  scoped.set_job_id(scope->ToRegistry(request->job_id()));
  GS_LOG(DEBUG) << "JoinJob job='" << request->job_id() << "' member='" << request->member_id()
                << "' rank=" << request->requested_rank() << " from " << ctx->peer();
  // `done` runs once: here, or on the registry's join thread. The reactor
  // may be gone right after Finish, so nothing touches it afterwards.
  const uint64_t join = registry_->StartJoin(
      scoped, RpcDeadline(*ctx),
      [this, reactor, response, timer, tenant = scope->tenant,
       job = scoped.job_id()](absl::StatusOr<v1::JoinJobResponse> joined) {
        grpc::Status reply = ReplyToJoin(std::move(joined), tenant, job, response);
        timer->Done();
        reactor->Finish(reply);
      },
      scope->limits.max_pending_joins);
  reactor->set_join(join);
  return reactor;
}

grpc::Status CoordinatorService::ReplyToJoin(absl::StatusOr<v1::JoinJobResponse> joined,
                                             const std::string& tenant,
                                             const std::string& scoped_job_id,
                                             v1::JoinJobResponse* response) {
  if (joined.ok()) joined->set_tenant(tenant);
  if (joined.ok() && joined->options().ps_shards() > 0) {
    // The epoch's parameter-server shards: chosen once, the same for every rank.
    auto shards =
        shards_.AssignForJob(scoped_job_id, joined->epoch(), joined->options().ps_shards());
    if (!shards.ok()) return ToGrpcStatus(shards.status());
    shards_.ForgetJob(scoped_job_id, joined->epoch());
    for (size_t i = 0; i < shards->ids.size(); ++i) {
      joined->add_ps_shard_ids(shards->ids[i]);
      *joined->add_ps_shards() = shards->endpoints[i];
    }
  }
  return Reply(std::move(joined), response);
}

grpc::Status CoordinatorService::DeleteJob(grpc::ServerContext* ctx,
                                           const v1::DeleteJobRequest* request,
                                           v1::DeleteJobResponse* response) {
  if (grpc::Status denied = RequireRole(*ctx, tls_, "operator", "DeleteJob"); !denied.ok()) {
    return denied;
  }
  if (request->reason().size() > 200) {
    return ToGrpcStatus(absl::InvalidArgumentError(absl::StrCat(
        "DeleteJob of job '", absl::CHexEscape(request->job_id()), "': reason is ",
        request->reason().size(), " bytes; at most 200")));
  }
  absl::StatusOr<CallScope> scope = Scope(*ctx, "DeleteJob", request->job_id(), false);
  if (!scope.ok()) return ToGrpcStatus(scope.status());
  if (absl::Status s = ValidateJobId(request->job_id()); !s.ok()) return ToGrpcStatus(s);
  const PeerIdentity who = IdentityOf(*ctx);
  std::string why = absl::StrCat("deleted by ", who.authenticated() ? who.ToString() : ctx->peer());
  if (!request->reason().empty()) absl::StrAppend(&why, ": ", absl::CHexEscape(request->reason()));
  absl::StatusOr<v1::DeleteJobResponse> deleted =
      registry_->DeleteJob(scope->ToRegistry(request->job_id()), why);
  if (!deleted.ok()) {
    // The caller's own id in the message, not the registry's scoped one.
    return ToGrpcStatus(absl::Status(
        deleted.status().code(), absl::StrReplaceAll(deleted.status().message(),
                                                      {{scope->ToRegistry(request->job_id()),
                                                        request->job_id()}})));
  }
  return Reply(std::move(deleted), response);  // its shards went with it (ShardRelease)
}

grpc::Status CoordinatorService::RegisterShard(grpc::ServerContext* ctx,
                                               const v1::RegisterShardRequest* request,
                                               v1::RegisterShardResponse* response) {
  if (grpc::Status denied = RequireRole(*ctx, tls_, "ps", "RegisterShard"); !denied.ok()) {
    return denied;
  }
  // The id is bound to the certificate that registered it first.
  absl::Status s = shards_.Register(request->shard_id(), request->endpoint(), IdentityOf(*ctx).name);
  if (!s.ok()) return ToGrpcStatus(s);
  response->set_heartbeat_interval_ms(1000);
  return grpc::Status::OK;
}

grpc::Status CoordinatorService::ListShards(grpc::ServerContext* ctx, const v1::ListShardsRequest*,
                                            v1::ListShardsResponse* response) {
  if (grpc::Status denied = RequireRole(*ctx, tls_, "node,ps,operator", "ListShards");
      !denied.ok()) {
    return denied;
  }
  for (auto& st : shards_.List()) *response->add_shards() = std::move(st);
  return grpc::Status::OK;
}

grpc::Status CoordinatorService::GetShardKey(grpc::ServerContext* ctx,
                                             const v1::GetShardKeyRequest* request,
                                             v1::GetShardKeyResponse* response) {
  if (grpc::Status denied = RequireRole(*ctx, tls_, "ps", "GetShardKey"); !denied.ok()) {
    return denied;
  }
  // Only the shard itself (the certificate that registered the id) gets its key.
  if (const std::string caller = IdentityOf(*ctx).name;
      !shards_.IsRegisteredBy(request->shard_id(), caller)) {
    return grpc::Status(grpc::StatusCode::PERMISSION_DENIED,
                        absl::StrCat("shard '", request->shard_id(),
                                     "' is not registered by certificate '", caller, "'"));
  }
  if (!shards_.IsAssigned(request->job_id(), request->epoch(), request->shard_id())) {
    return grpc::Status(grpc::StatusCode::PERMISSION_DENIED,
                        absl::StrCat("shard '", request->shard_id(), "' does not serve job '",
                                     request->job_id(), "' epoch ", request->epoch()));
  }
  absl::StatusOr<JobRegistry::JobSecret> secret = registry_->JobKey(request->job_id());
  if (!secret.ok()) return ToGrpcStatus(secret.status());
  response->set_key(PsShardKey(secret->key, request->shard_id()));
  response->set_data_tls(secret->data_tls);
  return grpc::Status::OK;
}

grpc::Status CoordinatorService::Heartbeat(grpc::ServerContext* ctx,
                                           const v1::HeartbeatRequest* request,
                                           v1::HeartbeatResponse* response) {
  if (grpc::Status denied = RequireRole(*ctx, tls_, "node", "Heartbeat"); !denied.ok()) {
    return denied;
  }
  Timer timer(rpc_observer_, CoordinatorRpc::kHeartbeat);
  absl::StatusOr<CallScope> scope = Scope(*ctx, "Heartbeat", request->job_id(), true);
  if (!scope.ok()) return ToGrpcStatus(scope.status());
  v1::HeartbeatRequest scoped = WithBoundKey(*ctx, *request);
  scoped.set_job_id(scope->ToRegistry(request->job_id()));
  return Reply(registry_->Heartbeat(scoped), response);
}

grpc::Status CoordinatorService::LeaveJob(grpc::ServerContext* ctx,
                                          const v1::LeaveJobRequest* request,
                                          v1::LeaveJobResponse*) {
  if (grpc::Status denied = RequireRole(*ctx, tls_, "node", "LeaveJob"); !denied.ok()) {
    return denied;
  }
  Timer timer(rpc_observer_, CoordinatorRpc::kLeaveJob);
  absl::StatusOr<CallScope> scope = Scope(*ctx, "LeaveJob", request->job_id(), true);
  if (!scope.ok()) return ToGrpcStatus(scope.status());
  v1::LeaveJobRequest scoped = WithBoundKey(*ctx, *request);
  scoped.set_job_id(scope->ToRegistry(request->job_id()));
  return ToGrpcStatus(registry_->LeaveJob(scoped));
}

grpc::Status CoordinatorService::GetJobStatus(grpc::ServerContext* ctx,
                                              const v1::GetJobStatusRequest* request,
                                              v1::JobStatus* response) {
  if (grpc::Status denied = RequireRole(*ctx, tls_, "node,operator", "GetJobStatus");
      !denied.ok()) {
    return denied;
  }
  Timer timer(rpc_observer_, CoordinatorRpc::kGetJobStatus);
  absl::StatusOr<CallScope> scope = Scope(*ctx, "GetJobStatus", request->job_id(), false);
  if (!scope.ok()) return ToGrpcStatus(scope.status());
  absl::StatusOr<v1::JobStatus> status = registry_->GetJobStatus(scope->ToRegistry(request->job_id()));
  if (status.ok()) Unscope(*scope, &*status);
  return Reply(std::move(status), response);
}

grpc::Status CoordinatorService::ListJobs(grpc::ServerContext* ctx, const v1::ListJobsRequest*,
                                          v1::ListJobsResponse* response) {
  if (grpc::Status denied = RequireRole(*ctx, tls_, "node,operator", "ListJobs"); !denied.ok()) {
    return denied;
  }
  Timer timer(rpc_observer_, CoordinatorRpc::kListJobs);
  absl::StatusOr<CallScope> scope = Scope(*ctx, "ListJobs", "*", false);
  if (!scope.ok()) return ToGrpcStatus(scope.status());
  v1::ListJobsResponse all = registry_->ListJobs();
  for (v1::JobStatus& job : *all.mutable_jobs()) {
    if (!scope->Sees(job.job_id())) continue;
    Unscope(*scope, &job);
    *response->add_jobs() = std::move(job);
  }
  return grpc::Status::OK;
}

grpc::Status CoordinatorService::WatchJob(grpc::ServerContext* ctx,
                                          const v1::WatchJobRequest* request,
                                          grpc::ServerWriter<v1::JobEvent>* writer) {
  if (grpc::Status denied = RequireRole(*ctx, tls_, "node,operator", "WatchJob"); !denied.ok()) {
    return denied;
  }
  absl::StatusOr<CallScope> scope = Scope(*ctx, "WatchJob", request->job_id(), false);
  if (!scope.ok()) return ToGrpcStatus(scope.status());
  absl::StatusOr<std::unique_ptr<JobWatch>> watch =
      registry_->WatchJob(scope->ToRegistry(request->job_id()));
  if (!watch.ok()) return ToGrpcStatus(watch.status());
  GS_LOG(DEBUG) << "WatchJob job='" << request->job_id() << "' from " << ctx->peer();
  while (true) {
    absl::StatusOr<v1::JobEvent> event = (*watch)->Next(kWatchPollInterval);
    if (event.ok()) {
      event->set_job_id(scope->FromRegistry(event->job_id()));
      if (event->has_status()) Unscope(*scope, event->mutable_status());
      // No lock is held here: the queue hands out copies.
      if (!writer->Write(*event)) {
        return grpc::Status(grpc::StatusCode::CANCELLED, "watcher went away");
      }
      continue;
    }
    if (absl::IsDeadlineExceeded(event.status())) {
      if (ctx->IsCancelled()) {
        return grpc::Status(grpc::StatusCode::CANCELLED, "watch cancelled by the client");
      }
      continue;
    }
    if (absl::IsOutOfRange(event.status())) return grpc::Status::OK;  // job deleted
    return ToGrpcStatus(event.status());
  }
}

// ---------------------------------------------------------------------------
// CoordinatorServer

absl::StatusOr<std::unique_ptr<CoordinatorServer>> CoordinatorServer::Start(
    CoordinatorServerOptions options) {
  std::unique_ptr<CoordinatorServer> s(new CoordinatorServer());
  std::vector<JobRegistryObserver*> observers = {&s->shard_release_};
  if (options.registry.observer != nullptr) observers.push_back(options.registry.observer);
  s->observers_ = std::make_unique<JobRegistryObserverList>(std::move(observers));
  options.registry.observer = s->observers_.get();
  s->registry_ = std::make_unique<JobRegistry>(std::move(options.registry));
  absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> credentials =
      MakeServerCredentials(options.tls);
  if (!credentials.ok()) return credentials.status();
  s->service_ = std::make_unique<CoordinatorService>(s->registry_.get(), &s->shards_,
                                                     options.rpc_observer,
                                                     options.tls.enabled(), options.tenants);
  if (options.tenants != nullptr && options.tls.enabled()) {
    (*credentials)->SetAuthMetadataProcessor(
        std::make_shared<TenantAuthProcessor>(options.tenants));
  }

  grpc::EnableDefaultHealthCheckService(true);  // process-wide; before building
  grpc::ServerBuilder builder;
  // gRPC sets SO_REUSEPORT by default: a second coordinator on the same port
  // would then start and silently split the jobs. Fail instead.
  builder.AddChannelArgument(GRPC_ARG_ALLOW_REUSEPORT, 0);
  builder.AddListeningPort(options.listen_address, *credentials, &s->port_);
  builder.RegisterService(s->service_.get());
  s->server_ = builder.BuildAndStart();
  if (s->server_ == nullptr || s->port_ == 0) {
    if (s->server_ != nullptr) s->server_->Shutdown();
    return absl::UnavailableError(
        absl::StrCat("cannot listen on '", options.listen_address, "' (address in use or invalid?)"));
  }
  const std::string& listen = options.listen_address;
  const size_t colon = listen.rfind(':');
  s->address_ = colon == std::string::npos ? listen
                                             : absl::StrCat(listen.substr(0, colon), ":", s->port_);
  if (grpc::HealthCheckServiceInterface* health = s->server_->GetHealthCheckService()) {
    health->SetServingStatus(true);
    health->SetServingStatus(v1::Coordinator::service_full_name(), true);
  }
  return s;
}

CoordinatorServer::~CoordinatorServer() { Shutdown(absl::ZeroDuration()); }

void CoordinatorServer::Shutdown(absl::Duration grace) {
  absl::MutexLock lock(&shutdown_mu_);
  if (shut_down_ || server_ == nullptr) return;
  shut_down_ = true;
  if (grpc::HealthCheckServiceInterface* health = server_->GetHealthCheckService()) {
    health->Shutdown();  // NOT_SERVING from now on
  }
  registry_->Shutdown();  // unblocks JoinJob and WatchJob handlers
  server_->Shutdown(absl::ToChronoTime(absl::Now() + grace));
  server_->Wait();
}

}  // namespace gradsync
