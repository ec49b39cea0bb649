// The link probe run when a session's job epoch forms: it measures the
// latency and bandwidth of the ring neighbours' links and the local reduction
// speed, then agrees on one set of values across ranks (the maximum of each),
// so every rank's cost model makes the same algorithm choice.
#ifndef GRADSYNC_WORKER_LINK_PROBE_H_
#define GRADSYNC_WORKER_LINK_PROBE_H_

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "collective/cost_model.h"
#include "transport/transport.h"

namespace gradsync {

// Reserved op sequence numbers of the probe (client ops start at 1).
inline constexpr uint64_t kProbeSeq = 1ull << 62;

// Every rank of `ctx` must call this at the same point. World size 1 returns
// LocalOnly params (no links).
absl::StatusOr<LinkParams> ProbeLinks(transport::Context& ctx, absl::Time deadline);

}  // namespace gradsync

#endif  // GRADSYNC_WORKER_LINK_PROBE_H_
