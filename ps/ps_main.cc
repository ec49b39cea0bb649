// gradsync-ps: one parameter-server shard. Worker daemons connect to it (one
// TCP connection per worker and job), push partitions and get their sums back;
// see ps/README.md.
//
//   gradsync-ps [--listen=0.0.0.0:7073] [--threads=4] [--step_timeout_ms=30000]
//       [--max_memory_mb=8192] [--port_file=PATH] [--v=0|1]
//
// SIGTERM/SIGINT: connected workers get "ps shard K: shutting down"
// (Unavailable), running steps fail, exit 0.
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "common/build_info.h"
#include "common/process.h"
#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "common/logging.h"
#include "common/tls_flags.h"
#include "common/port_file.h"
#include "common/net.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "common/config_file.h"
#include "common/metrics.h"
#include "common/sd_notify.h"
#include "proto/coordinator.grpc.pb.h"
#include "ps/shard.h"
#include "transport/rdma_endpoint.h"

#include <grpcpp/grpcpp.h>
#include <thread>

ABSL_FLAG(std::string, listen, "0.0.0.0:7073",
          "data-plane listen address host:port; port 0 picks a free port (see --port_file)");
ABSL_FLAG(int, threads, 4, "aggregation threads (partition p is reduced on thread p % threads)");
ABSL_FLAG(int64_t, step_timeout_ms, 30000,
          "a step whose pushes are not all in this long after it started fails on every worker, "
          "naming the missing ranks");
ABSL_FLAG(int64_t, max_memory_mb, 8192,
          "staging memory bound: a step reserves workers x its bytes on this shard");
ABSL_FLAG(std::string, port_file, "",
          "if set, the bound port number and a newline are written here (atomically) once "
          "listening");
ABSL_FLAG(int, v, 0, "log verbosity: 0 info, 1 debug");
ABSL_FLAG(std::string, coordinator, "",
          "gradsync-coordinator to register with (host:port); empty = do not register");
ABSL_FLAG(std::string, shard_id, "", "this shard's name at the coordinator (default: host:port)");
ABSL_FLAG(std::string, advertise_host, "",
          "host workers use to reach this shard (default: the --listen host, or the hostname "
          "when that is a wildcard)");
ABSL_FLAG(std::string, metrics_listen, "0.0.0.0:9472",
          "Prometheus /metrics HTTP address (empty = off; port 0 = any free port)");
ABSL_FLAG(bool, metrics_identifying_labels, false,
          "export the per-job series gradsync_ps_job_* (label gradsync_job: the job id with its "
          "tenant); the metrics endpoint has no authentication: only for a trusted scraper");
ABSL_FLAG(std::string, transport, "auto",
          "how workers reach this shard: auto (over RDMA too, for workers that ask, when this "
          "host has a usable RDMA port) or tcp");
ABSL_FLAG(std::string, rdma_device, "", "verbs device (empty = the first with an ACTIVE port)");
ABSL_FLAG(int32_t, rdma_port, 0, "port of --rdma_device (0 = its first ACTIVE port)");
ABSL_FLAG(int32_t, rdma_gid_index, -1,
          "RoCE GID table index (-1 = the first RoCE v2 entry with an IPv4 address)");
ABSL_FLAG(std::string, rdma_emulation, "",
          "tests only: the verbs emulation linked with the other processes of this fabric name "
          "on this host, instead of libibverbs");
ABSL_FLAG(std::string, config, "",
          "config file of `flag = value` lines (docs/operations.md); command-line flags win");

