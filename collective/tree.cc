// Binomial trees: broadcast, reduce, allreduce (= reduce + broadcast), barrier.
//
// Ranks are renumbered relative to the root: vr = (r - root) mod n. The
// parent of vr > 0 is vr minus its lowest set bit; the children of vr are
// vr + 2^k for every 2^k below that bit (below n for the root) with
// vr + 2^k < n. A tree over n ranks has ceil(log2 n) levels and works for
// every n.
//
// broadcast: every rank receives the buffer from its parent in pieces
// (RingSegmentBytes: at least 4 when large) and forwards each piece to its
// children, largest subtree first, as soon as it landed.
//
// reduce: every rank receives its children's partial results one child at a
// time, smallest subtree first, into scratch, and reduces each piece as it
// lands: acc = ((own OP child_1) OP child_2) OP ..., then sends acc to its
// parent. The root accumulates in its buffer and, for avg, divides once; the
// other ranks accumulate in scratch, so their buffers stay unchanged (leaves
// send their buffer as is). Every element is therefore reduced in the same
// order on every run.
//
// allreduce: reduce to rank 0 (accumulating in place, since every buffer is
// overwritten anyway), then broadcast from rank 0.
//
// barrier: empty messages up the tree to rank 0, then down again.
#include <vector>

#include "absl/strings/str_cat.h"
#include "collective/algorithms.h"
#include "collective/exchange.h"
#include "collective/ring_pipeline.h"
#include "common/status_macros.h"

namespace gradsync::internal {
namespace {

// Steps (the high bits of the slots): reduce level k uses step k (< 32),
// broadcast uses kBroadcastStep, the barrier's release kReleaseStep.
constexpr uint32_t kBroadcastStep = 32;
constexpr uint32_t kReleaseStep = 33;

struct Link {
  int rank;   // real rank
  int level;  // k where the link is vr <-> vr + 2^k
};

struct Tree {
  Tree(int world, int me, int root_rank)
      : n(world), root(root_rank), vr((me - root_rank + world) % world) {
    int k = 0;
    for (int mask = 1; mask < n; mask <<= 1, ++k) {
      if (vr & mask) {
        parent = {Real(vr - mask), k};
        break;
      }
      if (vr + mask < n) children.push_back({Real(vr + mask), k});
    }
  }
  int Real(int v) const { return (v + root) % n; }
  bool is_root() const { return vr == 0; }

