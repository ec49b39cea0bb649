// gradsync-coordinator: the control-plane server (jobs, rendezvous, heartbeats,
// epochs, events) on gRPC, with the standard gRPC health service.
//
//   gradsync-coordinator [--config=/etc/gradsync/gradsync-coordinator.conf]
//       [--listen=0.0.0.0:7070] [--port_file=PATH] [--metrics_listen=0.0.0.0:9470]
//       [--heartbeat_timeout_ms=3000] [--op_timeout_ms=60000]
//       [--forming_job_timeout_ms=10000] [--tenants_file=PATH] [--v=0|1]
//
// --config: a `key = value` file of these flags (common/config_file.h);
// flags given on the command line win. Prometheus metrics are served at
// http://<metrics_listen>/metrics (docs/metrics.md). Under systemd
// (Type=notify) it reports READY once serving, STOPPING on SIGTERM, and pings
// the watchdog when WatchdogSec= is set. See docs/operations.md.
//
// SIGTERM/SIGINT: health goes NOT_SERVING, blocked rendezvous calls fail with
// UNAVAILABLE, the server drains for up to 2 s, exit 0.
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
#include "common/config_file.h"
#include "common/logging.h"
#include "common/tls_flags.h"
#include "common/port_file.h"
#include "common/metrics.h"
#include "common/sd_notify.h"
#include "server/coordinator_metrics.h"
#include "server/coordinator_service.h"

ABSL_FLAG(std::string, listen, "0.0.0.0:7070",
          "gRPC listen address host:port; port 0 picks a free port (see --port_file)");
ABSL_FLAG(std::string, port_file, "",
          "if set, the bound gRPC port and the metrics port (0 without --metrics_listen) are "
          "written here (atomically) once the server is serving");
ABSL_FLAG(int64_t, heartbeat_timeout_ms, 3000,
          "default heartbeat timeout of new jobs: a member silent for longer is declared dead");
ABSL_FLAG(int64_t, op_timeout_ms, 60000, "default deadline of one collective of new jobs");
ABSL_FLAG(int64_t, forming_job_timeout_ms, 10000,
          "a job whose first rendezvous never completed and that no member has waited in for "
          "this long is deleted (its id is free again)");
ABSL_FLAG(std::string, metrics_listen, "0.0.0.0:9470",
          "Prometheus metrics endpoint (http://ADDRESS/metrics), IPv4:port or [IPv6]:port; "
          "port 0 picks a free port; empty: no metrics endpoint");
ABSL_FLAG(std::string, tenants_file, "",
          "tenants and their tokens, one 'NAME TOKEN [max_forming_jobs=N] [max_jobs=N]' per line "
          "(docs/security.md); re-read when it changes. Empty: one namespace, every node may "
          "create and read every job (a warning)");
ABSL_FLAG(int, v, 0, "log verbosity: 0 info, 1 debug");
ABSL_FLAG(std::string, config, "",
          "a `key = value` file setting any of these flags (keys without dashes); flags given "
          "on the command line win");

namespace gradsync {
namespace {

constexpr absl::Duration kShutdownGrace = absl::Seconds(2);

int Run() {
  const int64_t heartbeat_ms = absl::GetFlag(FLAGS_heartbeat_timeout_ms);
  const int64_t op_ms = absl::GetFlag(FLAGS_op_timeout_ms);
  const int64_t forming_ms = absl::GetFlag(FLAGS_forming_job_timeout_ms);
  if (heartbeat_ms <= 0 || op_ms <= 0 || forming_ms <= 0 || absl::GetFlag(FLAGS_listen).empty()) {
    GS_LOG(ERROR) << "--heartbeat_timeout_ms, --op_timeout_ms and --forming_job_timeout_ms must "
                     "be > 0 and --listen must not be empty";
    return 1;
  }

  // Block the shutdown signals in every thread (gRPC's threads inherit this
  // mask); this thread takes them with sigwait.
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGTERM);
  sigaddset(&signals, SIGINT);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);

  // Metrics: registered here, served by the MetricsServer; both outlive the
  // coordinator server (declared before it).
  absl::StatusOr<TlsConfig> tls = ServerTlsConfigFromFlags("gradsync-coordinator");
  if (!tls.ok()) {
    GS_LOG(ERROR) << "cannot start: " << tls.status().message();
    return 2;
  }
  std::shared_ptr<TenantTable> tenants;
  if (const std::string path = absl::GetFlag(FLAGS_tenants_file); !path.empty()) {
    absl::StatusOr<std::unique_ptr<TenantTable>> loaded = TenantTable::Load(path);
    if (!loaded.ok()) {
      GS_LOG(ERROR) << "cannot start: --tenants_file: " << loaded.status().message();
      return 2;
    }
    tenants = *std::move(loaded);
  } else {
    GS_LOG(WARNING) << "no --tenants_file: jobs share one namespace and need no tenant token; "
                       "every node daemon may create, join and read every job";
  }
  MetricsRegistry metrics;
  if (absl::Status s = metrics.AddProcessMetrics(); !s.ok()) {
    GS_LOG(ERROR) << "metrics: " << s.ToString();
    return 1;
  }
  if (auto g = metrics.AddGauge("gradsync_coordinator_insecure",
                                 "1 while the gRPC control plane is plaintext and unauthenticated "
                                 "(--insecure), 0 with mutual TLS",
                                 {});
      g.ok()) {
    (*g)->Set(tls->enabled() ? 0 : 1);
  }
  if (auto g = metrics.AddGauge("gradsync_coordinator_tenants",
                                 "tenants in --tenants_file at start (0: no tenants, one "
                                 "namespace)",
                                 {});
      g.ok()) {
    (*g)->Set(tenants != nullptr ? tenants->size() : 0);
  }
  absl::StatusOr<std::unique_ptr<CoordinatorMetrics>> coordinator_metrics =
      CoordinatorMetrics::Create(metrics);
  if (!coordinator_metrics.ok()) {
    GS_LOG(ERROR) << "metrics: " << coordinator_metrics.status().ToString();
    return 1;
  }
  std::unique_ptr<MetricsServer> metrics_server;
  if (const std::string address = absl::GetFlag(FLAGS_metrics_listen); !address.empty()) {
    absl::StatusOr<std::unique_ptr<MetricsServer>> started = MetricsServer::Start(address, metrics);
    if (!started.ok()) {
      GS_LOG(ERROR) << "--metrics_listen: " << started.status().message();
      return 1;
    }
    metrics_server = *std::move(started);
  }

