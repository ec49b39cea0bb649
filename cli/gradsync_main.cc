// gradsync: the command-line tool. Commands: demo, bench, status, cluster. See docs/cli.md.
#include <unistd.h>

#include <cstdio>
#include <string>
#include <tuple>
#include <vector>

#include "common/build_info.h"
#include "common/certs.h"
#include "common/tls_flags.h"
#include "common/process.h"
#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/flags/usage.h"
#include "absl/strings/numbers.h"
#include "cli/bench.h"
#include "cli/timeline_merge.h"
#include "cli/cluster.h"
#include "cli/demo.h"
#include "cli/job_delete.h"
#include "cli/status.h"

ABSL_FLAG(std::string, dir, "", "certs: the directory to write ca.pem and ROLE.{pem,key} into");
ABSL_FLAG(std::string, hosts, "",
          "certs: comma-separated host names and IP addresses every certificate names "
          "(localhost and 127.0.0.1 are always included)");
ABSL_FLAG(int, days, 365, "certs: validity in days");
ABSL_FLAG(std::string, nodes, "",
          "certs: comma-separated node names; each gets its own node certificate NAME.{pem,key} "
          "(CN NAME, OU node), from a new CA or, with an existing --dir, from its CA");
ABSL_FLAG(std::string, ps_names, "",
          "certs: comma-separated PS shard names; each gets its own PS certificate NAME.{pem,key} "
          "(CN NAME, OU ps), whose shard ids no other certificate can take over");
ABSL_FLAG(std::string, revoke, "",
          "certs: revoke this certificate (issued by the CA in --dir): writes the CA's next CRL "
          "into DIR/crl/, the directory --tls_crl_dir names");
ABSL_FLAG(int32_t, ranks, 4,
          "demo/bench: ranks of the embedded local cluster (one gradsyncd each); cluster: "
          "daemons to start (default 2)");
ABSL_FLAG(std::string, env_file, "",
          "cluster: also write the GRADSYNC_* variables (where everything listens) to this file");
ABSL_FLAG(int32_t, duration_s, 0, "cluster: stop after this many seconds (0: at SIGINT/SIGTERM)");
ABSL_FLAG(std::string, max_bytes, "64M", "largest message (K/M/G suffixes)");
ABSL_FLAG(int32_t, ranks_per_daemon, 1,
          "bench: clients sharing one gradsyncd (> 1 exercises the hierarchical node path)");
ABSL_FLAG(std::string, min_bytes, "8", "bench: smallest message (K/M/G suffixes)");
ABSL_FLAG(std::string, step_factor, "2", "bench: multiply the size by this between rows");
ABSL_FLAG(int32_t, iters, -1, "timed iterations per size (demo: 3, bench: 20)");
ABSL_FLAG(int32_t, warmup, -1, "untimed iterations per size (demo: 1, bench: 5)");
ABSL_FLAG(int64_t, timeout_ms, 60000, "deadline of each collective");
ABSL_FLAG(bool, keep_logs, false,
          "demo, bench, cluster: keep the embedded cluster's logs even when all is well");
ABSL_FLAG(std::string, op, "allreduce",
          "bench: allreduce|reduce_scatter|allgather|broadcast|reduce|alltoall|barrier|gather|scatter");
ABSL_FLAG(std::string, dtype, "f32", "bench: f32|f64|f16|bf16|i32|i64|u8");
ABSL_FLAG(std::string, redop, "sum", "bench: sum|avg|min|max|prod");
ABSL_FLAG(std::string, algo, "auto",
          "bench: auto (cost model) or ring|rhd|rd|tree|pairwise|oneshot|hier|ps (ps needs "
          "--ps_shards; hier needs ranks that share a daemon)");
ABSL_FLAG(std::string, codec, "",
          "bench: the ops' wire codec: none|bf16|fp16|fp8e4m3|fp8e5m2|int8|auto|auto:LIST "
          "(f32 allreduce/reduce_scatter; docs/compression.md; --check allows its error bound) "
          "or topk:RATIO[,warmup=N][,momentum=M] (f32 allreduce; not with --check)");
ABSL_FLAG(int32_t, root, 0, "bench: root rank of broadcast/reduce/gather/scatter");
ABSL_FLAG(bool, check, false, "bench: check results (one checked op per size) and count #wrong");
ABSL_FLAG(std::string, csv, "", "bench: also write the table as CSV to this file");
ABSL_FLAG(bool, out_of_place, false,
          "bench: also time each size out of place (oop_time, oop_busbw columns): the input in "
          "memory of its own, copied into the op's buffer before every op, as with "
          "gradsync's in-place ops a training process does");
