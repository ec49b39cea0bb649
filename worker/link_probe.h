// The link probe run when a job epoch's daemons have connected (on the job's
// node context, one participant per daemon): it measures the latency and
// bandwidth of the ring neighbours' links and the local reduction speed, then
// agrees on one set of values across the daemons (the maximum of each), so
// every daemon's planner makes the same choices.
#ifndef GRADSYNC_WORKER_LINK_PROBE_H_
#define GRADSYNC_WORKER_LINK_PROBE_H_

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "collective/cost_model.h"
#include "transport/transport.h"

namespace gradsync {

// Reserved op sequence numbers of the probe (client ops start at 1).
inline constexpr uint64_t kProbeSeq = 1ull << 62;

struct ProbeResult {
  LinkParams link;
  // Connections per peer worth using: when the context has several, the
  // probe times a 4 MiB ring allreduce over one and over all (medians of 3,
  // after one untimed run each), and keeps all only if that was at least 10%
  // faster (the agreed, slowest-rank figures). Already applied to the
  // context (Context::UseStreams). The figures are the allreduces' algbw.
  int streams = 1;
  double one_stream_gbps = 0, all_streams_gbps = 0;
};

// link.signatures is DefaultSignaturePattern(world size, one_host); every
// rank must pass the same `one_host` (AllOnOneHost of the job's data
// endpoints, which every rank gets alike from the coordinator).
// Every rank of `ctx` must call this at the same point. World size 1 measures
// only the local reduction speed.
absl::StatusOr<ProbeResult> ProbeLinks(transport::Context& ctx, bool one_host,
                                       absl::Time deadline);

}  // namespace gradsync

#endif  // GRADSYNC_WORKER_LINK_PROBE_H_
