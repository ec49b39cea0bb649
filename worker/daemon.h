// The core of gradsyncd, independent of the gRPC edge: it owns the data-plane
// listener, the coordinator connection, the sessions, and the background
// threads that send heartbeats and reap abandoned sessions.
#ifndef GRADSYNC_WORKER_DAEMON_H_
#define GRADSYNC_WORKER_DAEMON_H_

#include <atomic>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/time.h"
#include "collective/planner.h"
#include "collective/ring_allreduce.h"
#include "common/net.h"
#include "common/tls.h"
#include "ipc/fd_registration.h"
#include "proto/coordinator.grpc.pb.h"
#include "transport/device.h"
#include "transport/rdma_endpoint.h"
#include "transport/tcp_listener.h"
#include "worker/client_watch.h"
#include "worker/coordinator_watch.h"
#include "worker/daemon_observer.h"
#include "worker/job_executor.h"
#include "worker/session.h"
#include "worker/transport_choice.h"

namespace gradsync {

struct DaemonOptions {
  std::string coordinator;                 // gRPC target of gradsync-coordinator
  TlsConfig tls;                           // mutual TLS toward it (empty: plaintext)
  HostPort data_listen{"0.0.0.0", 7071};   // data-plane TCP listener
  std::string advertise_host;              // host peers dial; default: derived
  std::string node_id;                     // default: hostname
  absl::Duration heartbeat_interval = absl::Milliseconds(500);
  absl::Duration session_lease = absl::Minutes(2);  // idle sessions are closed
  // Sessions one uid may hold (open or opening) on this daemon; each holds a
  // job's membership, an op queue and, per job, an executor thread.
  int max_sessions_per_uid = 256;
  // The most buffer memory one session may hold (SessionInfo::memory_limit_bytes);
  // 0: unlimited.
  uint64_t session_memory_limit_bytes = 0;
  // The most buffer memory the sessions of one tenant (without tenants: of
  // one uid) may hold together (TenantMemory); 0: unlimited.
  uint64_t tenant_memory_limit_bytes = 0;
  // The most buffer memory all sessions may hold together; 0: unlimited.
  uint64_t buffer_memory_limit_bytes = 0;
  absl::Duration connect_timeout = absl::Seconds(30);
  RingOptions ring;
  int socket_buffer_bytes = 0;  // 0: the kernel's autotuned buffers
  int tcp_streams = 2;  // default TCP connections per pair of daemons for jobs this daemon creates
  // The data plane between daemons (gradsyncd --transport): RDMA where every
  // daemon of an epoch has it (auto), TCP always, or RDMA or nothing.
  TransportMode transport = TransportMode::kAuto;
  std::string rdma_device;  // "" = the first device with an ACTIVE port
  int rdma_port = 0;        // 0 = the device's first ACTIVE port
  int rdma_gid_index = -1;  // RoCE: -1 chooses (rdma::ChooseGidIndex)
  // Tests: the verbs emulation, linked with the other processes of this
  // fabric on this host, instead of libibverbs (rdma/verbs_emulation.h).
  std::string rdma_emulation;
  // TLS on the data connections of the jobs this daemon creates; and it
  // joins no job without (gradsyncd --data_tls). Needs `tls`.
  bool data_tls = false;
  int spin_us = 1000;   // data-plane progress spins this long before sleeping
  // A job's executor polls its ranks' op queues this long after activity
  // before it sleeps (gradsyncd --queue_spin_us).
  absl::Duration executor_spin = absl::Microseconds(50);
  std::string timeline_dir = "/var/lib/gradsync/timeline";  // for jobs with timeline on
  // How ops are planned (collective/planner.h), the parameter-server
  // partition size among its settings.
  PlannerSettings planner;
  DaemonObserver* observer = nullptr;  // metrics; not owned, outlives the daemon
  // Whether the coordinator answers (CoordinatorWatch), on every change.
  std::function<void(bool reachable, const std::string& detail)> on_coordinator_change;
};

struct OpenSessionArgs {
  std::string job_id;
  int world_size = 1;
  int rank = -1;
  absl::Duration timeout = absl::Seconds(60);
  int64_t heartbeat_timeout_ms = 0;
  int64_t op_timeout_ms = 0;
  int tcp_streams = 0;    // 0: DaemonOptions::tcp_streams
  std::string algorithm;  // job-wide forced algorithm; "" = cost model
  std::string codec;      // job-wide codec (collective/codec_request.h); "" = none
  bool timeline = false;  // job-wide Chrome-trace timeline
  int ps_shards = 0;      // parameter-server shards the job uses (if it creates it)
  std::string client_name;
  // The client's tenant token, sent to the coordinator with every call about
  // the job ("" for a coordinator without tenants). Never logged.
  std::string tenant_token;
  // The uid of the process that opens the session (-1: unknown, a TCP
  // client); only that uid may use the session.
  int64_t owner_uid = -1;
  // The pid of the process that opens the session (SO_PEERCRED; 0: unknown,
  // a TCP client). When it exits the session closes at once.
  int64_t client_pid = 0;
  // Non-empty: the coordinator the client means; refused when this daemon
  // uses another (SameGrpcTarget).
  std::string expected_coordinator;
};

class Daemon {
 public:
  static absl::StatusOr<std::unique_ptr<Daemon>> Start(const DaemonOptions& options);
  ~Daemon();  // Shutdown(), then closes the data plane

