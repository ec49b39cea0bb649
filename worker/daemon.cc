#include "worker/daemon.h"

#include "collective/codec_request.h"
#include "common/status_macros.h"

#include <grpcpp/grpcpp.h>
#include <unistd.h>

#include <algorithm>
#include <set>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/tls.h"
#include "absl/strings/str_replace.h"
#include "common/grpc_status.h"
#include "common/net.h"
#include "common/logging.h"
#include "ipc/fd_registration.h"
#include "transport/tcp_device.h"
#include "worker/coordinator_rpc.h"
#include "worker/link_probe.h"
#include "worker/submit_validation.h"

namespace gradsync {
namespace {

// Bytes of a member's key at the coordinator (JoinJobRequest.member_key).
constexpr size_t kMemberKeyBytes = 16;


std::string Hostname() {
  char buf[256] = {0};
  if (::gethostname(buf, sizeof(buf) - 1) != 0) return "localhost";
  return buf;
}

}  // namespace

Daemon::Daemon(const DaemonOptions& options)
    : options_(options),
      tenant_memory_(std::make_shared<TenantMemory>(options.tenant_memory_limit_bytes,
                                                    options.buffer_memory_limit_bytes)) {}

absl::StatusOr<std::unique_ptr<Daemon>> Daemon::Start(const DaemonOptions& options) {
  if (options.coordinator.empty()) {
    return absl::InvalidArgumentError("no coordinator address (--coordinator)");
  }
  std::unique_ptr<Daemon> d(new Daemon(options));
  if (d->options_.node_id.empty()) d->options_.node_id = Hostname();
  if (d->options_.advertise_host.empty()) {
    const std::string& h = options.data_listen.host;
    d->options_.advertise_host = (h.empty() || h == "0.0.0.0" || h == "::") ? Hostname() : h;
  }
  transport::ListenerOptions lo;
  lo.listen = options.data_listen;
  auto listener = transport::TcpListener::Start(lo);
  if (!listener.ok()) return listener.status();
  d->listener_ = std::move(*listener);
  // Every context the daemon uses comes from its device.
  transport::TcpDeviceOptions device;
  device.listener = d->listener_.get();
  device.socket_buffer_bytes = options.socket_buffer_bytes;
  if (DaemonObserver* observer = options.observer) {
    device.on_auth_failure = [observer](absl::string_view reason) {
      observer->OnAuthFailure("data", reason);
    };
  }
  device.spin_us = options.spin_us;
  device.tls = options.tls;
  d->device_ = std::make_unique<transport::TcpDevice>(device);
  if (options.transport != TransportMode::kTcp) {
    absl::Status rdma = d->OpenRdma(device);
    if (!rdma.ok() && options.transport == TransportMode::kRdma) {
      return absl::Status(rdma.code(), absl::StrCat("--transport=rdma: no usable RDMA port: ",
                                                    rdma.message()));
    }
    if (!rdma.ok()) {
      d->rdma_unavailable_ = std::string(rdma.message());
      GS_LOG(INFO) << "RDMA: not used (" << rdma.message() << "); the data plane runs over TCP";
    }
  }
  absl::StatusOr<std::shared_ptr<grpc::ChannelCredentials>> credentials =
      MakeChannelCredentials(options.tls);
  if (!credentials.ok()) return credentials.status();
  // Reconnect quickly to a coordinator that comes back (gRPC's default
  // back-off grows to 120 s; new sessions wait for the channel).
  grpc::ChannelArguments channel_args;
  channel_args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, 100);
  channel_args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, 1000);
  std::shared_ptr<grpc::Channel> channel =
      grpc::CreateCustomChannel(options.coordinator, *credentials, channel_args);
  d->coordinator_ = gradsync::v1::Coordinator::NewStub(channel);
  CoordinatorWatchOptions watch;
  watch.target = options.coordinator;
  watch.observer = options.observer;
  watch.on_change = options.on_coordinator_change;
  d->coordinator_watch_ = std::make_unique<CoordinatorWatch>(channel, std::move(watch));
  auto client_watch = ClientWatch::Start(
      [p = d.get()](const std::string& id, int64_t pid) { p->ClientExited(id, pid); });
  if (client_watch.ok()) {
    d->client_watch_ = std::move(*client_watch);
  } else {
    GS_LOG(WARNING) << "client processes are not watched (a session whose client dies ends at "
                       "its lease): "
                    << client_watch.status().message();
  }
  d->heartbeat_thread_ = std::thread([p = d.get()] { p->HeartbeatLoop(); });
  GS_LOG(INFO) << "data plane listening on port " << d->listener_->port() << ", advertised as "
               << d->options_.advertise_host << "; coordinator " << options.coordinator;
  return d;
}

