#include "collective/compressed_ring.h"

#include <algorithm>
#include <vector>

#include "absl/strings/str_cat.h"
#include "collective/ring_pipeline.h"
#include "collective/ring_plan.h"
#include "collective/trace.h"
#include "common/clock.h"

namespace gradsync::internal {

absl::Status CheckCodecApplies(CodecId codec, CollectiveKind kind, Algorithm algo, DType dtype,
                               ReduceOp op, transport::MemKind memory) {
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
  if (!(memory == transport::MemKind::Host())) {
    return refuse(absl::StrCat("the buffer is ", memory.ToString(),
                               " memory; codecs run on host memory"));
  }
  return absl::OkStatus();
}

namespace {

absl::Status RunPass(transport::Context& ctx, float* data, ReduceOp op, uint64_t seq,
                     absl::Time deadline, const RingOptions& options, const RingPass& pass,
                     const Codec& codec, transport::Scratch* scratch) {
  const RingPlan& plan = *pass.plan;
  const int n = plan.world();
  const int me = ctx.rank();
  const size_t nseg = plan.segments();
  const size_t total = static_cast<size_t>(pass.steps) * nseg;
  const size_t first = static_cast<size_t>(pass.first_step) * nseg;
  const int rs_steps = std::clamp(n - 1 - pass.first_step, 0, pass.steps);
  const size_t rs_end = static_cast<size_t>(rs_steps) * nseg;
  int bound = std::max(1, options.max_inflight);
  if (ctx.max_in_flight() > 0) bound = std::min(bound, ctx.max_in_flight());
  const size_t inflight = static_cast<size_t>(bound);
  const int right = (me + 1) % n;
  const int left = (me - 1 + n) % n;

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
  char* const encoded = (*area)->data();

  auto message = [&](size_t i, bool send) {
    RingMessage m = send ? plan.Send(first + i) : plan.Recv(first + i);
    if (pass.chunk_shift != 0) {
      m.chunk = ((m.chunk + pass.chunk_shift) % n + n) % n;
      m.range = plan.Segment(m.chunk, static_cast<size_t>(m.segment));
    }
    return m;
  };
  auto slot = [&](const RingMessage& m) {
    return static_cast<size_t>(m.chunk) * nseg + static_cast<size_t>(m.segment);
  };
  auto tag_for = [&](size_t i, size_t offset) {
    return transport::MessageTag{seq, static_cast<uint32_t>(i),
                                 static_cast<uint8_t>(DType::kF32), offset};
  };

  std::vector<transport::Request> sreq(total), rreq(total);
  size_t next_send = 0, sends_done = 0, next_recv = 0, recvs_done = 0;
  while (recvs_done < total || sends_done < total) {
    while (next_send < total && next_send - sends_done < inflight &&
           (next_send < nseg || recvs_done > next_send - nseg)) {
      const RingMessage m = message(next_send, /*send=*/true);
      const size_t g = slot(m);
      float* values = data + m.range.begin;
      if (m.reduce) {
        codec.Encode(values, m.range.count, encoded + where[g]);
      } else if (m.step == n - 1) {  // the owner's reduced chunk, encoded once
        codec.Encode(values, m.range.count, encoded + where[g]);
        codec.Decode(encoded + where[g], m.range.count, values);
      }  // later allgather steps forward the bytes received
      const size_t len = where[g + 1] - where[g];
      absl::Status s = ctx.PostSend(right, **area, where[g], len, tag_for(next_send, where[g]),
                                    &sreq[next_send]);
      if (!s.ok()) return s;
      ++next_send;
    }
    while (next_recv < total && next_recv < recvs_done + inflight &&
           (next_recv < rs_end || rs_end == 0 || sends_done + rs_end > next_recv)) {
      const RingMessage m = message(next_recv, /*send=*/false);
      const size_t g = slot(m);
      absl::Status s = ctx.PostRecv(left, **area, where[g], where[g + 1] - where[g],
                                    /*exact=*/true, tag_for(next_recv, where[g]), &rreq[next_recv]);
      if (!s.ok()) return s;
      ++next_recv;
    }
    bool progressed = false;
    while (sends_done < next_send && sreq[sends_done].done) {
      ++sends_done;
      progressed = true;
    }
    while (recvs_done < next_recv && rreq[recvs_done].done) {
      const RingMessage m = message(recvs_done, /*send=*/false);
      float* values = data + m.range.begin;
      const char* bytes = encoded + where[slot(m)];
      const absl::Time start = TraceNow();
      if (m.reduce) {
        codec.DecodeAdd(bytes, m.range.count, values);
        if (op == ReduceOp::kAvg && m.step == n - 2) {
          CpuReducer().Divide(DType::kF32, values, m.range.count, n);
        }
      } else {
        codec.Decode(bytes, m.range.count, values);
      }
      TraceEvent("decode", "reduce", start);
      ++recvs_done;
      progressed = true;
    }
    if (progressed) continue;
    absl::Status s = ctx.Progress(deadline);
    if (absl::IsDeadlineExceeded(s)) {
      return absl::DeadlineExceededError(absl::StrCat(
          "timed out at rank ", me, " in ", pass.label, " (", codec.name(), ") step ",
          std::min<size_t>(recvs_done / nseg + 1, pass.steps), " of ", pass.steps, ": received ",
          recvs_done, " of ", total, " messages from rank ", left, ", sent ", sends_done, " of ",
          total, " to rank ", right));
    }
    if (!s.ok()) return s;
  }
  return absl::OkStatus();
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
  return RunPass(ctx, reinterpret_cast<float*>(call.data()), call.op, call.seq, call.deadline,
                 call.ring, pass, *CodecFor(call.codec), scratch);
}

}  // namespace gradsync::internal