  int n;
  int root;
  int vr;
  Link parent{-1, -1};
  std::vector<Link> children;  // ascending level = smallest subtree first
};

absl::Status Broadcast(transport::Context& ctx, const CollectiveCall& call, int root, uint32_t step,
                       absl::string_view where) {
  const size_t bytes = call.count * DTypeSize(call.dtype);
  const Tree tree(ctx.size(), ctx.rank(), root);
  ASSIGN_OR_RETURN(auto mr, CallRegion(ctx, call, bytes));
  Exchange ex(ctx, call.seq, call.dtype, step, RingSegmentBytes(bytes, call.ring));
  int in = -1;
  if (!tree.is_root()) in = ex.Recv(tree.parent.rank, *mr, 0, call.count, 0);
  for (auto it = tree.children.rbegin(); it != tree.children.rend(); ++it) {
    ex.Send(it->rank, *mr, 0, call.count, 0, /*forward_of=*/in);
  }
  return ex.Run(call.deadline, where);
}

// Reduces to `root`. With `keep_buffer`, non-root ranks accumulate in scratch.
absl::Status Reduce(transport::Context& ctx, const CollectiveCall& call, int root, bool keep_buffer,
                    transport::Scratch* scratch, absl::string_view label) {
  const int n = ctx.size();
  const DType t = call.dtype;
  const ReduceOp op = call.op;
  const size_t esize = DTypeSize(t);
  const size_t bytes = call.count * esize;
  const Tree tree(n, ctx.rank(), root);
  char* data = call.data();
  const bool separate_acc = keep_buffer && !tree.is_root() && !tree.children.empty();
  const size_t stage_bytes = tree.children.empty() ? 0 : bytes;
  ASSIGN_OR_RETURN(const transport::MemoryRegion* s,
                   scratch->ReserveRegistered(ctx, stage_bytes + (separate_acc ? bytes : 0)));
  char* stage = s->data();
  auto stage_mr = std::make_unique<transport::RegionView>(*s, 0, stage_bytes);
  std::unique_ptr<transport::MemoryRegion> acc_mr;
  if (separate_acc) {
    acc_mr = std::make_unique<transport::RegionView>(*s, stage_bytes, bytes);
  } else {
    ASSIGN_OR_RETURN(acc_mr, CallRegion(ctx, call, bytes));
  }
  char* acc = acc_mr->data();
  const Reducer* red = &call.reduce();
  int levels = 0;
  for (int mask = 1; mask < n; mask <<= 1) ++levels;
  for (size_t i = 0; i < tree.children.size(); ++i) {
    const Link& child = tree.children[i];
    // The first reduction of a separate accumulator reads the own buffer.
    const char* own = (separate_acc && i == 0) ? data : acc;
    Exchange ex(ctx, call.seq, t, static_cast<uint32_t>(child.level), call.ring.segment_bytes);
    ex.Recv(child.rank, *stage_mr, 0, call.count, 0, [=](size_t b, size_t c) {
      red->Combine(t, op, acc + b * esize, own + b * esize, stage + b * esize, c);
    });
    RETURN_IF_ERROR(
        ex.Run(call.deadline, absl::StrCat(label, " level ", child.level + 1, " of ", levels)));
  }
  if (tree.is_root()) {
    if (op == ReduceOp::kAvg) red->Divide(t, data, call.count, n);
    return absl::OkStatus();
  }
  Exchange ex(ctx, call.seq, t, static_cast<uint32_t>(tree.parent.level), call.ring.segment_bytes);
  ex.Send(tree.parent.rank, *acc_mr, 0, call.count, 0);
  return ex.Run(call.deadline,
                absl::StrCat(label, " level ", tree.parent.level + 1, " of ", levels));
}

}  // namespace

absl::Status TreeBroadcast(transport::Context& ctx, const CollectiveCall& call,
                           transport::Scratch* /*scratch*/) {
  if (ctx.size() == 1 || call.count == 0) return absl::OkStatus();
  return Broadcast(ctx, call, call.root, kBroadcastStep,
                   absl::StrCat("tree broadcast from root ", call.root));
}

absl::Status TreeReduce(transport::Context& ctx, const CollectiveCall& call,
                        transport::Scratch* scratch) {
  if (ctx.size() == 1 || call.count == 0) return absl::OkStatus();
  return Reduce(ctx, call, call.root, /*keep_buffer=*/true, scratch,
                absl::StrCat("tree reduce to root ", call.root));
}

absl::Status TreeAllreduce(transport::Context& ctx, const CollectiveCall& call,
                           transport::Scratch* scratch) {
  if (ctx.size() == 1 || call.count == 0) return absl::OkStatus();
  RETURN_IF_ERROR(
      Reduce(ctx, call, /*root=*/0, /*keep_buffer=*/false, scratch, "tree allreduce (reduce)"));
  return Broadcast(ctx, call, /*root=*/0, kBroadcastStep, "tree allreduce (broadcast)");
}

absl::Status TreeBarrier(transport::Context& ctx, const CollectiveCall& call) {
  const int n = ctx.size();
  if (n == 1) return absl::OkStatus();
  const Tree tree(n, ctx.rank(), /*root=*/0);
  char token = 0;
  ASSIGN_OR_RETURN(auto mr, ctx.RegisterMemory(&token, 0));
  {  // gather: every child, then the parent
    Exchange ex = Exchange::Control(ctx, call.seq, 0);
    for (const Link& child : tree.children) ex.Recv(child.rank, *mr, 0, 0, 0);
    RETURN_IF_ERROR(ex.Run(call.deadline, "tree barrier (gather)"));
  }
  if (!tree.is_root()) {
    Exchange ex = Exchange::Control(ctx, call.seq, 0);
    ex.Send(tree.parent.rank, *mr, 0, 0, 0);
    RETURN_IF_ERROR(ex.Run(call.deadline, "tree barrier (gather)"));
  }
  Exchange ex = Exchange::Control(ctx, call.seq, kReleaseStep);  // release
  int in = -1;
  if (!tree.is_root()) in = ex.Recv(tree.parent.rank, *mr, 0, 0, 0);
  for (const Link& child : tree.children) ex.Send(child.rank, *mr, 0, 0, 0, /*forward_of=*/in);
  return ex.Run(call.deadline, "tree barrier (release)");
}

}  // namespace gradsync::internal
