// How an op runs, decided in one place: its path (flat among the daemons,
// hierarchical through the daemons that host several ranks, the parameter
// server, or all in memory when every rank is on this daemon), the network
// algorithm and the node-stage algorithm, whether the data ride on the
// signature exchange (fused), the TCP stream count, whether device buffers
// run in place on their GPU or on their host twins, the slicing of in-memory
// passes, the parameter-server partition size, the codec and the name users
// see. The job's executor (worker/job_executor.h) dispatches on the Plan and
// decides nothing; it tells the planner what it knows (the op, whether the
// local signatures differ, whether a device path can run the op) as a
// PlanRequest, and the job's shape as a PlanTopology.
//
// Every rank proposes a plan in its op signature (collective/op_signature.h,
// `proposal` and `streams`, not compared) and every rank runs rank 0's, so
// ranks whose link estimates drifted apart still agree (Agree completes rank
// 0's plan here). A forced plan (the op's or the job's algorithm) is
// compared like the rest of the signature. One decision cannot wait for
// rank 0's: whether the op's data ride on the signature exchange itself
// (fused, oneshot), which every rank must know before the exchange. It is
// made from inputs equal on every rank (the signature and the link figures
// agreed when the job formed), so every rank decides alike.
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
#include "collective/plan_code.h"
#include "collective/stream_tuner.h"
#include "common/types.h"
#include "kernels/codec.h"

namespace gradsync {

enum class PlanPath : uint8_t {
  kFlat = 0,             // one collective algorithm among the daemons
  kHierarchical = 1,     // ranks sharing a daemon combined in memory (collective/hierarchical.h)
  kParameterServer = 2,  // pushed to and pulled from gradsync-ps shards (ps/worker_client.h)
};

struct Plan {
  // What the op signature carries (Code): the path and, kFlat, the algorithm.
  PlanPath path = PlanPath::kFlat;
  Algorithm algorithm = Algorithm::kRing;  // kFlat: the algorithm among the daemons
  uint8_t streams = 0;                     // TCP streams for the op; 0: keep the current count
  CodecId codec = CodecId::kNone;  // the wire codec (kernels/codec.h)
  // Top-k sparsification with the op's parameters (PlanRequest::sparse;
  // collective/sparse_allreduce.h); codec is then kNone.
  bool sparse = false;

  // The rest, decided by the Planner on every daemon (Propose, Agree).
  // Every rank is on this daemon: the whole op in memory, no exchange
  // (RunInMemory, collective/hierarchical.h).
  bool in_memory = false;
  // Ranks share daemons: the local ranks are combined in memory before and
  // after the stage among the daemons (RunAcrossNodes; the PS path pushes
  // the daemon's partial result).
  bool local_stage = false;
  // The algorithm of that stage among the daemons (local_stage, not kPS):
  // the flat algorithm, or the cost model's for a hierarchical plan; ring
  // where that one does not implement the stage's collective, or is oneshot.
  Algorithm node_algorithm = Algorithm::kRing;
  // The data ride on the signature exchange (a flat oneshot allreduce or
  // barrier whose local signatures agree); nothing runs after it.
  bool fused = false;
  // Device buffers run in place on their GPU (the device path); false: on
  // their host twins.
  bool on_device = false;
  // In-memory passes over the local ranks' buffers go in slices of at least
  // this many bytes on the executor's slice pool; 0: on one thread.
  size_t slice_min_bytes = 0;
  // kParameterServer: the partition size of the push and pull.
  uint64_t ps_partition_bytes = 0;
  // "ring", "rhd", "rd", "tree", "pairwise", "oneshot", "hier", "ps": what an
  // op's result, its log line, its metrics and `gradsync status` show.
  const char* shown_name = "ring";
  // Why the op runs dense although its request allowed a codec ("" if not).
  const char* codec_note = "";

