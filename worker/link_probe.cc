#include "worker/link_probe.h"

#include <algorithm>
#include <functional>
#include <vector>

#include "absl/strings/str_cat.h"
#include "collective/ring_allreduce.h"
#include "collective/reducer.h"

namespace gradsync {
namespace {

// Drives the context until every request in `reqs` is done.
absl::Status Drive(transport::Context& ctx, const std::vector<transport::Request*>& reqs,
                   absl::Time deadline) {
  auto done = [&] {
    for (const transport::Request* r : reqs) {
      if (!r->done) return false;
    }
    return true;
  };
  while (!done()) {
    absl::Status st = ctx.Progress(deadline);
    if (!st.ok()) return st;
  }
  return absl::OkStatus();
}

// `warmup` untimed rounds, then `rounds` timed ones; each round posts its
// messages with `post(i, &reqs)` and waits for them. The untimed rounds absorb
// the ranks' different start times and wake every thread. Returns the median
// of the timed rounds.
using PostRound =
    std::function<absl::Status(uint32_t round, std::vector<transport::Request*>* reqs)>;
absl::StatusOr<absl::Duration> TimedRounds(transport::Context& ctx, int warmup, int rounds,
                                           absl::Time deadline, const PostRound& post) {
  std::vector<absl::Duration> took;
  std::vector<transport::Request*> reqs;
  for (int i = 0; i < warmup + rounds; ++i) {
    const absl::Time t0 = absl::Now();
    reqs.clear();
    absl::Status st = post(static_cast<uint32_t>(i), &reqs);
    if (st.ok()) st = Drive(ctx, reqs, deadline);
    if (!st.ok()) return st;
    if (i >= warmup) took.push_back(absl::Now() - t0);
  }
  std::sort(took.begin(), took.end());
  return took[took.size() / 2];
}

// Ring rounds: each rank sends `bytes` right and receives `bytes` from the left.
absl::StatusOr<absl::Duration> RingRounds(transport::Context& ctx, std::vector<char>& buf,
                                          size_t bytes, int warmup, int rounds, uint64_t seq,
                                          absl::Time deadline) {
  const int n = ctx.size(), me = ctx.rank();
  const int right = (me + 1) % n, left = (me - 1 + n) % n;
  auto mr = ctx.RegisterMemory(buf.data(), buf.size());
  if (!mr.ok()) return mr.status();
  transport::Request s, r;
  return TimedRounds(ctx, warmup, rounds, deadline, [&](uint32_t i, auto* reqs) {
    const transport::MessageTag tag{seq, i, 0, 0};
    absl::Status st = ctx.PostRecv(left, **mr, bytes, bytes, true, tag, &r);
    if (st.ok()) st = ctx.PostSend(right, **mr, 0, bytes, tag, &s);
    *reqs = {&s, &r};
    return st;
  });
}

// All-to-all rounds of `bytes`-byte messages (every rank sends to and
// receives from every other rank at once: the shape of the signature round
// every op starts with, and of oneshot).
absl::StatusOr<absl::Duration> AllToAllRounds(transport::Context& ctx, std::vector<char>& buf,
                                              size_t bytes, int warmup, int rounds, uint64_t seq,
                                              absl::Time deadline) {
  const int n = ctx.size(), me = ctx.rank();
  if (buf.size() < bytes * (n + 1)) buf.resize(bytes * (n + 1));
  auto mr = ctx.RegisterMemory(buf.data(), buf.size());
  if (!mr.ok()) return mr.status();
  std::vector<transport::Request> s(n), r(n);
  return TimedRounds(ctx, warmup, rounds, deadline, [&](uint32_t i, auto* reqs) {
    const transport::MessageTag tag{seq, i, 0, 0};
    absl::Status st;
    for (int p = 0; p < n && st.ok(); ++p) {
      if (p == me) continue;
      st = ctx.PostRecv(p, **mr, bytes * (p + 1), bytes, true, tag, &r[p]);
      if (st.ok()) st = ctx.PostSend(p, **mr, 0, bytes, tag, &s[p]);
      reqs->push_back(&r[p]);
      reqs->push_back(&s[p]);
    }
    return st;
  });
}

}  // namespace

absl::StatusOr<ProbeResult> ProbeLinks(transport::Context& ctx, bool one_host,
                                       absl::Time deadline) {
  ProbeResult result;
  LinkParams& p = result.link;
  // Local reduction speed: f32 sum over 1 MiB.
  {
    std::vector<float> a(1 << 18, 1.0f), b(1 << 18, 2.0f);
    CpuReducer().Reduce(DType::kF32, ReduceOp::kSum, a.data(), b.data(), a.size());  // warm
    const absl::Time t0 = absl::Now();
    for (int i = 0; i < 4; ++i) CpuReducer().Reduce(DType::kF32, ReduceOp::kSum, a.data(), b.data(), a.size());
    p.reduce_us_per_byte = absl::ToDoubleMicroseconds(absl::Now() - t0) / 4 / (a.size() * 4.0);
  }
  if (ctx.size() == 1) return result;
  constexpr size_t kBig = 1 << 20;
  std::vector<char> buf(2 * kBig);
  auto small = AllToAllRounds(ctx, buf, 8, /*warmup=*/8, /*rounds=*/16, kProbeSeq, deadline);
  if (!small.ok()) return small.status();
  constexpr size_t kBurst = 16 << 10;
  std::vector<char> burst_buf;
  auto burst = AllToAllRounds(ctx, burst_buf, kBurst, /*warmup=*/2, /*rounds=*/8, kProbeSeq + 5,
                              deadline);
  if (!burst.ok()) return burst.status();
  auto big = RingRounds(ctx, buf, kBig, /*warmup=*/1, /*rounds=*/4, kProbeSeq + 1, deadline);
  if (!big.ok()) return big.status();
  p.alpha_us = absl::ToDoubleMicroseconds(*small);
  p.beta_us_per_byte =
      std::max(1e-6, (absl::ToDoubleMicroseconds(*big) - p.alpha_us) / static_cast<double>(kBig));
  p.burst_us_per_byte =
      std::max(1e-6, (absl::ToDoubleMicroseconds(*burst) - p.alpha_us) /
                         (static_cast<double>(kBurst) * (ctx.size() - 1)));
  // One connection against all of them, for the stream count, timed on what
  // they are for: a 4 MiB ring allreduce (pipelined, reduced) over one
  // stream and over all, one untimed run of each, then three of each
  // alternating, and the medians. Plain 4 MiB exchanges, cold or warm,
  // favoured several streams on loopback where steady 64 MiB allreduces at
  // 4 ranks ran 5% faster on one.
  transport::TcpControls* tcp = ctx.tcp();  // only TCP has streams to choose from
  const int streams = tcp != nullptr ? tcp->streams() : 1;
  double one_us = 0, all_us = 0;
  if (streams > 1) {
    constexpr size_t kBulkFloats = 1 << 20;  // 4 MiB
    constexpr int kTimed = 3;
    std::vector<float> bulk(kBulkFloats, 1.0f);
    transport::Scratch ring_scratch;
    std::vector<double> took[2];
    for (int i = 0; i <= kTimed; ++i) {
      for (int k = 0; k < 2; ++k) {
        tcp->UseStreams(k == 0 ? 1 : streams);
        const absl::Time t0 = absl::Now();
        absl::Status st = RingAllreduce(ctx, transport::Buffer{bulk.data(), bulk.size() * sizeof(float)},
                                        bulk.size(), DType::kF32, ReduceOp::kMax,
                                        kProbeSeq + 8 + 2 * i + k, deadline, RingOptions{},
                                        &ring_scratch);
        if (!st.ok()) return st;
        if (i > 0) took[k].push_back(absl::ToDoubleMicroseconds(absl::Now() - t0));
      }
    }
    for (auto& t : took) std::sort(t.begin(), t.end());
    one_us = took[0][kTimed / 2];
    all_us = took[1][kTimed / 2];
  }
  // Agree: the maximum of each over every rank (the slowest link rules a ring).
  double v[6] = {p.alpha_us, p.beta_us_per_byte, p.reduce_us_per_byte, one_us, all_us,
                 p.burst_us_per_byte};
  transport::Scratch scratch;
  absl::Status st = RingAllreduce(ctx, transport::Buffer{v, sizeof(v)}, 6, DType::kF64, ReduceOp::kMax, kProbeSeq + 2, deadline,
                                  RingOptions{}, &scratch);
  if (!st.ok()) return st;
  p.alpha_us = v[0];
  p.beta_us_per_byte = v[1];
  p.reduce_us_per_byte = v[2];
  p.burst_us_per_byte = v[5];
  p.signatures = DefaultSignaturePattern(ctx.size(), one_host);
  if (streams > 1 && v[3] > 0 && v[4] > 0) {
    result.one_stream_gbps = (4 << 20) / v[3] / 1e3;
    result.all_streams_gbps = (4 << 20) / v[4] / 1e3;
    result.streams = v[4] < 0.9 * v[3] ? streams : 1;
  } else {
    result.streams = streams;
  }
  if (tcp != nullptr) tcp->UseStreams(result.streams);
  return result;
}

}  // namespace gradsync
