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

size_t RingInflight(const transport::Context& ctx, const RingOptions& options) {
  int bound = std::max(1, options.max_inflight);
  if (ctx.max_in_flight() > 0) bound = std::min(bound, ctx.max_in_flight());
  return static_cast<size_t>(bound);
}

absl::Status DriveRingPass(transport::Context& ctx, const RingPass& pass, uint8_t tag_dtype,
                           uint64_t seq, absl::Time deadline, const RingOptions& options,
                           RingMessageIo& io, RingStats* stats) {
  const RingPlan& plan = *pass.plan;
  const int n = plan.world();
  const int me = ctx.rank();
  const size_t nseg = plan.segments();
  const size_t total = static_cast<size_t>(pass.steps) * nseg;
  const size_t first = static_cast<size_t>(pass.first_step) * nseg;
  // The pass's reduce-scatter messages (plan steps < n-1) come first.
  const int rs_steps = std::clamp(n - 1 - pass.first_step, 0, pass.steps);
  const size_t rs_end = static_cast<size_t>(rs_steps) * nseg;
  const size_t inflight = RingInflight(ctx, options);
  const int right = (me + 1) % n;
  const int left = (me - 1 + n) % n;

  auto message = [&](size_t i, bool send) {
    RingMessage m = send ? plan.Send(first + i) : plan.Recv(first + i);
    if (pass.chunk_shift != 0) {
      m.chunk = ((m.chunk + pass.chunk_shift) % n + n) % n;
      m.range = plan.Segment(m.chunk, static_cast<size_t>(m.segment));
    }
    return m;
  };
  auto tag_for = [&](size_t i, const RingSpan& span) {
    return transport::MessageTag{seq, static_cast<uint32_t>(i), tag_dtype, span.tag_offset};
  };

  std::vector<transport::Request> sreq(total), rreq(total);
  size_t next_send = 0, sends_done = 0, next_recv = 0, recvs_done = 0;
  absl::Time step_start = TraceNow();  // timeline: one event per ring step
  while (recvs_done < total || sends_done < total) {
    // Post every send whose data is final here, up to the in-flight bound.
    while (next_send < total && next_send - sends_done < inflight &&
           (next_send < nseg || recvs_done > next_send - nseg)) {
      const RingSpan span = io.Send(next_send, message(next_send, /*send=*/true));
      absl::Status s = ctx.PostSend(right, *span.region, span.offset, span.len,
                                    tag_for(next_send, span), &sreq[next_send]);
      if (!s.ok()) return s;
      ++next_send;
    }
    // Post receives up to the bound; an allgather receive only after this
    // pass's reduce-scatter send of the same region left.
    while (next_recv < total && next_recv < recvs_done + inflight &&
           (next_recv < rs_end || rs_end == 0 || sends_done + rs_end > next_recv)) {
      const RingSpan span = io.Recv(next_recv, message(next_recv, /*send=*/false));
      absl::Status s = ctx.PostRecv(left, *span.region, span.offset, span.len, /*exact=*/true,
                                    tag_for(next_recv, span), &rreq[next_recv]);
      if (!s.ok()) return s;
      ++next_recv;
    }
    bool progressed = false;
    while (sends_done < next_send && sreq[sends_done].done) {
      ++sends_done;
      progressed = true;
    }
    while (recvs_done < next_recv && rreq[recvs_done].done) {
      io.Arrived(recvs_done, message(recvs_done, /*send=*/false));
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

namespace {

// The dense ring: sends straight from the buffer; reduce-scatter receives
// land in a staging slot and are reduced into the buffer, allgather
// receives land in place.
class DenseIo final : public RingMessageIo {
 public:
  DenseIo(char* data, const transport::MemoryRegion* data_mr,
          const transport::MemoryRegion* scratch_mr, size_t slot_bytes, size_t inflight,
          DType dtype, ReduceOp op, int world, const Reducer& red)
      : data_(data), data_mr_(data_mr), scratch_mr_(scratch_mr), slot_bytes_(slot_bytes),
        inflight_(inflight), dtype_(dtype), esize_(DTypeSize(dtype)), op_(op), world_(world),
        red_(red) {}

  RingSpan Send(size_t, const RingMessage& m) override {
    const size_t offset = m.range.begin * esize_;
    return {data_mr_, offset, m.range.count * esize_, offset};
  }
  RingSpan Recv(size_t i, const RingMessage& m) override {
    const size_t offset = m.range.begin * esize_;
    if (!m.reduce) return {data_mr_, offset, m.range.count * esize_, offset};
    return {scratch_mr_, (i % inflight_) * slot_bytes_, m.range.count * esize_, offset};
  }
  void Arrived(size_t i, const RingMessage& m) override {
    if (!m.reduce) return;
    char* dst = data_ + m.range.begin * esize_;
    const absl::Time reduce_start = TraceNow();
    red_.Reduce(dtype_, op_, dst, scratch_mr_->data() + (i % inflight_) * slot_bytes_,
                m.range.count);
    if (op_ == ReduceOp::kAvg && m.step == world_ - 2) red_.Divide(dtype_, dst, m.range.count, world_);
    TraceEvent("reduce", "reduce", reduce_start);
  }

 private:
  char* const data_;
  const transport::MemoryRegion* const data_mr_;
  const transport::MemoryRegion* const scratch_mr_;
  const size_t slot_bytes_, inflight_;
  const DType dtype_;
  const size_t esize_;
  const ReduceOp op_;
  const int world_;
  const Reducer& red_;
};

}  // namespace

absl::Status RunRingPass(transport::Context& ctx, const transport::Buffer& buffer, DType dtype,
                         ReduceOp op, uint64_t seq, absl::Time deadline, const RingOptions& options,
                         const RingPass& pass, transport::Scratch* scratch, RingStats* stats) {
  const RingPlan& plan = *pass.plan;
  const int n = plan.world();
  const bool reduces = n - 1 - pass.first_step > 0 && pass.steps > 0;  // has reduce-scatter steps
  const size_t inflight = RingInflight(ctx, options);
  const size_t slot_bytes = reduces ? plan.max_segment_elements() * DTypeSize(dtype) : 0;
  auto data_mr = transport::RegionFor(ctx, buffer, pass.region);
  if (!data_mr.ok()) return data_mr.status();
  auto scratch_mr = scratch->ReserveRegistered(ctx, inflight * slot_bytes);
  if (!scratch_mr.ok()) return scratch_mr.status();
  DenseIo io(buffer.bytes(), &**data_mr, *scratch_mr, slot_bytes, inflight, dtype, op, n,
             pass.reducer != nullptr ? *pass.reducer : CpuReducer());
  return DriveRingPass(ctx, pass, static_cast<uint8_t>(dtype), seq, deadline, options, io, stats);
}

}  // namespace gradsync::internal
