#include "worker/link_probe.h"

#include <algorithm>
#include <vector>

#include "absl/strings/str_cat.h"
#include "collective/ring_allreduce.h"
#include "kernels/cpu_reduce.h"

namespace gradsync {
namespace {

// One ring exchange of `bytes` (send right, receive left) per round; returns
// the mean time of a round.
absl::StatusOr<absl::Duration> RingRounds(transport::Context& ctx, std::vector<char>& buf,
                                          size_t bytes, int rounds, uint64_t seq,
                                          absl::Time deadline) {
  const int n = ctx.size(), me = ctx.rank();
  const int right = (me + 1) % n, left = (me - 1 + n) % n;
  auto mr = ctx.RegisterMemory(buf.data(), buf.size());
  if (!mr.ok()) return mr.status();
  const absl::Time t0 = absl::Now();
  for (int i = 0; i < rounds; ++i) {
    transport::Request s, r;
    const transport::MessageTag tag{seq, static_cast<uint32_t>(i), 0, 0};
    absl::Status st = ctx.PostRecv(left, **mr, bytes, bytes, true, tag, &r);
    if (st.ok()) st = ctx.PostSend(right, **mr, 0, bytes, tag, &s);
    while (st.ok() && !(s.done && r.done)) st = ctx.Progress(deadline);
    if (!st.ok()) return st;
  }
  return (absl::Now() - t0) / rounds;
}

}  // namespace

absl::StatusOr<LinkParams> ProbeLinks(transport::Context& ctx, absl::Time deadline) {
  LinkParams p;
  // Local reduction speed: f32 sum over 1 MiB.
  {
    std::vector<float> a(1 << 18, 1.0f), b(1 << 18, 2.0f);
    ReduceInto(DType::kF32, ReduceOp::kSum, a.data(), b.data(), a.size());  // warm
    const absl::Time t0 = absl::Now();
    for (int i = 0; i < 4; ++i) ReduceInto(DType::kF32, ReduceOp::kSum, a.data(), b.data(), a.size());
    p.reduce_us_per_byte = absl::ToDoubleMicroseconds(absl::Now() - t0) / 4 / (a.size() * 4.0);
  }
  if (ctx.size() == 1) return p;
  constexpr size_t kBig = 1 << 20;
  std::vector<char> buf(2 * kBig);
  auto small = RingRounds(ctx, buf, 8, 16, kProbeSeq, deadline);
  if (!small.ok()) return small.status();
  auto big = RingRounds(ctx, buf, kBig, 4, kProbeSeq + 1, deadline);
  if (!big.ok()) return big.status();
  p.alpha_us = absl::ToDoubleMicroseconds(*small);
  p.beta_us_per_byte =
      std::max(1e-6, (absl::ToDoubleMicroseconds(*big) - p.alpha_us) / static_cast<double>(kBig));
  // Agree: the maximum of each over every rank (the slowest link rules a ring).
  double v[3] = {p.alpha_us, p.beta_us_per_byte, p.reduce_us_per_byte};
  std::vector<char> scratch;
  absl::Status st = RingAllreduce(ctx, v, 3, DType::kF64, ReduceOp::kMax, kProbeSeq + 2, deadline,
                                  RingOptions{}, &scratch);
  if (!st.ok()) return st;
  p.alpha_us = v[0];
  p.beta_us_per_byte = v[1];
  p.reduce_us_per_byte = v[2];
  return p;
}

}  // namespace gradsync