  // Creates the job if needed, joins it, connects to every peer. Blocks up to
  // args.timeout.
  absl::StatusOr<std::shared_ptr<Session>> OpenSession(const OpenSessionArgs& args);
  // The coordinator this daemon joins jobs at (--coordinator).
  const std::string& coordinator() const { return options_.coordinator; }
  // NotFound naming the id if there is no such session.
  absl::StatusOr<std::shared_ptr<Session>> FindSession(const std::string& id);
  // Registers the client memory behind `fd` as a buffer of the session the
  // request names (its fd socket request, ipc/fd_registration.h), once the
  // request's token proves the session. PermissionDenied otherwise.
  absl::StatusOr<BufferInfo> RegisterFdBuffer(const ipc::RegisterRequest& request, int fd,
                                              const ucred& peer);
  // The session `session_id` if `token` is its registration token;
  // PermissionDenied (one answer for an unknown session and a wrong token).
  absl::StatusOr<std::shared_ptr<Session>> AuthorizeFdRequest(const std::string& session_id,
                                                              const std::string& token);
  // Closes the session and leaves the job. Idempotent for a known id.
  absl::Status CloseSession(const std::string& id);
  // Called after the daemon closed a session on its own (its client process
  // exited, its lease ran out), with the reason: the gRPC edge stops the
  // session's op queue, which holds the session. Set before sessions open;
  // nullptr removes it (and waits for a call in progress). Never called after
  // Shutdown returned.
  using SessionClosedListener =
      std::function<void(const std::string& session_id, const absl::Status& why)>;
  void SetSessionClosedListener(SessionClosedListener listener);
  // Graceful stop, first half: refuses new sessions and ops (Unavailable
  // naming the drain) and waits up to `timeout` for every queued and running
  // op to finish. Returns how many ops were still pending at the deadline.
  int Drain(absl::Duration timeout);
  // Fails every session's epoch with `reason`, closes them, stops threads.
  // The data plane's listener and devices stay until the destructor.
  void Shutdown(const absl::Status& reason = absl::UnavailableError("daemon shutting down"));

  int data_port() const { return listener_->port(); }
  // The RDMA port peers see ("ib", "roce", "ib emulated:F"; "" = none) and,
  // without one, why not.
  const std::string& rdma_advertised() const { return rdma_advertised_; }
  const std::string& rdma_unavailable() const { return rdma_unavailable_; }
  // "emu_ib0 port 1: InfiniBand, ..." ("" without RDMA).
  std::string rdma_description() const;
  const std::string& advertise_host() const { return options_.advertise_host; }
  const std::string& node_id() const { return options_.node_id; }
  // The status service's address, sent to the coordinator with every join.
  void SetStatusEndpoint(const std::string& endpoint);
  size_t session_count() const;
  // Every session's status (for `gradsync status`).
  std::vector<SessionStatus> Status() const;

