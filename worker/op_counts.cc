#include "worker/op_counts.h"

#include "absl/time/time.h"

namespace gradsync {

namespace {

// How much a running total grew since `*last` (0 if it went backwards: it
// only re-bases), remembering it.
uint64_t Increase(uint64_t now, uint64_t* last) {
  const uint64_t d = now >= *last ? now - *last : 0;
  *last = now;
  return d;
}

}  // namespace

void TakeOpCounts(const ipc::OpCounters& c, OpCounts* seen, OpCounts* sum) {
  sum->ok += Increase(c.ok.load(std::memory_order_relaxed), &seen->ok);
  sum->bytes += Increase(c.bytes.load(std::memory_order_relaxed), &seen->bytes);
  sum->run_ns += Increase(c.run_ns.load(std::memory_order_relaxed), &seen->run_ns);
  sum->wait_ns += Increase(c.wait_ns.load(std::memory_order_relaxed), &seen->wait_ns);
  for (int code = 0; code < ipc::kOpStatusCodes; ++code) {
    sum->failed[code] +=
        Increase(c.failed[code].load(std::memory_order_relaxed), &seen->failed[code]);
  }
}

void TakeUnsentFailures(const ipc::UnsentFailures& u, UnsentSeen* seen, const std::string& job,
                        std::vector<LocalOpsRecord>* out) {
  for (int kind = 1; kind < ipc::kCollectiveSlots; ++kind) {
    for (int code = 1; code < ipc::kOpStatusCodes; ++code) {
      const uint64_t d =
          Increase(u.failed[kind][code].load(std::memory_order_relaxed), &(*seen)[kind][code]);
      if (d == 0) continue;
      LocalOpsRecord f;
      f.job_id = job;
      f.kind = static_cast<CollectiveKind>(kind);
      f.algorithm = "none";
      f.code = static_cast<absl::StatusCode>(code);
      f.ops = d;
      out->push_back(f);
    }
  }
}

void AppendOpRecords(const OpCounts& sum, const std::string& job, int kind,
                     const char* algorithm, std::vector<LocalOpsRecord>* out) {
  const CollectiveKind k =
      kind == ipc::kOpCounterBarrier ? CollectiveKind::kBarrier : CollectiveKind::kAllreduce;
  if (sum.ok > 0) {
    LocalOpsRecord r;
    r.job_id = job;
    r.kind = k;
    r.algorithm = algorithm;
    r.ops = sum.ok;
    r.bytes = sum.bytes;
    r.run = absl::Nanoseconds(static_cast<int64_t>(sum.run_ns));
    r.arrival_wait = absl::Nanoseconds(static_cast<int64_t>(sum.wait_ns));
    out->push_back(r);
  }
  for (int code = 1; code < ipc::kOpStatusCodes; ++code) {
    if (sum.failed[code] == 0) continue;
    LocalOpsRecord f;
    f.job_id = job;
    f.kind = k;
    f.algorithm = algorithm;
    f.code = static_cast<absl::StatusCode>(code);
    f.ops = sum.failed[code];
    out->push_back(f);
  }
}

}  // namespace gradsync
