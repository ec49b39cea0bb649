#include "collective/ring_pipeline.h"

#include "collective/trace.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "common/clock.h"

namespace gradsync::internal {

size_t RingSegmentBytes(size_t chunk_bytes, const RingOptions& options) {
  return std::clamp(chunk_bytes / 4, options.min_segment_bytes,
                    std::max(options.segment_bytes, options.min_segment_bytes));
}

absl::Status RunRingPass(transport::Context& ctx, const transport::Buffer& buffer, DType dtype,
                         ReduceOp op, uint64_t seq, absl::Time deadline, const RingOptions& options,
                         const RingPass& pass, transport::Scratch* scratch, RingStats* stats) {
  char* const data = buffer.bytes();
  const RingPlan& plan = *pass.plan;
  const int n = plan.world();
  const int me = ctx.rank();
  const size_t esize = DTypeSize(dtype);
  const size_t nseg = plan.segments();
  const size_t total = static_cast<size_t>(pass.steps) * nseg;
  const size_t first = static_cast<size_t>(pass.first_step) * nseg;
  // The pass's reduce-scatter messages (plan steps < n-1) come first.
  const int rs_steps = std::clamp(n - 1 - pass.first_step, 0, pass.steps);
  const size_t rs_end = static_cast<size_t>(rs_steps) * nseg;
  int bound = std::max(1, options.max_inflight);
  if (ctx.max_in_flight() > 0) bound = std::min(bound, ctx.max_in_flight());
  const size_t inflight = static_cast<size_t>(bound);
  const size_t slot_bytes = rs_end > 0 ? plan.max_segment_elements() * esize : 0;
  const int right = (me + 1) % n;
  const int left = (me - 1 + n) % n;

  const Reducer& red = pass.reducer != nullptr ? *pass.reducer : CpuReducer();
  auto data_mr = transport::RegionFor(ctx, buffer, pass.region);
  if (!data_mr.ok()) return data_mr.status();
  auto scratch_mr = scratch->ReserveRegistered(ctx, inflight * slot_bytes);
  if (!scratch_mr.ok()) return scratch_mr.status();

  auto message = [&](size_t i, bool send) {
    RingMessage m = send ? plan.Send(first + i) : plan.Recv(first + i);
    if (pass.chunk_shift != 0) {
      m.chunk = ((m.chunk + pass.chunk_shift) % n + n) % n;
      m.range = plan.Segment(m.chunk, static_cast<size_t>(m.segment));
    }
    return m;
  };
  auto tag_for = [&](size_t i, const RingMessage& m) {
    return transport::MessageTag{seq, static_cast<uint32_t>(i), static_cast<uint8_t>(dtype),
                                 m.range.begin * esize};
  };

  std::vector<transport::Request> sreq(total), rreq(total);
  size_t next_send = 0, sends_done = 0, next_recv = 0, recvs_done = 0;
  absl::Time step_start = TraceNow();  // timeline: one event per ring step
  while (recvs_done < total || sends_done < total) {
    // Post every send whose data is final here, up to the in-flight bound.
    while (next_send < total && next_send - sends_done < inflight &&
           (next_send < nseg || recvs_done > next_send - nseg)) {
      const RingMessage m = message(next_send, /*send=*/true);
      absl::Status s = ctx.PostSend(right, **data_mr, m.range.begin * esize, m.range.count * esize,
                                    tag_for(next_send, m), &sreq[next_send]);
      if (!s.ok()) return s;
      ++next_send;
    }
    // Post receives: reduce-scatter into a free staging slot; allgather into
    // the buffer (after this pass's reduce-scatter send of the region left).
    while (next_recv < total && next_recv < recvs_done + inflight &&
           (next_recv < rs_end || rs_end == 0 || sends_done + rs_end > next_recv)) {
      const RingMessage m = message(next_recv, /*send=*/false);
      const size_t bytes = m.range.count * esize;
      absl::Status s =
          m.reduce ? ctx.PostRecv(left, **scratch_mr, (next_recv % inflight) * slot_bytes, bytes,
                                  /*exact=*/true, tag_for(next_recv, m), &rreq[next_recv])
                   : ctx.PostRecv(left, **data_mr, m.range.begin * esize, bytes, /*exact=*/true,
                                  tag_for(next_recv, m), &rreq[next_recv]);
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
      if (m.reduce) {
        char* dst = data + m.range.begin * esize;
        const absl::Time reduce_start = TraceNow();
        red.Reduce(dtype, op, dst, (*scratch_mr)->data() + (recvs_done % inflight) * slot_bytes,
                   m.range.count);
        if (op == ReduceOp::kAvg && m.step == n - 2) red.Divide(dtype, dst, m.range.count, n);
        TraceEvent("reduce", "reduce", reduce_start);
      }
      ++recvs_done;
      if (recvs_done % nseg == 0 && CurrentTracer() != nullptr) {
        const size_t step = recvs_done / nseg;  // 1-based within the pass
        TraceEvent(absl::StrCat(pass.label, " step ", step, "/", pass.steps), "step", step_start);
        step_start = FastNow();
      }
      progressed = true;
    }
    if (progressed) continue;
    absl::Status s = ctx.Progress(deadline);
    if (absl::IsDeadlineExceeded(s)) {
      return absl::DeadlineExceededError(
          absl::StrCat("timed out at rank ", me, " in ", pass.label, " step ",
                       std::min<size_t>(recvs_done / nseg + 1, pass.steps), " of ", pass.steps,
                       ": received ", recvs_done, " of ", total, " messages from rank ", left,
                       ", sent ", sends_done, " of ", total, " to rank ", right));
    }
    if (!s.ok()) return s;
  }
  if (stats != nullptr) {
    stats->messages = total;
    stats->segments_per_chunk = nseg;
  }
  return absl::OkStatus();
}

}  // namespace gradsync::internal