ABSL_FLAG(std::string, daemon_flags, "",
          "bench: extra flags for the embedded cluster's gradsyncd, comma-separated (e.g. "
          "--daemon_flags=--spin_us=0,--segment_bytes=4194304)");
ABSL_FLAG(bool, blocking, false,
          "bench: time each op alone (ranks start together, submit + wait) and report the median "
          "over --iters of the slowest rank, as MPI/Gloo benchmarks do; default: --iters ops back "
          "to back, elapsed / iters");
ABSL_FLAG(int32_t, gap_us, 0,
          "bench --blocking: every rank sleeps this long before each op (the compute between a "
          "training step's allreduces), so the daemon's threads may be asleep when it arrives");
ABSL_FLAG(int32_t, tcp_streams, 0, "bench: TCP connections per pair of daemons (0: daemon default)");
ABSL_FLAG(int32_t, ps_shards, 0,
          "bench/demo: parameter-server shards (gradsync-ps) to start and use (--algo ps)");
ABSL_FLAG(bool, limits, true, "bench: measure and print link/memory limits before the table");
ABSL_FLAG(std::string, coordinator, "",
          "status: the coordinator to ask (default 127.0.0.1:7070); bench: use an existing "
          "cluster (run one bench per rank, each next to its gradsyncd)");
ABSL_FLAG(std::string, reason, "", "job delete: why, shown to the job's members");
ABSL_FLAG(std::string, daemon, "unix:/run/gradsync/gradsyncd.sock",
          "bench with --coordinator: the local gradsyncd");
ABSL_FLAG(int32_t, world_size, 0,
          "bench with --coordinator: ranks in the bench job (default $WORLD_SIZE, "
          "$OMPI_COMM_WORLD_SIZE or $PMI_SIZE)");
ABSL_FLAG(int32_t, rank, -1,
          "bench with --coordinator: this process's rank (default $RANK, $OMPI_COMM_WORLD_RANK or "
          "$PMI_RANK; -1: in joining order)");
ABSL_FLAG(std::string, out, "timeline.json", "timeline merge: the merged trace to write");
ABSL_FLAG(std::string, plot, "", "bench: write busbw vs size, with the measured limits, as SVG");
ABSL_FLAG(bool, timeline, false,
          "bench: the job's Chrome-trace timeline on every rank (gradsyncd --timeline_dir; "
          "embedded: merged into ./<job>.timeline.json; also GRADSYNC_TIMELINE=1)");
ABSL_FLAG(std::string, job, "",
          "status: only this job; bench with --coordinator: job id shared by all bench processes "
          "(default $GRADSYNC_JOB)");

