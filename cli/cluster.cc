#include "cli/cluster.h"

#include <signal.h>
#include <time.h>

#include <cstdio>
#include <fstream>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "cli/local_cluster.h"

namespace gradsync {

absl::Status RunCluster(const ClusterOptions& options) {
  if (options.daemons < 1 || options.daemons > 64) {
    return absl::InvalidArgumentError(
        absl::StrCat("--ranks must be in [1, 64] (daemons to start); got ", options.daemons));
  }
  // Block the stop signals before any child starts, then wait for them.
  sigset_t stop;
  sigemptyset(&stop);
  sigaddset(&stop, SIGINT);
  sigaddset(&stop, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &stop, nullptr);

  LocalClusterOptions lo;
  lo.daemons = options.daemons;
  lo.ps_shards = options.ps_shards;
  lo.keep_logs = options.keep_logs;
  absl::StatusOr<std::unique_ptr<LocalCluster>> cluster = LocalCluster::Start(lo);
  if (!cluster.ok()) return cluster.status();
  std::vector<std::string> targets;
  std::string env = absl::StrCat("GRADSYNC_COORDINATOR=", (*cluster)->coordinator_address(), "\n");
  for (int i = 0; i < (*cluster)->size(); ++i) {
    targets.push_back((*cluster)->daemon_target(i));
    absl::StrAppend(&env, "GRADSYNC_DAEMON_", i, "=", targets.back(), "\n");
  }
  absl::StrAppend(&env, "GRADSYNC_DAEMONS=", absl::StrJoin(targets, ","), "\n");
  // The operator certificate of this cluster, for `gradsync status $GRADSYNC_TLS_FLAGS`.
  const TlsConfig& op = (*cluster)->certs().operator_;
  absl::StrAppend(&env, "GRADSYNC_TLS_FLAGS=\"--tls_cert=", op.cert, " --tls_key=", op.key,
                  " --tls_ca=", op.ca, "\"\n");
  // The lab tenant's token: clients started from this environment present it.
  absl::StrAppend(&env, "GRADSYNC_TENANT_TOKEN=", LabTenantToken(), "\n");
  if (!options.env_file.empty()) {
    // Written whole to a temporary name, then renamed: a reader never sees half of it.
    const std::string tmp = options.env_file + ".tmp";
    {
      std::ofstream out(tmp);
      out << env;
      if (!out) return absl::InternalError(absl::StrCat("cannot write ", tmp));
    }
    if (std::rename(tmp.c_str(), options.env_file.c_str()) != 0) {
      return absl::InternalError(absl::StrCat("cannot rename ", tmp, " to ", options.env_file));
    }
  }
  std::fputs(env.c_str(), stdout);
  std::fprintf(stdout, "# gradsync cluster: %d daemons up (logs in %s); Ctrl-C stops it\n",
               (*cluster)->size(), (*cluster)->work_dir().c_str());
  std::fflush(stdout);

  // Waits for a stop signal (or the duration), checking the daemons each second.
  const absl::Time end = options.duration == absl::InfiniteDuration()
                             ? absl::InfiniteFuture()
                             : absl::Now() + options.duration;
  while (absl::Now() < end) {
    timespec wait{1, 0};
    const int sig = sigtimedwait(&stop, nullptr, &wait);
    if (sig == SIGINT || sig == SIGTERM) break;
    for (int i = 0; i < (*cluster)->size(); ++i) {
      if (!(*cluster)->DaemonAlive(i)) {
        (*cluster)->KeepLogs();  // the error points at the log: it must stay
        if (!options.env_file.empty()) std::remove(options.env_file.c_str());
        return absl::UnavailableError(absl::StrCat("gradsyncd #", i, " exited; its log: ",
                                                   (*cluster)->daemon_log(i)));
      }
    }
  }
  if (!options.env_file.empty()) std::remove(options.env_file.c_str());
  return absl::OkStatus();
}

}  // namespace gradsync