absl::Status Daemon::OpenRdma(const transport::TcpDeviceOptions& bootstrap) {
  transport::RdmaDeviceOptions ro;
  ro.device_name = options_.rdma_device;
  ro.port = options_.rdma_port;
  ro.gid_index = options_.rdma_gid_index;
  ro.bootstrap = bootstrap;
  ASSIGN_OR_RETURN(rdma_, transport::OpenRdmaEndpoint(ro, options_.rdma_emulation));
  rdma_device_ = rdma_.device.get();
  rdma_advertised_ = rdma_.advertised;
  GS_LOG(INFO) << "RDMA: " << rdma_device_->description() << " (--transport="
               << TransportModeName(options_.transport) << ")";
  return absl::OkStatus();
}

std::string Daemon::rdma_description() const {
  return rdma_device_ != nullptr ? rdma_device_->description() : std::string();
}

Daemon::~Daemon() {
  Shutdown();
  coordinator_watch_.reset();  // here: a session still opening may read it until then
  // Likewise (a session still opening watches its client); its thread calls
  // into members declared after it, so it stops first.
  client_watch_.reset();
  // Here, not in Shutdown: the client and status servers may still call in
  // (data_port(), an OpenSession that is about to be refused) until they stop.
  rdma_device_ = nullptr;
  rdma_.device.reset();
  device_.reset();
  listener_.reset();
}

size_t Daemon::session_count() const {
  absl::MutexLock l(&mu_);
  return sessions_.size();
}

absl::StatusOr<v1::JoinJobResponse> Daemon::CreateAndJoin(const v1::CreateJobRequest& creq,
                                                           v1::JoinJobRequest jreq,
                                                           const std::string& tenant_token,
                                                           absl::Time deadline) {
  // Both calls wait for the channel to be ready (a coordinator starting or
  // restarting) until the session's deadline. A join cut off by UNAVAILABLE
  // (the coordinator went away mid-rendezvous) is made again with the same
  // member id and key: a retry at the same coordinator, a fresh join at a
  // restarted one, which has to learn the job again first.
  //
  // A new session while the coordinator is known to be down waits for it
  // only kCoordinatorDownGrace (it may just be back: the channel reconnects
  // within a second), then fails naming it: no job can form without it. A
  // join already under way rides out a restart (the retries below).
  constexpr absl::Duration kCoordinatorDownGrace = absl::Seconds(2);
  const bool down_at_start =
      coordinator_watch_ != nullptr && !coordinator_watch_->Describe().empty();
  for (int attempt = 1;; ++attempt) {
    v1::CreateJobResponse cresp;
    const absl::Time create_deadline =
        attempt == 1 && down_at_start ? std::min(deadline, absl::Now() + kCoordinatorDownGrace)
                                      : deadline;
    auto rpc = CoordinatorRpcContext(std::max(create_deadline - absl::Now(), absl::Milliseconds(1)),
                                     tenant_token);
    rpc->set_wait_for_ready(true);
    absl::Status s = FromGrpcStatus(coordinator_->CreateJob(rpc.get(), creq, &cresp));
    if (!s.ok()) {
      const std::string why = coordinator_watch_ != nullptr ? coordinator_watch_->Describe() : "";
      if (!why.empty() && (absl::IsUnavailable(s) || absl::IsDeadlineExceeded(s))) {
        return absl::UnavailableError(absl::StrCat(
            "create job '", creq.job_id(), "': ", why,
            "; no job can be created or joined until it answers (", s.message(), ")"));
      }
      return absl::Status(s.code(), absl::StrCat("coordinator ", options_.coordinator,
                                                 ": create job '", creq.job_id(), "': ",
                                                 s.message()));
    }
    jreq.set_timeout_ms(std::max<int64_t>(1, absl::ToInt64Milliseconds(deadline - absl::Now())));
    v1::JoinJobResponse jresp;
    rpc = CoordinatorRpcContext(deadline - absl::Now() + absl::Seconds(2), tenant_token);
    rpc->set_wait_for_ready(true);
    s = FromGrpcStatus(coordinator_->JoinJob(rpc.get(), jreq, &jresp));
    if (s.ok()) return jresp;
    if (s.code() != absl::StatusCode::kUnavailable || absl::Now() >= deadline) return s;
    GS_LOG(WARNING) << "join of job '" << creq.job_id() << "' (member " << jreq.member_id()
                    << ", attempt " << attempt << ") cut off: " << s.message() << "; joining again";
    absl::SleepFor(absl::Milliseconds(100));
  }
}