namespace {
constexpr char kUsage[] =
    "gradsync <command> [flags]\n"
    "commands:\n"
    "  demo    start a local cluster (1 coordinator + --ranks daemons) on loopback, run\n"
    "          allreduces over several sizes and dtypes, check every result, print a table;\n"
    "          exits 0 only if every check passed\n"
    "  bench   nccl-tests style table for one collective over a range of sizes, next to the\n"
    "          link limits measured in the same run (--op, --min_bytes, --max_bytes, ...)\n"
    "  status  ask the coordinator (--coordinator, default 127.0.0.1:7070) and every daemon\n"
    "          what each rank of each job (--job) is doing, and who an op is waiting for\n"
    "  cluster start a local cluster (1 coordinator + --ranks daemons, default 2) and keep it\n"
    "          up until Ctrl-C; prints GRADSYNC_COORDINATOR / GRADSYNC_DAEMONS (--env_file)\n"
    "  certs   write a lab CA and a certificate per role (coordinator, node, ps, operator)\n"
    "          into --dir, naming --hosts, for mutual TLS (--tls_cert/--tls_key/--tls_ca);\n"
    "          --nodes a,b: one node certificate per name (added to an existing --dir);\n"
    "          --ps_names s0,s1: one PS shard certificate per name (likewise);\n"
    "          --revoke FILE.pem: add it to the CA's CRL in DIR/crl (--tls_crl_dir)\n"
    "  job delete ID  end a job at the coordinator (--coordinator; an operator certificate;\n"
    "          --reason is shown to its ranks)\n"
    "  timeline merge TRACE_OR_DIR...  the daemons' per-rank Chrome traces of a job\n"
    "          (--timeline) as one trace, every rank its own row (--out, default timeline.json)\n"
    "  version the version, the source commit and the build mode (as --version)\n";

int Fail(const char* cmd, const std::string& msg) {
  std::fprintf(stderr, "gradsync %s: %s\n", cmd, msg.c_str());
  return 2;
}

// gradsync certs: a new lab CA and role certificates, node certificates
// (--nodes), or a revocation (--revoke).
int RunCerts(const std::string& dir, const std::vector<std::string>& hosts) {
  const int days = absl::GetFlag(FLAGS_days);
  if (const std::string revoke = absl::GetFlag(FLAGS_revoke); !revoke.empty()) {
    auto crl = gradsync::RevokeLabCert(dir, revoke);
    if (!crl.ok()) return Fail("certs", std::string(crl.status().message()));
    std::printf("revoked %s: CRL %s (servers and clients with --tls_crl_dir=%s/crl refuse it "
                "from their next handshake)\n",
                revoke.c_str(), crl->c_str(), dir.c_str());
    return 0;
  }
  auto print = [](const std::string& what, const gradsync::TlsConfig& c) {
    std::printf("%-11s --tls_cert=%s --tls_key=%s --tls_ca=%s\n", what.c_str(), c.cert.c_str(),
                c.key.c_str(), c.ca.c_str());
  };
  const std::vector<std::string> nodes =
      absl::StrSplit(absl::GetFlag(FLAGS_nodes), ',', absl::SkipEmpty());
  const std::vector<std::string> shards =
      absl::StrSplit(absl::GetFlag(FLAGS_ps_names), ',', absl::SkipEmpty());
  if ((nodes.empty() && shards.empty()) || ::access((dir + "/ca.key").c_str(), R_OK) != 0) {
    auto certs = gradsync::MakeLabCerts(dir, hosts, days);
    if (!certs.ok()) return Fail("certs", std::string(certs.status().message()));
    std::printf("CA %s (key %s/ca.key: keep it off the nodes)\n", certs->ca.c_str(), dir.c_str());
    print("coordinator", certs->coordinator);
    print("node", certs->node);
    print("ps", certs->ps);
    print("operator", certs->operator_);
  }
  // One certificate of `role` per name, for hosts that must be told apart
  // (revoked alone; a shard id bound to its own certificate).
  for (const auto& [role, flag, names] :
       {std::make_tuple("node", "--nodes", nodes), std::make_tuple("ps", "--ps_names", shards)}) {
    for (const std::string& name : names) {
      if (name == "ca" || name == "coordinator" || name == "node" || name == "ps" ||
          name == "operator" || name.find('/') != std::string::npos) {
        return Fail("certs", std::string(flag) + ": '" + name + "' is not a usable name");
      }
      auto c = gradsync::AddLabCert(dir, role, name, hosts, days);
      if (!c.ok()) return Fail("certs", std::string(c.status().message()));
      print(std::string(role) + " " + name, *c);
    }
  }
  return 0;
}
}  // namespace

// nccl-tests and the docs spell flags with dashes (--min-bytes); absl flags
// use underscores. Accept both: rewrite "--a-b[=v]" to "--a_b[=v]".
std::vector<std::string> NormalizeFlagNames(int argc, char** argv) {
  std::vector<std::string> out;
  for (int i = 0; i < argc; ++i) {
    std::string a = argv[i];
    if (i > 0 && a.size() > 2 && a[0] == '-' && a[1] == '-') {
      const size_t end = a.find('=');
      for (size_t j = 2; j < (end == std::string::npos ? a.size() : end); ++j) {
        if (a[j] == '-') a[j] = '_';
      }
    }
    out.push_back(a);
  }
  return out;
}

