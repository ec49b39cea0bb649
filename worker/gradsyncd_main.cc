// gradsyncd: the per-node gradsync daemon. See docs/operations.md for flags.
#include <grpcpp/grpcpp.h>
#include <grpcpp/health_check_service_interface.h>
#include <signal.h>
#include <sys/stat.h>

#include <cstdio>
#include <unistd.h>

#include <string>
#include <thread>
#include <vector>

#include "common/process.h"
#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/build_info.h"
#include "common/config_file.h"
#include "common/logging.h"
#include "common/tls_flags.h"
#include "common/port_file.h"
#include "common/metrics.h"
#include "common/net.h"
#include "common/sd_notify.h"
#include "worker/local_client_socket.h"
#include "worker/daemon_metrics.h"
#include "worker/buffer_fd_server.h"
#include "worker/buffer_limits.h"
#include "worker/daemon.h"
#include "worker/device_memory.h"
#include "worker/shm_segment.h"
#include "worker/socket_group.h"
#include "worker/status_service.h"
#include "worker/worker_service.h"

ABSL_FLAG(std::string, listen, "unix:/run/gradsync/gradsyncd.sock",
          "gRPC address for local clients: unix:PATH, unix-abstract:NAME or HOST:PORT");
ABSL_FLAG(std::string, coordinator, "127.0.0.1:7070", "gradsync-coordinator address (host:port)");
ABSL_FLAG(std::string, socket_group, "",
          "group of the unix client socket and fd socket (mode 0660): the users who may run "
          "training processes on this node; empty: the daemon's group; refused with a "
          "unix-abstract: socket, which has no file permissions");
ABSL_FLAG(std::string, data_listen, "0.0.0.0:7071",
          "data-plane TCP listen address (port 0 = any free port)");
ABSL_FLAG(std::string, advertise_host, "",
          "host name or IP peers use to reach this daemon's data plane (default: the "
          "--data_listen host, or the hostname when that is a wildcard)");
ABSL_FLAG(std::string, node_id, "", "name of this node in logs and member ids (default: hostname)");
ABSL_FLAG(int64_t, heartbeat_interval_ms, 500, "heartbeat period to the coordinator");
ABSL_FLAG(int64_t, session_lease_ms, 120000,
          "a session with no client call and no running op for this long is closed");
ABSL_FLAG(int32_t, max_sessions_per_uid, 256,
          "sessions one uid may hold (open or opening) on this daemon; more are "
          "RESOURCE_EXHAUSTED naming the uid");
ABSL_FLAG(int64_t, session_memory_limit_mb, 0,
          "the most buffer memory (allocated and registered) one session may hold, MiB; "
          "0 = half of the machine's buffer memory (the smaller of physical memory and /dev/shm)");
ABSL_FLAG(int64_t, tenant_memory_limit_mb, 0,
          "the most buffer memory all sessions of one tenant (without tenants: of one uid) may "
          "hold on this daemon, MiB; 0 = half of the machine's buffer memory");
ABSL_FLAG(int64_t, buffer_memory_limit_mb, 0,
          "the most buffer memory all sessions may hold on this daemon together, MiB; "
          "0 = three quarters of the machine's buffer memory");
ABSL_FLAG(int64_t, segment_bytes, 1 << 20, "largest pipelined ring message");
ABSL_FLAG(int32_t, max_inflight, 4, "ring segments in flight per direction");
ABSL_FLAG(int32_t, socket_buffer_bytes, 0,
          "SO_SNDBUF/SO_RCVBUF of data sockets; 0 = the kernel's, autotuned (tcp_rmem/tcp_wmem)");
ABSL_FLAG(std::string, timeline_dir, "/var/lib/gradsync/timeline",
          "where jobs with the timeline switched on get their Chrome-trace files");
ABSL_FLAG(int64_t, ps_partition_bytes, 1 << 20,
          "partition size of parameter-server allreduces (algo ps)");
ABSL_FLAG(int64_t, drain_timeout_ms, 10000,
          "on SIGTERM: how long running and queued ops may take to finish before the daemon "
          "fails them and exits");