absl::StatusOr<std::shared_ptr<Session>> Daemon::OpenSession(const OpenSessionArgs& args) {
  {
    absl::MutexLock l(&mu_);
    if (shut_down_) return absl::UnavailableError("daemon is shutting down");
    if (draining_) return absl::UnavailableError("gradsyncd is draining for shutdown (SIGTERM)");
    // One uid's sessions, open and opening, are bounded: a local user cannot
    // take the daemon's threads, descriptors and memory from the others.
    int held = opening_[args.owner_uid];
    for (const auto& [id, s] : sessions_) held += s->info().owner_uid == args.owner_uid ? 1 : 0;
    if (held >= options_.max_sessions_per_uid) {
      return absl::ResourceExhaustedError(absl::StrCat(
          "uid ", args.owner_uid, " already has ", held, " sessions on this gradsyncd (at most ",
          options_.max_sessions_per_uid, ", --max_sessions_per_uid); close some first"));
    }
    ++opening_[args.owner_uid];
  }
  struct Opening {
    Daemon* d;
    int64_t uid;
    ~Opening() {
      absl::MutexLock l(&d->mu_);
      if (--d->opening_[uid] <= 0) d->opening_.erase(uid);
    }
  } opening{this, args.owner_uid};
  RETURN_IF_ERROR(CheckSessionShape(args.world_size, args.rank, args.tcp_streams));
  if (!args.expected_coordinator.empty() &&
      !SameGrpcTarget(args.expected_coordinator, options_.coordinator)) {
    return absl::FailedPreconditionError(absl::StrCat(
        "this gradsyncd (node ", options_.node_id, ") joins jobs at coordinator '",
        options_.coordinator, "', not at '", args.expected_coordinator,
        "' that the client asked for: point the client at a daemon of that cluster"));
  }
  const absl::Time deadline = absl::Now() + args.timeout;
  const std::string session_id =
      absl::StrCat(options_.node_id, "-", ::getpid(), "-", next_session_++);
  v1::CreateJobRequest creq;
  creq.set_job_id(args.job_id);
  creq.set_world_size(args.world_size);
  creq.mutable_options()->set_heartbeat_timeout_ms(args.heartbeat_timeout_ms);
  creq.mutable_options()->set_op_timeout_ms(args.op_timeout_ms);
  creq.mutable_options()->set_tcp_streams(args.tcp_streams > 0 ? args.tcp_streams
                                                                : options_.tcp_streams);
  creq.mutable_options()->set_algorithm(args.algorithm);
  creq.mutable_options()->set_codec(args.codec);
  creq.mutable_options()->set_timeline(args.timeline);
  creq.mutable_options()->set_ps_shards(args.ps_shards);
  creq.mutable_options()->set_data_tls(options_.data_tls);
  // The member's secret at the coordinator: its id is public, the key proves
  // this daemon's heartbeats, retries and leave.
  absl::StatusOr<std::string> member_key = ipc::RandomBytes(kMemberKeyBytes);
  if (!member_key.ok()) return member_key.status();
  v1::JoinJobRequest jreq;
  jreq.set_job_id(args.job_id);
  jreq.set_member_id(session_id);
  jreq.set_member_key(*member_key);
  jreq.set_requested_rank(args.rank);
  jreq.mutable_data_endpoint()->set_host(options_.advertise_host);
  jreq.mutable_data_endpoint()->set_port(listener_->port());
  jreq.mutable_data_endpoint()->set_rdma(rdma_advertised_);
  jreq.mutable_data_endpoint()->set_rdma_required(options_.transport == TransportMode::kRdma);
  {
    absl::MutexLock l(&mu_);
    jreq.set_status_endpoint(status_endpoint_);
  }
  absl::StatusOr<v1::JoinJobResponse> joined = CreateAndJoin(creq, jreq, args.tenant_token, deadline);
  if (!joined.ok()) return joined.status();
  const v1::JoinJobResponse& jresp = *joined;

  SessionInfo info;
  info.session_id = session_id;
  info.job_id = args.job_id;
  info.member_id = session_id;
  info.member_key = *std::move(member_key);
  info.job_key = jresp.job_key();
  info.data_tls = jresp.options().data_tls();
  info.tenant = jresp.tenant();
  info.tenant_token = args.tenant_token;
  info.owner_uid = args.owner_uid;
  info.client_pid = args.client_pid;
  info.rank = jresp.rank();
  info.world_size = jresp.world_size();
  info.epoch = jresp.epoch();
  const int64_t op_ms = jresp.options().op_timeout_ms();
  if (op_ms > 0) info.default_op_timeout = absl::Milliseconds(op_ms);
  if (const int64_t hb_ms = jresp.options().heartbeat_timeout_ms(); hb_ms > 0) {
    info.heartbeat_timeout = absl::Milliseconds(hb_ms);
  }
  info.job_algorithm = jresp.options().algorithm();
  info.job_codec = jresp.options().codec();
  for (const auto& e : jresp.ps_shards()) {
    info.ps_shards.push_back(HostPort{e.host(), e.port()});
    info.ps_shard_rdma.push_back(e.rdma());
  }
  for (const std::string& id : jresp.ps_shard_ids()) {
    info.ps_shard_keys.push_back(PsShardKey(info.job_key, id));
  }
  absl::StatusOr<std::string> token = ipc::RandomBytes(ipc::kRegistrationTokenBytes);
  if (!token.ok()) {
    LeaveJob(info);
    return token.status();
  }
  info.registration_token = std::move(*token);
  if (jresp.options().timeline()) {
    // A tenant's job "t/j" writes "t+j.epoch…" ('+' is in neither name).
    info.timeline_path = absl::StrCat(options_.timeline_dir, "/",
                                      absl::StrReplaceAll(info.scoped_job_id(), {{"/", "+"}}), ".epoch",
                                      info.epoch, ".rank", info.rank, ".trace.json");
  }
  if (options_.data_tls && !info.data_tls) {
    LeaveJob(info);
    return absl::FailedPreconditionError(absl::StrCat(
        "job '", args.job_id, "' runs without TLS on the data plane (it was created by a daemon "
        "without --data_tls), and this daemon (node ", options_.node_id,
        ") requires it: run every daemon of the cluster with the same --data_tls"));
  }
  if (!info.job_algorithm.empty() && info.job_algorithm != "auto" &&
      !ParseAlgorithm(info.job_algorithm).ok()) {
    LeaveJob(info);
    return absl::InvalidArgumentError(absl::StrCat("job '", args.job_id, "': ",
                                                   ParseAlgorithm(info.job_algorithm).status().message()));
  }
  if (absl::StatusOr<CodecRequest> codec = ParseCodecRequest(info.job_codec, /*job=*/true);
      !codec.ok()) {
    LeaveJob(info);
    return absl::InvalidArgumentError(
        absl::StrCat("job '", args.job_id, "': codec: ", codec.status().message()));
  }

  // Where the ranks live: ranks with the same data endpoint share a daemon
  // (in order of first appearance, so daemon i hosts a rank no higher than
  // those of daemon i + 1).
  JobPlacement placement;
  placement.world = info.world_size;
  std::vector<HostPort> node_endpoints;
  std::vector<TransportAdvert> node_rdma;  // what each daemon advertised (Endpoint.rdma)
  const HostPort mine{options_.advertise_host, listener_->port()};
  for (const auto& m : jresp.members()) {
    const HostPort hp{m.data_endpoint().host(), m.data_endpoint().port()};
    auto it = std::find_if(node_endpoints.begin(), node_endpoints.end(), [&](const HostPort& e) {
      return e.host == hp.host && e.port == hp.port;
    });
    const int node = static_cast<int>(it - node_endpoints.begin());
    if (it == node_endpoints.end()) {
      node_endpoints.push_back(hp);
      node_rdma.push_back({m.data_endpoint().rdma(), m.data_endpoint().rdma_required(),
                           absl::StrCat("daemon ", node, " (", hp.ToString(), ")")});
      placement.ranks_of_node.emplace_back();
      placement.node_names.push_back(hp.ToString());
    }
    placement.node_of_rank.push_back(node);
    placement.ranks_of_node[node].push_back(static_cast<int>(placement.node_of_rank.size()) - 1);
    if (hp.host == mine.host && hp.port == mine.port) placement.node_index = node;
  }
  const int streams = std::max(1, jresp.options().tcp_streams());
  // Heartbeats from now on, while the epoch's connections and link probe run.
  {
    absl::MutexLock l(&mu_);
    setting_up_[session_id] = info;
  }
  struct SetupDone {
    Daemon* d;
    const std::string& id;
    ~SetupDone() {
      absl::MutexLock l(&d->mu_);
      d->setting_up_.erase(id);
    }
  } setup_done{this, session_id};
  auto executor = GetOrCreateExecutor(info, placement, node_endpoints, node_rdma, streams,
                                      std::max(deadline, absl::Now() + absl::Seconds(5)));
  if (!executor.ok()) {
    LeaveJob(info);
    return executor.status();
  }
  info.link = (*executor)->link();
  info.transport = absl::StrCat((*executor)->transport(), ": ", (*executor)->transport_detail());
  info.memory_limit_bytes = options_.session_memory_limit_bytes;
  auto session = std::make_shared<Session>(info, *executor, options_.observer, tenant_memory_);
  (*executor)->Attach(session.get());
  {
    absl::MutexLock l(&mu_);
    if (shut_down_) {
      session->Close();
      LeaveJob(info);
      return absl::UnavailableError("daemon is shutting down");
    }
    sessions_[session_id] = session;
  }
  GS_LOG(INFO) << "session " << session_id << " (" << args.client_name << ", pid "
               << args.client_pid << "): job '" << args.job_id << "' epoch " << info.epoch
               << " rank " << info.rank << " of " << info.world_size << " ("
               << placement.local_ranks().size() << " on this daemon, " << placement.nodes()
               << " daemon(s))";
  WatchClient(info);
  return session;
}

