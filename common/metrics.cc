#include "common/metrics.h"

#include <dirent.h>
#include <sys/resource.h>
#include <unistd.h>

#include <exception>
#include <fstream>
#include <iterator>
#include <utility>

#include <prometheus/check_names.h>
#include <prometheus/family.h>
#include <prometheus/text_serializer.h>

#include "absl/base/thread_annotations.h"
#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"

namespace gradsync {
namespace {

const char* TypeName(prometheus::MetricType type) {
  switch (type) {
    case prometheus::MetricType::Counter:
      return "counter";
    case prometheus::MetricType::Gauge:
      return "gauge";
    case prometheus::MetricType::Histogram:
      return "histogram";
    case prometheus::MetricType::Summary:
      return "summary";
    case prometheus::MetricType::Untyped:
      break;
  }
  return "untyped";
}

// ---------------------------------------------------------------------------
// Process metrics, read from /proc at scrape time.

struct ProcStat {
  double cpu_seconds = 0;
  double start_time_seconds = 0;
  double virtual_bytes = 0;
  double resident_bytes = 0;
};

// Reads /proc/self/stat (and btime from /proc/stat). false if unavailable.
bool ReadProcStat(ProcStat* out) {
  std::ifstream in("/proc/self/stat");
  std::string line;
  if (!in || !std::getline(in, line)) return false;
  // The command name (field 2) is in parentheses and may contain spaces.
  const size_t close = line.rfind(')');
  if (close == std::string::npos) return false;
  std::vector<absl::string_view> f =
      absl::StrSplit(absl::string_view(line).substr(close + 1), ' ', absl::SkipEmpty());
  // f[0] is field 3 (state): field N is f[N - 3].
  if (f.size() < 22) return false;
  double utime = 0, stime = 0, start_ticks = 0, vsize = 0, rss_pages = 0;
  if (!absl::SimpleAtod(f[11], &utime) || !absl::SimpleAtod(f[12], &stime) ||
      !absl::SimpleAtod(f[19], &start_ticks) || !absl::SimpleAtod(f[20], &vsize) ||
      !absl::SimpleAtod(f[21], &rss_pages)) {
    return false;
  }
  const double ticks = static_cast<double>(sysconf(_SC_CLK_TCK));
  const double page = static_cast<double>(sysconf(_SC_PAGESIZE));
  if (ticks <= 0 || page <= 0) return false;
  double boot_time = 0;
  std::ifstream stat("/proc/stat");
  for (std::string l; std::getline(stat, l);) {
    if (absl::StartsWith(l, "btime ")) {
      absl::SimpleAtod(absl::StripAsciiWhitespace(absl::string_view(l).substr(6)), &boot_time);
      break;
    }
  }
  if (boot_time <= 0) return false;
  out->cpu_seconds = (utime + stime) / ticks;
  out->start_time_seconds = boot_time + start_ticks / ticks;
  out->virtual_bytes = vsize;
  out->resident_bytes = rss_pages * page;
  return true;
}

int CountOpenFds() {
  DIR* dir = opendir("/proc/self/fd");
  if (dir == nullptr) return -1;
  int n = 0;
  while (const struct dirent* e = readdir(dir)) {
    if (e->d_name[0] != '.') ++n;
  }
  closedir(dir);
  return n - 1;  // not the directory's own fd
}

prometheus::MetricFamily OneValue(const char* name, const char* help,
                                  prometheus::MetricType type, double value) {
  prometheus::MetricFamily family;
  family.name = name;
  family.help = help;
  family.type = type;
  prometheus::ClientMetric m;
  if (type == prometheus::MetricType::Counter) {
    m.counter.value = value;
  } else {
    m.gauge.value = value;
  }
  family.metric.push_back(std::move(m));
  return family;
}

class ProcessCollector final : public prometheus::Collectable {
 public:
  // The fallback start time if /proc is unreadable.
  ProcessCollector() : constructed_(absl::ToDoubleSeconds(absl::Now() - absl::UnixEpoch())) {}

  std::vector<prometheus::MetricFamily> Collect() const override {
    using prometheus::MetricType;
    std::vector<prometheus::MetricFamily> out;
    ProcStat st;
    const bool have_stat = ReadProcStat(&st);
    out.push_back(OneValue("process_start_time_seconds",
                           "Start time of the process since unix epoch in seconds.",
                           MetricType::Gauge, have_stat ? st.start_time_seconds : constructed_));
    if (have_stat) {
      out.push_back(OneValue("process_cpu_seconds_total",
                             "Total user and system CPU time spent in seconds.",
                             MetricType::Counter, st.cpu_seconds));
      out.push_back(OneValue("process_resident_memory_bytes", "Resident memory size in bytes.",
                             MetricType::Gauge, st.resident_bytes));
      out.push_back(OneValue("process_virtual_memory_bytes", "Virtual memory size in bytes.",
                             MetricType::Gauge, st.virtual_bytes));
    }
    if (const int fds = CountOpenFds(); fds >= 0) {
      out.push_back(OneValue("process_open_fds", "Number of open file descriptors.",
                             MetricType::Gauge, fds));
    }
    struct rlimit lim;
    if (getrlimit(RLIMIT_NOFILE, &lim) == 0 && lim.rlim_cur != RLIM_INFINITY) {
      out.push_back(OneValue("process_max_fds", "Maximum number of open file descriptors.",
                             MetricType::Gauge, static_cast<double>(lim.rlim_cur)));
    }
    return out;
  }