ABSL_FLAG(int32_t, spin_us, 1000,
          "microseconds the data plane polls (yielding the CPU) while it waits for peers before it "
          "blocks in poll(2) (0 = never spin); lower latency for small and mid-size ops at the "
          "cost of CPU while an op waits");
ABSL_FLAG(int32_t, queue_spin_us, 50,
          "microseconds a job's executor keeps polling its ranks' shared-memory op queues after an "
          "op before it sleeps on the futex (0 = never); saves a wake-up per small op");
ABSL_FLAG(bool, data_tls, false,
          "TLS 1.3 on every data connection of the jobs this daemon creates (node certificates, "
          "bound to the job key), and join no job without it; needs --tls_cert/--tls_key/--tls_ca");
ABSL_FLAG(int32_t, tcp_streams, 2,
          "TCP connections per pair of daemons of a job, for jobs this daemon creates (a job's value wins)");
ABSL_FLAG(std::string, transport, "auto",
          "data plane between daemons: auto (RDMA when every daemon of a job epoch has the same "
          "kind of RDMA port, else TCP), tcp, or rdma (refuse to start without an RDMA port, and "
          "fail jobs that cannot use it)");
ABSL_FLAG(std::string, device_ops, "in_place",
          "device buffers' ops: in_place (on the GPU: messages staged through page-locked host "
          "blocks or sent by GPUDirect RDMA, reduced by CUDA kernels, co-located ranks combined on "
          "the GPU; not the PS path) or host_twin (copied to host memory before each op and back "
          "after)");
ABSL_FLAG(std::string, rdma_device, "",
          "verbs device for RDMA (e.g. mlx5_0; empty = the first with an ACTIVE port)");
ABSL_FLAG(int32_t, rdma_port, 0, "port of --rdma_device (0 = its first ACTIVE port)");
ABSL_FLAG(int32_t, rdma_gid_index, -1,
          "RoCE GID table index (-1 = the first RoCE v2 entry with an IPv4 address)");
ABSL_FLAG(std::string, rdma_emulation, "",
          "tests only: use the in-process verbs emulation, linked with the other processes of "
          "this fabric name on this host, instead of libibverbs (docs/architecture.md)");
ABSL_FLAG(std::string, port_file, "",
          "if set, write the data-plane port and the metrics port (one per line) here once serving");
ABSL_FLAG(int32_t, v, 0, "log verbosity: 0 info, 1 debug");
ABSL_FLAG(std::string, status_listen, "0.0.0.0:7072",
          "TCP address of the read-only status service used by `gradsync status` (empty = off)");
ABSL_FLAG(std::string, metrics_listen, "0.0.0.0:9471",
          "Prometheus /metrics HTTP address (empty = off; port 0 = any free port)");
ABSL_FLAG(bool, metrics_identifying_labels, false,
          "label metrics with job ids (TENANT/JOB) and peer daemons' addresses (the per-job "
          "gradsync_job_* series, peer_daemon); the metrics endpoint has no authentication: only "
          "for a scraper every user of the node may trust");
ABSL_FLAG(std::string, fd_socket, "auto",
          "unix socket where local clients register memory by passing its descriptor: "
          "unix:PATH or unix-abstract:NAME; auto = --listen + \".fd\" for a unix --listen, "
          "none for a TCP one; empty = off");
ABSL_FLAG(std::string, config, "",
          "config file of `flag = value` lines (docs/operations.md); command-line flags win");