void Daemon::SetStatusEndpoint(const std::string& endpoint) {
  absl::MutexLock l(&mu_);
  status_endpoint_ = endpoint;
}

std::vector<SessionStatus> Daemon::Status() const {
  std::vector<std::shared_ptr<Session>> sessions;
  {
    absl::MutexLock l(&mu_);
    for (const auto& [id, s] : sessions_) sessions.push_back(s);
  }
  std::vector<SessionStatus> out;
  for (const auto& s : sessions) out.push_back(s->Status());
  return out;
}

absl::StatusOr<std::shared_ptr<Session>> Daemon::FindSession(const std::string& id) {
  absl::MutexLock l(&mu_);
  auto it = sessions_.find(id);
  if (it == sessions_.end()) {
    return absl::NotFoundError(absl::StrCat("no session '", id, "' on this daemon"));
  }
  it->second->Touch();
  return it->second;
}

absl::StatusOr<std::shared_ptr<Session>> Daemon::AuthorizeFdRequest(const std::string& session_id,
                                                                    const std::string& token) {
  std::shared_ptr<Session> session;
  {
    absl::MutexLock l(&mu_);
    auto it = sessions_.find(session_id);
    if (it != sessions_.end()) session = it->second;
  }
  // One answer for an unknown session and a wrong token: the fd socket does
  // not tell which session ids exist. The token comparison takes the same
  // time whatever the bytes.
  const std::string& want = session != nullptr ? session->info().registration_token : token;
  unsigned char diff = session == nullptr || want.size() != token.size() ? 1 : 0;
  for (size_t i = 0; i < std::min(want.size(), token.size()); ++i) {
    diff |= static_cast<unsigned char>(want[i] ^ token[i]);
  }
  if (diff != 0) {
    return absl::PermissionDeniedError(absl::StrCat(
        "no session '", session_id, "' on this daemon with that registration token"));
  }
  session->Touch();
  return session;
}