namespace gradsync::ps {
namespace {


std::string HostName() {
  char buf[256] = {0};
  if (::gethostname(buf, sizeof(buf) - 1) != 0) return "localhost";
  return buf;
}

// Keeps this shard registered at the coordinator (RegisterShard is also the
// heartbeat).
class Registrar {
 public:
  Registrar(const std::string& coordinator,
            const std::shared_ptr<grpc::ChannelCredentials>& credentials, std::string id,
            std::string host, int port, std::string rdma)
      : stub_(v1::Coordinator::NewStub(grpc::CreateChannel(coordinator, credentials))),
        id_(std::move(id)),
        host_(std::move(host)),
        port_(port),
        rdma_(std::move(rdma)) {}
  ~Registrar() { Stop(); }
  std::shared_ptr<v1::Coordinator::Stub> stub() const { return stub_; }
  absl::Status RegisterOnce() {
    v1::RegisterShardRequest req;
    req.set_shard_id(id_);
    req.mutable_endpoint()->set_host(host_);
    req.mutable_endpoint()->set_port(port_);
    req.mutable_endpoint()->set_rdma(rdma_);  // workers with the same port use RDMA
    v1::RegisterShardResponse resp;
    grpc::ClientContext ctx;
    ctx.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(5)));
    grpc::Status s = stub_->RegisterShard(&ctx, req, &resp);
    if (!s.ok()) return absl::UnavailableError(s.error_message());
    if (resp.heartbeat_interval_ms() > 0) interval_ = absl::Milliseconds(resp.heartbeat_interval_ms());
    return absl::OkStatus();
  }
  void Start() {
    thread_ = std::thread([this] {
      while (!stop_.WaitForNotificationWithTimeout(interval_)) {
        if (absl::Status s = RegisterOnce(); !s.ok()) {
          GS_LOG(WARNING) << "re-registering with the coordinator: " << s.message();
        }
      }
    });
  }
  void Stop() {
    if (!stop_.HasBeenNotified()) stop_.Notify();
    if (thread_.joinable()) thread_.join();
  }

 private:
  std::shared_ptr<v1::Coordinator::Stub> stub_;
  const std::string id_, host_;
  const int port_;
  const std::string rdma_;
  absl::Duration interval_ = absl::Seconds(1);
  absl::Notification stop_;
  std::thread thread_;
};

// Fetches this shard's key of a job epoch from the coordinator (GetShardKey),
// once the shard registered (its id includes its port).
class KeyFetcher {
 public:
  void Set(std::shared_ptr<v1::Coordinator::Stub> stub, std::string shard_id) {
    absl::MutexLock l(&mu_);
    stub_ = std::move(stub);
    shard_id_ = std::move(shard_id);
  }
  absl::StatusOr<ShardJobKey> Fetch(const std::string& job_id, uint64_t epoch) {
    std::shared_ptr<v1::Coordinator::Stub> stub;
    v1::GetShardKeyRequest req;
    {
      absl::MutexLock l(&mu_);
      stub = stub_;
      req.set_shard_id(shard_id_);
    }
    if (stub == nullptr) return absl::UnavailableError("not registered with the coordinator yet");
    req.set_job_id(job_id);
    req.set_epoch(static_cast<int64_t>(epoch));
    v1::GetShardKeyResponse resp;
    grpc::ClientContext ctx;
    ctx.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(3)));
    grpc::Status s = stub->GetShardKey(&ctx, req, &resp);
    if (!s.ok()) {
      return absl::Status(static_cast<absl::StatusCode>(s.error_code()),
                          absl::StrCat("no key for job '", job_id, "' epoch ", epoch,
                                       " from the coordinator: ", s.error_message()));
    }
    return ShardJobKey{resp.key(), resp.data_tls()};
  }

 private:
  absl::Mutex mu_;
  std::shared_ptr<v1::Coordinator::Stub> stub_ ABSL_GUARDED_BY(mu_);
  std::string shard_id_ ABSL_GUARDED_BY(mu_);
};