  CoordinatorServerOptions options;
  options.listen_address = absl::GetFlag(FLAGS_listen);
  options.registry.default_heartbeat_timeout_ms = heartbeat_ms;
  options.registry.default_op_timeout_ms = op_ms;
  options.registry.forming_job_timeout = absl::Milliseconds(forming_ms);
  options.registry.observer = coordinator_metrics->get();
  options.rpc_observer = coordinator_metrics->get();
  options.tls = *tls;
  options.tenants = tenants;
  absl::StatusOr<std::unique_ptr<CoordinatorServer>> server =
      CoordinatorServer::Start(std::move(options));
  if (!server.ok()) {
    GS_LOG(ERROR) << "cannot start: " << server.status().ToString();
    return 1;
  }
  if (const std::string path = absl::GetFlag(FLAGS_port_file); !path.empty()) {
    if (absl::Status s = WritePortFile(path, {(*server)->port(), metrics_server ? metrics_server->port() : 0}); !s.ok()) {
      GS_LOG(ERROR) << "cannot write --port_file: " << s.ToString();
      (*server)->Shutdown(absl::ZeroDuration());
      return 1;
    }
  }
  const std::string serving =
      absl::StrCat("serving gRPC (", tls->enabled() ? "mutual TLS" : "plaintext", ") on ",
                   (*server)->address(), ", metrics ",
                   metrics_server ? absl::StrCat("on http://", metrics_server->address(), "/metrics")
                                  : std::string("off"));
  GS_LOG(INFO) << "gradsync-coordinator " << serving << " (heartbeat timeout " << heartbeat_ms
               << " ms, op timeout " << op_ms << " ms, "
               << (tenants != nullptr ? absl::StrCat(tenants->size(), " tenant(s)")
                                      : std::string("no tenants"))
               << ", version " << kGradsyncVersion << ", pid "
               << getpid() << ")";

  // systemd (Type=notify): ready now; the watchdog pings only while the
  // registry's mutex can be taken (a deadlocked coordinator gets restarted).
  if (absl::Status s = NotifyReady(serving); !s.ok()) {
    GS_LOG(WARNING) << s.message();
  }
  JobRegistry& registry = (*server)->registry();
  absl::StatusOr<std::unique_ptr<SystemdWatchdog>> watchdog = SystemdWatchdog::Start([&registry] {
    registry.JobCount();
    return true;
  });
  if (!watchdog.ok()) {
    GS_LOG(WARNING) << watchdog.status().message() << "; no watchdog pings";
  }

  int sig = 0;
  while (sigwait(&signals, &sig) != 0) {
  }
  GS_LOG(INFO) << "received " << (sig == SIGTERM ? "SIGTERM" : "SIGINT")
               << ", shutting down (grace " << absl::FormatDuration(kShutdownGrace) << ")";
  if (absl::Status s = NotifyStopping("draining"); !s.ok()) {
    GS_LOG(WARNING) << s.message();
  }
  // systemd disarms the watchdog once the unit is stopping.
  if (watchdog.ok()) (*watchdog)->Stop();
  (*server)->Shutdown(kShutdownGrace);
  metrics_server.reset();
  GS_LOG(INFO) << "stopped";
  return 0;
}

}  // namespace
}  // namespace gradsync

int main(int argc, char** argv) {
  gradsync::InitFlagsUsage("gradsync-coordinator", 
      "gradsync control plane: jobs, rendezvous, heartbeats, epochs.\n"
      "  gradsync-coordinator [--config=FILE] [--listen=0.0.0.0:7070] [--port_file=PATH]\n"
      "      [--metrics_listen=0.0.0.0:9470]", __FILE__);
  std::vector<char*> positional = absl::ParseCommandLine(argc, argv);
  gradsync::InitProcess();
  if (positional.size() > 1) {
    std::fprintf(stderr, "gradsync-coordinator: unexpected argument '%s'\n", positional[1]);
    return 1;
  }
  // The config file fills in the flags not given on the command line.
  if (const std::string config = absl::GetFlag(FLAGS_config); !config.empty()) {
    if (absl::Status s = gradsync::ApplyConfigFile(config, argc, argv); !s.ok()) {
      std::fprintf(stderr, "gradsync-coordinator: --config: %s\n",
                   std::string(s.message()).c_str());
      return 1;
    }
  }
  gradsync::SetLogTag("gradsync-coordinator");
  gradsync::SetMinLogLevel(absl::GetFlag(FLAGS_v) >= 1 ? gradsync::LogLevel::kDebug
                                                       : gradsync::LogLevel::kInfo);
  return gradsync::Run();
}