absl::StatusOr<BufferInfo> Daemon::RegisterFdBuffer(const ipc::RegisterRequest& request, int fd,
                                                    const ucred& peer) {
  ASSIGN_OR_RETURN(std::shared_ptr<Session> session,
                   AuthorizeFdRequest(request.session_id, request.token));
  RETURN_IF_ERROR(CheckOwner(session->info(), peer.uid, "register a buffer of"));
  return session->RegisterBuffer(fd, request.offset, request.size,
                                 absl::StrCat("fd of pid ", peer.pid, " (uid ", peer.uid, ")"));
}

absl::Status Daemon::CloseSession(const std::string& id) {
  std::shared_ptr<Session> s;
  {
    absl::MutexLock l(&mu_);
    auto it = sessions_.find(id);
    if (it == sessions_.end()) {
      return absl::NotFoundError(absl::StrCat("no session '", id, "' on this daemon"));
    }
    s = it->second;
    sessions_.erase(it);
  }
  if (client_watch_ != nullptr) client_watch_->Unwatch(id);
  s->Close();
  LeaveJob(s->info());
  GS_LOG(INFO) << "session " << id << " closed";
  return absl::OkStatus();
}

void Daemon::WatchClient(const SessionInfo& info) {
  if (client_watch_ == nullptr || info.client_pid <= 0) return;
  const absl::Status s = client_watch_->Watch(info.session_id, info.client_pid);
  if (absl::IsNotFound(s)) {
    ClientExited(info.session_id, info.client_pid);
  } else if (!s.ok()) {
    GS_LOG(WARNING) << "session " << info.session_id << ": not watching its client: "
                    << s.message();
  }
}