  // The name of the signature's code (path and algorithm): shown_name
  // differs where ranks share daemons ("hier") or every rank is here.
  const char* Name() const;
  // The byte an op signature carries (PlanCode / PlanFromCode).
  uint8_t Code() const;
  // The codec byte an op signature carries (OpSignature::codec): the
  // CodecId, or kSparseCodecCode for top-k.
  static constexpr uint8_t kSparseCodecCode = 0x80;
  uint8_t CodecCode() const { return sparse ? kSparseCodecCode : static_cast<uint8_t>(codec); }
  bool operator==(const Plan& o) const {
    return path == o.path && algorithm == o.algorithm && codec == o.codec && sparse == o.sparse;
  }
};

// Signature codes (collective/plan_code.h): an Algorithm's value for a flat
// plan, kHierarchicalPlanCode / kParameterServerPlanCode for the other paths,
// kAutoCode (algorithm.h) for none.
// DataLoss naming the code if it is none of the above.
absl::StatusOr<Plan> PlanFromCode(uint8_t code);
// The name of a code ("?" if unknown; "auto" for kAutoCode).
const char* PlanCodeName(uint8_t code);

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
  // In-memory passes over several local ranks' buffers go in slices of at
  // least this many bytes (on a slice pool, from twice this size).
  size_t min_slice_bytes = 1 << 20;
  // Partition size of parameter-server allreduces (gradsyncd
  // --ps_partition_bytes).
  uint64_t ps_partition_bytes = 1 << 20;
  // Device buffers' ops run in place on their GPU where a device path can
  // run them (staged through host blocks, reduced by CUDA kernels), else on
  // their host twins (gradsyncd --device_ops=in_place|host_twin).
  bool device_ops_in_place = true;
  // Allreduces of at least this many bytes among daemons that share hosts run
  // in two levels (collective/two_level.h).
  size_t two_level_min_bytes = 1 << 20;
  // Under codec "auto", a codec runs only where its modelled time is at most
  // this fraction of the dense ring's.
  double codec_max_time_ratio = 0.9;
};

// The participants of an op's network stage, fixed for the job's epoch: one
// per daemon (the job's executor combines the ranks that share a daemon
// before and after it, collective/hierarchical.h).
struct PlanTopology {
  int world = 1;           // participants (daemons)
  int ranks = 1;           // the job's ranks; at most `world`: one per daemon
  bool every_rank_here = false;  // no node context: the job runs on this daemon alone
  int ps_shards = 0;       // 0: no parameter-server path
  int streams = 1;         // TCP connections per peer
  int probe_streams = 1;   // what the link probe chose (1 or streams)

  bool one_rank_per_daemon() const { return ranks <= world; }
};

// One op, as the executor sees it on this daemon.
struct PlanRequest {
  CollectiveKind kind = CollectiveKind::kAllreduce;
  size_t bytes = 0;               // per rank: the op's whole buffer (CollectiveBufferBytes)
  uint8_t forced = kAutoCode;     // the forced plan code (validated, RequestedPlanCode)
  bool local_mismatch = false;    // the local ranks' signatures differ
  bool device_path = false;       // every buffer is device memory and a device path was made
                                  // for it (WantsDevicePath)
  DType dtype = DType::kF32;
  ReduceOp op = ReduceOp::kSum;
  uint64_t count = 0;             // elements per rank-block
  uint8_t codecs = 0;             // the CodecRequest code (collective/codec_request.h)
  uint64_t sparse = 0;            // its top-k parameters (SparseSpec::Code; 0: none)
  // The daemon can keep the op's error feedback (its residual): the op has
  // a name, or runs on the client's own memory (worker/op_runner.h).
  bool keyed = false;
  uint64_t sparse_ops_so_far = 0;  // ops of this name run so far here (the warm-up)
};

class Planner {
 public:
  // `agreed_link`: the link figures every rank agreed on when the epoch formed.
  Planner(PlannerSettings settings, PlanTopology topology, LinkParams agreed_link);

  const PlannerSettings& settings() const { return settings_; }
  const PlanTopology& topology() const { return topology_; }
  // This rank's refined link estimate.
  const LinkParams& link() const { return link_; }

