// Recursive halving-doubling (rhd, Rabenseifner) and recursive doubling (rd).
//
// Non-powers of two (MPICH, Rabenseifner): let p be the largest power of two
// <= n and rem = n - p. Fold-in: each even rank 2i < 2*rem hands its data to
// rank 2i+1 and sits out; the p remaining ranks get virtual ranks v (rank
// 2v+1 for v < rem, rank v+rem after that) and run the power-of-two
// algorithm; fold-out: rank 2i+1 hands the result back to rank 2i. This costs
// two extra steps, and for allreduce two extra transfers of the whole buffer.
//
// Groups: the buffer is cut into p contiguous groups, one per virtual rank.
// allreduce: group g = elements [g*count/p, (g+1)*count/p). reduce_scatter and
// allgather: group g = the blocks of the real ranks behind virtual rank g
// (blocks 2g and 2g+1 for g < rem, block g+rem after), so virtual rank v ends
// reduce-scatter owning exactly its ranks' blocks.
//
// rhd allreduce = reduce-scatter by recursive halving (distance p/2, p/4, ...,
// 1: keep the half of the current window of groups that holds my group, send
// the other half to the partner v^d, reduce what the partner sends for mine),
// avg division on the owner, then allgather by recursive doubling (distance
// 1, 2, ..., p/2: exchange the current windows). rhd reduce_scatter and
// allgather are those halves on their own.
//
// rd allreduce: log2(p) steps exchanging the whole buffer with v^d (d = 1, 2,
// ...); both partners compute the same (lower v's value) OP (higher v's
// value), so every rank holds identical bits; avg divides at the end.
//
// rd allgather: Bruck-style doubling, ceil(log2 n) steps for every n with no
// folding: at step k (d = 2^k) rank r holds blocks r .. r+d-1 (mod n), sends
// min(d, n-d) of them to rank r-d and receives blocks r+d .. from rank r+d,
// each straight into its final place (a wrapped range travels as two
// messages).
//
// Barrier (rd): dissemination, ceil(log2 n) rounds of an empty message to
// rank r+2^k and one from rank r-2^k.
//
// Reduction operand order: when this rank combines its value with a partner's,
// the lower virtual rank's value is the first operand (the fold-in: the even
// rank's). Each element is finalized by one rank (rd: by both partners, with
// the same operands), so every rank ends with the same bits.
#include <vector>

#include "absl/strings/str_cat.h"
#include "collective/algorithms.h"
#include "collective/exchange.h"
#include "common/status_macros.h"

namespace gradsync::internal {
namespace {

// MPICH's folding of a non-power-of-two world into p = 2^l virtual ranks.
struct Fold {
  Fold(int n, int me) {
    while ((p << 1) <= n) {
      p <<= 1;
      ++l;
    }
    rem = n - p;
    vrank = me < 2 * rem ? (me % 2 == 1 ? me / 2 : -1) : me - rem;
  }
  int Real(int v) const { return v < rem ? 2 * v + 1 : v + rem; }
  int p = 1;
  int l = 0;
  int rem = 0;
  int vrank = -1;  // -1: this rank sits out between fold-in and fold-out
};

// (mine OP theirs) if mine belongs to the lower virtual rank, else (theirs OP
// mine), into mine.
void Combine(const Reducer& red, DType t, ReduceOp op, bool mine_is_lower, char* mine,
             const char* theirs, size_t count) {
  if (mine_is_lower) {
    red.Reduce(t, op, mine, theirs, count);
  } else {
    red.Combine(t, op, mine, theirs, mine, count);
  }
}

// Element offsets of the groups of virtual ranks (see the top of the file).
struct Groups {
  size_t count;  // elements per rank-block
  const Fold* fold;
  bool per_block;  // reduce_scatter / allgather: groups of whole blocks
  size_t Begin(int g) const {
    if (!per_block) return count * static_cast<size_t>(g) / fold->p;
    return static_cast<size_t>(g < fold->rem ? 2 * g : g + fold->rem) * count;
  }
  size_t Size(int lo, int hi) const { return Begin(hi) - Begin(lo); }
};

// Shared state of one rhd/rd operation.
struct Schedule {
  transport::Context& ctx;
  const CollectiveCall& call;
  const char* label;  // "rhd allreduce"
  int n;
  int me;
  Fold fold;
  size_t esize;
  char* data;
  char* stage;
  std::unique_ptr<transport::MemoryRegion> data_mr, stage_mr;