// gradsync_ps_* metrics from PsShard::stats() at scrape time (docs/metrics.md).
class ShardCollector : public prometheus::Collectable {
 public:
  // `per_job`: also the series labelled with job ids (--metrics_identifying_labels).
  ShardCollector(PsShard* shard, bool per_job) : shard_(shard), per_job_(per_job) {}
  std::vector<prometheus::MetricFamily> Collect() const override {
    const PsShardStats st = shard_->stats();
    std::vector<prometheus::MetricFamily> out;
    auto add = [&](const char* name, const char* help, prometheus::MetricType type, double v) {
      prometheus::MetricFamily f;
      f.name = name;
      f.help = help;
      f.type = type;
      prometheus::ClientMetric m;
      if (type == prometheus::MetricType::Gauge) {
        m.gauge.value = v;
      } else {
        m.counter.value = v;
      }
      f.metric.push_back(m);
      out.push_back(std::move(f));
    };
    using T = prometheus::MetricType;
    add("gradsync_ps_steps_total", "Steps this shard completed", T::Counter, st.steps_completed);
    add("gradsync_ps_steps_failed_total", "Steps that failed on this shard", T::Counter,
        st.steps_failed);
    add("gradsync_ps_pushed_bytes_total", "Partition bytes workers pushed here", T::Counter,
        st.bytes_pushed);
    add("gradsync_ps_pulled_bytes_total", "Result bytes sent to workers", T::Counter,
        st.bytes_pulled);
    add("gradsync_ps_pushes_refused_total", "Pushes discarded (stale, refused or failed step)",
        T::Counter, st.pushes_refused);
    add("gradsync_ps_connections_total", "Worker connections accepted", T::Counter, st.connections);
    add("gradsync_ps_tls_connections_total",
        "Worker connections accepted with TLS (jobs with data_tls)", T::Counter,
        st.tls_connections);
    add("gradsync_ps_rdma_connections_total", "Worker connections accepted over RDMA",
        T::Counter, st.rdma_connections);
    // The same family as the daemons' data port (port="ps" here).
    add("gradsync_auth_failures_total",
        "Connections refused for the job key: on a PS shard, no key for the job epoch here, no "
        "nonce, or a wrong proof",
        T::Counter, st.auth_failures);
    out.back().metric[0].label = {{"port", "ps"}, {"reason", "job_key"}};
    add("gradsync_ps_jobs", "Jobs with state on this shard", T::Gauge, st.jobs);
    add("gradsync_ps_reserved_bytes", "Staging memory reserved by running steps", T::Gauge,
        st.reserved_bytes);
    // Per job, for the jobs with state on this shard (a bounded set: an idle
    // job is forgotten after 5 idle minutes, PsShardOptions::idle_job_timeout). Label as in gradsyncd's
    // per-job series.
    auto per_job = [&](const char* name, const char* help, uint64_t PsJobStats::*field) {
      prometheus::MetricFamily f;
      f.name = name;
      f.help = help;
      f.type = T::Counter;
      for (const PsJobStats& j : st.per_job) {
        prometheus::ClientMetric m;
        m.label.push_back({"gradsync_job", j.job});
        m.counter.value = static_cast<double>(j.*field);
        f.metric.push_back(std::move(m));
      }
      out.push_back(std::move(f));
    };
    if (!per_job_) return out;
    per_job("gradsync_ps_job_steps_total", "Steps this shard completed, per job",
            &PsJobStats::steps_completed);
    per_job("gradsync_ps_job_steps_failed_total", "Steps that failed on this shard, per job",
            &PsJobStats::steps_failed);
    per_job("gradsync_ps_job_pushed_bytes_total", "Partition bytes pushed here, per job",
            &PsJobStats::bytes_pushed);
    per_job("gradsync_ps_job_pulled_bytes_total", "Result bytes sent to workers, per job",
            &PsJobStats::bytes_pulled);
    return out;
  }

 private:
  PsShard* shard_;
  const bool per_job_;
};

// Flags -> options, validated once.
absl::StatusOr<PsShardOptions> OptionsFromFlags() {
  PsShardOptions o;
  absl::StatusOr<HostPort> listen = ParseHostPort(absl::GetFlag(FLAGS_listen));
  if (!listen.ok())
    return absl::InvalidArgumentError(absl::StrCat("--listen: ", listen.status().message()));
  o.listen = *listen;
  o.threads = absl::GetFlag(FLAGS_threads);
  if (o.threads < 1 || o.threads > 256)
    return absl::InvalidArgumentError("--threads must be 1..256");
  const int64_t timeout_ms = absl::GetFlag(FLAGS_step_timeout_ms);
  if (timeout_ms <= 0) return absl::InvalidArgumentError("--step_timeout_ms must be > 0");
  o.step_timeout = absl::Milliseconds(timeout_ms);
  const int64_t mem_mb = absl::GetFlag(FLAGS_max_memory_mb);
  if (mem_mb <= 0) return absl::InvalidArgumentError("--max_memory_mb must be > 0");
  o.max_memory_bytes = static_cast<uint64_t>(mem_mb) << 20;
  return o;
}

