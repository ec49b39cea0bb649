#include "cli/local_cluster.h"

#include <fcntl.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/prctl.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <filesystem>
#include <fstream>

#include "absl/strings/escaping.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "common/net.h"

namespace gradsync {
namespace {

bool IsExecutable(const std::string& p) { return ::access(p.c_str(), X_OK) == 0; }

absl::StatusOr<int> WaitForPortFile(const std::string& path, pid_t pid, const std::string& name,
                                    const std::string& log, absl::Time deadline) {
  while (absl::Now() < deadline) {
    std::ifstream f(path);
    std::string line;
    int port = 0;
    if (f && std::getline(f, line) && absl::SimpleAtoi(absl::StripAsciiWhitespace(line), &port)) {
      return port;
    }
    int status = 0;
    if (::waitpid(pid, &status, WNOHANG) == pid) {
      return absl::InternalError(absl::StrCat(name, " exited during start-up (status ", status,
                                              "); see ", log));
    }
    absl::SleepFor(absl::Milliseconds(20));
  }
  return absl::DeadlineExceededError(absl::StrCat(name, " did not become ready; see ", log));
}

// The last `lines` lines of a child's log, indented, for an error message.
std::string LogTail(const std::string& path, size_t lines) {
  std::ifstream f(path);
  std::vector<std::string> tail;
  for (std::string line; std::getline(f, line);) {
    tail.push_back(std::move(line));
    if (tail.size() > lines) tail.erase(tail.begin());
  }
  std::string out;
  for (const std::string& line : tail) absl::StrAppend(&out, "\n    | ", line);
  return out;
}

}  // namespace

std::string FindBinary(const std::string& name) {
  std::vector<std::string> dirs;
  char exe[4096];
  ssize_t n = ::readlink("/proc/self/exe", exe, sizeof(exe) - 1);
  if (n > 0) {
    exe[n] = '\0';
    std::string dir = std::filesystem::path(exe).parent_path().string();
    dirs = {dir,
            dir + "/../server",
            dir + "/../worker",
            dir + "/../bench",
            dir + "/../ps",
            dir + "/../../server",
            dir + "/../../worker",
            dir + "/../../bench",
            dir + "/../../ps"};
  }
  for (const char* rel : {"server", "worker", "bench", "ps"}) {  // Bazel runfiles (tests)
    dirs.push_back(rel);
  }
  if (const char* env = std::getenv("GRADSYNC_BIN_DIR")) dirs.insert(dirs.begin(), env);
  for (const auto& d : dirs) {
    std::string p = d + "/" + name;
    if (IsExecutable(p)) return std::filesystem::absolute(p).lexically_normal().string();
  }
  if (const char* path = std::getenv("PATH")) {
    for (absl::string_view d : absl::StrSplit(path, ':')) {
      std::string p = absl::StrCat(d, "/", name);
      if (IsExecutable(p)) return p;
    }
  }
  return name;
}

absl::StatusOr<pid_t> LocalCluster::Spawn(const std::string& bin,
                                          const std::vector<std::string>& args,
                                          const std::string& log_path) {
  if (!IsExecutable(bin)) {
    return absl::NotFoundError(absl::StrCat("cannot find executable '", bin, "'"));
  }
  std::vector<std::string> argv_s = {bin};
  argv_s.insert(argv_s.end(), args.begin(), args.end());
  std::vector<char*> argv;
  for (auto& a : argv_s) argv.push_back(a.data());
  argv.push_back(nullptr);
  const pid_t parent = ::getpid();
  pid_t pid = ::fork();
  if (pid < 0) return absl::InternalError("fork: " + ErrnoString(errno));
  if (pid == 0) {
    ::prctl(PR_SET_PDEATHSIG, SIGTERM);
    if (::getppid() != parent) _exit(1);
    sigset_t none;
    sigemptyset(&none);
    ::sigprocmask(SIG_SETMASK, &none, nullptr);
    ::setpgid(0, 0);  // Ctrl-C reaches the parent only; the parent stops us
    int fd = ::open(log_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd >= 0) {
      ::dup2(fd, 1);
      ::dup2(fd, 2);
    }
    ::execv(bin.c_str(), argv.data());
    _exit(127);
  }
  return pid;
}

const std::string& LabTenantToken() {
  static const std::string* const token = [] {
    if (const char* env = std::getenv("GRADSYNC_TENANT_TOKEN"); env != nullptr && *env != '\0') {
      return new std::string(env);
    }
    unsigned char bytes[16] = {};
    size_t got = 0;
    while (got < sizeof(bytes)) {
      const ssize_t r = ::getrandom(bytes + got, sizeof(bytes) - got, 0);
      if (r > 0) got += static_cast<size_t>(r);
    }
    auto* hex = new std::string(absl::BytesToHexString(
        absl::string_view(reinterpret_cast<const char*>(bytes), sizeof(bytes))));
    ::setenv("GRADSYNC_TENANT_TOKEN", hex->c_str(), 0);
    return hex;
  }();
  return *token;
}

absl::StatusOr<std::unique_ptr<LocalCluster>> LocalCluster::Start(
    const LocalClusterOptions& options) {
  std::unique_ptr<LocalCluster> c(new LocalCluster());
  c->keep_logs_ = options.keep_logs;
  if (options.work_dir.empty()) {
    const char* tmp = std::getenv("TEST_TMPDIR");
    if (tmp == nullptr) tmp = std::getenv("TMPDIR");
    std::string tmpl = absl::StrCat(tmp != nullptr ? tmp : "/tmp", "/gradsync-XXXXXX");
    if (::mkdtemp(tmpl.data()) == nullptr) {
      return absl::InternalError("mkdtemp: " + ErrnoString(errno));
    }
    c->work_dir_ = tmpl;
    c->owns_work_dir_ = true;
  } else {
    c->work_dir_ = options.work_dir;
    std::filesystem::create_directories(c->work_dir_);
  }
  c->tag_ = absl::StrCat(::getpid(), "-", std::filesystem::path(c->work_dir_).filename().string());
  const std::string coord_bin =
      options.coordinator_bin.empty() ? FindBinary("gradsync-coordinator") : options.coordinator_bin;
  const std::string daemon_bin =
      options.daemon_bin.empty() ? FindBinary("gradsyncd") : options.daemon_bin;
  const absl::Time deadline = absl::Now() + options.start_timeout;
  if (options.tls) {
    absl::StatusOr<LabCerts> certs = MakeLabCerts(c->work_dir_ + "/certs", {});
    if (!certs.ok()) return certs.status();
    c->certs_ = *std::move(certs);
    // Every process honours revocations (RevokeLabCert writes here).
    const std::string crl_dir = c->certs_.dir + "/crl";
    if (::mkdir(crl_dir.c_str(), 0755) != 0 && errno != EEXIST) {
      return absl::InternalError(absl::StrCat("cannot create ", crl_dir));
    }
    for (TlsConfig* t : {&c->certs_.coordinator, &c->certs_.node, &c->certs_.ps,
                         &c->certs_.operator_}) {
      t->crl_dir = crl_dir;
    }
  }
  // --tls_* flags for a process with `config` (none without TLS).
  auto tls_flags = [&](const TlsConfig& config) {
    if (!options.tls) return std::vector<std::string>{"--insecure"};
    return std::vector<std::string>{"--tls_cert=" + config.cert, "--tls_key=" + config.key,
                                    "--tls_ca=" + config.ca, "--tls_crl_dir=" + config.crl_dir};
  };

  const std::string coord_port_file = c->work_dir_ + "/coordinator.port";
  const std::string coord_log = c->work_dir_ + "/coordinator.log";
  std::vector<std::string> cargs = {"--listen=127.0.0.1:0", "--port_file=" + coord_port_file,
                                    "--metrics_listen=127.0.0.1:0"};
  for (std::string& f : tls_flags(c->certs_.coordinator)) cargs.push_back(std::move(f));
  if (options.tenants) {
    const std::string tenants = c->work_dir_ + "/tenants";
    {
      std::ofstream out(tenants);
      out << "# gradsync lab cluster\nlab " << LabTenantToken() << "\n";
      for (const std::string& line : options.extra_tenants) out << line << "\n";
      if (!out) return absl::InternalError(absl::StrCat("cannot write ", tenants));
    }
    ::chmod(tenants.c_str(), 0600);
    cargs.push_back("--tenants_file=" + tenants);
  }
  cargs.insert(cargs.end(), options.coordinator_flags.begin(), options.coordinator_flags.end());
  c->coordinator_bin_ = coord_bin;
  c->coordinator_args_ = cargs;
  auto cpid = Spawn(coord_bin, cargs, coord_log);
  if (!cpid.ok()) return cpid.status();
  c->coordinator_ = Child{*cpid, "gradsync-coordinator", false, 0, coord_log};
  auto cport = WaitForPortFile(coord_port_file, *cpid, "gradsync-coordinator", coord_log, deadline);
  if (!cport.ok()) {
    c->keep_logs_ = true;
    return cport.status();
  }
  c->coordinator_address_ = absl::StrCat("127.0.0.1:", *cport);

  for (int i = 0; i < options.daemons; ++i) {
    const std::string port_file = absl::StrCat(c->work_dir_, "/daemon", i, ".port");
    std::vector<std::string> args = {
        "--listen=" + c->daemon_target(i).substr(0),
        "--coordinator=" + c->coordinator_address_,
        "--data_listen=127.0.0.1:0",
        "--metrics_listen=127.0.0.1:0",
        "--status_listen=127.0.0.1:0",
        "--drain_timeout_ms=1000",
        absl::StrCat("--timeline_dir=", c->work_dir_, "/timeline"),
        absl::StrCat("--node_id=local", i),
        "--port_file=" + port_file,
    };
    TlsConfig node = c->certs_.node;
    if (options.tls) {
      // Each daemon its own identity (CN lab-node-I), as on a real cluster.
      absl::StatusOr<TlsConfig> own =
          AddLabCert(c->certs_.dir, "node", absl::StrCat("lab-node-", i), {});
      if (!own.ok()) return own.status();
      node = *std::move(own);
      node.crl_dir = c->certs_.node.crl_dir;
    }
    for (std::string& f : tls_flags(node)) args.push_back(std::move(f));
    args.insert(args.end(), options.daemon_flags.begin(), options.daemon_flags.end());
    if (static_cast<size_t>(i) < options.per_daemon_flags.size()) {
      args.insert(args.end(), options.per_daemon_flags[i].begin(), options.per_daemon_flags[i].end());
    }
    auto pid = Spawn(daemon_bin, args, c->daemon_log(i));
    if (!pid.ok()) return pid.status();
    c->daemons_.push_back(Child{*pid, absl::StrCat("gradsyncd #", i), false, 0, c->daemon_log(i)});
  }
  // Parameter-server shards: registered with the coordinator before any job
  // forms (WaitForShards below).
  const std::string ps_bin = options.ps_bin.empty() ? FindBinary("gradsync-ps") : options.ps_bin;
  for (int i = 0; i < options.ps_shards; ++i) {
    std::vector<std::string> args = {
        "--listen=127.0.0.1:0",
        absl::StrCat("--port_file=", c->work_dir_, "/ps", i, ".port"),
        "--coordinator=" + c->coordinator_address_,
        absl::StrCat("--shard_id=ps", i),
        "--metrics_listen=127.0.0.1:0",
    };
    for (std::string& f : tls_flags(c->certs_.ps)) args.push_back(std::move(f));
    args.insert(args.end(), options.ps_flags.begin(), options.ps_flags.end());
    const std::string log = absl::StrCat(c->work_dir_, "/ps", i, ".log");
    auto pid = Spawn(ps_bin, args, log);
    if (!pid.ok()) return pid.status();
    c->shards_.push_back(Child{*pid, absl::StrCat("gradsync-ps #", i), false, 0, log});
  }
  for (int i = 0; i < options.ps_shards; ++i) {
    auto port = WaitForPortFile(absl::StrCat(c->work_dir_, "/ps", i, ".port"), c->shards_[i].pid,
                                c->shards_[i].name, absl::StrCat(c->work_dir_, "/ps", i, ".log"),
                                deadline);
    if (!port.ok()) {
      c->keep_logs_ = true;
      return port.status();
    }
  }
  for (int i = 0; i < options.daemons; ++i) {
    auto port = WaitForPortFile(absl::StrCat(c->work_dir_, "/daemon", i, ".port"),
                                c->daemons_[i].pid, c->daemons_[i].name, c->daemon_log(i), deadline);
    if (!port.ok()) {
      c->keep_logs_ = true;
      return port.status();
    }
  }
  return c;
}

std::string LocalCluster::daemon_target(int i) const {
  return absl::StrCat("unix-abstract:gradsync-", tag_, "-", i);
}

std::string LocalCluster::daemon_log(int i) const {
  return absl::StrCat(work_dir_, "/daemon", i, ".log");
}

namespace {
int PortLine(const std::string& path, int line_no) {
  std::ifstream f(path);
  std::string line;
  for (int i = 0; i <= line_no; ++i) {
    if (!std::getline(f, line)) return 0;
  }
  int port = 0;
  return absl::SimpleAtoi(absl::StripAsciiWhitespace(line), &port) ? port : 0;
}
}  // namespace

int LocalCluster::daemon_data_port(int i) const {
  return PortLine(absl::StrCat(work_dir_, "/daemon", i, ".port"), 0);
}
int LocalCluster::daemon_metrics_port(int i) const {
  return PortLine(absl::StrCat(work_dir_, "/daemon", i, ".port"), 1);
}
int LocalCluster::coordinator_metrics_port() const {
  return PortLine(work_dir_ + "/coordinator.port", 1);
}
int LocalCluster::ps_data_port(int i) const {
  return PortLine(absl::StrCat(work_dir_, "/ps", i, ".port"), 0);
}
int LocalCluster::ps_metrics_port(int i) const {
  return PortLine(absl::StrCat(work_dir_, "/ps", i, ".port"), 1);
}

void LocalCluster::KillCoordinator() {
  if (coordinator_.exited) return;
  ::kill(coordinator_.pid, SIGKILL);
  ::waitpid(coordinator_.pid, &coordinator_.status, 0);
  coordinator_.exited = true;
}

absl::Status LocalCluster::RestartCoordinator(absl::Duration timeout) {
  if (!coordinator_.exited) {
    return absl::FailedPreconditionError("RestartCoordinator: the coordinator is still running");
  }
  std::vector<std::string> args = coordinator_args_;
  for (std::string& a : args) {
    if (a == "--listen=127.0.0.1:0") a = "--listen=" + coordinator_address_;  // the same port
  }
  const std::string port_file = work_dir_ + "/coordinator.port";
  std::filesystem::remove(port_file);
  // The port may be briefly taken (a daemon's redial of it can self-connect):
  // a few tries.
  const absl::Time deadline = absl::Now() + timeout;
  absl::Status last;
  for (int attempt = 0; attempt < 10 && absl::Now() < deadline; ++attempt) {
    const std::string log = absl::StrCat(work_dir_, "/coordinator.", ++coordinator_restarts_, ".log");
    auto pid = Spawn(coordinator_bin_, args, log);
    if (!pid.ok()) return pid.status();
    coordinator_ = Child{*pid, "gradsync-coordinator", false, 0, log};
    auto port = WaitForPortFile(port_file, *pid, "gradsync-coordinator", log, deadline);
    if (port.ok()) return absl::OkStatus();
    last = port.status();
    if (absl::IsInternal(last)) {
      coordinator_.exited = true;  // it exited (reaped by WaitForPortFile)
    } else {
      KillCoordinator();
    }
    absl::SleepFor(absl::Milliseconds(200));
  }
  keep_logs_ = true;
  return last;
}

void LocalCluster::SignalShard(int i, int sig) {
  if (!shards_[i].exited) ::kill(shards_[i].pid, sig);
}

void LocalCluster::SignalDaemon(int i, int sig) {
  if (!daemons_[i].exited) ::kill(daemons_[i].pid, sig);
}

bool LocalCluster::DaemonAlive(int i) {
  Child& ch = daemons_[i];
  if (ch.exited) return false;
  if (::waitpid(ch.pid, &ch.status, WNOHANG) == ch.pid) ch.exited = true;
  return !ch.exited;
}

absl::Status LocalCluster::StopAll(absl::Duration grace) {
  std::vector<Child*> all;
  for (auto& d : daemons_) all.push_back(&d);
  for (auto& s : shards_) all.push_back(&s);
  if (coordinator_.pid > 0) all.push_back(&coordinator_);
  std::vector<Child*> signalled;
  for (Child* ch : all) {
    if (!ch->exited && ::waitpid(ch->pid, &ch->status, WNOHANG) == ch->pid) {
      ch->exited = true;  // died earlier (e.g. SIGKILLed by a test); not our SIGTERM
      continue;
    }
    if (!ch->exited) {
      ::kill(ch->pid, SIGTERM);
      signalled.push_back(ch);
    }
  }
  const absl::Time deadline = absl::Now() + grace;
  std::string failures;
  for (Child* ch : signalled) {
    while (!ch->exited) {
      if (::waitpid(ch->pid, &ch->status, WNOHANG) == ch->pid) {
        ch->exited = true;
      } else if (absl::Now() >= deadline) {
        ::kill(ch->pid, SIGKILL);
        ::waitpid(ch->pid, &ch->status, 0);
        ch->exited = true;
        absl::StrAppend(&failures, " ", ch->name, " ignored SIGTERM for ",
                        absl::FormatDuration(grace), ";", LogTail(ch->log, 20), "\n");
      } else {
        absl::SleepFor(absl::Milliseconds(10));
      }
    }
    if (WIFEXITED(ch->status) && WEXITSTATUS(ch->status) != 0) {
      absl::StrAppend(&failures, " ", ch->name, " exited with ", WEXITSTATUS(ch->status), ";",
                      LogTail(ch->log, 20), "\n");
    } else if (WIFSIGNALED(ch->status) && WTERMSIG(ch->status) != SIGKILL) {
      absl::StrAppend(&failures, " ", ch->name, " died of signal ", WTERMSIG(ch->status), ";",
                      LogTail(ch->log, 20), "\n");
    }
  }
  if (!failures.empty()) {
    keep_logs_ = true;
    return absl::InternalError(absl::StrCat("unclean stop:", failures, " logs in ", work_dir_));
  }
  return absl::OkStatus();
}

LocalCluster::~LocalCluster() {
  (void)StopAll();
  if (owns_work_dir_ && !keep_logs_) {
    std::error_code ec;
    std::filesystem::remove_all(work_dir_, ec);
  }
}

}  // namespace gradsync
