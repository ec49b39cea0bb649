#include "collective/compressed_ring.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "absl/strings/str_cat.h"
#include "collective/ring_pipeline.h"
#include "collective/ring_plan.h"
#include "collective/trace.h"
#include "common/clock.h"

namespace gradsync::internal {

absl::Status CheckCodecApplies(CodecId codec, CollectiveKind kind, Algorithm algo, DType dtype,
                               ReduceOp op, transport::MemKind memory, bool error_feedback) {
  auto refuse = [&](const std::string& why) {
    return absl::InvalidArgumentError(
        absl::StrCat("codec '", CodecName(codec), "' does not apply to this ", CollectiveName(kind),
                     ": ", why));
  };
  if (CodecFor(codec) == nullptr) return refuse("not a wire codec");
  if (kind != CollectiveKind::kAllreduce && kind != CollectiveKind::kReduceScatter) {
    return refuse("codecs compress allreduce and reduce_scatter only");
  }
  if (algo != Algorithm::kRing) {
    return refuse(absl::StrCat("compressed ops run the ring algorithm, not '", AlgorithmName(algo),
                               "'"));
  }
  if (dtype != DType::kF32) {
    return refuse(absl::StrCat("codecs encode f32 values, not ", DTypeName(dtype)));
  }
  const ReduceOp sum = CombineOp(op);
  if (sum != ReduceOp::kSum && op != ReduceOp::kAvg) {
    return refuse(absl::StrCat("codecs sum (sum, avg, premul_sum), not ", ReduceOpName(op)));
  }
  if (error_feedback && !(memory == transport::MemKind::Host())) {
    return refuse(absl::StrCat("the buffer is ", memory.ToString(),
                               " memory; error feedback keeps host memory (device buffers run "
                               "codecs without it)"));
  }
  return absl::OkStatus();
}

namespace {

// The compressed ring's messages: every segment's encoding has one place in
// the encoded area, which its reduce-scatter receive, its encoded send, its
// allgather receive and the forward of those bytes use in turn.
class CodecIo final : public RingMessageIo {
 public:
  CodecIo(float* data, const transport::MemoryRegion* area, std::vector<size_t> where,
          size_t segments, const Codec& codec, const Reducer& kernels, ReduceOp op, int world,
          float* residual)
      : data_(data), area_(area), where_(std::move(where)), segments_(segments), codec_(codec),
        kernels_(kernels), op_(op), world_(world), residual_(residual) {}

  RingSpan Send(size_t, const RingMessage& m) override {
    const size_t g = Slot(m);
    const size_t n = m.range.count;
    float* values = data_ + m.range.begin;
    float* lost = residual_ != nullptr ? residual_ + m.range.begin : nullptr;
    char* bytes = area_->data() + where_[g];
    if (m.reduce) {
      kernels_.Encode(codec_.id(), values, n, bytes);
      if (lost != nullptr) {  // what the next rank will not see of this partial sum
        codec_.Decode(bytes, n, lost);
        KeepLoss(values, lost, n, 1.0f, lost);
      }
    } else if (m.step == world_ - 1) {  // the owner's reduced chunk, encoded once
      kernels_.Encode(codec_.id(), values, n, bytes);
      if (lost != nullptr) std::memcpy(lost, values, n * sizeof(float));
      kernels_.Decode(codec_.id(), bytes, n, values, /*add=*/false);
      // avg divided this chunk: what is owed joins a rank's input, before
      // the division.
      if (lost != nullptr) {
        KeepLoss(lost, values, n, op_ == ReduceOp::kAvg ? static_cast<float>(world_) : 1.0f, lost);
      }
    }  // later allgather steps forward the bytes received
    return Span(g);
  }
  RingSpan Recv(size_t, const RingMessage& m) override { return Span(Slot(m)); }
  void Arrived(size_t, const RingMessage& m) override {
    float* values = data_ + m.range.begin;
    const char* bytes = area_->data() + where_[Slot(m)];
    const absl::Time start = TraceNow();
    if (m.reduce) {
      kernels_.Decode(codec_.id(), bytes, m.range.count, values, /*add=*/true);
      if (op_ == ReduceOp::kAvg && m.step == world_ - 2) {
        kernels_.Divide(DType::kF32, values, m.range.count, world_);
      }
    } else {
      kernels_.Decode(codec_.id(), bytes, m.range.count, values, /*add=*/false);
    }
    TraceEvent("decode", "reduce", start);
  }