 private:
  const double constructed_;
};

}  // namespace

prometheus::Histogram::BucketBoundaries LatencyBuckets() {
  return {0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1,
          0.25,   0.5,     1,      2.5,   5,      10,    30,   60,    120,  300};
}

prometheus::Histogram::BucketBoundaries SizeBuckets() {
  prometheus::Histogram::BucketBoundaries b;
  for (double v = 256; v <= 4.0 * 1024 * 1024 * 1024; v *= 4) b.push_back(v);
  return b;
}

absl::Status ValidateMetricName(absl::string_view name, prometheus::MetricType type) {
  auto bad = [&](absl::string_view why) {
    return absl::InvalidArgumentError(
        absl::StrCat(TypeName(type), " name '", name, "' ", why));
  };
  if (!absl::StartsWith(name, "gradsync_") || name.size() <= 9) {
    return bad("must start with 'gradsync_'");
  }
  for (char c : name) {
    if (!((c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '_')) {
      return bad("may contain only lowercase letters, digits and '_'");
    }
  }
  if (absl::StrContains(name, "__") || absl::EndsWith(name, "_")) {
    return bad("must not contain '__' or end in '_'");
  }
  const bool total = absl::EndsWith(name, "_total");
  if (type == prometheus::MetricType::Counter && !total) return bad("must end in '_total'");
  if (type != prometheus::MetricType::Counter && total) {
    return bad("must not end in '_total' (only counters do)");
  }
  const absl::string_view base = total ? name.substr(0, name.size() - 6) : name;
  for (absl::string_view unit : {"_ms", "_us", "_ns", "_millis", "_milliseconds", "_micros",
                                 "_microseconds", "_nanoseconds", "_minutes", "_hours", "_kb",
                                 "_mb", "_gb", "_kib", "_mib", "_gib", "_kbytes", "_mbytes",
                                 "_percent"}) {
    if (absl::EndsWith(base, unit)) {
      return bad(absl::StrCat("uses the unit '", unit.substr(1),
                              "'; use base units (seconds, bytes, ratio 0..1)"));
    }
  }
  if (type == prometheus::MetricType::Histogram && !absl::EndsWith(name, "_seconds") &&
      !absl::EndsWith(name, "_bytes")) {
    return bad("must end in its unit, '_seconds' or '_bytes'");
  }
  return absl::OkStatus();
}

absl::Status ValidateLabels(const prometheus::Labels& labels) {
  for (const auto& [key, value] : labels) {
    if (!prometheus::CheckLabelName(key) || absl::StartsWith(key, "__")) {
      return absl::InvalidArgumentError(absl::StrCat("invalid label name '", key, "'"));
    }
    for (absl::string_view reserved : {"job", "instance", "le", "quantile"}) {
      if (key == reserved) {
        return absl::InvalidArgumentError(absl::StrCat(
            "label name '", key, "' is reserved (Prometheus sets it itself)"));
      }
    }
    // Not forbidden: "peer_daemon" (a peer gradsyncd's data endpoint): one
    // value per node of the cluster, like a node label.
    for (absl::string_view unbounded :
         {"job_id", "member", "member_id", "rank", "host", "address", "peer"}) {
      if (key == unbounded) {
        return absl::InvalidArgumentError(
            absl::StrCat("label name '", key,
                         "' has unbounded values; use a log line or an event instead"));
      }
    }
  }
  return absl::OkStatus();
}

// ---------------------------------------------------------------------------
// MetricsRegistry

// What the exporter sees: the registry plus the extra collectables.
class MetricsRegistry::Exported final : public prometheus::Collectable {
 public:
  explicit Exported(std::shared_ptr<prometheus::Registry> registry)
      : registry_(std::move(registry)) {}

  std::vector<prometheus::MetricFamily> Collect() const override {
    std::vector<prometheus::MetricFamily> out = registry_->Collect();
    std::vector<std::shared_ptr<prometheus::Collectable>> extra;
    {
      absl::MutexLock lock(&mu_);
      extra = extra_;
    }
    for (const auto& c : extra) {
      std::vector<prometheus::MetricFamily> more = c->Collect();
      out.insert(out.end(), std::make_move_iterator(more.begin()),
                 std::make_move_iterator(more.end()));
    }
    return out;
  }

  void Add(std::shared_ptr<prometheus::Collectable> c) {
    absl::MutexLock lock(&mu_);
    extra_.push_back(std::move(c));
  }

  // true the first time only.
  bool MarkProcessMetrics() {
    absl::MutexLock lock(&mu_);
    return !std::exchange(process_metrics_, true);
  }

 private:
  const std::shared_ptr<prometheus::Registry> registry_;
  mutable absl::Mutex mu_;
  std::vector<std::shared_ptr<prometheus::Collectable>> extra_ ABSL_GUARDED_BY(mu_);
  bool process_metrics_ ABSL_GUARDED_BY(mu_) = false;
};

MetricsRegistry::MetricsRegistry()
    : registry_(std::make_shared<prometheus::Registry>()),
      exported_(std::make_shared<Exported>(registry_)) {}

MetricsRegistry::~MetricsRegistry() = default;

namespace {

// Registers (or finds) the family and adds the series; maps exceptions.
template <typename T, typename Builder, typename... Args>
absl::StatusOr<T*> AddSeries(prometheus::Registry& registry, Builder builder,
                             absl::string_view name, absl::string_view help,
                             prometheus::MetricType type, const prometheus::Labels& labels,
                             Args&&... args) {
  if (absl::Status s = ValidateMetricName(name, type); !s.ok()) return s;
  if (absl::Status s = ValidateLabels(labels); !s.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("metric '", name, "': ", s.message()));
  }
  try {
    prometheus::Family<T>& family =
        builder.Name(std::string(name)).Help(std::string(help)).Register(registry);
    return &family.Add(labels, std::forward<Args>(args)...);
  } catch (const std::invalid_argument& e) {
    // Registry::Merge throws this when the name exists with another type.
    return absl::AlreadyExistsError(absl::StrCat("metric '", name, "': ", e.what()));
  } catch (const std::exception& e) {
    return absl::InvalidArgumentError(absl::StrCat("metric '", name, "': ", e.what()));
  }
}

}  // namespace

absl::StatusOr<prometheus::Counter*> MetricsRegistry::AddCounter(absl::string_view name,
                                                                 absl::string_view help,
                                                                 const prometheus::Labels& labels) {
  return AddSeries<prometheus::Counter>(*registry_, prometheus::BuildCounter(), name, help,
                                        prometheus::MetricType::Counter, labels);
}

absl::StatusOr<prometheus::Gauge*> MetricsRegistry::AddGauge(absl::string_view name,
                                                             absl::string_view help,
                                                             const prometheus::Labels& labels) {
  return AddSeries<prometheus::Gauge>(*registry_, prometheus::BuildGauge(), name, help,
                                      prometheus::MetricType::Gauge, labels);
}

absl::StatusOr<prometheus::Histogram*> MetricsRegistry::AddHistogram(
    absl::string_view name, absl::string_view help,
    const prometheus::Histogram::BucketBoundaries& buckets, const prometheus::Labels& labels) {
  if (buckets.empty()) {
    return absl::InvalidArgumentError(absl::StrCat("histogram '", name, "': no buckets"));
  }
  for (size_t i = 1; i < buckets.size(); ++i) {
    if (!(buckets[i - 1] < buckets[i])) {
      return absl::InvalidArgumentError(
          absl::StrCat("histogram '", name, "': bucket bounds must be strictly increasing (",
                       buckets[i - 1], " then ", buckets[i], ")"));
    }
  }
  return AddSeries<prometheus::Histogram>(*registry_, prometheus::BuildHistogram(), name, help,
                                          prometheus::MetricType::Histogram, labels, buckets);
}

void MetricsRegistry::AddCollectable(std::shared_ptr<prometheus::Collectable> collectable) {
  exported_->Add(std::move(collectable));
}

std::vector<prometheus::MetricFamily> MetricsRegistry::Collect() const {
  return exported_->Collect();
}

std::string MetricsRegistry::TextFormat() const {
  return prometheus::TextSerializer().Serialize(Collect());
}

std::weak_ptr<prometheus::Collectable> MetricsRegistry::collectable() const { return exported_; }

absl::Status MetricsRegistry::AddProcessMetrics(absl::string_view version) {
  if (!exported_->MarkProcessMetrics()) return absl::OkStatus();
  absl::StatusOr<prometheus::Gauge*> info =
      AddGauge("gradsync_build_info", "Always 1; the labels describe the build.",
               {{"version", std::string(version)}});
  if (!info.ok()) return info.status();
  (*info)->Set(1);
  AddCollectable(std::make_shared<ProcessCollector>());
  return absl::OkStatus();
}

}  // namespace gradsync