int Run() {
  absl::StatusOr<PsShardOptions> options = OptionsFromFlags();
  if (!options.ok()) {
    GS_LOG(ERROR) << options.status().message();
    return 1;
  }
  // Registration at the coordinator is its gRPC: TLS or an explicit --insecure.
  gradsync::TlsConfig tls = gradsync::TlsConfigFromFlags();
  if (!absl::GetFlag(FLAGS_coordinator).empty()) {
    absl::StatusOr<gradsync::TlsConfig> checked = gradsync::ServerTlsConfigFromFlags("gradsync-ps");
    if (!checked.ok()) {
      GS_LOG(ERROR) << "cannot start: " << checked.status().message();
      return 2;
    }
    tls = *checked;
  }
  options->tls = tls;  // also the TLS of the workers' connections of data_tls jobs
  // Block the shutdown signals in every thread; this thread takes them with sigwait.
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGTERM);
  sigaddset(&signals, SIGINT);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);

  // Workers prove the job's shard key, which the coordinator hands out.
  auto keys = std::make_shared<KeyFetcher>();
  if (!absl::GetFlag(FLAGS_coordinator).empty()) {
    options->job_key = [keys](const std::string& job_id, uint64_t epoch) {
      return keys->Fetch(job_id, epoch);
    };
  } else {
    GS_LOG(WARNING) << "no --coordinator: workers' connections are not authenticated (no job "
                       "keys); run standalone shards only on a trusted network";
  }
  // RDMA for the workers that ask (their daemons see our port at the
  // coordinator): bootstrapped over the same TCP connections.
  transport::RdmaEndpoint rdma;
  const std::string mode = absl::GetFlag(FLAGS_transport);
  if (mode != "auto" && mode != "tcp") {
    GS_LOG(ERROR) << "--transport '" << mode << "': expected auto or tcp";
    return 2;
  }
  if (mode == "auto") {
    transport::RdmaDeviceOptions ro;
    ro.device_name = absl::GetFlag(FLAGS_rdma_device);
    ro.port = absl::GetFlag(FLAGS_rdma_port);
    ro.gid_index = absl::GetFlag(FLAGS_rdma_gid_index);
    ro.bootstrap.socket_buffer_bytes = options->socket_buffer_bytes;
    ro.bootstrap.tls = tls;
    absl::StatusOr<transport::RdmaEndpoint> opened =
        transport::OpenRdmaEndpoint(ro, absl::GetFlag(FLAGS_rdma_emulation));
    if (opened.ok()) {
      rdma = *std::move(opened);
      options->rdma_device = rdma.device.get();
      GS_LOG(INFO) << "RDMA: " << rdma.device->description();
    } else {
      GS_LOG(INFO) << "RDMA: not used (" << opened.status().message() << "); workers connect over TCP";
    }
  }
  absl::StatusOr<std::unique_ptr<PsShard>> shard = PsShard::Start(*options);
  if (!shard.ok()) {
    GS_LOG(ERROR) << "cannot start: " << shard.status();
    return 1;
  }
  // Metrics: the shard's counters, read at scrape time.
  MetricsRegistry metrics;
  if (absl::Status s = metrics.AddProcessMetrics(); !s.ok()) {
    GS_LOG(ERROR) << "metrics: " << s.message();
    return 1;
  }
  if (auto g = metrics.AddGauge("gradsync_ps_insecure",
                                 "1 while the gRPC control plane is plaintext and unauthenticated "
                                 "(--insecure), 0 with mutual TLS",
                                 {});
      g.ok()) {
    (*g)->Set(tls.enabled() ? 0 : 1);
  }
  if (auto g = metrics.AddGauge("gradsync_ps_rdma_up",
                                 "1 while this shard takes workers' connections over RDMA too", {});
      g.ok()) {
    (*g)->Set(rdma.device != nullptr ? 1 : 0);
  }
  metrics.AddCollectable(std::make_shared<ShardCollector>(
      shard->get(), absl::GetFlag(FLAGS_metrics_identifying_labels)));
  std::unique_ptr<MetricsServer> metrics_server;
  if (const std::string address = absl::GetFlag(FLAGS_metrics_listen); !address.empty()) {
    auto started = MetricsServer::Start(address, metrics);
    if (!started.ok()) {
      GS_LOG(ERROR) << "--metrics_listen: " << started.status().message();
      return 1;
    }
    metrics_server = std::move(*started);
  }
  // Registration: once before we report ready (so a job can use us at once),
  // then every heartbeat interval on a thread.
  std::string host = absl::GetFlag(FLAGS_advertise_host);
  if (host.empty()) {
    host = (options->listen.host == "0.0.0.0" || options->listen.host == "::") ? HostName()
                                                                             : options->listen.host;
  }
  const std::string shard_id = absl::GetFlag(FLAGS_shard_id).empty()
                                   ? absl::StrCat(host, ":", (*shard)->port())
                                   : absl::GetFlag(FLAGS_shard_id);
  std::unique_ptr<Registrar> registrar;
  if (const std::string coord = absl::GetFlag(FLAGS_coordinator); !coord.empty()) {
    auto credentials = gradsync::MakeChannelCredentials(tls);
    if (!credentials.ok()) {
      GS_LOG(ERROR) << "cannot start: " << credentials.status().message();
      return 2;
    }
    registrar = std::make_unique<Registrar>(coord, *credentials, shard_id, host,
                                            (*shard)->port(), rdma.advertised);
    if (absl::Status s = registrar->RegisterOnce(); !s.ok()) {
      GS_LOG(ERROR) << "cannot register with the coordinator " << coord << ": " << s.message();
      return 1;
    }
    keys->Set(registrar->stub(), shard_id);
    registrar->Start();
  }
  if (const std::string path = absl::GetFlag(FLAGS_port_file); !path.empty()) {
    if (absl::Status s = WritePortFile(path, {(*shard)->port(), metrics_server ? metrics_server->port() : 0});
        !s.ok()) {
      GS_LOG(ERROR) << "cannot write --port_file: " << s;
      return 1;
    }
  }
  GS_LOG(INFO) << "gradsync-ps listening on " << options->listen.host << ":" << (*shard)->port()
               << " (" << options->threads << " aggregation threads, step timeout "
               << absl::FormatDuration(options->step_timeout) << ", pid " << getpid() << ")";

  const std::string serving =
      absl::StrCat("shard '", shard_id, "' serving on ", host, ":", (*shard)->port(), ", metrics ",
                   metrics_server ? absl::StrCat("on http://", metrics_server->address(), "/metrics")
                                  : std::string("off"));
  if (absl::Status s = NotifyReady(serving); !s.ok()) GS_LOG(WARNING) << s.message();
  auto watchdog = SystemdWatchdog::Start([&shard] {
    (*shard)->stats();  // takes the shard's locks: a deadlocked shard stops pinging
    return true;
  });
  if (!watchdog.ok()) GS_LOG(WARNING) << watchdog.status().message() << "; no watchdog pings";

  int sig = 0;
  while (sigwait(&signals, &sig) != 0) {
  }
  GS_LOG(INFO) << "received " << (sig == SIGTERM ? "SIGTERM" : "SIGINT") << ", shutting down";
  if (absl::Status s = NotifyStopping("stopping"); !s.ok()) GS_LOG(WARNING) << s.message();
  if (watchdog.ok() && *watchdog != nullptr) (*watchdog)->Stop();
  if (registrar != nullptr) registrar->Stop();
  (*shard)->Shutdown();
  const PsShardStats st = (*shard)->stats();
  GS_LOG(INFO) << "stopped: " << st.steps_completed << " steps completed, " << st.steps_failed
               << " failed, " << st.bytes_pushed << " bytes pushed, " << st.bytes_pulled
               << " bytes pulled";
  return 0;
}

}  // namespace
}  // namespace gradsync::ps