 private:
  size_t Slot(const RingMessage& m) const {
    return static_cast<size_t>(m.chunk) * segments_ + static_cast<size_t>(m.segment);
  }
  RingSpan Span(size_t g) const { return {area_, where_[g], where_[g + 1] - where_[g], where_[g]}; }

  // out[i] = (sent[i] - got[i]) * scale, or 0 where that is not finite (a
  // non-finite value is delivered as such, or saturated; it is not owed).
  static void KeepLoss(const float* sent, const float* got, size_t n, float scale, float* out) {
    for (size_t i = 0; i < n; ++i) {
      const float d = (sent[i] - got[i]) * scale;
      out[i] = std::isfinite(d) ? d : 0.0f;
    }
  }

  float* const data_;
  const transport::MemoryRegion* const area_;
  const std::vector<size_t> where_;  // by segment in element order: its offset in the area
  const size_t segments_;            // per chunk
  const Codec& codec_;
  const Reducer& kernels_;  // the buffer's memory's (error feedback: host memory only)
  const ReduceOp op_;
  const int world_;
  float* const residual_;  // null: no error feedback
};

absl::Status RunPass(transport::Context& ctx, float* data, ReduceOp op, uint64_t seq,
                     absl::Time deadline, const RingOptions& options, RingPass pass,
                     const Codec& codec, const Reducer& kernels, float* residual,
                     transport::Scratch* scratch) {
  const RingPlan& plan = *pass.plan;
  const int n = plan.world();
  const size_t nseg = plan.segments();
  // Where each segment's encoding lives: segments in element order.
  std::vector<size_t> where(static_cast<size_t>(n) * nseg + 1, 0);
  for (int c = 0; c < n; ++c) {
    for (size_t k = 0; k < nseg; ++k) {
      const size_t g = static_cast<size_t>(c) * nseg + k;
      where[g + 1] = where[g] + codec.EncodedBytes(plan.Segment(c, k).count);
    }
  }
  auto area = scratch->ReserveRegistered(ctx, std::max<size_t>(where.back(), 8));
  if (!area.ok()) return area.status();
  const std::string label = absl::StrCat(pass.label, " (", codec.name(), ")");
  pass.label = label.c_str();
  CodecIo io(data, *area, std::move(where), nseg, codec, kernels, op, n, residual);
  return DriveRingPass(ctx, pass, static_cast<uint8_t>(DType::kF32), seq, deadline, options, io,
                       /*stats=*/nullptr);
}

}  // namespace

RingPlan CompressedRingPlan(CollectiveKind kind, size_t count, int world, int rank,
                            const RingOptions& options) {
  const size_t esize = sizeof(float);
  if (kind == CollectiveKind::kAllreduce) {
    const size_t chunk_bytes = (count + world - 1) / world * esize;
    return RingPlan(count, world, rank, esize, RingSegmentBytes(chunk_bytes, options));
  }
  return RingPlan(world * count, world, rank, esize, RingSegmentBytes(count * esize, options));
}

absl::Status CompressedRing(transport::Context& ctx, const CollectiveCall& call,
                            transport::Scratch* scratch) {
  const int n = ctx.size();
  if (n == 1 || call.count == 0) return absl::OkStatus();
  const RingPlan plan = CompressedRingPlan(call.kind, call.count, n, ctx.rank(), call.ring);
  const bool allreduce = call.kind == CollectiveKind::kAllreduce;
  RingPass pass;
  pass.plan = &plan;
  pass.first_step = 0;
  pass.steps = allreduce ? 2 * (n - 1) : n - 1;
  pass.chunk_shift = allreduce ? 0 : -1;
  pass.label = allreduce ? "ring" : "ring reduce_scatter";
  float* data = reinterpret_cast<float*>(call.data());
  float* residual = nullptr;
  if (call.codec_feedback != nullptr) {
    // What is owed joins this op; every value this rank quantizes leaves its
    // loss in its place (each element once: the allreduce quantizes every
    // chunk once per rank, reduce_scatter all but this rank's own block).
    std::vector<float>& owed = call.codec_feedback->residual;
    const size_t elems = plan.count();
    if (owed.size() != elems) owed.assign(elems, 0.0f);
    for (size_t i = 0; i < elems; ++i) {
      data[i] += owed[i];
      owed[i] = 0.0f;
    }
    residual = owed.data();
  }
  return RunPass(ctx, data, call.op, call.seq, call.deadline, call.ring, pass,
                 *CodecFor(call.codec), call.reduce(), residual, scratch);
}

}  // namespace gradsync::internal