void Daemon::ClientExited(const std::string& id, int64_t pid) {
  std::shared_ptr<Session> s;
  {
    absl::MutexLock l(&mu_);
    auto it = sessions_.find(id);
    if (it == sessions_.end()) return;  // closed meanwhile
    s = it->second;
    sessions_.erase(it);
  }
  const SessionInfo& info = s->info();
  const absl::Status why = absl::UnavailableError(
      absl::StrCat("rank ", info.rank, " (client pid ", pid, ") of job '", info.job_id,
                   "' disconnected: its process exited"));
  GS_LOG(WARNING) << "session " << id << ": " << why.message() << "; closing the session";
  // A failure, not a leave: the other daemons are told at once (ABORT), as
  // their pending op cannot complete without this rank.
  s->AbortEpoch(why);
  s->Close(why);
  NotifyClosed(id, why);
  LeaveJob(info);
}

void Daemon::SetSessionClosedListener(SessionClosedListener listener) {
  absl::MutexLock l(&listener_mu_);
  session_closed_ = std::move(listener);
}

void Daemon::NotifyClosed(const std::string& id, const absl::Status& why) {
  absl::MutexLock l(&listener_mu_);
  if (session_closed_) session_closed_(id, why);
}

void Daemon::LeaveJob(const SessionInfo& info) {
  v1::LeaveJobRequest req;
  req.set_job_id(info.job_id);
  req.set_rank(info.rank);
  req.set_epoch(info.epoch);
  req.set_member_id(info.member_id);
  req.set_member_key(info.member_key);
  v1::LeaveJobResponse resp;
  auto rpc = CoordinatorRpcContext(absl::Seconds(2), info.tenant_token);
  grpc::Status s = coordinator_->LeaveJob(rpc.get(), req, &resp);
  if (!s.ok()) {
    GS_LOG(WARNING) << "leave job '" << info.job_id << "' rank " << info.rank << ": "
                    << s.error_message();
  }
}

int Daemon::Drain(absl::Duration timeout) {
  const std::string why =
      "gradsyncd is draining for shutdown (SIGTERM): no new ops; running ops finish";
  std::vector<std::shared_ptr<Session>> sessions;
  {
    absl::MutexLock l(&mu_);
    draining_ = true;
    for (const auto& [id, s] : sessions_) sessions.push_back(s);
  }
  for (auto& s : sessions) s->StopAccepting(why);
  const absl::Time deadline = absl::Now() + timeout;
  int pending = 0;
  while (true) {
    pending = 0;
    for (auto& s : sessions) pending += s->has_pending_ops() ? 1 : 0;
    if (pending == 0 || absl::Now() >= deadline) break;
    absl::SleepFor(absl::Milliseconds(20));
  }
  return pending;
}

void Daemon::Shutdown(const absl::Status& reason) {
  std::map<std::string, std::shared_ptr<Session>> sessions;
  {
    absl::MutexLock l(&mu_);
    if (shut_down_) return;
    shut_down_ = true;
    sessions.swap(sessions_);
  }
  stop_.Notify();
  if (heartbeat_thread_.joinable()) heartbeat_thread_.join();
  for (auto& [id, s] : sessions) {
    s->AbortEpoch(reason);
    s->Close();
    LeaveJob(s->info());
  }
}

}  // namespace gradsync
