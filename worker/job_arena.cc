#include "worker/job_arena.h"

#include "worker/op_counts.h"

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <random>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "collective/op_signature.h"
#include "common/clock.h"
#include "common/logging.h"

namespace gradsync {
namespace {

std::atomic<uint64_t> g_arena_counter{0};

uint64_t JobTag(const std::string& job_id) {  // FNV-1a, as the data plane's job tag
  uint64_t h = 1469598103934665603ull;
  for (unsigned char c : job_id) {
    h ^= c;
    h *= 1099511628211ull;
  }
  return h;
}

}  // namespace

absl::StatusOr<std::shared_ptr<JobArena>> JobArena::Create(const std::string& job_id,
                                                           uint64_t epoch,
                                                           const ipc::ArenaGeometry& g) {
  absl::StatusOr<size_t> bytes = ipc::ArenaBytes(g);
  if (!bytes.ok()) return bytes.status();
  std::random_device rd;
  const std::string name = absl::StrCat("/gradsync.", ::getpid(), ".",
                                        absl::Hex(rd(), absl::kZeroPad8), "-a",
                                        ++g_arena_counter);
  absl::StatusOr<std::unique_ptr<ipc::SharedMemory>> mem = ipc::SharedMemory::Create(name, *bytes);
  if (!mem.ok()) {
    return absl::Status(mem.status().code(), absl::StrCat("job '", job_id, "': cannot create its ",
                                                          *bytes, "-byte arena: ",
                                                          mem.status().message()));
  }
  absl::StatusOr<ipc::ArenaView> view =
      ipc::ArenaView::Format((*mem)->data(), (*mem)->size(), g, JobTag(job_id), epoch);
  if (!view.ok()) return view.status();
  return std::shared_ptr<JobArena>(new JobArena(job_id, *std::move(mem), *view));
}

JobArena::JobArena(std::string job_id, std::unique_ptr<ipc::SharedMemory> mem, ipc::ArenaView view)
    : job_id_(std::move(job_id)), mem_(std::move(mem)), view_(view) {
  seen_.resize(view_.world_size());
}

JobArena::~JobArena() {
  // Anyone still waiting in it (a client whose job is gone) stops waiting.
  view_.Fail(absl::CancelledError(absl::StrCat("job '", job_id_, "': its arena was closed")));
}

absl::Status JobArena::CheckSignatures(int rank, const OpSignature& op, absl::Time deadline,
                                       const std::function<void(int rank)>& on_arrival) {
  const uint64_t seq = op.seq;
  // Only error messages need the description: built then, not per op.
  auto describe = [&op] { return op.Describe(); };
  const int n = view_.world_size();
  if (rank < 0 || rank >= n) return absl::InternalError(absl::StrCat("rank ", rank, " not in arena"));
  std::vector<bool> seen(n, false);
  int arrived = 0;
  const absl::Time spin_end = FastNow() + kSpin;
  ipc::Doorbell bell = view_.bell();
  while (true) {
    const uint32_t snapshot = bell.Snapshot();
    for (int r = 0; r < n; ++r) {
      if (seen[r] || !view_.Published(r, seq)) continue;
      seen[r] = true;
      ++arrived;
      if (on_arrival && r != rank) on_arrival(r);
    }
    if (arrived == n) break;
    // Failed: nothing more will come (an op whose frames are all here still
    // runs, above; the rest of the job is told by whoever failed it).
    if (view_.has_failed()) return view_.failure();
    for (int r = 0; r < n; ++r) {
      uint64_t done = 0;
      if (!seen[r] && view_.Left(r, &done)) {
        return absl::CancelledError(absl::StrCat("rank ", r, " closed its session after op ", done,
                                                 " and will not submit op ", seq, " (", describe(),
                                                 ")"));
      }
    }
    const absl::Time now = FastNow();
    if (now >= deadline) {
      std::vector<int> missing;
      for (int r = 0; r < n; ++r) {
        if (!seen[r]) missing.push_back(r);
      }
      absl::Status late = absl::DeadlineExceededError(absl::StrCat(
          "timed out at rank ", rank, " waiting for rank(s) ", absl::StrJoin(missing, ","),
          " to submit op ", seq, " (", describe(), ")"));
      view_.Fail(late);  // the ranks are out of step now
      return late;
    }
    if (now < spin_end) {
      bell.Spin(snapshot, std::min(spin_end, deadline) - now);
    } else {
      bell.Wait(snapshot, std::min(absl::Milliseconds(10), deadline - now));
    }
  }
  std::vector<std::string> by_rank(n);
  for (int r = 0; r < n; ++r) {
    absl::StatusOr<ipc::ArenaFrame> f = view_.Read(r, seq);
    if (!f.ok()) {
      view_.Fail(f.status());
      return f.status();
    }
    by_rank[r] = std::string(f->signature);  // a private copy: the client may scribble
  }
  if (!CompareSignatures(seq, {by_rank[rank], op.Encode()}).ok()) {
    absl::Status lied = absl::InternalError(absl::StrCat(
        "rank ", rank, "'s client published a different op ", seq,
        " in the job's arena than it submitted to gradsyncd (", describe(), ")"));
    view_.Fail(lied);
    return lied;
  }
  return CompareSignatures(seq, by_rank);
}

std::vector<LocalOpsRecord> JobArena::TakeLocalOps() {
  std::vector<LocalOpsRecord> out;
  absl::MutexLock l(&mu_);
  for (int k = 0; k < ipc::kArenaCounterKinds; ++k) {
    OpCounts sum;
    for (int r = 0; r < view_.world_size(); ++r) TakeOpCounts(view_.counters(r, k), &seen_[r][k], &sum);
    AppendOpRecords(sum, job_id_, k, "local", &out);
  }
  return out;
}

}  // namespace gradsync