  Schedule(transport::Context& c, const CollectiveCall& cl, const char* lb)
      : ctx(c),
        call(cl),
        label(lb),
        n(c.size()),
        me(c.rank()),
        fold(c.size(), c.rank()),
        esize(DTypeSize(cl.dtype)),
        data(cl.data()),
        stage(nullptr) {}

  // Registers the buffer (`elements` long) and `stage_elements` of scratch.
  absl::Status Register(size_t elements, size_t stage_elements, transport::Scratch* scratch) {
    ASSIGN_OR_RETURN(const transport::MemoryRegion* s,
                     scratch->ReserveRegistered(ctx, stage_elements * esize));
    stage = s->data();
    stage_mr = std::make_unique<transport::RegionView>(*s, 0, stage_elements * esize);
    ASSIGN_OR_RETURN(data_mr, CallRegion(ctx, call, elements * esize));
    return absl::OkStatus();
  }
  Exchange Step(uint32_t step) const {
    return Exchange(ctx, call.seq, call.dtype, step, call.ring.segment_bytes);
  }
  // "rhd allreduce reduce-scatter step 2 of 3", "rd allgather step 1 of 3",
  // "rhd allreduce fold-in".
  std::string Where(absl::string_view phase, int k = 0, int of = 0) const {
    std::string out = label;
    if (!phase.empty()) absl::StrAppend(&out, " ", phase);
    if (of > 0) absl::StrAppend(&out, " step ", k, " of ", of);
    return out;
  }
  // Send/receive `count` elements at element offset `at`, tagged with it.
  void Send(Exchange& ex, int peer, size_t at, size_t count) const {
    ex.Send(peer, *data_mr, at * esize, count, at * esize);
  }
  void RecvInPlace(Exchange& ex, int peer, size_t at, size_t count) const {
    ex.Recv(peer, *data_mr, at * esize, count, at * esize);
  }
  // Receives into the staging area at the same offset, then combines into the
  // buffer (after this exchange's sends when they read the same memory).
  void RecvCombine(Exchange& ex, int peer, size_t at, size_t count, bool mine_is_lower,
                   bool after_sends) const {
    const DType t = call.dtype;
    const ReduceOp op = call.op;
    const size_t es = esize;
    char* d = data;
    const char* s = stage;
    const Reducer* red = &call.reduce();
    ex.Recv(
        peer, *stage_mr, at * es, count, at * es,
        [=](size_t b, size_t c) {
          Combine(*red, t, op, mine_is_lower, d + (at + b) * es, s + (at + b) * es, c);
        },
        after_sends);
  }

  // Fold-in of `elements` elements: even rank 2i < 2*rem sends them, rank
  // 2i+1 reduces them in (the even rank's value first).
  absl::Status FoldInReduce(size_t elements) {
    if (me >= 2 * fold.rem) return absl::OkStatus();
    Exchange ex = Step(0);
    if (me % 2 == 0) {
      Send(ex, me + 1, 0, elements);
    } else {
      RecvCombine(ex, me - 1, 0, elements, /*mine_is_lower=*/false, /*after_sends=*/false);
    }
    return ex.Run(call.deadline, Where("fold-in"));
  }

  // Reduce-scatter by recursive halving over the virtual ranks (steps 1..l);
  // afterwards virtual rank v owns group v, divided for avg.
  absl::Status HalvingReduceScatter(const Groups& g) {
    const int v = fold.vrank;
    int lo = 0, hi = fold.p;
    uint32_t step = 1;
    for (int d = fold.p / 2; d >= 1; d /= 2, ++step) {
      const int pv = v ^ d;
      const int mid = lo + d;
      const bool upper = (v & d) != 0;
      const int keep_lo = upper ? mid : lo, keep_hi = upper ? hi : mid;
      const int give_lo = upper ? lo : mid, give_hi = upper ? mid : hi;
      Exchange ex = Step(step);
      Send(ex, fold.Real(pv), g.Begin(give_lo), g.Size(give_lo, give_hi));
      RecvCombine(ex, fold.Real(pv), g.Begin(keep_lo), g.Size(keep_lo, keep_hi), v < pv,
                  /*after_sends=*/false);
      RETURN_IF_ERROR(ex.Run(call.deadline, Where("reduce-scatter", step, fold.l)));
      lo = keep_lo;
      hi = keep_hi;
    }
    if (call.op == ReduceOp::kAvg) {
      call.reduce().Divide(call.dtype, data + g.Begin(v) * esize, g.Size(v, v + 1), n);
    }
    return absl::OkStatus();
  }

