// gRPC edge of the coordinator: gradsync.v1.Coordinator implemented on top of
// JobRegistry (which holds all state and semantics; see job_registry.h), plus
// CoordinatorServer, which owns a registry, the service and a started
// grpc::Server with the standard health service. The binary
// gradsync-coordinator is a thin wrapper around CoordinatorServer; tests and
// embedded clusters (`gradsync demo`) can start one in-process.
#ifndef GRADSYNC_SERVER_COORDINATOR_SERVICE_H_
#define GRADSYNC_SERVER_COORDINATOR_SERVICE_H_

#include <memory>
#include <string>

#include <grpcpp/grpcpp.h>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/tls.h"
#include "proto/coordinator.grpc.pb.h"
#include "server/job_registry.h"
#include "server/shard_registry.h"
#include "server/tenants.h"

namespace gradsync {

// The unary methods of gradsync.v1.Coordinator (WatchJob streams for as long
// as the watcher wants, so it has no meaningful latency).
enum class CoordinatorRpc { kCreateJob, kJoinJob, kHeartbeat, kLeaveJob, kGetJobStatus, kListJobs };
inline constexpr CoordinatorRpc kAllCoordinatorRpcs[] = {
    CoordinatorRpc::kCreateJob, CoordinatorRpc::kJoinJob,      CoordinatorRpc::kHeartbeat,
    CoordinatorRpc::kLeaveJob,  CoordinatorRpc::kGetJobStatus, CoordinatorRpc::kListJobs};
// "CreateJob", "JoinJob", ... (the gRPC method name).
const char* CoordinatorRpcName(CoordinatorRpc rpc);

// Told how long each unary call took (metrics). Called on gRPC threads after
// the handler's work; must be thread-safe and cheap.
class RpcObserver {
 public:
  virtual ~RpcObserver() = default;
  virtual void OnRpcDone(CoordinatorRpc rpc, absl::Duration elapsed) = 0;
};

// Which jobs one call may reach: one tenant's (the registry holds them as
// "TENANT/JOB"), or every job (an operator without a token, or a
// coordinator without tenants, where ids are not scoped).
struct CallScope {
  std::string tenant;        // "" with `all`
  bool all = false;
  NamespaceLimits limits;  // the tenant's share of the registry's tables (none with `all`)
  std::string ToRegistry(absl::string_view job_id) const;
  bool Sees(absl::string_view scoped_id) const;
  std::string FromRegistry(absl::string_view scoped_id) const;
};

// Synchronous-API service, but for JoinJob: a callback method whose call
// waits in the registry (JobRegistry::StartJoin), holding no thread, until
// the rendezvous completes, its deadline (min of timeout_ms and the RPC
// deadline) passes, the call is cancelled, or the registry shuts down.
// WatchJob polls for events and cancellation every 100 ms. The registry is not
// owned and must outlive the service.
class CoordinatorService final
    : public v1::Coordinator::WithCallbackMethod_JoinJob<v1::Coordinator::Service> {
 public:
  // `rpc_observer` (may be null) is not owned and must outlive the service.
  // `tls`: callers are verified certificates, and each call is allowed only
  // for some roles (their OU; common/tls.h): jobs (create, join, heartbeat,
  // leave) for "node", shard registration for "ps", reading jobs for "node"
  // and "operator", listing shards for all three.
  // `tenants` (may be null: one namespace, no tokens): creating, joining,
  // heartbeating and leaving need a tenant's token, and a tenant reads only
  // its own jobs (operators without a token read all, ids as TENANT/JOB).
  // `shards` (not owned, outlives the service) holds the PS shards and their
  // assignments; the registry's observer releases those of ended jobs
  // (ShardRelease).
  CoordinatorService(JobRegistry* registry, ShardRegistry* shards,
                     RpcObserver* rpc_observer = nullptr, bool tls = false,
                     std::shared_ptr<TenantTable> tenants = nullptr)
      : registry_(registry),
        shards_(*shards),
        rpc_observer_(rpc_observer),
        tls_(tls),
        tenants_(std::move(tenants)) {}

  grpc::Status CreateJob(grpc::ServerContext* ctx, const v1::CreateJobRequest* request,
                         v1::CreateJobResponse* response) override;
  grpc::ServerUnaryReactor* JoinJob(grpc::CallbackServerContext* ctx,
                                    const v1::JoinJobRequest* request,
                                    v1::JoinJobResponse* response) override;
  grpc::Status Heartbeat(grpc::ServerContext* ctx, const v1::HeartbeatRequest* request,
                         v1::HeartbeatResponse* response) override;
  grpc::Status LeaveJob(grpc::ServerContext* ctx, const v1::LeaveJobRequest* request,
                        v1::LeaveJobResponse* response) override;
  grpc::Status GetJobStatus(grpc::ServerContext* ctx, const v1::GetJobStatusRequest* request,
                            v1::JobStatus* response) override;
  grpc::Status ListJobs(grpc::ServerContext* ctx, const v1::ListJobsRequest* request,
                        v1::ListJobsResponse* response) override;
  grpc::Status WatchJob(grpc::ServerContext* ctx, const v1::WatchJobRequest* request,
                        grpc::ServerWriter<v1::JobEvent>* writer) override;
  grpc::Status RegisterShard(grpc::ServerContext* ctx, const v1::RegisterShardRequest* request,
                             v1::RegisterShardResponse* response) override;
  grpc::Status ListShards(grpc::ServerContext* ctx, const v1::ListShardsRequest* request,
                          v1::ListShardsResponse* response) override;
  grpc::Status GetShardKey(grpc::ServerContext* ctx, const v1::GetShardKeyRequest* request,
                           v1::GetShardKeyResponse* response) override;
  grpc::Status DeleteJob(grpc::ServerContext* ctx, const v1::DeleteJobRequest* request,
                         v1::DeleteJobResponse* response) override;

 private:
  // Times one unary call for the RpcObserver.
  class Timer;
  class JoinReactor;
  // A finished join's reply: the tenant and the epoch's PS shards added.
  grpc::Status ReplyToJoin(absl::StatusOr<v1::JoinJobResponse> joined, const std::string& tenant,
                           const std::string& scoped_job_id, v1::JoinJobResponse* response);

  // The caller's scope for `call` about `job_id`. member_call (create, join,
  // heartbeat, leave): the id must be unscoped and, with tenants, a token is
  // needed. Else (reads): a tenant's own jobs, or every job for an operator.
  absl::StatusOr<CallScope> Scope(const grpc::ServerContextBase& ctx, absl::string_view call,
                                  absl::string_view job_id, bool member_call) const;

  JobRegistry* const registry_;
  ShardRegistry& shards_;
  RpcObserver* const rpc_observer_;
  const bool tls_;
  const std::shared_ptr<TenantTable> tenants_;
};

struct CoordinatorServerOptions {
  // gRPC listen address; port 0 picks a free port (see CoordinatorServer::port).
  std::string listen_address = "127.0.0.1:0";
  // registry.observer receives the state machine's events (metrics).
  JobRegistry::Options registry;
  // Receives each unary call's latency; not owned, must outlive the server.
  // See CoordinatorMetrics for both observers on Prometheus.
  RpcObserver* rpc_observer = nullptr;
  // Mutual TLS (empty: plaintext).
  TlsConfig tls;
  // Tenants and their tokens (null: one namespace).
  std::shared_ptr<TenantTable> tenants;
};

// A running coordinator: registry + service + grpc::Server (+ health service,
// SERVING for "" and "gradsync.v1.Coordinator" once started). Thread-safe.
class CoordinatorServer {
 public:
  // Builds and starts the server. UNAVAILABLE if the address cannot be bound.
  static absl::StatusOr<std::unique_ptr<CoordinatorServer>> Start(
      CoordinatorServerOptions options);
  ~CoordinatorServer();  // Shutdown(absl::ZeroDuration()) if not done yet

  // The bound port and "host:port" with the real port.
  int port() const { return port_; }
  const std::string& address() const { return address_; }
  JobRegistry& registry() { return *registry_; }

  // Graceful stop: health goes NOT_SERVING, blocked JoinJob calls return
  // UNAVAILABLE and watches end, then the server stops taking calls and
  // cancels whatever is still running after `grace`. Idempotent; returns once
  // all handlers returned.
  void Shutdown(absl::Duration grace);

 private:
  CoordinatorServer() = default;

  // The registry tells the shards (and options.registry.observer) through
  // observers_, so these outlive it.
  ShardRegistry shards_;
  ShardRelease shard_release_{&shards_};
  std::unique_ptr<JobRegistryObserverList> observers_;
  std::unique_ptr<JobRegistry> registry_;
  std::unique_ptr<CoordinatorService> service_;
  std::unique_ptr<grpc::Server> server_;  // destroyed first
  int port_ = 0;
  std::string address_;
  absl::Mutex shutdown_mu_;
  bool shut_down_ ABSL_GUARDED_BY(shutdown_mu_) = false;
};

}  // namespace gradsync

#endif  // GRADSYNC_SERVER_COORDINATOR_SERVICE_H_
