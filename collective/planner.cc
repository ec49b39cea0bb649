#include "collective/planner.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "collective/codec_request.h"

namespace gradsync {

const char* Plan::Name() const {
  switch (path) {
    case PlanPath::kHierarchical: return "hier";
    case PlanPath::kParameterServer: return "ps";
    case PlanPath::kFlat: break;
  }
  return AlgorithmName(algorithm);
}

uint8_t Plan::Code() const {
  switch (path) {
    case PlanPath::kHierarchical: return kHierarchicalPlanCode;
    case PlanPath::kParameterServer: return kParameterServerPlanCode;
    case PlanPath::kFlat: break;
  }
  return static_cast<uint8_t>(algorithm);
}

absl::StatusOr<Plan> PlanFromCode(uint8_t code) {
  Plan plan;
  if (code < kAlgorithmCount) {
    plan.algorithm = static_cast<Algorithm>(code);
  } else if (code == kHierarchicalPlanCode) {
    plan.path = PlanPath::kHierarchical;
  } else if (code == kParameterServerPlanCode) {
    plan.path = PlanPath::kParameterServer;
  } else {
    return absl::DataLossError(absl::StrCat("unknown plan code ", code));
  }
  return plan;
}

const char* PlanCodeName(uint8_t code) {
  if (code == kAutoCode) return "auto";
  absl::StatusOr<Plan> plan = PlanFromCode(code);
  return plan.ok() ? plan->Name() : "?";
}

Planner::Planner(PlannerSettings settings, PlanTopology topology, LinkParams agreed_link)
    : settings_(settings),
      topology_(topology),
      agreed_link_(agreed_link),
      link_(agreed_link),
      streams_(topology.streams, topology.probe_streams) {}

namespace {

// The data of a flat oneshot allreduce (or the barrier) ride on the
// signature exchange, which every local rank's signature must agree to.
// Why no codec can apply to `op` itself ("" if one can).
const char* CodecInapplicable(const PlanRequest& op) {
  if (op.kind != CollectiveKind::kAllreduce && op.kind != CollectiveKind::kReduceScatter) {
    return "codecs compress allreduce and reduce_scatter only";
  }
  if (op.dtype != DType::kF32) return "codecs encode f32 values";
  if (CombineOp(op.op) != ReduceOp::kSum && op.op != ReduceOp::kAvg) {
    return "codecs sum (sum, avg, premul_sum)";
  }
  if (op.count < kCodecBlockElements) return "fewer elements than one codec block";
  return "";
}

// A codec named (not "auto") that applies to the op: it runs on the ring,
// so the data do not ride on the signature exchange.
bool CodecNamed(const PlanRequest& op) {
  const CodecRequest request = CodecRequest::FromCodes(op.codecs, op.sparse);
  return !request.none() && !request.automatic && *CodecInapplicable(op) == '\0';
}

bool Fused(const Plan& plan, const PlanRequest& op) {
  return plan.path == PlanPath::kFlat && plan.algorithm == Algorithm::kOneShot &&
         !op.local_mismatch &&
         (op.kind == CollectiveKind::kAllreduce || op.kind == CollectiveKind::kBarrier);
}

}  // namespace

Plan Planner::Propose(const PlanRequest& op) {
  const int world = topology_.world;
  Plan plan;
  if (topology_.every_rank_here) {
    plan.in_memory = true;
    plan.on_device = op.device_path && settings_.device_ops_in_place;
    if (!topology_.one_rank_per_daemon()) {
      plan.path = PlanPath::kHierarchical;
      plan.local_stage = true;
      plan.slice_min_bytes = settings_.min_slice_bytes;
      plan.shown_name = "hier";
    } else {
      // A job of one rank runs nothing; it reports what it was asked for.
      plan.shown_name = op.forced != kAutoCode ? PlanCodeName(op.forced) : "ring";
    }
    return plan;
  }
  if (op.forced != kAutoCode) {
    absl::StatusOr<Plan> p = PlanFromCode(op.forced);
    if (p.ok()) plan = *p;  // the caller validated the code (RequestedPlanCode)
  } else if (op.bytes <= settings_.oneshot_max_bytes && !CodecNamed(op) &&
             fused_memo_.Choose(op.kind, op.bytes, world, agreed_link_) == Algorithm::kOneShot) {
    plan.algorithm = Algorithm::kOneShot;  // decided on the agreed link: alike everywhere
  } else if (topology_.ps_shards > 0 && op.kind == CollectiveKind::kAllreduce &&
             PreferParameterServer(op.bytes, world, topology_.ps_shards, link_)) {
    plan.path = PlanPath::kParameterServer;
  } else {
    plan.algorithm = memo_.Choose(op.kind, op.bytes, world, link_, /*allow_oneshot=*/false);
  }
  // Large bandwidth-bound flat ops carry this rank's stream count proposal.
  const bool tune = plan.path == PlanPath::kFlat && topology_.streams > 1 &&
                    op.bytes >= settings_.stream_tuning_min_bytes &&
                    (op.kind == CollectiveKind::kAllreduce ||
                     op.kind == CollectiveKind::kReduceScatter ||
                     op.kind == CollectiveKind::kAllgather);
  plan.streams = tune ? static_cast<uint8_t>(streams_.Propose()) : 0;
  plan.fused = Fused(plan, op);
  // Until rank 0's plan is known: a fused exchange carries host memory.
  plan.on_device = op.device_path && settings_.device_ops_in_place && !plan.fused;
  plan.codec = ChooseCodec(op, plan, &plan.codec_note);
  plan.sparse = op.sparse != 0 && ChooseSparse(op, plan, &plan.codec_note);
  if (plan.codec != CodecId::kNone || plan.sparse) {
    // Compressed ops run the ring (the cost model may have chosen another
    // dense algorithm). Codecs run wherever the buffer is; top-k on host
    // memory (a device buffer's op stages through its host twin: the
    // selection and the residual are the CPU's).
    if (plan.path == PlanPath::kFlat) plan.algorithm = Algorithm::kRing;
    if (plan.sparse) plan.on_device = false;
  }
  Complete(op, &plan);
  return plan;
}

double Planner::CodecMicros(const PlanRequest& op, CodecId codec) const {
  return ModelledCodecMicros(op, codec) * codec_correction_[static_cast<int>(codec)];
}

double Planner::ModelledCodecMicros(const PlanRequest& op, CodecId codec) const {
  const int world = topology_.world;
  // The stage among the daemons: the hierarchical reduce_scatter is an
  // allreduce of every block.
  const CollectiveKind kind = topology_.one_rank_per_daemon() ? op.kind : CollectiveKind::kAllreduce;
  const Codec* c = CodecFor(codec);
  if (c == nullptr) return PredictMicros(kind, Algorithm::kRing, op.bytes, world, link_);
  // The same messages with fewer bytes; decoding replaces the reduction.
  // Each rank encodes and decode-adds about its whole buffer once per
  // phase (reduce-scatter, and allgather's decode).
  LinkParams wire = link_;
  wire.reduce_us_per_byte = 0;
  const double phases = kind == CollectiveKind::kAllreduce ? 1.5 : 1.0;
  const size_t encoded = static_cast<size_t>(static_cast<double>(op.bytes) * c->Ratio());
  return PredictMicros(kind, Algorithm::kRing, encoded, world, wire) +
         phases * static_cast<double>(op.bytes) * c->MeasuredMicrosPerByte();
}

CodecId Planner::ChooseCodec(const PlanRequest& op, const Plan& plan, const char** why) const {
  const CodecRequest request = CodecRequest::FromCode(op.codecs);
  *why = "";
  if (request.none()) return CodecId::kNone;
  // A request the op's validation let through that cannot apply here runs
  // dense (an op's own codec was checked against everything else).
  *why = *CodecInapplicable(op) != '\0' ? CodecInapplicable(op) : StageRunsDense(op, plan);
  if (**why != '\0') return CodecId::kNone;
  if (!request.automatic) return request.only();
  // auto: the fastest by the model, if it beats dense by the margin. Codecs
  // within 5% of the fastest count as tied, and the first in id order wins
  // (bf16 before fp16), so a noisy measurement does not flip the choice.
  double us[kCodecCount] = {};
  double fastest = CodecMicros(op, CodecId::kNone) * settings_.codec_max_time_ratio;
  bool any = false;
  // An 8-bit codec's error is only safe to choose for the user where the
  // daemon feeds it back: a named op on host memory.
  auto choosable = [&](CodecId id) {
    return id != CodecId::kNone && request.allows(id) &&
           (FedBack(op) || CodecFor(id)->element_bytes() > 1);
  };
  for (CodecId id : kAllCodecs) {
    if (!choosable(id)) continue;
    us[static_cast<int>(id)] = CodecMicros(op, id);
    if (us[static_cast<int>(id)] < fastest) {
      fastest = us[static_cast<int>(id)];
      any = true;
    }
  }
  if (!any) {
    bool unfed = false;  // an 8-bit codec was allowed but not choosable
    for (CodecId id : kAllCodecs) unfed |= id != CodecId::kNone && request.allows(id) && !choosable(id);
    *why = unfed && !FedBack(op)
               ? "auto: 8-bit codecs run only where the daemon feeds their loss back to the next op "
                 "(ops with a name, or on the client's own memory, on host memory), and no other "
                 "codec is modelled faster than dense on this link"
               : "auto: no codec is modelled faster than dense on this link";
    return CodecId::kNone;
  }
  for (CodecId id : kAllCodecs) {
    if (choosable(id) && us[static_cast<int>(id)] <= fastest * 1.05) {
      return id;
    }
  }
  return CodecId::kNone;
}

const char* Planner::StageRunsDense(const PlanRequest& op, const Plan& plan) const {
  if (topology_.every_rank_here) return "every rank is on this daemon (no link to save)";
  if (plan.path == PlanPath::kParameterServer) return "the parameter-server path runs dense";
  if (plan.fused) return "the data ride on the signature exchange";
  if (plan.path == PlanPath::kFlat && plan.algorithm != Algorithm::kRing &&
      op.forced != kAutoCode) {
    return "the op forces an algorithm other than ring";
  }
  return "";
}

bool Planner::FedBack(const PlanRequest& op) const {
  return op.keyed && !(op.device_path && settings_.device_ops_in_place);
}

bool Planner::ChooseSparse(const PlanRequest& op, const Plan& plan, const char** why) const {
  const SparseSpec spec = SparseSpec::FromCode(op.sparse);
  *why = "";
  if (op.kind != CollectiveKind::kAllreduce) {
    *why = "topk sparsifies allreduce only";
  } else if (*CodecInapplicable(op) != '\0') {
    *why = CodecInapplicable(op);
  } else if (!op.keyed) {
    *why = "this op keeps no residual: topk needs an op name or the client's own memory (the DDP "
           "hook names its buckets; the PyTorch backend's adopted buckets are their memory)";
  } else if (*StageRunsDense(op, plan) != '\0') {
    *why = StageRunsDense(op, plan);
  } else if (op.sparse_ops_so_far < spec.warmup) {
    *why = "topk warm-up: the first ops of each name run dense";
  }
  return **why == '\0';
}

absl::StatusOr<Plan> Planner::Agree(const PlanRequest& op, const Plan& mine, uint8_t code,
                                    uint8_t streams, uint8_t codec) const {
  absl::StatusOr<Plan> agreed = PlanFromCode(code);
  if (!agreed.ok()) {
    return absl::Status(agreed.status().code(),
                        absl::StrCat("rank 0 proposed ", agreed.status().message()));
  }
  Plan plan = *agreed;
  plan.streams = streams;
  if (codec == Plan::kSparseCodecCode) {
    if (op.sparse == 0) {
      return absl::DataLossError("rank 0 proposed topk for an op without topk parameters");
    }
    plan.sparse = true;
  } else if (!IsValidCodec(codec)) {
    return absl::DataLossError(absl::StrCat("rank 0 proposed unknown codec ", codec));
  } else {
    plan.codec = static_cast<CodecId>(codec);
  }
  plan.codec_note = mine.codec_note;
  // Alike on every daemon (the fused exchange succeeded only if so).
  plan.fused = mine.fused;
  // The parameter server and top-k: host memory (codecs run on the GPU).
  plan.on_device = mine.on_device && plan.path != PlanPath::kParameterServer && !plan.sparse;
  if (!plan.fused) {
    if (plan.path == PlanPath::kParameterServer) {
      if (topology_.ps_shards == 0) {
        return absl::FailedPreconditionError(
            "rank 0 chose the parameter server; this daemon has no shards");
      }
      if (op.kind != CollectiveKind::kAllreduce) {
        return absl::InvalidArgumentError(absl::StrCat(
            "rank 0 chose 'ps', which does not implement ", CollectiveName(op.kind)));
      }
    } else if (topology_.one_rank_per_daemon()) {
      if (plan.path == PlanPath::kHierarchical) {
        return absl::FailedPreconditionError(
            "rank 0 chose the hierarchical path; this job has one rank per daemon");
      }
      if (!Implements(plan.algorithm, op.kind)) {
        return absl::InvalidArgumentError(absl::StrCat("rank 0 chose '", plan.Name(),
                                                       "', which does not implement ",
                                                       CollectiveName(op.kind)));
      }
    }
  }
  Complete(op, &plan);
  return plan;
}

void Planner::Complete(const PlanRequest& op, Plan* plan) const {
  const bool shared = !topology_.one_rank_per_daemon();
  plan->local_stage = shared;
  if (plan->path == PlanPath::kParameterServer) {
    plan->ps_partition_bytes = settings_.ps_partition_bytes;
    plan->shown_name = plan->Name();
    return;
  }
  plan->shown_name = shared ? "hier" : plan->Name();
  if (!shared) return;
  plan->slice_min_bytes = settings_.min_slice_bytes;
  // The stage among the daemons: allreduce for reduce_scatter (every block).
  const CollectiveKind stage =
      op.kind == CollectiveKind::kReduceScatter ? CollectiveKind::kAllreduce : op.kind;
  Algorithm node = plan->path == PlanPath::kFlat
                       ? plan->algorithm
                       : ChooseAlgorithm(stage, op.bytes, topology_.world, agreed_link_,
                                         /*allow_oneshot=*/false);
  if (!Implements(node, stage) || node == Algorithm::kOneShot) {
    // gather and scatter: only the linear exchange (RunAcrossNodes moves the
    // daemons' blocks itself; the field names what runs among them).
    node = Implements(Algorithm::kRing, stage) ? Algorithm::kRing : Algorithm::kPairwise;
  }
  plan->node_algorithm = plan->codec != CodecId::kNone || plan->sparse ? Algorithm::kRing : node;
}

void Planner::ObserveStage(const Plan& plan, CollectiveKind kind, size_t bytes, double stage_us) {
  if (plan.local_stage && plan.codec != CodecId::kNone) LearnCodec(plan.codec, kind, bytes, stage_us);
}

void Planner::LearnCodec(CodecId codec, CollectiveKind kind, size_t bytes, double run_us) {
  // The CPU it really takes here, the error feedback's passes, a
  // cache-resident speed measurement: what the model does not know.
  if (bytes < (1u << 20) || run_us <= 0) return;
  PlanRequest op;
  op.kind = kind;
  op.bytes = bytes;
  const double modelled = ModelledCodecMicros(op, codec);
  if (modelled <= 0) return;
  const double ratio = std::clamp(run_us / modelled, 0.25, 16.0);
  const int id = static_cast<int>(codec);
  codec_correction_[id] = codec_observed_[id] ? 0.7 * codec_correction_[id] + 0.3 * ratio : ratio;
  codec_observed_[id] = true;
  // The codecs not run yet take the mean correction of those that have
  // (the same CPU, the same trainers beside it, the same error-feedback
  // passes): where one codec proved slow, auto does not try the others one
  // op at a time before it settles on dense.
  double sum = 0;
  int seen = 0;
  for (int c = 1; c < kCodecCount; ++c) {
    if (codec_observed_[c]) {
      sum += codec_correction_[c];
      ++seen;
    }
  }
  for (int c = 1; c < kCodecCount; ++c) {
    if (!codec_observed_[c]) codec_correction_[c] = sum / seen;
  }
}

std::string Planner::Observe(const Plan& plan, CollectiveKind kind, size_t bytes, uint8_t streams,
                             double took_us, double exchange_us, bool rank0) {
  if (plan.path != PlanPath::kFlat) return "";
  const int world = topology_.world;
  if (plan.algorithm == Algorithm::kOneShot) {  // the data rode on the exchange
    ObserveSmallOp(kind, Algorithm::kOneShot, bytes, exchange_us);
    return "";
  }
  const double run_us = took_us - exchange_us;
  if (plan.sparse) return "";
  if (plan.codec != CodecId::kNone) {
    // Its time is the codec's work as much as the link's: it corrects the
    // codec's model, never the link's β, which would otherwise look slower
    // and make the codec look better still. With ranks sharing daemons the
    // op's time includes the in-memory stages: ObserveStage learns instead.
    if (!plan.local_stage) LearnCodec(plan.codec, kind, bytes, run_us);
    return "";
  }
  link_ = RefineFromObservation(link_, kind, plan.algorithm, bytes, world, run_us);
  std::string line;
  if (streams > 0 && rank0 &&
      (plan.algorithm == Algorithm::kRing ||
       plan.algorithm == Algorithm::kRecursiveHalvingDoubling)) {
    const int before = streams_.choice();
    streams_.Observe(streams, bytes, run_us);
    if (streams_.one_us_per_byte() > 0 && streams_.all_us_per_byte() > 0 &&
        (streams_.choice() != before || !streams_reported_)) {
      streams_reported_ = true;
      line = absl::StrCat("large ops on 1 TCP stream ", 1e-3 / streams_.one_us_per_byte(),
                          " GB/s, on ", topology_.streams, " ", 1e-3 / streams_.all_us_per_byte(),
                          " GB/s (per rank, tried on ops of ", bytes, " bytes); using ",
                          streams_.choice());
    }
  }
  ObserveSmallOp(kind, plan.algorithm, bytes, took_us);
  return line;
}

void Planner::ObserveSmallOp(CollectiveKind kind, Algorithm algo, size_t bytes, double took_us) {
  if (kind != CollectiveKind::kAllreduce || bytes > settings_.oneshot_max_bytes ||
      (algo != Algorithm::kOneShot && algo != Algorithm::kRecursiveDoubling)) {
    return;
  }
  // The fastest of a window: waiting for a straggler only ever adds time.
  if (alpha_count_ == 0 || took_us < alpha_best_us_) {
    alpha_best_us_ = took_us;
    alpha_algo_ = algo;
    alpha_bytes_ = bytes;
  }
  if (++alpha_count_ < settings_.alpha_window) return;
  link_ = RefineAlphaFromObservation(link_, kind, alpha_algo_, alpha_bytes_, topology_.world,
                                     alpha_best_us_);
  alpha_count_ = 0;
}

}  // namespace gradsync