int main(int argc, char** argv) {
  gradsync::InitFlagsUsage("gradsync", kUsage, __FILE__);
  std::vector<std::string> normalized = NormalizeFlagNames(argc, argv);
  std::vector<char*> argv2;
  for (auto& a : normalized) argv2.push_back(a.data());
  argv2.push_back(nullptr);
  argc = static_cast<int>(normalized.size());
  argv = argv2.data();
  std::vector<char*> args = absl::ParseCommandLine(argc, argv);
  gradsync::InitProcess();
  if (args.size() < 2) {
    std::fputs(kUsage, stderr);
    return 2;
  }
  const std::string cmd = args[1];
  auto max_bytes = gradsync::ParseBytes(absl::GetFlag(FLAGS_max_bytes));
  if (!max_bytes.ok()) return Fail(cmd.c_str(), "--max_bytes: " + std::string(max_bytes.status().message()));
  const int iters = absl::GetFlag(FLAGS_iters);
  const int warmup = absl::GetFlag(FLAGS_warmup);
  if (cmd == "certs") {
    const std::string dir = absl::GetFlag(FLAGS_dir);
    if (dir.empty()) return Fail("certs", "--dir is required (where to write the certificates)");
    std::vector<std::string> hosts;
    for (absl::string_view h : absl::StrSplit(absl::GetFlag(FLAGS_hosts), ',', absl::SkipEmpty())) {
      hosts.emplace_back(h);
    }
    return RunCerts(dir, hosts);
  }
  if (cmd == "version") {
    std::printf("%s\n", gradsync::VersionLine("gradsync").c_str());
    return 0;
  }
  if (cmd == "demo") {
    gradsync::DemoOptions o;
    o.ranks = absl::GetFlag(FLAGS_ranks);
    o.max_bytes = *max_bytes;
    if (iters >= 0) o.iters = iters;
    if (warmup >= 0) o.warmup = warmup;
    o.timeout_ms = absl::GetFlag(FLAGS_timeout_ms);
    o.keep_logs = absl::GetFlag(FLAGS_keep_logs);
    o.ps_shards = absl::GetFlag(FLAGS_ps_shards) > 0 ? absl::GetFlag(FLAGS_ps_shards) : o.ps_shards;
    auto failures = gradsync::RunDemo(o);
    if (!failures.ok()) {
      std::fprintf(stderr, "gradsync demo: %s\n", std::string(failures.status().message()).c_str());
      return 1;
    }
    return *failures == 0 ? 0 : 1;
  }
  if (cmd == "bench") {
    gradsync::BenchOptions o;
    auto op = gradsync::ParseCollective(absl::GetFlag(FLAGS_op));
    if (!op.ok()) return Fail("bench", "--op: " + std::string(op.status().message()));
    if (gradsync::IsPointToPoint(*op)) {
      return Fail("bench", "--op: " + std::string(gradsync::CollectiveName(*op)) +
                               " is point-to-point; the bench times collectives");
    }
    auto dtype = gradsync::ParseDType(absl::GetFlag(FLAGS_dtype));
    if (!dtype.ok()) return Fail("bench", "--dtype: " + std::string(dtype.status().message()));
    auto redop = gradsync::ParseReduceOp(absl::GetFlag(FLAGS_redop));
    if (!redop.ok()) return Fail("bench", "--redop: " + std::string(redop.status().message()));
    if (*redop == gradsync::ReduceOp::kPremulSum) {
      return Fail("bench", "--redop: premul_sum takes a factor per rank; the bench times sum, avg, "
                           "min, max and prod");
    }
    auto min_bytes = gradsync::ParseBytes(absl::GetFlag(FLAGS_min_bytes));
    if (!min_bytes.ok()) return Fail("bench", "--min_bytes: " + std::string(min_bytes.status().message()));
    double step = 0;
    if (!absl::SimpleAtod(absl::GetFlag(FLAGS_step_factor), &step)) {
      return Fail("bench", "--step_factor: not a number");
    }
    o.op = *op;
    o.dtype = *dtype;
    o.redop = *redop;
    o.min_bytes = *min_bytes;
    o.max_bytes = *max_bytes;
    o.step_factor = step;
    o.ranks = absl::GetFlag(FLAGS_ranks);
    o.ranks_per_daemon = absl::GetFlag(FLAGS_ranks_per_daemon);
    o.algo = absl::GetFlag(FLAGS_algo);
    o.codec = absl::GetFlag(FLAGS_codec);
    o.root = absl::GetFlag(FLAGS_root);
    if (iters >= 0) o.iters = iters;
    if (warmup >= 0) o.warmup = warmup;
    o.check = absl::GetFlag(FLAGS_check);
    o.blocking = absl::GetFlag(FLAGS_blocking);
    o.gap_us = absl::GetFlag(FLAGS_gap_us);
    if (o.gap_us < 0 || (o.gap_us > 0 && !o.blocking)) {
      std::fprintf(stderr, "gradsync bench: --gap_us must be >= 0 and needs --blocking\n");
      return 2;
    }
    for (absl::string_view f : absl::StrSplit(absl::GetFlag(FLAGS_daemon_flags), ',', absl::SkipEmpty())) {
      o.daemon_flags.emplace_back(f);
    }
    o.keep_logs = absl::GetFlag(FLAGS_keep_logs);
    o.csv = absl::GetFlag(FLAGS_csv);
    o.out_of_place = absl::GetFlag(FLAGS_out_of_place);
    o.tcp_streams = absl::GetFlag(FLAGS_tcp_streams);
    o.ps_shards = absl::GetFlag(FLAGS_ps_shards);
    o.limits = absl::GetFlag(FLAGS_limits);
    o.timeout_ms = absl::GetFlag(FLAGS_timeout_ms);
    o.coordinator = absl::GetFlag(FLAGS_coordinator);
    o.daemon = absl::GetFlag(FLAGS_daemon);
    o.world_size = absl::GetFlag(FLAGS_world_size);
    o.rank = absl::GetFlag(FLAGS_rank);
    o.job = absl::GetFlag(FLAGS_job);
    o.plot = absl::GetFlag(FLAGS_plot);
    o.timeline = absl::GetFlag(FLAGS_timeline);
    if (!o.coordinator.empty()) {
      absl::Status launch = gradsync::ResolveBenchLaunch(o, [](const char* n) { return std::getenv(n); });
      if (!launch.ok()) return Fail("bench", std::string(launch.message()));
    }
    auto wrong = gradsync::RunBench(o);
    if (!wrong.ok()) {
      std::fprintf(stderr, "gradsync bench: %s\n", std::string(wrong.status().message()).c_str());
      return 1;
    }
    return *wrong == 0 ? 0 : 1;
  }
  if (cmd == "status") {
    gradsync::StatusOptions o;
    const std::string coordinator = absl::GetFlag(FLAGS_coordinator);
    if (!coordinator.empty()) o.coordinator = coordinator;
    o.job = absl::GetFlag(FLAGS_job);
    o.tls = gradsync::TlsConfigFromFlags();
    auto hanging = gradsync::RunStatus(o);
    if (!hanging.ok()) {
      std::fprintf(stderr, "gradsync status: %s\n", std::string(hanging.status().message()).c_str());
      return 1;
    }
    return 0;
  }
  if (cmd == "job") {
    if (args.size() != 4 || std::string(args[2]) != "delete") {
      return Fail("job", "usage: gradsync job delete ID [--reason=TEXT] [--coordinator=ADDR]");
    }
    gradsync::StatusOptions o;
    const std::string coordinator = absl::GetFlag(FLAGS_coordinator);
    if (!coordinator.empty()) o.coordinator = coordinator;
    o.job = args[3];
    o.tls = gradsync::TlsConfigFromFlags();
    auto done = gradsync::RunJobDelete(o, absl::GetFlag(FLAGS_reason));
    if (!done.ok()) {
      std::fprintf(stderr, "gradsync job delete: %s\n", std::string(done.status().message()).c_str());
      return 1;
    }
    std::printf("%s\n", done->c_str());
    return 0;
  }
  if (cmd == "timeline") {
    if (args.size() < 4 || std::string(args[2]) != "merge") {
      return Fail("timeline", "usage: gradsync timeline merge [--out=FILE] TRACE_OR_DIR...");
    }
    const std::string out = absl::GetFlag(FLAGS_out);
    auto merged = gradsync::MergeTimelines(std::vector<std::string>(args.begin() + 3, args.end()), out);
    if (!merged.ok()) return Fail("timeline merge", std::string(merged.status().message()));
    for (const std::string& w : merged->warnings) std::fprintf(stderr, "gradsync timeline merge: %s\n", w.c_str());
    std::printf("%s: %d events from %d files, one row each (%s); open in ui.perfetto.dev or "
                "chrome://tracing\n", out.c_str(), merged->events, merged->files,
                absl::StrJoin(merged->rows, ", ").c_str());
    return 0;
  }
  if (cmd == "cluster") {
    gradsync::ClusterOptions o;
    // --ranks defaults to 4 for demo/bench; a cluster defaults to 2 daemons.
    const bool ranks_set = [&] {
      for (int i = 1; i < argc; ++i) {
        const std::string a = argv[i];
        if (a == "--ranks" || a.rfind("--ranks=", 0) == 0) return true;
      }
      return false;
    }();
    o.daemons = ranks_set ? absl::GetFlag(FLAGS_ranks) : 2;
    o.ps_shards = absl::GetFlag(FLAGS_ps_shards);
    o.env_file = absl::GetFlag(FLAGS_env_file);
    o.keep_logs = absl::GetFlag(FLAGS_keep_logs);
    if (absl::GetFlag(FLAGS_duration_s) > 0) o.duration = absl::Seconds(absl::GetFlag(FLAGS_duration_s));
    absl::Status s = gradsync::RunCluster(o);
    if (!s.ok()) {
      std::fprintf(stderr, "gradsync cluster: %s\n", std::string(s.message()).c_str());
      return 1;
    }
    return 0;
  }
  std::fprintf(stderr, "gradsync: unknown command '%s'\n%s", cmd.c_str(), kUsage);
  return 2;
}
