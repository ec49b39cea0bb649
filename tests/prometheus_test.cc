// The real Prometheus server (Debian's `prometheus`, run directly) scrapes a
// running local cluster that is doing allreduces. Its HTTP API must show the
// traffic in the byte counters and the latency histograms, see every target
// up, and answer every PromQL query of deploy/grafana/gradsync-dashboard.json.
//
// Skipped when /usr/bin/prometheus is missing (scripts/install-deps.sh
// installs it). Prometheus only has data about 5.5 s after it starts (its
// discovery manager throttles updates to one per 5 s), so this takes ~10 s.
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <fstream>
#include <functional>
#include <map>
#include <memory>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_replace.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "cli/local_cluster.h"
#include "common/net.h"
#include "gtest/gtest.h"
#include "tests/cluster_util.h"
#include "tests/json_reader.h"

namespace gradsync {
namespace {

using testing::Json;
using testing::JsonParser;

constexpr char kPrometheus[] = "/usr/bin/prometheus";
// The dashboard, in the runfiles (data dependency on //deploy).
constexpr const char* kDashboards[] = {"deploy/grafana/gradsync-dashboard.json"};

// ---------------------------------------------------------------------------
// HTTP and the Prometheus server.

std::string UrlEncode(absl::string_view s) {
  static constexpr char kHex[] = "0123456789ABCDEF";
  std::string out;
  for (unsigned char c : s) {
    if ((c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '-' ||
        c == '_' || c == '.' || c == '~') {
      out += static_cast<char>(c);
    } else {
      out += '%';
      out += kHex[c >> 4];
      out += kHex[c & 15];
    }
  }
  return out;
}

struct HttpReply {
  int code = 0;
  std::string body;
};

// GET http://127.0.0.1:port<path>, HTTP/1.0. Unlike HttpGet
// (common/metrics_testing.h) this returns the body of any status, because
// Prometheus explains a bad query in the JSON body of a 400.
absl::StatusOr<HttpReply> Get(int port, const std::string& path,
                              absl::Duration timeout = absl::Seconds(10)) {
  const absl::Time deadline = absl::Now() + timeout;
  auto fd = TcpConnect(HostPort{"127.0.0.1", port}, deadline);
  if (!fd.ok()) return fd.status();
  const std::string request = absl::StrCat("GET ", path, " HTTP/1.0\r\nHost: 127.0.0.1:", port,
                                           "\r\nConnection: close\r\n\r\n");
  if (absl::Status s = WriteFull(fd->get(), request.data(), request.size(), deadline); !s.ok()) {
    return s;
  }
  std::string reply;
  char buf[16384];
  while (true) {
    struct pollfd pfd = {fd->get(), POLLIN, 0};
    const int ready = ::poll(&pfd, 1, PollTimeoutMs(deadline));
    if (ready == 0) return absl::DeadlineExceededError(absl::StrCat("GET ", path, ": timed out"));
    if (ready < 0 && errno == EINTR) continue;
    const ssize_t r = ready < 0 ? -1 : ::recv(fd->get(), buf, sizeof(buf), MSG_DONTWAIT);
    if (r == 0) break;
    if (r < 0) {
      if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR) continue;
      return absl::UnavailableError(absl::StrCat("GET ", path, ": ", ErrnoString(errno)));
    }
    reply.append(buf, static_cast<size_t>(r));
  }
  const size_t eoh = reply.find("\r\n\r\n");
  int code = 0;
  // "HTTP/1.x NNN reason"
  if (eoh == std::string::npos || reply.size() < 12 || !absl::StartsWith(reply, "HTTP/") ||
      !absl::SimpleAtoi(absl::string_view(reply).substr(9, 3), &code)) {
    return absl::InternalError(absl::StrCat("GET ", path, ": malformed reply '", reply, "'"));
  }
  return HttpReply{code, reply.substr(eoh + 4)};
}

std::string ReadFile(const std::string& path) {
  std::ifstream f(path);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

// A `prometheus` child process on 127.0.0.1. Killed (SIGTERM, then SIGKILL)
// when this object goes away, and by the kernel if the test process dies
// (PR_SET_PDEATHSIG).
class PrometheusServer {
 public:
  static absl::StatusOr<std::unique_ptr<PrometheusServer>> Start(const std::string& dir,
                                                                 const std::string& config) {
    absl::Status last = absl::UnknownError("not started");
    // The port is picked by binding port 0 and closing the socket, so another
    // process may take it before Prometheus binds it: retry with a new one.
    for (int attempt = 0; attempt < 3; ++attempt) {
      auto listener = TcpListen(HostPort{"127.0.0.1", 0});
      if (!listener.ok()) return listener.status();
      auto port = LocalPort(listener->get());
      if (!port.ok()) return port.status();
      listener->Reset();
      std::unique_ptr<PrometheusServer> p(new PrometheusServer());
      p->port_ = *port;
      p->log_ = absl::StrCat(dir, "/prometheus.log");
      const std::vector<std::string> args = {
          kPrometheus,
          "--config.file=" + config,
          "--storage.tsdb.path=" + dir + "/data",
          absl::StrCat("--web.listen-address=127.0.0.1:", *port),
          "--log.level=info",
      };
      last = p->Spawn(args);
      if (!last.ok()) return last;
      last = p->WaitReady(absl::Now() + absl::Seconds(20));
      if (last.ok()) return p;
    }
    return last;
  }

  ~PrometheusServer() { Stop(); }

  int port() const { return port_; }
  std::string Log() const { return ReadFile(log_); }

  // GET path; the reply parsed as JSON (any HTTP status).
  absl::StatusOr<Json> GetJson(const std::string& path) const {
    auto reply = Get(port_, path);
    if (!reply.ok()) return reply.status();
    auto json = JsonParser::Parse(reply->body);
    if (!json.ok()) {
      return absl::InternalError(absl::StrCat("GET ", path, ": HTTP ", reply->code, ", ",
                                              json.status().message()));
    }
    return json;
  }

  // An instant query. The reply's "data", or an error with Prometheus's
  // errorType and error when its status is not "success".
  absl::StatusOr<Json> Query(const std::string& promql) const {
    auto json = GetJson("/api/v1/query?query=" + UrlEncode(promql));
    if (!json.ok()) return json.status();
    if ((*json)["status"].str != "success") {
      return absl::InvalidArgumentError(absl::StrCat("query '", promql, "': status '",
                                                     (*json)["status"].str, "', ",
                                                     (*json)["errorType"].str, ": ",
                                                     (*json)["error"].str));
    }
    return (*json)["data"];
  }

  void Stop() {
    if (pid_ <= 0) return;
    ::kill(pid_, SIGTERM);
    const absl::Time deadline = absl::Now() + absl::Seconds(10);
    int status = 0;
    while (::waitpid(pid_, &status, WNOHANG) == 0) {
      if (absl::Now() >= deadline) {
        ::kill(pid_, SIGKILL);
        ::waitpid(pid_, &status, 0);
        break;
      }
      absl::SleepFor(absl::Milliseconds(20));
    }
    pid_ = -1;
  }

 private:
  PrometheusServer() = default;

  absl::Status Spawn(const std::vector<std::string>& args) {
    std::vector<std::string> copy = args;
    std::vector<char*> argv;
    for (auto& a : copy) argv.push_back(a.data());
    argv.push_back(nullptr);
    const pid_t parent = ::getpid();
    const pid_t pid = ::fork();
    if (pid < 0) return absl::InternalError("fork: " + ErrnoString(errno));
    if (pid == 0) {
      ::prctl(PR_SET_PDEATHSIG, SIGKILL);
      if (::getppid() != parent) _exit(1);
      int fd = ::open(log_.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
      if (fd >= 0) {
        ::dup2(fd, 1);
        ::dup2(fd, 2);
      }
      ::execv(argv[0], argv.data());
      _exit(127);
    }
    pid_ = pid;
    return absl::OkStatus();
  }

  // Until /-/ready answers 200. Fails early if the process exits (e.g. the
  // port was taken).
  absl::Status WaitReady(absl::Time deadline) {
    while (absl::Now() < deadline) {
      int status = 0;
      if (::waitpid(pid_, &status, WNOHANG) == pid_) {
        pid_ = -1;
        return absl::UnavailableError(absl::StrCat("prometheus exited (status ", status,
                                                   ") before it was ready; log:\n", Log()));
      }
      auto r = Get(port_, "/-/ready", absl::Seconds(2));
      if (r.ok() && r->code == 200) return absl::OkStatus();
      absl::SleepFor(absl::Milliseconds(50));
    }
    Stop();
    return absl::DeadlineExceededError(
        absl::StrCat("prometheus not ready on port ", port_, "; log:\n", Log()));
  }

  pid_t pid_ = -1;
  int port_ = 0;
  std::string log_;
};

// The samples of an instant-vector result: labels -> value ("NaN" etc. are
// parsed by SimpleAtod as nan/inf).
struct Sample {
  std::map<std::string, std::string> labels;
  double value = 0;
};

absl::StatusOr<std::vector<Sample>> Vector(const Json& data) {
  if (data["resultType"].str != "vector") {
    return absl::InternalError(absl::StrCat("resultType '", data["resultType"].str, "'"));
  }
  std::vector<Sample> out;
  for (const Json& r : data["result"].items) {
    Sample s;
    for (const auto& [k, v] : r["metric"].members) s.labels[k] = v.str;
    const Json& value = r["value"];
    // "value": [<unix time>, "<sample value>"]
    if (value.items.size() != 2 || value[1].type != Json::Type::kString ||
        !absl::SimpleAtod(value[1].str, &s.value)) {
      return absl::InternalError("malformed sample value");
    }
    out.push_back(std::move(s));
  }
  return out;
}

std::string Describe(const std::vector<Sample>& v) {
  std::vector<std::string> parts;
  for (const auto& s : v) {
    std::vector<std::string> l;
    for (const auto& [k, val] : s.labels) l.push_back(absl::StrCat(k, "=\"", val, "\""));
    parts.push_back(absl::StrCat("{", absl::StrJoin(l, ","), "} ", s.value));
  }
  return parts.empty() ? "(empty)" : absl::StrJoin(parts, "; ");
}

// Every PromQL expression of the Grafana dashboard, with its panel title.
absl::StatusOr<std::vector<std::pair<std::string, std::string>>> DashboardQueries(
    const std::string& path) {
  const std::string text = ReadFile(path);
  if (text.empty()) return absl::NotFoundError(absl::StrCat("cannot read ", path));
  auto d = JsonParser::Parse(text);
  if (!d.ok()) return d.status();
  std::vector<std::pair<std::string, std::string>> out;
  for (const Json& panel : (*d)["panels"].items) {
    for (const Json& target : panel["targets"].items) {
      if (target["expr"].type == Json::Type::kString) {
        out.emplace_back(panel["title"].str, target["expr"].str);
      }
    }
  }
  return out;
}

// ---------------------------------------------------------------------------

TEST(Prometheus, ScrapesTheClusterAndAnswersTheDashboardQueries) {
  if (::access(kPrometheus, X_OK) != 0) {
    GTEST_SKIP() << kPrometheus
                 << " not found: apt-get install prometheus (scripts/install-deps.sh does)";
  }
  const absl::Time t0 = absl::Now();
  constexpr int kDaemons = 3;
  LocalClusterOptions o;
  o.daemons = kDaemons;
  o.ps_shards = 1;
  // The dashboard's job row and peer panels read job ids and peer addresses,
  // which the daemons and shards export only when told to.
  o.daemon_flags = {"--metrics_identifying_labels"};
  o.ps_flags = {"--metrics_identifying_labels"};
  auto cluster = LocalCluster::Start(o);
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  LocalCluster& c = **cluster;

  // Scrape config: the coordinator and every daemon, 1 s interval.
  const char* tmp = std::getenv("TEST_TMPDIR");
  std::string dir = absl::StrCat(tmp != nullptr ? tmp : "/tmp", "/prometheus-XXXXXX");
  ASSERT_NE(::mkdtemp(dir.data()), nullptr) << ErrnoString(errno);
  const std::string coordinator_target = absl::StrCat("127.0.0.1:", c.coordinator_metrics_port());
  ASSERT_GT(c.coordinator_metrics_port(), 0);
  std::vector<std::string> daemon_targets;
  for (int i = 0; i < kDaemons; ++i) {
    ASSERT_GT(c.daemon_metrics_port(i), 0) << i;
    daemon_targets.push_back(absl::StrCat("127.0.0.1:", c.daemon_metrics_port(i)));
  }
  ASSERT_GT(c.ps_metrics_port(0), 0);
  const std::string ps_target = absl::StrCat("127.0.0.1:", c.ps_metrics_port(0));
  const std::string config = dir + "/prometheus.yml";
  {
    std::ofstream f(config);
    f << "global:\n"
         "  scrape_interval: 1s\n"
         "  evaluation_interval: 1s\n"
         "scrape_configs:\n"
         "  - job_name: gradsync-coordinator\n"
         "    static_configs:\n"
         "      - targets: [\""
      << coordinator_target
      << "\"]\n"
         "  - job_name: gradsyncd\n"
         "    static_configs:\n"
         "      - targets: [\""
      << absl::StrJoin(daemon_targets, "\", \"")
      << "\"]\n"
         "  - job_name: gradsync-ps\n"
         "    static_configs:\n"
         "      - targets: [\""
      << ps_target << "\"]\n";
    ASSERT_TRUE(f.good());
  }
  auto prom = PrometheusServer::Start(dir, config);
  ASSERT_TRUE(prom.ok()) << prom.status();
  PrometheusServer& p = **prom;
  std::printf("prometheus ready on 127.0.0.1:%d after %.1f s\n", p.port(),
              absl::ToDoubleSeconds(absl::Now() - t0));

  // Traffic: rounds of 1 MiB f32 allreduces (ring, the cost model's choice,
  // then the parameter server) and a small one on every rank, until told to
  // stop. A short
  // pause between rounds keeps the CPU for Prometheus and other tests.
  auto job = testing::OpenJob(c, "prometheus", testing::FirstN(kDaemons), 30000, 0,
                              /*ps_shards=*/1);
  ASSERT_TRUE(job.ok()) << job.status();
  constexpr size_t kCount = 1 << 18;
  std::vector<std::unique_ptr<client::Buffer>> bufs(kDaemons);
  for (int r = 0; r < kDaemons; ++r) {
    auto b = (*job)[r].session->AllocateBuffer(kCount * sizeof(float));
    ASSERT_TRUE(b.ok()) << b.status();
    bufs[r] = std::move(*b);
    for (size_t i = 0; i < kCount; ++i) bufs[r]->as<float>()[i] = 1.0f;
  }
  std::atomic<bool> stop{false};
  std::atomic<int> rounds{0};
  absl::Mutex mu;
  std::string traffic_error;
  std::thread traffic([&] {
    while (!stop.load()) {
      testing::OnEveryRank(kDaemons, [&](int r) {
        for (const char* algorithm : {"ring", "", "ps", "small"}) {
          const bool small = std::string(algorithm) == "small";
          client::CollectiveSpec spec;
          spec.buffer = bufs[r].get();
          spec.count = small ? 16 : kCount;
          if (small) algorithm = "";
          spec.op = ReduceOp::kAvg;  // keeps the values at 1
          spec.algorithm = algorithm;
          spec.name = "grads";
          auto result = (*job)[r].session->Run(spec);
          if (!result.ok()) {
            absl::MutexLock l(&mu);
            if (traffic_error.empty()) {
              traffic_error = absl::StrCat("rank ", r, ": ", result.status().ToString());
            }
          }
        }
      });
      rounds.fetch_add(1);
      {
        absl::MutexLock l(&mu);
        if (!traffic_error.empty()) return;
      }
      absl::SleepFor(absl::Milliseconds(50));
    }
  });
  struct Joiner {
    std::atomic<bool>& stop;
    std::thread& t;
    ~Joiner() {
      stop = true;
      if (t.joinable()) t.join();
    }
  } joiner{stop, traffic};

  // Poll Prometheus until everything shows up.
  std::set<std::string> all_targets(daemon_targets.begin(), daemon_targets.end());
  all_targets.insert(coordinator_target);
  all_targets.insert(ps_target);
  struct Check {
    std::string query;
    std::string last = "(not queried)";
    bool ok = false;
  };
  // Each daemon's traffic, summed over its peers / sizes.
  auto per_daemon_positive = [&](const std::vector<Sample>& v) {
    std::set<std::string> seen;
    for (const auto& s : v) {
      if (s.value > 0) seen.insert(s.labels.count("instance") ? s.labels.at("instance") : "");
    }
    return seen == std::set<std::string>(daemon_targets.begin(), daemon_targets.end());
  };
  std::vector<std::pair<Check, std::function<bool(const std::vector<Sample>&)>>> checks = {
      {{"sum by (instance) (gradsync_daemon_peer_sent_bytes_total)"}, per_daemon_positive},
      {{"sum by (instance) (gradsync_daemon_peer_received_bytes_total)"}, per_daemon_positive},
      {{"sum by (instance) (gradsync_daemon_op_seconds_count)"}, per_daemon_positive},
      {{"sum(gradsync_daemon_op_seconds_count)"},
       [](const std::vector<Sample>& v) { return v.size() == 1 && v[0].value > 0; }},
      {{"histogram_quantile(0.5, sum by (le) (rate(gradsync_daemon_op_seconds_bucket[10s])))"},
       [](const std::vector<Sample>& v) {
         return v.size() == 1 && std::isfinite(v[0].value) && v[0].value > 0;
       }},
      {{"gradsync_coordinator_jobs{state=\"running\"}"},
       [](const std::vector<Sample>& v) { return v.size() == 1 && v[0].value == 1; }},
      {{"up"},
       [&](const std::vector<Sample>& v) {
         std::set<std::string> up;
         for (const auto& s : v) {
           if (s.value == 1 && s.labels.count("instance")) up.insert(s.labels.at("instance"));
         }
         return v.size() == all_targets.size() && up == all_targets;
       }},
  };
  const absl::Time deadline = absl::Now() + absl::Seconds(60);
  bool all_ok = false;
  std::string query_error;
  while (!all_ok && absl::Now() < deadline) {
    {
      absl::MutexLock l(&mu);
      ASSERT_TRUE(traffic_error.empty()) << traffic_error;
    }
    all_ok = true;
    for (auto& [check, pred] : checks) {
      if (check.ok) continue;  // counters only grow; the job stays running
      auto data = p.Query(check.query);
      if (!data.ok()) {
        query_error = data.status().ToString();
        all_ok = false;
        continue;
      }
      auto v = Vector(*data);
      if (!v.ok()) {
        query_error = absl::StrCat(check.query, ": ", v.status().ToString());
        all_ok = false;
        continue;
      }
      check.last = Describe(*v);
      check.ok = pred(*v);
      all_ok = all_ok && check.ok;
    }
    if (!all_ok) absl::SleepFor(absl::Milliseconds(250));
  }
  std::printf("prometheus showed the traffic %.1f s after the start (%d rounds of allreduces)\n",
              absl::ToDoubleSeconds(absl::Now() - t0), rounds.load());
  for (const auto& [check, pred] : checks) {
    EXPECT_TRUE(check.ok) << check.query << " -> " << check.last;
    std::printf("  %s -> %s\n", check.query.c_str(), check.last.c_str());
  }
  ASSERT_TRUE(all_ok) << "last query error: " << query_error << "\nprometheus log:\n" << p.Log();

  // Every target is scraped by the right job (the dashboard's queries rely on
  // the instance label only, but docs/operations.md names these jobs).
  {
    auto data = p.Query("count by (job) (up)");
    ASSERT_TRUE(data.ok()) << data.status();
    auto v = Vector(*data);
    ASSERT_TRUE(v.ok()) << v.status();
    std::map<std::string, double> by_job;
    for (const auto& s : *v) {
      auto it = s.labels.find("job");
      by_job[it == s.labels.end() ? "" : it->second] = s.value;
    }
    EXPECT_EQ(by_job, (std::map<std::string, double>{{"gradsync-coordinator", 1},
                                                     {"gradsyncd", kDaemons},
                                                     {"gradsync-ps", 1}}))
        << Describe(*v);
  }

  // The dashboard's rate() queries need two samples of each target in their
  // window: wait until every target has been scraped 3 times.
  {
    const absl::Time until = absl::Now() + absl::Seconds(20);
    std::string last;
    bool enough = false;
    while (!enough && absl::Now() < until) {
      auto data = p.Query("count_over_time(up[10s])");
      ASSERT_TRUE(data.ok()) << data.status();
      auto v = Vector(*data);
      ASSERT_TRUE(v.ok()) << v.status();
      last = Describe(*v);
      enough = v->size() == all_targets.size();
      for (const auto& s : *v) enough = enough && s.value >= 3;
      if (!enough) absl::SleepFor(absl::Milliseconds(250));
    }
    ASSERT_TRUE(enough) << "count_over_time(up[10s]) -> " << last;
  }

  // The dashboard: its `instance` variable (label_values(gradsync_daemon_sessions,
  // instance) in Grafana) lists the daemons, and every panel query is valid
  // PromQL that the server evaluates against the real series.
  {
    auto json = p.GetJson("/api/v1/label/instance/values?match%5B%5D=gradsync_daemon_sessions");
    ASSERT_TRUE(json.ok()) << json.status();
    ASSERT_EQ((*json)["status"].str, "success") << (*json)["error"].str;
    std::set<std::string> instances;
    for (const Json& i : (*json)["data"].items) instances.insert(i.str);
    EXPECT_EQ(instances, std::set<std::string>(daemon_targets.begin(), daemon_targets.end()));
  }
  std::string dashboard = kDashboards[0];
  for (const char* d : kDashboards) {
    if (::access(d, R_OK) == 0) {
      dashboard = d;
      break;
    }
  }
  auto queries = DashboardQueries(dashboard);
  ASSERT_TRUE(queries.ok()) << queries.status();
  ASSERT_GE(queries->size(), 10u) << "too few queries found in " << dashboard;
  int with_data = 0;
  for (const auto& [title, expr] : *queries) {
    const std::string promql = absl::StrReplaceAll(
        expr, {{"$__rate_interval", "10s"},
               {"${instance}", ".*"},
               {"$instance", ".*"},
               {"${job}", ".*"},
               {"$job", ".*"}});
    auto data = p.Query(promql);
    EXPECT_TRUE(data.ok()) << "panel '" << title << "': " << data.status();
    if (!data.ok()) continue;
    auto v = Vector(*data);
    EXPECT_TRUE(v.ok()) << "panel '" << title << "': " << promql << ": " << v.status();
    if (!v.ok()) continue;
    with_data += v->empty() ? 0 : 1;
    // A misspelt metric is valid PromQL too, and just returns nothing. With
    // traffic flowing, every panel shows data, except series that only exist
    // once an op has failed, a TCP segment was retransmitted (never on an
    // idle loopback).
    if (!absl::StrContains(expr, "status!=") &&
        !absl::StrContains(expr, "gradsync_daemon_peer_retransmits_total")) {
      EXPECT_FALSE(v->empty()) << "panel '" << title << "': no data for " << promql;
    }
    std::printf("  panel '%s': %s -> %zu series\n", title.c_str(), promql.c_str(), v->size());
  }
  std::printf("dashboard: %zu queries valid, %d with data\n", queries->size(), with_data);

  stop = true;
  traffic.join();
  {
    absl::MutexLock l(&mu);
    EXPECT_TRUE(traffic_error.empty()) << traffic_error;
  }
  for (int r = 0; r < kDaemons; ++r) {
    EXPECT_EQ(bufs[r]->as<float>()[0], 1.0f);
    EXPECT_EQ(bufs[r]->as<float>()[kCount - 1], 1.0f);
  }
  p.Stop();
  std::printf("done in %.1f s\n", absl::ToDoubleSeconds(absl::Now() - t0));
}

}  // namespace
}  // namespace gradsync