namespace {

absl::Status PrepareUnixSocket(const std::string& listen) {
  if (!absl::StartsWith(listen, "unix:")) return absl::OkStatus();
  std::string path = listen.substr(5);
  if (absl::StartsWith(path, "//")) path = path.substr(2);
  if (path.size() > 107) {
    return absl::InvalidArgumentError(absl::StrCat("unix socket path '", path, "' is ", path.size(),
                                                   " bytes; the limit is 107"));
  }
  const size_t slash = path.rfind('/');
  if (slash != std::string::npos && slash > 0) {
    const std::string dir = path.substr(0, slash);
    ::mkdir(dir.c_str(), 0755);
  }
  return absl::OkStatus();
}

// The fd socket --fd_socket names ("auto": derived from --listen).
std::string FdSocketAddress() {
  std::string fd_socket = absl::GetFlag(FLAGS_fd_socket);
  if (fd_socket == "auto") fd_socket = gradsync::BufferFdServer::DefaultAddress(absl::GetFlag(FLAGS_listen));
  return fd_socket;
}

// --socket_group with an abstract socket restricts nothing: refused before
// anything starts (worker/socket_group.h).
absl::Status CheckSocketGroups() {
  const std::string group = absl::GetFlag(FLAGS_socket_group);
  const std::pair<std::string, const char*> sockets[] = {
      {absl::GetFlag(FLAGS_listen), "the client socket (--listen)"},
      {FdSocketAddress(), "the fd socket (--fd_socket)"}};
  for (const auto& [address, what] : sockets) {
    if (!absl::StartsWith(address, "unix-abstract:")) continue;
    absl::StatusOr<gradsync::ipc::UnixAddress> parsed = gradsync::ipc::ParseUnixAddress(address);
    if (!parsed.ok()) return parsed.status();
    if (absl::Status s = gradsync::CheckSocketGroup(*parsed, group, what); !s.ok()) return s;
  }
  return absl::OkStatus();
}

}  // namespace

// The daemon's health-service entry for its coordinator link: SERVING while
// the coordinator answers (`grpc_health_probe -service=gradsync.coordinator`).
constexpr char kCoordinatorHealth[] = "gradsync.coordinator";

