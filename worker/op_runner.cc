#include "worker/op_runner.h"

#include <algorithm>
#include <cstring>
#include <thread>

#include "absl/strings/str_cat.h"
#include "collective/codec_request.h"
#include "collective/trace.h"
#include "common/clock.h"
#include "common/logging.h"
#include "common/status_macros.h"
#include "collective/two_level.h"
#include "kernels/cpu_reduce.h"
#include "worker/session.h"

namespace gradsync {

OpRunner::OpRunner(OpRunnerOptions options, transport::Context* node_ctx, DeviceStaging* staging)
    : options_(std::move(options)),
      node_ctx_(node_ctx),
      staging_(staging),
      local_(options_.placement.local_ranks()),
      one_rank_per_daemon_(options_.placement.nodes() == options_.placement.world),
      feedback_(options_.job_id, options_.epoch) {
  const JobPlacement& p = options_.placement;
  PlanTopology topology;  // the network stage: one participant per daemon
  topology.world = p.nodes();
  topology.ranks = p.world;
  topology.every_rank_here = node_ctx_ == nullptr;
  topology.ps_shards = static_cast<int>(options_.ps_shards.size());
  const transport::TcpControls* tcp = node_ctx_ != nullptr ? node_ctx_->tcp() : nullptr;
  topology.streams = tcp != nullptr ? tcp->streams() : 1;
  topology.probe_streams = tcp != nullptr ? tcp->active_streams() : 1;
  if (!options_.ps_shards.empty()) {
    ps::PsWorkerOptions po;
    po.job_id = options_.job_id;
    po.epoch = static_cast<uint64_t>(options_.epoch);
    po.shards = options_.ps_shards;
    po.shard_keys = options_.ps_shard_keys;
    po.encrypt = options_.data_tls;
    po.device = options_.device;
    auto w = ps::PsWorker::Create(po);
    if (w.ok()) {
      ps_ = std::move(*w);
    } else {
      topology.ps_shards = 0;
      GS_LOG(WARNING) << "job '" << options_.job_id << "': no parameter-server path: "
                      << w.status().message();
    }
  }
  planner_ = std::make_unique<Planner>(options_.planner, topology, options_.link);
  const int cores = std::max(1, static_cast<int>(std::thread::hardware_concurrency()));
  if (local_.size() > 1 && cores > 1) {
    pool_ = std::make_unique<SlicePool>(std::min(static_cast<int>(local_.size()), cores));
  }
  encoded_.resize(local_.size());
  hosts_ = GroupByHost(options_.placement.node_names);
}

bool OpRunner::TwoLevel(const QueuedOp& lead, const Plan& plan, size_t bytes) const {
  // Not plan.on_device: each daemon decides that for its own buffers.
  return lead.sig.kind == CollectiveKind::kAllreduce && !plan.local_stage &&
         plan.path != PlanPath::kParameterServer && one_rank_per_daemon_ &&
         lead.sig.forced == OpSignature::kNoAlgorithm && node_ctx_ != nullptr &&
         bytes >= options_.planner.two_level_min_bytes && hosts_.two_level();
}

OpRunner::~OpRunner() = default;

absl::Status OpRunner::Run(const std::vector<QueuedOp*>& ops, absl::Time negotiate_start,
                           Outcome* out) {
  const size_t k = ops.size();
  const QueuedOp& lead = *ops[0];
  const uint64_t seq = lead.seq;
  const JobPlacement& place = options_.placement;
  const size_t bytes =
      CollectiveBufferBytes(lead.sig.kind, lead.sig.count, lead.sig.dtype, place.world);
  // Only debug logs use it: built on demand, not for every op.
  auto what = [&lead] { return absl::StrCat(lead.sig.Describe(), " (op ", lead.seq, ")"); };
  out->plan_name.clear();
  out->exchange = absl::ZeroDuration();
  out->wire_ratio = 0;
  out->kept_state = false;
  absl::Status s;
  // The local ranks' signatures, compared in memory.
  bool local_mismatch = false;
  if (k > 1) {
    for (size_t i = 0; i < k; ++i) ops[i]->sig.EncodeTo(&encoded_[i]);
    for (size_t i = 1; i < k; ++i) local_mismatch = local_mismatch || !SameSignature(encoded_[0], encoded_[i]);
  }
  // What the planner needs to know of the op here; it decides the rest
  // (collective/planner.h). A device path is made for device buffers where
  // the planner would use one and one can be made (worker/device_staging.h).
  const bool device_buffers =
      std::all_of(ops.begin(), ops.end(), [](const QueuedOp* op) { return op->device != nullptr; });
  // premul_sum multiplies the inputs in host memory (device buffers stage
  // through their host twins).
  const bool premul = lead.sig.op == ReduceOp::kPremulSum;
  DevicePath* device_path = !premul && planner_->WantsDevicePath(device_buffers)
                                ? staging_->PathFor(ops)
                                : nullptr;
  PlanRequest request;
  request.kind = lead.sig.kind;
  request.bytes = bytes;
  request.forced = lead.sig.forced;
  request.local_mismatch = local_mismatch;
  request.device_path = device_path != nullptr;
  request.dtype = lead.sig.dtype;
  request.op = lead.sig.op;
  request.count = lead.sig.count;
  request.codecs = lead.sig.codecs;
  request.sparse = lead.sig.sparse;
  const ErrorFeedbackStore::Key key = FeedbackKeyOf(lead);
  request.keyed = !key.name.empty();
  const SparseSpec spec = SparseSpec::FromCode(lead.sig.sparse);
  // Top-k keeps state per key (the warm-up count, the residual).
  const bool topk_kept = spec.on() && request.keyed && lead.sig.kind == CollectiveKind::kAllreduce;
  const FeedbackLayout topk_layout = FeedbackLayout::Topk(lead.sig.count, spec);
  if (topk_kept) request.sparse_ops_so_far = feedback_.OpsSoFar(key.name, topk_layout);
  const Plan mine = planner_->Propose(request);
  if (!mine.on_device) s = staging_->StageIn(ops, bytes);
  if (s.ok() && premul) Premultiply(ops, bytes);
  Plan plan = mine;
  bool two_level = false;
  if (s.ok() && mine.in_memory) {
    // Every rank is here: the whole op in memory.
    if (local_mismatch) {
      s = CompareSignatures(seq, encoded_);  // local index = rank
    } else {
      out->plan_name = plan.shown_name;
      SetPhase(absl::StrCat("running ", out->plan_name));
      if (plan.on_device) {
        s = staging_->RunInMemory(*device_path, ops);
      } else {
        LocalCollective c{lead.sig.kind, lead.sig.dtype, lead.sig.op, lead.sig.count,
                          lead.sig.root, {}};
        for (QueuedOp* op : ops) c.bufs.push_back(op->data());
        s = RunInMemory(place, c, &scratch_, Slicing{pool_.get(), plan.slice_min_bytes});
      }
    }
    out->exchange = FastNow() - negotiate_start;
  } else if (s.ok()) {
    uint8_t agreed_code = OpSignature::kNoAlgorithm, agreed_streams = 0, agreed_codec = 0;
    // A fused op's data ride on the exchange, and every rank decides to fuse
    // alike (never with a codec): what is owed joins them now.
    if (mine.fused && !mine.on_device) PayBack(lead, out);
    s = Exchange(ops, mine, local_mismatch, &agreed_code, &agreed_streams, &agreed_codec);
    out->exchange = FastNow() - negotiate_start;
    TraceEvent("negotiate", "op", negotiate_start);
    if (s.ok()) {
      absl::StatusOr<Plan> agreed =
          planner_->Agree(request, mine, agreed_code, agreed_streams, agreed_codec);
      if (agreed.ok()) {
        plan = *agreed;
      } else {
        s = agreed.status();
      }
    }
    if (s.ok()) {
      two_level = !plan.fused && TwoLevel(lead, plan, bytes);
      out->plan_name = two_level ? kTwoLevelPlanName : plan.shown_name;
      // A compressed op shows its codec: "ring+bf16", "hier+int8", "ring+topk".
      if (plan.codec != CodecId::kNone) absl::StrAppend(&out->plan_name, "+", CodecName(plan.codec));
      if (plan.sparse) absl::StrAppend(&out->plan_name, "+topk");
      if (*plan.codec_note != '\0' && (lead.sig.codecs != 0 || lead.sig.sparse != 0)) {
        GS_LOG(DEBUG) << "job '" << options_.job_id << "' " << what() << ": dense, codec "
                      << CodecRequest::FromCodes(lead.sig.codecs, lead.sig.sparse).ToString()
                      << " not used: " << plan.codec_note;
      }
      SparseStage sparse;
      ErrorFeedback* codec_feedback = nullptr;
      out->kept_state = topk_kept;
      if (plan.sparse) {
        sparse.spec = spec;
        sparse.feedback = feedback_.StateFor(key, topk_layout, lead.quota);
        // n daemons' k entries of 8 bytes against the dense ring's 2(n-1)/n
        // of the f32 values: n k / count.
        out->wire_ratio = static_cast<double>(place.nodes()) *
                          static_cast<double>(spec.K(lead.sig.count)) /
                          static_cast<double>(lead.sig.count);
      } else if (plan.codec != CodecId::kNone && lead.sig.count > 0) {
        out->wire_ratio = static_cast<double>(CodecFor(plan.codec)->EncodedBytes(lead.sig.count)) /
                          static_cast<double>(lead.sig.count * sizeof(float));
        // A keyed op's quantization loss is owed to its next op (host
        // memory; a device buffer's codec runs on its GPU without it).
        if (request.keyed && !plan.on_device) {
          codec_feedback = feedback_.StateFor(key, QuantizedLayout(lead), lead.quota);
          out->kept_state = true;
        }
      }
      if (mine.on_device && !plan.on_device) s = staging_->StageIn(ops, bytes);
      if (s.ok() && plan.codec == CodecId::kNone && !plan.sparse && !plan.fused &&
          !plan.on_device) {
        PayBack(lead, out);
      }
      if (!plan.fused && s.ok()) {  // a fused op is done with the exchange
        SetPhase(absl::StrCat("running ", out->plan_name));
        const absl::Time run_start = TraceNow();
        stage_time_ = absl::ZeroDuration();
        s = RunAgreed(ops, plan, plan.on_device ? device_path : nullptr, two_level, &sparse,
                      codec_feedback);
        if (s.ok() && stage_time_ > absl::ZeroDuration()) {
          planner_->ObserveStage(plan, lead.sig.kind, bytes,
                                 absl::ToDoubleMicroseconds(stage_time_));
        }
        if (topk_kept) feedback_.CountOp(key, topk_layout);
        if (codec_feedback != nullptr) {
          ++codec_feedback->ops;
          if (!s.ok()) feedback_.Drop(key.name, "the op failed midway");
        }
        TraceEvent(out->plan_name, "op", run_start);
      }
      if (s.ok() && !two_level) {  // the cost model knows flat algorithms only
        const std::string line = planner_->Observe(
            plan, lead.sig.kind, bytes, plan.streams,
            absl::ToDoubleMicroseconds(FastNow() - negotiate_start),
            absl::ToDoubleMicroseconds(out->exchange), place.node_index == 0);
        if (!line.empty()) GS_LOG(INFO) << "job '" << options_.job_id << "': " << line;
        GS_LOG(DEBUG) << "job '" << options_.job_id << "' " << what() << ": plan "
                      << out->plan_name << " (rank 0's; this daemon proposed " << mine.Name()
                      << ")";
      }
    }
  }
  if (s.ok() && !plan.on_device) s = staging_->StageOut(ops, bytes);
  return s;
}

FeedbackLayout OpRunner::QuantizedLayout(const QueuedOp& lead) const {
  // The stage among the daemons runs over every rank-block of a reduce_scatter.
  const size_t elems = lead.sig.kind == CollectiveKind::kReduceScatter
                           ? lead.sig.count * static_cast<size_t>(options_.placement.world)
                           : lead.sig.count;
  return FeedbackLayout::Quantized(elems);
}

ErrorFeedbackStore::Key OpRunner::FeedbackKeyOf(const QueuedOp& op) {
  if (!op.sig.name.empty()) return {op.sig.name, {}};
  if (op.buffer == nullptr || !op.buffer->client_memory() || op.device != nullptr) return {};
  return {absl::StrCat("(unnamed, on client buffer ", op.buffer->serial(), " at byte ", op.offset,
                       ")"),
          std::weak_ptr<const void>(op.buffer)};
}

void OpRunner::PayBack(const QueuedOp& lead, Outcome* out) {
  const CollectiveKind kind = lead.sig.kind;
  const ErrorFeedbackStore::Key key = FeedbackKeyOf(lead);
  if (key.name.empty() || lead.sig.dtype != DType::kF32 ||
      (kind != CollectiveKind::kAllreduce && kind != CollectiveKind::kReduceScatter) ||
      (CombineOp(lead.sig.op) != ReduceOp::kSum && lead.sig.op != ReduceOp::kAvg)) {
    return;
  }
  const std::vector<float> owed = feedback_.TakeResidual(key.name, QuantizedLayout(lead));
  if (owed.empty()) return;
  // The lead's buffer: the local ranks' combine, or the ring, sums it with
  // the others, as the compressed ring sums the residual it adds.
  float* data = reinterpret_cast<float*>(lead.data());
  for (size_t i = 0; i < owed.size(); ++i) data[i] += owed[i];
  out->kept_state = true;
}

void OpRunner::Premultiply(const std::vector<QueuedOp*>& ops, size_t bytes) {
  const DType dtype = ops[0]->sig.dtype;
  const size_t count = bytes / DTypeSize(dtype);
  for (QueuedOp* op : ops) {
    if (op->premul_factor != 1.0) MultiplyBy(dtype, op->data(), count, op->premul_factor);
  }
}

absl::Status OpRunner::RunAgreed(const std::vector<QueuedOp*>& ops, const Plan& plan,
                                 DevicePath* on_device, bool two_level,
                                 const SparseStage* sparse, ErrorFeedback* codec_feedback) {
  const QueuedOp& lead = *ops[0];
  const JobPlacement& place = options_.placement;
  const CollectiveKind kind = lead.sig.kind;
  absl::Time deadline = lead.deadline;
  for (const QueuedOp* op : ops) deadline = std::min(deadline, op->deadline);
  LocalCollective c{kind, lead.sig.dtype, lead.sig.op, lead.sig.count, lead.sig.root, {}};
  const Slicing slicing{pool_.get(), plan.slice_min_bytes};
  if (plan.path == PlanPath::kParameterServer) {
    ps::PsMemory memory;  // the client's shared-memory buffer, registered once
    if (lead.buffer != nullptr) {
      memory.whole = transport::Buffer{lead.buffer->data(), lead.buffer->size()};
      memory.owner = lead.buffer;
    }
    const ps::PsMemory* mem = lead.buffer != nullptr ? &memory : nullptr;
    if (!plan.local_stage) {
      return ps_->PushPull(lead.seq, lead.data(), lead.sig.count, lead.sig.dtype, lead.sig.op,
                           place.world, local_[0], plan.ps_partition_bytes, slicer_,
                           lead.deadline, mem);
    }
    // This daemon's partial result is one worker's push (host memory: the
    // CPU's reducer), combined and spread as the hierarchical allreduce does.
    for (QueuedOp* op : ops) c.bufs.push_back(op->data());
    ReduceLocalShare(c, slicing);
    RETURN_IF_ERROR(ps_->PushPull(lead.seq, c.bufs[0], lead.sig.count, lead.sig.dtype,
                                  CombineOp(lead.sig.op), place.nodes(), place.node_index,
                                  plan.ps_partition_bytes, slicer_, lead.deadline, mem));
    SpreadLocalResult(c, place.world, slicing);
    return absl::OkStatus();
  }
  if (!plan.local_stage) {
    if (on_device != nullptr) {
      return staging_->RunFlat(*on_device, lead, plan.algorithm, plan.codec,
                               two_level ? &hosts_ : nullptr);
    }
    CollectiveCall call =
        FlatCallOf(lead, place.world, options_.ring, lead.data(), transport::MemKind::Host());
    if (lead.buffer != nullptr) {
      absl::StatusOr<const transport::MemoryRegion*> region = BufferRegion(lead);
      if (!region.ok()) return region.status();
      call.region = *region;
    }
    call.codec = plan.codec;
    call.codec_feedback = codec_feedback;
    if (plan.sparse && sparse != nullptr) call.sparse = *sparse;
    if (two_level) return RunTwoLevelAllreduce(*node_ctx_, hosts_, call, plan.algorithm, &algo_scratch_);
    return RunCollective(*node_ctx_, call, plan.algorithm, &algo_scratch_);
  }
  // Ranks share daemons: combined in memory, one share per daemon between them.
  if (on_device != nullptr) {
    RETURN_IF_ERROR(staging_->Local(*on_device, ops, &c));
    c.codec = plan.codec;
    c.between_time = &stage_time_;
    absl::Status s = RunAcrossNodes(*on_device->context(), place, c, plan.node_algorithm,
                                    lead.seq, deadline, options_.ring, &on_device->scratch(),
                                    &on_device->algo_scratch());
    return staging_->Result(*on_device, s);
  }
  for (QueuedOp* op : ops) c.bufs.push_back(op->data());
  if (lead.buffer != nullptr) {
    absl::StatusOr<const transport::MemoryRegion*> region = BufferRegion(lead);
    if (!region.ok()) return region.status();
    c.region0 = *region;
  }
  c.codec = plan.codec;
  c.codec_feedback = codec_feedback;
  if (plan.sparse && sparse != nullptr) c.sparse = *sparse;
  c.between_time = &stage_time_;
  return RunAcrossNodes(*node_ctx_, place, c, plan.node_algorithm, lead.seq, deadline,
                        options_.ring, &scratch_, &algo_scratch_, slicing);
}

absl::StatusOr<const transport::MemoryRegion*> OpRunner::BufferRegion(const QueuedOp& op) {
  const ShmSegment& seg = *op.buffer;
  return registrations_.Get(*node_ctx_, transport::Buffer{seg.data(), seg.size()},
                            std::weak_ptr<const void>(op.buffer));
}

absl::Status OpRunner::Exchange(const std::vector<QueuedOp*>& ops, const Plan& mine,
                                bool local_mismatch, uint8_t* agreed_code,
                                uint8_t* agreed_streams, uint8_t* agreed_codec) {
  const QueuedOp& lead = *ops[0];
  const JobPlacement& place = options_.placement;
  OpSignature rep = lead.sig;
  rep.proposal = mine.Code();
  rep.streams = mine.streams;
  rep.codec = mine.CodecCode();
  if (local_mismatch) {
    // Differs from every other daemon's signature: the exchange reports a
    // mismatch everywhere, and every rank's signature is compared next.
    rep.name = absl::StrCat("\x01ranks of daemon ", place.node_index, " disagree");
  }
  absl::Time deadline = lead.deadline;
  for (const QueuedOp* op : ops) deadline = std::min(deadline, op->deadline);
  FusedAllreduce small;
  const bool with_data = mine.fused && lead.sig.kind == CollectiveKind::kAllreduce;
  // With one rank per daemon the client's buffer rides as it is (avg
  // divides by the participants, which are the ranks); else this daemon's
  // partial result (the local stage of the hierarchical allreduce, into
  // scratch so the clients' buffers stay as they are until it succeeded).
  const bool partial = with_data && mine.local_stage;
  const Reducer& red = CpuReducer();  // the clients' buffers are host shared memory
  // partial: bufs = {the accumulator, the ops' buffers by local index}.
  LocalCollective share{lead.sig.kind, lead.sig.dtype, lead.sig.op, lead.sig.count, lead.sig.root,
                        {}};
  share.reducer = &red;
  if (with_data && !partial) {
    small = {lead.data(), lead.sig.dtype, lead.sig.op, lead.sig.count, &red};
  } else if (partial) {
    const size_t data_bytes = lead.sig.count * DTypeSize(lead.sig.dtype);
    absl::StatusOr<transport::Buffer> acc = scratch_.Reserve(data_bytes);
    if (!acc.ok()) return acc.status();
    red.Copy(acc->ptr, ops[0]->data(), data_bytes);
    share.bufs.push_back(static_cast<char*>(acc->ptr));
    // Combined in rank order into the accumulator (avg: summed).
    for (size_t i = 1; i < ops.size(); ++i) share.bufs.push_back(ops[i]->data());
    ReduceLocalShare(share, Slicing{});
    share.bufs.insert(share.bufs.begin() + 1, ops[0]->data());
    small = {acc->ptr, lead.sig.dtype, CombineOp(lead.sig.op), lead.sig.count, &red};
  }
  auto arrived = [this, &place](int node) {
    for (int r : place.ranks_of_node[node]) NoteArrived(r);
  };
  uint8_t agreed = OpSignature::kNoAlgorithm;
  absl::Status s = CheckSignatures(*node_ctx_, rep, options_.link.signatures, deadline, arrived,
                                   &agreed, with_data ? &small : nullptr, &sig_scratch_,
                                   agreed_streams,
                                   one_rank_per_daemon_ ? nullptr : &place.ranks_of_node,
                                   agreed_codec);
  if (absl::IsInvalidArgument(s) && !one_rank_per_daemon_) s = CompareEverywhere(ops);
  if (!s.ok()) return s;
  // Every daemon switches alike, after the exchange (which uses stream 0).
  if (*agreed_streams > 0 && node_ctx_->tcp() != nullptr) node_ctx_->tcp()->UseStreams(*agreed_streams);
  *agreed_code = agreed;
  // The job's result: divided (avg) and copied to every local rank's buffer.
  if (partial) SpreadLocalResult(share, place.world, Slicing{});
  return absl::OkStatus();
}

absl::Status OpRunner::CompareEverywhere(const std::vector<QueuedOp*>& ops) {
  const JobPlacement& place = options_.placement;
  const uint64_t seq = ops[0]->seq;
  const int n = place.nodes(), me = place.node_index;
  // [n][rank, length, signature]... of this daemon's ranks.
  std::vector<char> out;
  auto put32 = [](std::vector<char>* v, uint32_t x) {
    const size_t at = v->size();
    v->resize(at + 4);
    std::memcpy(v->data() + at, &x, 4);
  };
  put32(&out, static_cast<uint32_t>(ops.size()));
  for (size_t i = 0; i < ops.size(); ++i) {
    const std::string sig = ops[i]->sig.Encode();
    put32(&out, static_cast<uint32_t>(local_[i]));
    put32(&out, static_cast<uint32_t>(sig.size()));
    out.insert(out.end(), sig.begin(), sig.end());
  }
  std::vector<std::vector<char>> in(n);
  std::vector<std::unique_ptr<transport::MemoryRegion>> mrs;
  std::vector<transport::Request> sends(n), recvs(n);
  transport::MessageTag tag;
  tag.op_seq = seq;
  tag.slot = 2;
  const absl::Time deadline = std::max(ops[0]->deadline, FastNow() + absl::Seconds(5));
  for (int q = 0; q < n; ++q) {
    if (q == me) continue;
    in[q].resize(4 + place.ranks_of_node[q].size() * (8 + kMaxEncodedSignatureBytes));
    auto mr = node_ctx_->RegisterMemory(in[q].data(), in[q].size());
    if (!mr.ok()) return mr.status();
    absl::Status st = node_ctx_->PostRecv(q, **mr, 0, in[q].size(), /*exact=*/false, tag, &recvs[q]);
    if (!st.ok()) return st;
    mrs.push_back(std::move(*mr));
  }
  auto omr = node_ctx_->RegisterMemory(out.data(), out.size());
  if (!omr.ok()) return omr.status();
  for (int q = 0; q < n; ++q) {
    if (q == me) continue;
    absl::Status st = node_ctx_->PostSend(q, **omr, 0, out.size(), tag, &sends[q]);
    if (!st.ok()) return st;
  }
  for (int q = 0; q < n; ++q) {
    while (q != me && (!sends[q].done || !recvs[q].done)) {
      absl::Status st = node_ctx_->Progress(deadline);
      if (!st.ok()) return st;
    }
  }
  std::vector<std::string> all(place.world);
  for (size_t i = 0; i < ops.size(); ++i) all[local_[i]] = ops[i]->sig.Encode();
  for (int q = 0; q < n; ++q) {
    if (q == me) continue;
    const char* m = in[q].data();
    const size_t len = recvs[q].bytes;
    auto get32 = [&](size_t at, uint32_t* x) {
      if (at + 4 > len) return false;
      std::memcpy(x, m + at, 4);
      return true;
    };
    uint32_t count = 0, rank = 0, sig_len = 0;
    size_t at = 4;
    bool ok = get32(0, &count) && count == place.ranks_of_node[q].size();
    for (uint32_t j = 0; ok && j < count; ++j) {
      ok = get32(at, &rank) && get32(at + 4, &sig_len) && rank < static_cast<uint32_t>(place.world) &&
           place.node_of_rank[rank] == q && sig_len <= kMaxEncodedSignatureBytes &&
           at + 8 + sig_len <= len;
      if (ok) all[rank].assign(m + at + 8, sig_len);
      at += 8 + sig_len;
    }
    if (!ok) {
      return absl::DataLossError(absl::StrCat("op ", seq, ": daemon ", place.node_names[q],
                                              " sent a malformed list of its ranks' signatures"));
    }
  }
  absl::Status s = CompareSignatures(seq, all);
  if (s.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "op ", seq, " does not match across daemons, though every rank's signature is equal"));
  }
  return s;
}

}  // namespace gradsync