  // Allgather by recursive doubling over the virtual ranks (steps l+1..2l):
  // virtual rank v starts with group v.
  absl::Status DoublingAllgather(const Groups& g) {
    const int v = fold.vrank;
    uint32_t step = fold.l + 1;
    int k = 1;
    for (int d = 1; d < fold.p; d *= 2, ++step, ++k) {
      const int pv = v ^ d;
      const int mine = v & ~(d - 1), theirs = pv & ~(d - 1);
      Exchange ex = Step(step);
      Send(ex, fold.Real(pv), g.Begin(mine), g.Size(mine, mine + d));
      RecvInPlace(ex, fold.Real(pv), g.Begin(theirs), g.Size(theirs, theirs + d));
      RETURN_IF_ERROR(ex.Run(call.deadline, Where("allgather", k, fold.l)));
    }
    return absl::OkStatus();
  }

  // Fold-out: rank 2i+1 sends elements [at, at+count) of its buffer, for
  // every (at, count) in `ranges`, to rank 2i.
  absl::Status FoldOut(std::initializer_list<std::pair<size_t, size_t>> ranges) {
    if (me >= 2 * fold.rem) return absl::OkStatus();
    Exchange ex = Step(2 * fold.l + 1);
    for (const auto& [at, count] : ranges) {
      if (me % 2 == 1) {
        Send(ex, me - 1, at, count);
      } else {
        RecvInPlace(ex, me + 1, at, count);
      }
    }
    return ex.Run(call.deadline, Where("fold-out"));
  }
};

}  // namespace

absl::Status RhdAllreduce(transport::Context& ctx, const CollectiveCall& call,
                          transport::Scratch* scratch) {
  if (ctx.size() == 1 || call.count == 0) return absl::OkStatus();
  Schedule sched(ctx, call, "rhd allreduce");
  const size_t count = call.count;
  RETURN_IF_ERROR(sched.Register(count, count, scratch));
  const Groups groups{count, &sched.fold, /*per_block=*/false};
  RETURN_IF_ERROR(sched.FoldInReduce(count));
  if (sched.fold.vrank >= 0) {
    RETURN_IF_ERROR(sched.HalvingReduceScatter(groups));
    RETURN_IF_ERROR(sched.DoublingAllgather(groups));
  }
  return sched.FoldOut({{0, count}});
}

absl::Status RhdReduceScatter(transport::Context& ctx, const CollectiveCall& call,
                              transport::Scratch* scratch) {
  if (ctx.size() == 1 || call.count == 0) return absl::OkStatus();
  Schedule sched(ctx, call, "rhd reduce_scatter");
  const size_t count = call.count;
  const size_t total = static_cast<size_t>(sched.n) * count;
  RETURN_IF_ERROR(sched.Register(total, total, scratch));
  const Groups groups{count, &sched.fold, /*per_block=*/true};
  RETURN_IF_ERROR(sched.FoldInReduce(total));
  if (sched.fold.vrank >= 0) RETURN_IF_ERROR(sched.HalvingReduceScatter(groups));
  // Rank 2i+1 finalized blocks 2i and 2i+1; block 2i goes back to rank 2i.
  const size_t even = static_cast<size_t>(sched.me - sched.me % 2);
  return sched.FoldOut({{even * count, count}});
}

absl::Status RhdAllgather(transport::Context& ctx, const CollectiveCall& call,
                          transport::Scratch* scratch) {
  if (ctx.size() == 1 || call.count == 0) return absl::OkStatus();
  Schedule sched(ctx, call, "rhd allgather");
  const size_t count = call.count;
  const size_t total = static_cast<size_t>(sched.n) * count;
  RETURN_IF_ERROR(sched.Register(total, 0, scratch));
  const Groups groups{count, &sched.fold, /*per_block=*/true};
  const int me = sched.me;
  if (me < 2 * sched.fold.rem) {  // fold-in: rank 2i's block joins rank 2i+1's group
    Exchange ex = sched.Step(0);
    if (me % 2 == 0) {
      sched.Send(ex, me + 1, me * count, count);
    } else {
      sched.RecvInPlace(ex, me - 1, (me - 1) * count, count);
    }
    RETURN_IF_ERROR(ex.Run(call.deadline, sched.Where("fold-in")));
  }
  if (sched.fold.vrank >= 0) RETURN_IF_ERROR(sched.DoublingAllgather(groups));
  // Fold-out: every block but rank 2i's own.
  const size_t even = static_cast<size_t>(me - me % 2);
  return sched.FoldOut({{0, even * count}, {(even + 1) * count, total - (even + 1) * count}});
}

absl::Status RdAllreduce(transport::Context& ctx, const CollectiveCall& call,
                         transport::Scratch* scratch) {
  if (ctx.size() == 1 || call.count == 0) return absl::OkStatus();
  Schedule sched(ctx, call, "rd allreduce");
  const size_t count = call.count;
  RETURN_IF_ERROR(sched.Register(count, count, scratch));
  RETURN_IF_ERROR(sched.FoldInReduce(count));
  const int v = sched.fold.vrank;
  if (v >= 0) {
    uint32_t step = 1;
    for (int d = 1; d < sched.fold.p; d *= 2, ++step) {
      const int pv = v ^ d;
      Exchange ex = sched.Step(step);
      sched.Send(ex, sched.fold.Real(pv), 0, count);
      // The combine writes the memory this step sends from: after the sends.
      sched.RecvCombine(ex, sched.fold.Real(pv), 0, count, v < pv, /*after_sends=*/true);
      RETURN_IF_ERROR(ex.Run(call.deadline, sched.Where("", step, sched.fold.l)));
    }
    if (call.op == ReduceOp::kAvg) call.reduce().Divide(call.dtype, sched.data, count, sched.n);
  }
  return sched.FoldOut({{0, count}});
}

absl::Status RdAllgather(transport::Context& ctx, const CollectiveCall& call,
                         transport::Scratch* scratch) {
  const int n = ctx.size();
  if (n == 1 || call.count == 0) return absl::OkStatus();
  Schedule sched(ctx, call, "rd allgather");
  const size_t count = call.count;
  RETURN_IF_ERROR(sched.Register(static_cast<size_t>(n) * count, 0, scratch));
  int steps = 0;
  for (int d = 1; d < n; d *= 2) ++steps;
  // Queues blocks [first, first+blocks) (mod n) as at most two messages.
  auto queue = [&](Exchange& ex, bool send, int peer, int first, int blocks) {
    const int head = std::min(blocks, n - first);
    const std::pair<int, int> parts[] = {{first, head}, {0, blocks - head}};
    for (const auto& [b, c] : parts) {
      if (c == 0) continue;
      const size_t at = static_cast<size_t>(b) * count, len = static_cast<size_t>(c) * count;
      if (send) {
        sched.Send(ex, peer, at, len);
      } else {
        sched.RecvInPlace(ex, peer, at, len);
      }
    }
  };
  const int me = sched.me;
  uint32_t step = 0;
  for (int d = 1; d < n; d *= 2, ++step) {
    const int blocks = std::min(d, n - d);  // this rank holds blocks me .. me+d-1
    Exchange ex = sched.Step(step);
    queue(ex, /*send=*/true, (me - d + n) % n, me, blocks);
    queue(ex, /*send=*/false, (me + d) % n, (me + d) % n, blocks);
    RETURN_IF_ERROR(ex.Run(call.deadline, sched.Where("", step + 1, steps)));
  }
  return absl::OkStatus();
}

absl::Status DisseminationBarrier(transport::Context& ctx, const CollectiveCall& call) {
  const int n = ctx.size();
  const int me = ctx.rank();
  if (n == 1) return absl::OkStatus();
  char token = 0;
  ASSIGN_OR_RETURN(auto mr, ctx.RegisterMemory(&token, 0));
  int rounds = 0;
  for (int d = 1; d < n; d *= 2) ++rounds;
  uint32_t k = 0;
  for (int d = 1; d < n; d *= 2, ++k) {
    Exchange ex = Exchange::Control(ctx, call.seq, k);
    ex.Recv((me - d + n) % n, *mr, 0, 0, 0);
    ex.Send((me + d) % n, *mr, 0, 0, 0);
    RETURN_IF_ERROR(
        ex.Run(call.deadline, absl::StrCat("rd barrier round ", k + 1, " of ", rounds)));
  }
  return absl::OkStatus();
}

}  // namespace gradsync::internal