int main(int argc, char** argv) {
  gradsync::InitFlagsUsage(
      "gradsyncd",
      "gradsync node daemon: serves the training processes of this node (unix socket, shared-"
      "memory op queues) and runs their collectives with the other daemons.\n"
      "  gradsyncd [--config=FILE] [--listen=unix:/run/gradsync/gradsyncd.sock]\n"
      "      [--coordinator=HOST:7070] [--data_listen=0.0.0.0:7071] [--status_listen=0.0.0.0:7072]\n"
      "      [--metrics_listen=0.0.0.0:9471] [--port_file=PATH] [--v=0|1]",
      __FILE__);
  std::vector<char*> positional = absl::ParseCommandLine(argc, argv);
  gradsync::InitProcess();
  if (positional.size() > 1) {
    std::fprintf(stderr, "gradsyncd: unexpected argument '%s'\n", positional[1]);
    return 2;
  }
  if (const std::string config = absl::GetFlag(FLAGS_config); !config.empty()) {
    if (absl::Status s = gradsync::ApplyConfigFile(config, argc, argv); !s.ok()) {
      std::fprintf(stderr, "gradsyncd: --config: %s\n", std::string(s.message()).c_str());
      return 2;
    }
  }
  gradsync::SetLogTag("gradsyncd");
  if (absl::GetFlag(FLAGS_v) > 0) gradsync::SetMinLogLevel(gradsync::LogLevel::kDebug);
  if (absl::Status s = CheckSocketGroups(); !s.ok()) {
    GS_LOG(ERROR) << "cannot start: " << s.message();
    return 2;
  }

  // Block the stop signals in every thread; one thread waits for them.
  sigset_t stop_signals;
  sigemptyset(&stop_signals);
  sigaddset(&stop_signals, SIGTERM);
  sigaddset(&stop_signals, SIGINT);
  pthread_sigmask(SIG_BLOCK, &stop_signals, nullptr);
  signal(SIGPIPE, SIG_IGN);

  int swept = gradsync::SweepStaleSegments();
  if (swept > 0) GS_LOG(INFO) << "removed " << swept << " stale shared-memory segments";

  // Metrics: registered before the daemon starts, served over HTTP.
  absl::StatusOr<gradsync::TlsConfig> tls = gradsync::ServerTlsConfigFromFlags("gradsyncd");
  if (!tls.ok()) {
    GS_LOG(ERROR) << "cannot start: " << tls.status().message();
    return 2;
  }
  gradsync::MetricsRegistry metrics;
  if (absl::Status s = metrics.AddProcessMetrics(); !s.ok()) {
    GS_LOG(ERROR) << "metrics: " << s.message();
    return 1;
  }
  if (auto g = metrics.AddGauge("gradsync_daemon_insecure",
                                 "1 while the gRPC control plane is plaintext and unauthenticated "
                                 "(--insecure), 0 with mutual TLS",
                                 {});
      g.ok()) {
    (*g)->Set(tls->enabled() ? 0 : 1);
  }
  auto daemon_metrics =
      gradsync::DaemonMetrics::Create(metrics, absl::GetFlag(FLAGS_metrics_identifying_labels));
  if (!daemon_metrics.ok()) {
    GS_LOG(ERROR) << "metrics: " << daemon_metrics.status().message();
    return 1;
  }
  std::unique_ptr<gradsync::MetricsServer> metrics_server;
  if (const std::string address = absl::GetFlag(FLAGS_metrics_listen); !address.empty()) {
    auto started = gradsync::MetricsServer::Start(address, metrics);
    if (!started.ok()) {
      GS_LOG(ERROR) << "--metrics_listen: " << started.status().message();
      return 1;
    }
    metrics_server = std::move(*started);
  }

  gradsync::DaemonOptions opts;
  opts.observer = daemon_metrics->get();
  opts.coordinator = absl::GetFlag(FLAGS_coordinator);
  opts.tls = *tls;
  auto data_listen = gradsync::ParseHostPort(absl::GetFlag(FLAGS_data_listen));
  if (!data_listen.ok()) {
    GS_LOG(ERROR) << "--data_listen: " << data_listen.status().message();
    return 2;
  }
  opts.data_listen = *data_listen;
  opts.advertise_host = absl::GetFlag(FLAGS_advertise_host);
  opts.node_id = absl::GetFlag(FLAGS_node_id);
  opts.heartbeat_interval = absl::Milliseconds(absl::GetFlag(FLAGS_heartbeat_interval_ms));
  opts.session_lease = absl::Milliseconds(absl::GetFlag(FLAGS_session_lease_ms));
  opts.max_sessions_per_uid = absl::GetFlag(FLAGS_max_sessions_per_uid);
  {
    const uint64_t machine = gradsync::MachineBufferMemory();
    const gradsync::BufferLimits defaults = gradsync::DefaultBufferLimits(machine);
    const std::pair<const char*, int64_t> flags[] = {
        {"--session_memory_limit_mb", absl::GetFlag(FLAGS_session_memory_limit_mb)},
        {"--tenant_memory_limit_mb", absl::GetFlag(FLAGS_tenant_memory_limit_mb)},
        {"--buffer_memory_limit_mb", absl::GetFlag(FLAGS_buffer_memory_limit_mb)}};
    for (const auto& [name, mb] : flags) {
      if (mb < 0 || mb > (int64_t{1} << 40)) {
        GS_LOG(ERROR) << name << " must be in [0, 2^40], got " << mb;
        return 2;
      }
    }
    auto bytes = [](int64_t mb, uint64_t fallback) {
      return mb > 0 ? static_cast<uint64_t>(mb) << 20 : fallback;
    };
    opts.session_memory_limit_bytes = bytes(flags[0].second, defaults.session);
    opts.tenant_memory_limit_bytes = bytes(flags[1].second, defaults.account);
    opts.buffer_memory_limit_bytes = bytes(flags[2].second, defaults.total);
    GS_LOG(INFO) << "buffer memory: " << (opts.session_memory_limit_bytes >> 20)
                 << " MiB per session, " << (opts.tenant_memory_limit_bytes >> 20)
                 << " MiB per tenant (or uid), " << (opts.buffer_memory_limit_bytes >> 20)
                 << " MiB in all (the machine can back " << (machine >> 20) << " MiB)";
  }
  opts.ring.segment_bytes = static_cast<size_t>(absl::GetFlag(FLAGS_segment_bytes));
  opts.ring.max_inflight = absl::GetFlag(FLAGS_max_inflight);
  opts.socket_buffer_bytes = absl::GetFlag(FLAGS_socket_buffer_bytes);
  opts.tcp_streams = absl::GetFlag(FLAGS_tcp_streams);
  opts.data_tls = absl::GetFlag(FLAGS_data_tls);
  if (opts.data_tls && !opts.tls.enabled()) {
    GS_LOG(ERROR) << "--data_tls needs this node's certificate (--tls_cert, --tls_key, --tls_ca); "
                     "it cannot run with --insecure";
    return 2;
  }
  if (auto mode = gradsync::ParseTransportMode(absl::GetFlag(FLAGS_transport)); !mode.ok()) {
    GS_LOG(ERROR) << mode.status().message();
    return 2;
  } else {
    opts.transport = *mode;
  }
  if (const std::string d = absl::GetFlag(FLAGS_device_ops); d != "in_place" && d != "host_twin") {
    GS_LOG(ERROR) << "--device_ops '" << d << "': expected in_place or host_twin";
    return 2;
  } else {
    opts.planner.device_ops_in_place = d == "in_place";
  }
  opts.rdma_device = absl::GetFlag(FLAGS_rdma_device);
  opts.rdma_port = absl::GetFlag(FLAGS_rdma_port);
  opts.rdma_gid_index = absl::GetFlag(FLAGS_rdma_gid_index);
  opts.rdma_emulation = absl::GetFlag(FLAGS_rdma_emulation);
  if (opts.rdma_port < 0 || opts.rdma_port > 255 || opts.rdma_gid_index < -1 ||
      opts.rdma_gid_index > 255) {
    GS_LOG(ERROR) << "invalid flags: --rdma_port must be in [0, 255], --rdma_gid_index in [-1, 255]";
    return 2;
  }
  opts.spin_us = std::max(0, absl::GetFlag(FLAGS_spin_us));
  opts.executor_spin = absl::Microseconds(std::max(0, absl::GetFlag(FLAGS_queue_spin_us)));
  opts.timeline_dir = absl::GetFlag(FLAGS_timeline_dir);
  opts.planner.ps_partition_bytes =
      static_cast<uint64_t>(std::max<int64_t>(4096, absl::GetFlag(FLAGS_ps_partition_bytes)));
  if (opts.heartbeat_interval <= absl::ZeroDuration() || opts.ring.segment_bytes < 4096 ||
      opts.ring.max_inflight < 1 || opts.tcp_streams < 1 || opts.tcp_streams > 16 ||
      opts.max_sessions_per_uid < 1) {
    GS_LOG(ERROR) << "invalid flags: --heartbeat_interval_ms must be > 0, --segment_bytes >= "
                     "4096, --max_inflight >= 1, --tcp_streams in [1, 16], "
                     "--max_sessions_per_uid >= 1";
    return 2;
  }
  // The coordinator's reachability, from start-up on: the health service's
  // "gradsync.coordinator" entry and the systemd status line follow it.
  struct CoordinatorState {
    absl::Mutex mu;
    grpc::Server* server = nullptr;  // once serving
    std::string serving;             // the status line while all is well
    bool reachable = true;
    std::string detail;
    void Apply() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
      if (server != nullptr) server->GetHealthCheckService()->SetServingStatus(kCoordinatorHealth, reachable);
      if (serving.empty()) return;
      (void)gradsync::NotifyStatus(
          reachable ? serving : absl::StrCat(serving, "; coordinator unreachable: ", detail));
    }
  };
  auto coordinator_state = std::make_shared<CoordinatorState>();
  opts.on_coordinator_change = [coordinator_state](bool reachable, const std::string& detail) {
    absl::MutexLock l(&coordinator_state->mu);
    coordinator_state->reachable = reachable;
    coordinator_state->detail = detail;
    coordinator_state->Apply();
  };
  auto daemon = gradsync::Daemon::Start(opts);
  if (!daemon.ok()) {
    GS_LOG(ERROR) << "cannot start: " << daemon.status().message();
    return 1;
  }
  if (auto g = metrics.AddGauge("gradsync_daemon_rdma_up",
                                 "1 while this daemon advertises a usable RDMA port (--transport "
                                 "auto|rdma), 0 without one",
                                 {});
      g.ok()) {
    (*g)->Set((*daemon)->rdma_advertised().empty() ? 0 : 1);
  }

  const std::string listen = absl::GetFlag(FLAGS_listen);
  absl::Status prep = PrepareUnixSocket(listen);
  if (!prep.ok()) {
    GS_LOG(ERROR) << "--listen: " << prep.message();
    return 2;
  }
  grpc::EnableDefaultHealthCheckService(true);
  // The status service (TCP, read-only), registered with the coordinator.
  gradsync::StatusService status_service(daemon->get(), opts.tls.enabled());
  std::unique_ptr<grpc::Server> status_server;
  int status_port = 0;
  if (const std::string address = absl::GetFlag(FLAGS_status_listen); !address.empty()) {
    auto hp = gradsync::ParseHostPort(address);
    if (!hp.ok()) {
      GS_LOG(ERROR) << "--status_listen: " << hp.status().message();
      return 2;
    }
    grpc::ServerBuilder sb;
    sb.AddChannelArgument(GRPC_ARG_ALLOW_REUSEPORT, 0);
    auto credentials = gradsync::MakeServerCredentials(opts.tls);
    if (!credentials.ok()) {
      GS_LOG(ERROR) << "--status_listen: " << credentials.status().message();
      return 2;
    }
    sb.AddListeningPort(address, *credentials, &status_port);
    sb.RegisterService(&status_service);
    status_server = sb.BuildAndStart();
    if (status_server == nullptr || status_port == 0) {
      GS_LOG(ERROR) << "cannot serve status on " << address;
      return 1;
    }
    const std::string host = (hp->host == "0.0.0.0" || hp->host == "::")
                                 ? opts.advertise_host
                                 : hp->host;
    (*daemon)->SetStatusEndpoint(gradsync::HostPort{host.empty() ? (*daemon)->advertise_host() : host,
                                                    status_port}.ToString());
  }
  gradsync::OpQueueServerOptions queue_options;
  queue_options.spin = absl::Microseconds(std::max(0, absl::GetFlag(FLAGS_queue_spin_us)));
  const std::string fd_socket = FdSocketAddress();
  if (fd_socket.empty()) {
    GS_LOG(WARNING) << "no fd socket (--fd_socket is empty or --listen is TCP): buffers and op "
                       "queues are named POSIX shared memory that a local client can truncate, "
                       "which makes gradsyncd fault (SIGBUS); give --fd_socket on a shared node";
  }
  gradsync::WorkerService service(daemon->get(), queue_options, fd_socket);
  // Declared after `service`, whose segments it hands out: stops first.
  std::unique_ptr<gradsync::BufferFdServer> fd_server;
  if (!fd_socket.empty()) {
    gradsync::Daemon* core = daemon->get();
    auto started = gradsync::BufferFdServer::Start(
        fd_socket, absl::GetFlag(FLAGS_socket_group),
        [core](const gradsync::ipc::RegisterRequest& request, int fd, const ucred& peer) {
          return core->RegisterFdBuffer(request, fd, peer);
        },
        [&service](const gradsync::ipc::FetchRequest& request, const ucred& peer) {
          return service.FetchSegment(request, peer);
        },
        opts.observer);
    if (!started.ok()) {
      GS_LOG(ERROR) << "--fd_socket: " << started.status().message();
      return 1;
    }
    fd_server = std::move(*started);
  }
  // A unix --listen: the daemon accepts the connections itself to learn each
  // caller's uid (sessions belong to the uid that opened them), then hands
  // them to gRPC. A TCP --listen (clients on other hosts) has no uids.
  const bool unix_socket = absl::StartsWith(listen, "unix:") || absl::StartsWith(listen, "unix-abstract:");
  grpc::ServerBuilder builder;
  if (!unix_socket) builder.AddListeningPort(listen, grpc::InsecureServerCredentials());
  builder.RegisterService(&service);
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  if (server == nullptr) {
    GS_LOG(ERROR) << "cannot serve clients on " << listen;
    return 1;
  }
  std::unique_ptr<gradsync::LocalClientSocket> client_socket;
  if (unix_socket) {
    auto listening = gradsync::LocalClientSocket::Listen(listen, absl::GetFlag(FLAGS_socket_group),
                                                         server.get());
    if (!listening.ok()) {
      GS_LOG(ERROR) << "--listen: " << listening.status().message();
      return 1;
    }
    client_socket = *std::move(listening);
    gradsync::LocalClientSocket* sock = client_socket.get();
    service.SetPeerCredentials([sock](const std::string& peer) { return sock->PeerOf(peer); });
    // Only now: a call accepted earlier would read the lookup while it is set
    // and, finding none, open a session without an owner.
    client_socket->StartAccepting();
  } else {
    GS_LOG(WARNING) << "clients over TCP (--listen " << listen
                    << "): sessions are not tied to a uid";
  }
  server->GetHealthCheckService()->SetServingStatus(true);
  const std::string port_file = absl::GetFlag(FLAGS_port_file);
  if (!port_file.empty()) {
    if (absl::Status s = gradsync::WritePortFile(
            port_file, {(*daemon)->data_port(), metrics_server ? metrics_server->port() : 0});
        !s.ok()) {
      GS_LOG(ERROR) << "cannot write --port_file: " << s.message();
      return 1;
    }
  }
  const std::string serving = absl::StrCat(
      "serving clients on ", listen, fd_server ? absl::StrCat(" (fd socket ", fd_socket, ")") : "",
      ", data plane on port ", (*daemon)->data_port(), ", metrics ",
      metrics_server ? absl::StrCat("on http://", metrics_server->address(), "/metrics")
                     : std::string("off"));
  GS_LOG(INFO) << serving << " (node " << (*daemon)->node_id() << ")";
  GS_LOG(INFO) << gradsync::GpuContexts::Describe();
  if (absl::Status s = gradsync::NotifyReady(serving); !s.ok()) GS_LOG(WARNING) << s.message();
  {
    absl::MutexLock l(&coordinator_state->mu);
    coordinator_state->server = server.get();
    coordinator_state->serving = serving;
    coordinator_state->Apply();
  }
  gradsync::Daemon* core = daemon->get();
  auto watchdog = gradsync::SystemdWatchdog::Start([core] {
    core->session_count();  // takes the daemon's lock: a deadlocked daemon stops pinging
    return true;
  });
  if (!watchdog.ok()) GS_LOG(WARNING) << watchdog.status().message() << "; no watchdog pings";

  int sig = 0;
  sigwait(&stop_signals, &sig);
  GS_LOG(INFO) << "received " << (sig == SIGTERM ? "SIGTERM" : "SIGINT") << ", shutting down";
  server->GetHealthCheckService()->SetServingStatus(false);
  if (absl::Status s = gradsync::NotifyStopping("draining"); !s.ok()) GS_LOG(WARNING) << s.message();
  if (watchdog.ok() && *watchdog != nullptr) (*watchdog)->Stop();
  const absl::Duration drain = absl::Milliseconds(std::max<int64_t>(0, absl::GetFlag(FLAGS_drain_timeout_ms)));
  const int left = (*daemon)->Drain(drain);
  if (left > 0) {
    GS_LOG(WARNING) << left << " session(s) still had ops after draining for "
                    << absl::FormatDuration(drain) << "; failing them";
  } else {
    GS_LOG(INFO) << "drained: no op was running";
  }
  (*daemon)->Shutdown(absl::UnavailableError("daemon shutting down"));
  if (client_socket != nullptr) client_socket->StopAccepting();  // no new connections
  server->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(2));
  server->Wait();
  client_socket.reset();  // only now: calls read their caller's credentials from it
  {
    absl::MutexLock l(&coordinator_state->mu);
    coordinator_state->server = nullptr;  // the watch may still report until the daemon goes
  }
  if (status_server != nullptr) {
    status_server->Shutdown(std::chrono::system_clock::now() + std::chrono::milliseconds(500));
    status_server->Wait();
  }
  GS_LOG(INFO) << "stopped";
  return 0;
}