int main(int argc, char** argv) {
  gradsync::InitFlagsUsage("gradsync-ps", 
      "gradsync parameter-server shard.\n"
      "  gradsync-ps [--listen=0.0.0.0:7073] [--threads=4] [--step_timeout_ms=30000]\n"
      "      [--max_memory_mb=8192] [--coordinator=HOST:PORT] [--shard_id=ID]\n"
      "      [--metrics_listen=0.0.0.0:9472] [--config=FILE] [--port_file=PATH] [--v=0|1]", __FILE__);
  std::vector<char*> positional = absl::ParseCommandLine(argc, argv);
  gradsync::InitProcess();
  if (positional.size() > 1) {
    std::fprintf(stderr, "gradsync-ps: unexpected argument '%s'\n", positional[1]);
    return 1;
  }
  if (const std::string config = absl::GetFlag(FLAGS_config); !config.empty()) {
    if (absl::Status s = gradsync::ApplyConfigFile(config, argc, argv); !s.ok()) {
      std::fprintf(stderr, "gradsync-ps: --config: %s\n", std::string(s.message()).c_str());
      return 1;
    }
  }
  gradsync::SetLogTag("gradsync-ps");
  gradsync::SetMinLogLevel(absl::GetFlag(FLAGS_v) >= 1 ? gradsync::LogLevel::kDebug
                                                       : gradsync::LogLevel::kInfo);
  return gradsync::ps::Run();
}
