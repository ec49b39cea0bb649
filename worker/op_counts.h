// The daemon's side of ipc/op_counters.h: what a client counted of the ops
// it ran itself since the daemon last looked, as LocalOpsRecords for the
// observer. Used for a node-local job's arena (worker/job_arena.h) and for a
// session's direct path (its op queue).
#ifndef GRADSYNC_WORKER_OP_COUNTS_H_
#define GRADSYNC_WORKER_OP_COUNTS_H_

#include <array>
#include <cstdint>
#include <string>
#include <vector>

#include "ipc/op_counters.h"
#include "worker/daemon_observer.h"

namespace gradsync {

// Running totals of one counter block, as last seen (or summed increases).
struct OpCounts {
  uint64_t ok = 0, bytes = 0, run_ns = 0, wait_ns = 0;
  std::array<uint64_t, ipc::kOpStatusCodes> failed{};
};

// Adds the increase of `c` over `*seen` to `*sum` and remembers `c` in
// `*seen`; a total that went backwards (a scribbling client) only re-bases.
void TakeOpCounts(const ipc::OpCounters& c, OpCounts* seen, OpCounts* sum);

// What a client's direct path counted of the daemon's ops that failed before
// they reached it (ipc::UnsentFailures), as last seen.
using UnsentSeen = std::array<std::array<uint64_t, ipc::kOpStatusCodes>, ipc::kCollectiveSlots>;

// Appends a record per collective and code whose count grew since `*seen`
// (algorithm "none": they failed before one was chosen, as the daemon's own
// signature check counts them), labelled with `job`, and remembers the counts.
void TakeUnsentFailures(const ipc::UnsentFailures& u, UnsentSeen* seen, const std::string& job,
                        std::vector<LocalOpsRecord>* out);

// The records for `sum` of `kind`: one for its successful ops (if any) and
// one per failure code, labelled with `job` and `algorithm`.
void AppendOpRecords(const OpCounts& sum, const std::string& job, int kind,
                     const char* algorithm, std::vector<LocalOpsRecord>* out);

}  // namespace gradsync

#endif  // GRADSYNC_WORKER_OP_COUNTS_H_
