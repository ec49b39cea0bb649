#include "collective/ring_allreduce.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "collective/ring_plan.h"
#include "kernels/cpu_reduce.h"

namespace gradsync {

absl::Status RingAllreduce(transport::Context& ctx, void* data, size_t count, DType dtype,
                           ReduceOp op, uint64_t seq, absl::Time deadline,
                           const RingOptions& options, std::vector<char>* scratch,
                           RingStats* stats) {
  const int n = ctx.size();
  const int me = ctx.rank();
  if (n == 1 || count == 0) return absl::OkStatus();  // avg over one rank is the identity
  const size_t esize = DTypeSize(dtype);
  // Pipeline at least a few segments per chunk for mid-size messages.
  const size_t chunk_bytes = (count + n - 1) / n * esize;
  const size_t seg_bytes = std::clamp(chunk_bytes / 4, options.min_segment_bytes,
                                      std::max(options.segment_bytes, options.min_segment_bytes));
  const RingPlan plan(count, n, me, esize, seg_bytes);
  const size_t total = plan.num_messages();
  const size_t rs_total = plan.reduce_scatter_messages();
  const size_t nseg = plan.segments();
  const size_t inflight = static_cast<size_t>(std::max(1, options.max_inflight));
  const size_t slot_bytes = plan.max_segment_elements() * esize;
  if (scratch->size() < inflight * slot_bytes) scratch->resize(inflight * slot_bytes);
  const int right = (me + 1) % n;
  const int left = (me - 1 + n) % n;
  char* base = static_cast<char*>(data);

  auto data_mr = ctx.RegisterMemory(data, count * esize);
  if (!data_mr.ok()) return data_mr.status();
  auto scratch_mr = ctx.RegisterMemory(scratch->data(), scratch->size());
  if (!scratch_mr.ok()) return scratch_mr.status();

  std::vector<transport::Request> sreq(total), rreq(total);
  size_t next_send = 0, sends_done = 0, next_recv = 0, recvs_done = 0;
  auto tag_for = [&](size_t i, const RingMessage& m) {
    return transport::MessageTag{seq, static_cast<uint32_t>(i), static_cast<uint8_t>(dtype),
                                 m.range.begin * esize};
  };

  while (recvs_done < total || sends_done < total) {
    // Post every send whose data is final here, up to the in-flight bound.
    while (next_send < total && next_send - sends_done < inflight &&
           (next_send < nseg || recvs_done > next_send - nseg)) {
      const RingMessage m = plan.Send(next_send);
      absl::Status s = ctx.PostSend(right, **data_mr, m.range.begin * esize, m.range.count * esize,
                                    tag_for(next_send, m), &sreq[next_send]);
      if (!s.ok()) return s;
      ++next_send;
    }
    // Post receives: reduce-scatter into a free staging slot; allgather into
    // the buffer once the region's reduce-scatter send has left.
    while (next_recv < total && next_recv < recvs_done + inflight &&
           (next_recv < rs_total || sends_done + rs_total > next_recv)) {
      const RingMessage m = plan.Recv(next_recv);
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
      const RingMessage m = plan.Recv(recvs_done);
      if (m.reduce) {
        char* dst = base + m.range.begin * esize;
        ReduceInto(dtype, op, dst, scratch->data() + (recvs_done % inflight) * slot_bytes,
                   m.range.count);
        if (op == ReduceOp::kAvg && m.step == n - 2) DivideBy(dtype, dst, m.range.count, n);
      }
      ++recvs_done;
      progressed = true;
    }
    if (progressed) continue;
    absl::Status s = ctx.Progress(deadline);
    if (absl::IsDeadlineExceeded(s)) {
      return absl::DeadlineExceededError(absl::StrCat(
          "timed out at rank ", me, " in ring step ", (recvs_done / nseg) + 1, " of ", 2 * (n - 1),
          ": received ", recvs_done, " of ", total, " messages from rank ", left, ", sent ",
          sends_done, " of ", total, " to rank ", right));
    }
    if (!s.ok()) return s;
  }
  if (stats != nullptr) {
    stats->messages = total;
    stats->segments_per_chunk = nseg;
  }
  return absl::OkStatus();
}

}  // namespace gradsync
