// An embedded local cluster: one gradsync-coordinator and N gradsyncd child
// processes on loopback, each daemon serving clients on an abstract unix
// socket. Used by `gradsync demo`/`bench` and by the integration tests.
// Children get PR_SET_PDEATHSIG=SIGTERM, so they never outlive the parent;
// StopAll()/the destructor stop them with SIGTERM (graceful: daemons unlink
// their shared memory), then SIGKILL after a grace period.
#ifndef GRADSYNC_CLI_LOCAL_CLUSTER_H_
#define GRADSYNC_CLI_LOCAL_CLUSTER_H_

#include <sys/types.h>

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/certs.h"

namespace gradsync {

struct LocalClusterOptions {
  int daemons = 4;
  int ps_shards = 0;             // gradsync-ps processes (registered with the coordinator)
  std::string ps_bin;            // empty: FindBinary("gradsync-ps")
  std::string coordinator_bin;  // empty: FindBinary("gradsync-coordinator")
  std::string daemon_bin;       // empty: FindBinary("gradsyncd")
  std::vector<std::string> coordinator_flags;
  std::vector<std::string> daemon_flags;
  std::vector<std::string> ps_flags;  // more flags for every gradsync-ps
  // More flags for daemon i (after daemon_flags; a later flag wins), e.g. its
  // own --coordinator address through a proxy.
  std::vector<std::vector<std::string>> per_daemon_flags;
  std::string work_dir;  // logs and port files; empty: a fresh directory under $TMPDIR or /tmp
  absl::Duration start_timeout = absl::Seconds(20);
  bool keep_logs = false;  // otherwise the work dir is removed when all is well
  // Mutual TLS between every process and the coordinator (and the daemons'
  // status services), with certificates made for this cluster in
  // WORK_DIR/certs (common/certs.h; certs() has the operator's). false: every
  // process runs with --insecure.
  bool tls = true;
  // Tenants at the coordinator: one tenant "lab" whose token is
  // LabTenantToken() (WORK_DIR/tenants), so sessions need the token, as in
  // production. false: no tenants, one namespace.
  bool tenants = true;
  // More lines of the tenants file ("NAME TOKEN [max_forming_jobs=N]").
  std::vector<std::string> extra_tenants;
};

// The lab tenant's token: $GRADSYNC_TENANT_TOKEN when set, else 32 random hex
// digits made once per process and exported as $GRADSYNC_TENANT_TOKEN, so
// this process's clients and its children present it (client/client.h).
const std::string& LabTenantToken();

class LocalCluster {
 public:
  static absl::StatusOr<std::unique_ptr<LocalCluster>> Start(const LocalClusterOptions& options);
  ~LocalCluster();  // StopAll()

  const std::string& coordinator_address() const { return coordinator_address_; }
  // The cluster's certificates (LocalClusterOptions::tls), else empty.
  const LabCerts& certs() const { return certs_; }
  // gRPC target of daemon i ("unix-abstract:...").
  std::string daemon_target(int i) const;
  pid_t daemon_pid(int i) const { return daemons_[i].pid; }
  int ps_shards() const { return static_cast<int>(shards_.size()); }
  // Sends `sig` to PS shard i.
  void SignalShard(int i, int sig);
  int size() const { return static_cast<int>(daemons_.size()); }
  const std::string& work_dir() const { return work_dir_; }
  std::string daemon_log(int i) const;
  // Ports daemon i reported in its port file (data plane, metrics HTTP).
  int daemon_data_port(int i) const;
  int daemon_metrics_port(int i) const;
  // The coordinator's metrics port (0 if unknown).
  int coordinator_metrics_port() const;
  // PS shard i's data-plane and Prometheus ports (from its port file).
  int ps_data_port(int i) const;
  int ps_metrics_port(int i) const;

  // SIGKILLs the coordinator (and reaps it): its jobs are gone.
  void KillCoordinator();
  // Starts a fresh coordinator on the same address (after KillCoordinator),
  // with the same flags, certificates and tenants; returns once it serves.
  absl::Status RestartCoordinator(absl::Duration timeout = absl::Seconds(20));

  // Sends `sig` to daemon i (e.g. SIGKILL to simulate a node failure).
  void SignalDaemon(int i, int sig);
  // True if daemon i has not exited (reaps it if it has).
  bool DaemonAlive(int i);
  // The wait status of daemon i once DaemonAlive(i) returned false (see wait(2)).
  int DaemonWaitStatus(int i) const { return daemons_[i].status; }
  // SIGTERM to every child, SIGKILL to any still alive after `grace`.
  // Returns an error naming children that did not exit 0 on SIGTERM.
  absl::Status StopAll(absl::Duration grace = absl::Seconds(5));
  void KeepLogs() { keep_logs_ = true; }

 private:
  struct Child {
    pid_t pid = -1;
    std::string name;
    bool exited = false;
    int status = 0;
    std::string log;  // its stdout/stderr
  };
  LocalCluster() = default;
  static absl::StatusOr<pid_t> Spawn(const std::string& bin, const std::vector<std::string>& args,
                                     const std::string& log_path);

  std::string work_dir_;
  bool owns_work_dir_ = false;
  bool keep_logs_ = false;
  std::string tag_;
  std::string coordinator_address_;
  std::string coordinator_bin_;
  std::vector<std::string> coordinator_args_;
  int coordinator_restarts_ = 0;
  LabCerts certs_;
  Child coordinator_;
  std::vector<Child> daemons_;
  std::vector<Child> shards_;
};

// Looks for a gradsync binary next to the running executable, in the Bazel
// output tree around it, under $GRADSYNC_BIN_DIR, then on $PATH.
std::string FindBinary(const std::string& name);

}  // namespace gradsync

#endif  // GRADSYNC_CLI_LOCAL_CLUSTER_H_