  // Whether an op whose buffers are all device memory (`device_buffers`)
  // could run in place: the executor then makes its device path (a
  // resource), and says in PlanRequest::device_path whether it could.
  bool WantsDevicePath(bool device_buffers) const {
    return device_buffers && settings_.device_ops_in_place;
  }

  // This daemon's whole plan for `op`: with every rank here, the one that
  // runs; else the proposal its signature carries. Fused plans are decided
  // alike on every rank.
  Plan Propose(const PlanRequest& op);
  // The plan that runs: rank 0's `code` and `streams` from the signature
  // exchange, completed here for `op` (this daemon proposed `mine`).
  // FailedPrecondition / InvalidArgument for a plan this daemon cannot run
  // (ps without shards, hier with one rank per daemon, an algorithm that
  // does not implement the op); DataLoss for an unknown code.
  absl::StatusOr<Plan> Agree(const PlanRequest& op, const Plan& mine, uint8_t code,
                             uint8_t streams, uint8_t codec = 0) const;

  // The modelled microseconds of `op` through `codec` (kNone: dense) on the
  // ring among the daemons, with this rank's link estimate; a codec's
  // model is scaled by what its ops of at least 1 MiB took here against it
  // (codec_correction).
  double CodecMicros(const PlanRequest& op, CodecId codec) const;
  // Observed over modelled time of `codec`'s ops (1 until one is observed).
  double codec_correction(CodecId codec) const {
    return codec_correction_[static_cast<int>(codec)];
  }

  // `plan` (Agree's) ran an op of `bytes` per rank on `streams` TCP streams (0: not
  // tuned) in `took_us` microseconds, measured from the start of its
  // signature exchange (`exchange_us` of them in it): refines the link
  // estimate and, on rank 0, the stream tuner; a compressed op refines its
  // codec's correction instead (its time is the codec's as much as the
  // link's). Returns a line to log when the tuner's choice changed (empty
  // otherwise).
  std::string Observe(const Plan& plan, CollectiveKind kind, size_t bytes, uint8_t streams,
                      double took_us, double exchange_us, bool rank0);
  // The stage among the daemons of a `hier` op (ranks sharing daemons) took
  // `stage_us`: a compressed one corrects its codec's model, as Observe does
  // for a flat op (the op's whole time includes the in-memory stages).
  void ObserveStage(const Plan& plan, CollectiveKind kind, size_t bytes, double stage_us);

 private:
  // The decisions that follow from the path and algorithm: the node-stage
  // algorithm, the device path, slicing, PS partitions, the name shown.
  void Complete(const PlanRequest& op, Plan* plan) const;
  // The codec `op` runs with under `plan` (path and algorithm chosen), and
  // why none where the request named one (for the log).
  CodecId ChooseCodec(const PlanRequest& op, const Plan& plan, const char** why) const;
  // Why `plan` (path and algorithm chosen) keeps `op`'s stage among the
  // daemons dense whatever codec or top-k it asked for ("" if it need not).
  const char* StageRunsDense(const PlanRequest& op, const Plan& plan) const;
  // Whether the daemon keeps `op`'s codec loss for its next op (a keyed op
  // on host memory): the condition for `auto` to choose an 8-bit codec.
  bool FedBack(const PlanRequest& op) const;
  // Whether `op`'s top-k runs under `plan`, and why not where it asked for it.
  bool ChooseSparse(const PlanRequest& op, const Plan& plan, const char** why) const;
  void ObserveSmallOp(CollectiveKind kind, Algorithm algo, size_t bytes, double took_us);
  // A compressed op of `bytes` took `run_us` on the stage among the daemons:
  // the codec's correction moves toward observed over modelled.
  void LearnCodec(CodecId codec, CollectiveKind kind, size_t bytes, double run_us);
  // CodecMicros before the correction.
  double ModelledCodecMicros(const PlanRequest& op, CodecId codec) const;

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
  // By codec id: observed / modelled time of its ops (a moving average).
  double codec_correction_[kCodecCount] = {1, 1, 1, 1, 1, 1};
  bool codec_observed_[kCodecCount] = {};
};

}  // namespace gradsync

#endif  // GRADSYNC_COLLECTIVE_PLANNER_H_
