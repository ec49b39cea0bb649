// How an op runs, decided in one place: its path (flat among the ranks,
// hierarchical through the daemons that host several ranks, or the parameter
// server), the collective algorithm, the TCP stream count and the codec.
//
// Every rank proposes a plan in its op signature (collective/op_signature.h,
// `proposal` and `streams`, not compared) and every rank runs rank 0's, so
// ranks whose link estimates drifted apart still agree. A forced plan (the
// op's or the job's algorithm) is compared like the rest of the signature.
// One decision cannot wait for rank 0's: whether the op's data ride on the
// signature exchange itself (oneshot), which every rank must know before the
// exchange. It is made from inputs equal on every rank (the signature and the
// link figures agreed when the job formed), so every rank decides alike.
//
// Every threshold the choice uses is a PlannerSettings field; the rest is
// the cost model (collective/cost_model.h) and the stream tuner
// (collective/stream_tuner.h). Not thread-safe: the thread that runs a
// job's ops on this daemon owns its Planner.
#ifndef GRADSYNC_COLLECTIVE_PLANNER_H_
#define GRADSYNC_COLLECTIVE_PLANNER_H_

#include <cstddef>
#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "collective/algorithm.h"
#include "collective/cost_model.h"
#include "collective/stream_tuner.h"
#include "common/types.h"

namespace gradsync {

enum class PlanPath : uint8_t {
  kFlat = 0,             // one collective algorithm among all ranks
  kHierarchical = 1,     // ranks sharing a daemon combined in memory (collective/hierarchical.h)
  kParameterServer = 2,  // pushed to and pulled from gradsync-ps shards (ps/worker_client.h)
};

// What travels besides the data's own encoding. Only kNone today.
enum class Codec : uint8_t { kNone = 0 };

struct Plan {
  PlanPath path = PlanPath::kFlat;
  Algorithm algorithm = Algorithm::kRing;  // kFlat only
  uint8_t streams = 0;                     // TCP streams for the op; 0: keep the current count
  Codec codec = Codec::kNone;

  // The data ride on the signature exchange (flat oneshot).
  bool fused() const { return path == PlanPath::kFlat && algorithm == Algorithm::kOneShot; }
  // "ring", "rhd", "rd", "tree", "pairwise", "oneshot", "hier", "ps": what an
  // op's result, its log line, its metrics and `gradsync status` show.
  const char* Name() const;
  // The byte an op signature carries (PlanCode / PlanFromCode).
  uint8_t Code() const;
  bool operator==(const Plan& o) const {
    return path == o.path && algorithm == o.algorithm && codec == o.codec;
  }
};

// Signature codes: an Algorithm's value for a flat plan, these for the other
// paths, kAutoCode (algorithm.h) for none.
inline constexpr uint8_t kHierarchicalPlanCode = 100;
inline constexpr uint8_t kParameterServerPlanCode = 101;
// DataLoss naming the code if it is none of the above.
absl::StatusOr<Plan> PlanFromCode(uint8_t code);
// The name of a code ("?" if unknown; "auto" for kAutoCode).
const char* PlanCodeName(uint8_t code);

// The code of a plan requested by name ("" or "auto": kAutoCode) for a
// `kind` op of `bytes` bytes per rank: an algorithm name, "hier" or "ps".
// Every check that depends only on the op itself, so the client SDK and
// gradsyncd refuse the same requests with the same words. InvalidArgument
// (without the op's name: callers prefix it) for an unknown name, a plan that
// does not implement `kind`, or oneshot above its size. What depends on the
// job (hier needs ranks that share a daemon, ps needs shards) is the
// caller's to check.
absl::StatusOr<uint8_t> RequestedPlanCode(absl::string_view name, CollectiveKind kind,
                                          uint64_t bytes);

struct PlannerSettings {
  // Largest allreduce (bytes per rank) whose data may ride on the signature
  // exchange; the message format caps it (kOneShotMaxBytes).
  size_t oneshot_max_bytes = kOneShotMaxBytes;
  // Bandwidth-bound ops from this size (bytes per rank) carry a stream count
  // proposal (collective/stream_tuner.h).
  size_t stream_tuning_min_bytes = StreamTuner::kMinBytes;
  // Small latency-bound ops refresh the latency estimate from the fastest of
  // every this many.
  int alpha_window = 32;
};

// The participants of an op's network stage, fixed for the job's epoch: one
// per daemon (the job's executor combines the ranks that share a daemon
// before and after it, collective/hierarchical.h).
struct PlanTopology {
  int world = 1;           // participants (daemons)
  int ps_shards = 0;       // 0: no parameter-server path
  int streams = 1;         // TCP connections per peer
  int probe_streams = 1;   // what the link probe chose (1 or streams)
};

class Planner {
 public:
  // `agreed_link`: the link figures every rank agreed on when the epoch formed.
  Planner(PlannerSettings settings, PlanTopology topology, LinkParams agreed_link);

  const PlannerSettings& settings() const { return settings_; }
  const PlanTopology& topology() const { return topology_; }
  // This rank's refined link estimate.
  const LinkParams& link() const { return link_; }

  // This rank's proposal for an op of `kind` and `bytes` per rank (the op's
  // whole buffer, CollectiveBufferBytes), with `forced` the forced plan code
  // or kAutoCode. Fused plans (fused()) are decided alike on every rank.
  Plan Propose(CollectiveKind kind, size_t bytes, uint8_t forced);

  // `plan` ran an op of `bytes` per rank on `streams` TCP streams (0: not
  // tuned) in `took_us` microseconds, measured from the start of its
  // signature exchange (`exchange_us` of them in it): refines the link
  // estimate and, on rank 0, the stream tuner. Returns a line to log when
  // the tuner's choice changed (empty otherwise).
  std::string Observe(const Plan& plan, CollectiveKind kind, size_t bytes, uint8_t streams,
                      double took_us, double exchange_us, bool rank0);

 private:
  void ObserveSmallOp(CollectiveKind kind, Algorithm algo, size_t bytes, double took_us);

  const PlannerSettings settings_;
  const PlanTopology topology_;
  const LinkParams agreed_link_;
  LinkParams link_;  // agreed_link_, refined from observed transfers
  // The cost model's answers per op shape: for the fused decision (on the
  // agreed link) and for the proposal (on the refined link).
  AlgorithmMemo fused_memo_;
  AlgorithmMemo memo_;
  StreamTuner streams_;
  bool streams_reported_ = false;
  int alpha_count_ = 0;
  double alpha_best_us_ = 0;
  Algorithm alpha_algo_ = Algorithm::kOneShot;
  size_t alpha_bytes_ = 0;
};

}  // namespace gradsync

#endif  // GRADSYNC_COLLECTIVE_PLANNER_H_