 private:
  explicit Daemon(const DaemonOptions& options);
  void HeartbeatLoop();
  // This daemon's executor for (job, epoch): created (its node context
  // connected to the other daemons' and their links probed) by the first
  // local session, shared by the rest.
  absl::StatusOr<std::shared_ptr<JobExecutor>> GetOrCreateExecutor(
      const SessionInfo& info, const JobPlacement& placement,
      const std::vector<HostPort>& node_endpoints, const std::vector<TransportAdvert>& node_rdma,
      int streams, absl::Time deadline);
  // Opens the RDMA device (--transport auto|rdma) with the TCP device's
  // options for its bootstrap connections.
  absl::Status OpenRdma(const transport::TcpDeviceOptions& bootstrap);
  void LeaveJob(const SessionInfo& info);
  // The client process of session `id` exited: closes the session, telling
  // the job's other ranks which rank went and why, and leaves the job.
  void ClientExited(const std::string& id, int64_t pid);
  // Starts watching the session's client process (if known); closes the
  // session at once if it already exited.
  void WatchClient(const SessionInfo& info);
  // Tells the SessionClosedListener.
  void NotifyClosed(const std::string& id, const absl::Status& why);
  // CreateJob (idempotent) then JoinJob at the coordinator, until `deadline`.
  absl::StatusOr<v1::JoinJobResponse> CreateAndJoin(const v1::CreateJobRequest& creq,
                                                    v1::JoinJobRequest jreq,
                                                    const std::string& tenant_token,
                                                    absl::Time deadline);
  // One heartbeat for the member of `info`.
  grpc::Status Beat(const SessionInfo& info, v1::HeartbeatResponse* response);

  DaemonOptions options_;
  std::unique_ptr<transport::TcpListener> listener_;
  std::unique_ptr<transport::Device> device_;  // over listener_
  transport::RdmaEndpoint rdma_;                    // --transport auto|rdma
  transport::RdmaDevice* rdma_device_ = nullptr;    // rdma_.device; null: no RDMA here
  std::string rdma_advertised_;
  std::string rdma_unavailable_;
  std::unique_ptr<gradsync::v1::Coordinator::Stub> coordinator_;
  std::unique_ptr<CoordinatorWatch> coordinator_watch_;
  // Null where the kernel has no pidfds: sessions then end at their lease.
  std::unique_ptr<ClientWatch> client_watch_;
  absl::Mutex listener_mu_;  // held while the listener runs
  SessionClosedListener session_closed_ ABSL_GUARDED_BY(listener_mu_);
  std::atomic<uint64_t> next_session_{1};
  std::string status_endpoint_ ABSL_GUARDED_BY(mu_);

  const std::shared_ptr<TenantMemory> tenant_memory_;
  mutable absl::Mutex mu_;
  std::map<std::string, std::shared_ptr<Session>> sessions_ ABSL_GUARDED_BY(mu_);
  // Members whose session is still being set up (the epoch's connections and
  // link probe, after the rendezvous): the heartbeat loop beats for them too,
  // since the coordinator's liveness clock starts at the rendezvous.
  std::map<std::string, SessionInfo> setting_up_ ABSL_GUARDED_BY(mu_);
  // OpenSession calls under way, by the caller's uid (max_sessions_per_uid).
  std::map<int64_t, int> opening_ ABSL_GUARDED_BY(mu_);
  bool shut_down_ ABSL_GUARDED_BY(mu_) = false;
  bool draining_ ABSL_GUARDED_BY(mu_) = false;
  struct ExecutorEntry {
    absl::Notification ready;
    absl::Status status;
    std::weak_ptr<JobExecutor> executor;
  };
  std::map<std::string, std::shared_ptr<ExecutorEntry>> executors_ ABSL_GUARDED_BY(mu_);

  absl::Notification stop_;
  std::thread heartbeat_thread_;
};

}  // namespace gradsync

#endif  // GRADSYNC_WORKER_DAEMON_H_
