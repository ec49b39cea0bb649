#include "collective/hierarchical.h"

#include <algorithm>
#include <functional>
#include <cstring>
#include <memory>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "collective/collectives.h"
#include "common/clock.h"
#include "common/status_macros.h"

namespace gradsync {
namespace {

int LocalIndex(const JobPlacement& p, int rank) {
  const std::vector<int>& local = p.local_ranks();
  auto it = std::find(local.begin(), local.end(), rank);
  return it == local.end() ? -1 : static_cast<int>(it - local.begin());
}

// Block `b` of `count` elements of a blocked buffer.
char* Block(char* buf, int b, size_t block_bytes) { return buf + static_cast<size_t>(b) * block_bytes; }

// reduce_scatter's and reduce's local stage: the element-wise reduction of
// `elems` elements of every local buffer, in rank order, into `out`.
void ReduceLocalInto(const LocalCollective& c, size_t elems, char* out) {
  const size_t bytes = elems * DTypeSize(c.dtype);
  const Reducer& red = c.reduce();
  red.Copy(out, c.bufs[0], bytes);
  for (size_t j = 1; j < c.bufs.size(); ++j) red.Reduce(c.dtype, CombineOp(c.op), out, c.bufs[j], elems);
}

// alltoall among local ranks: rank s's block d and rank d's block s trade
// places (the diagonal stays), through one block of scratch.
absl::Status LocalAlltoall(const JobPlacement& p, const LocalCollective& c, size_t block_bytes,
                           transport::Scratch* scratch) {
  const std::vector<int>& local = p.local_ranks();
  if (local.size() < 2 || block_bytes == 0) return absl::OkStatus();
  ASSIGN_OR_RETURN(transport::Buffer tmp, scratch->Reserve(block_bytes));
  const Reducer& red = c.reduce();
  for (size_t i = 0; i < local.size(); ++i) {
    for (size_t j = i + 1; j < local.size(); ++j) {
      char* a = Block(c.bufs[i], local[j], block_bytes);
      char* b = Block(c.bufs[j], local[i], block_bytes);
      red.Copy(tmp.ptr, a, block_bytes);
      red.Copy(a, b, block_bytes);
      red.Copy(b, tmp.ptr, block_bytes);
    }
  }
  return absl::OkStatus();
}

// Sends out[q] to every other node q and receives into in[q] (exactly its
// size), on slot 1 of op `seq`; both are views of one registered staging area.
// Only to the nodes q with send_to[q] and from those with recv_from[q]
// (empty: every other node).
absl::Status ExchangeWithNodes(transport::Context& ctx, uint64_t seq,
                               const std::vector<transport::RegionView>& out,
                               const std::vector<transport::RegionView>& in, absl::Time deadline,
                               std::vector<bool> send_to = {}, std::vector<bool> recv_from = {}) {
  const int n = ctx.size(), me = ctx.rank();
  if (send_to.empty()) send_to.assign(n, true);
  if (recv_from.empty()) recv_from.assign(n, true);
  send_to[me] = recv_from[me] = false;
  std::vector<transport::Request> sends(n), recvs(n);
  transport::MessageTag tag;
  tag.op_seq = seq;
  tag.slot = 1;
  for (int q = 0; q < n; ++q) {
    if (!recv_from[q]) continue;
    RETURN_IF_ERROR(ctx.PostRecv(q, in[q], 0, in[q].size(), /*exact=*/true, tag, &recvs[q]));
  }
  for (int q = 0; q < n; ++q) {
    if (!send_to[q]) continue;
    RETURN_IF_ERROR(ctx.PostSend(q, out[q], 0, out[q].size(), tag, &sends[q]));
  }
  auto all_done = [&] {
    for (int q = 0; q < n; ++q) {
      if ((send_to[q] && !sends[q].done) || (recv_from[q] && !recvs[q].done)) return false;
    }
    return true;
  };
  while (!all_done()) {
    absl::Status s = ctx.Progress(deadline);
    if (absl::IsDeadlineExceeded(s)) {
      std::vector<int> waiting, sending;
      for (int q = 0; q < n; ++q) {
        if (recv_from[q] && !recvs[q].done) waiting.push_back(q);
        if (send_to[q] && !sends[q].done) sending.push_back(q);
      }
      if (waiting.empty()) {
        return absl::DeadlineExceededError(absl::StrCat(
            "op ", seq, ": timed out sending blocks to daemon(s) ", absl::StrJoin(sending, ","),
            " (node indices)"));
      }
      return absl::DeadlineExceededError(absl::StrCat(
          "op ", seq, ": timed out waiting for the blocks of daemon(s) ",
          absl::StrJoin(waiting, ","), " (node indices)"));
    }
    RETURN_IF_ERROR(s);
  }
  return absl::OkStatus();
}

// gather and scatter across daemons: one message between the root's daemon
// and every other daemon, carrying the blocks of that daemon's ranks (their
// own blocks, in rank order). gather: each daemon sends its ranks' blocks to
// the root's daemon, which places them in the root's buffer (its own local
// ranks' blocks by copy). scatter: the root's daemon sends each daemon the
// root's blocks for that daemon's ranks, and copies its own local ranks'
// blocks; each rank's block r lands in its buffer.
absl::Status RootedBlocksAcrossNodes(transport::Context& ctx, const JobPlacement& p,
                                     const LocalCollective& c, uint64_t seq, absl::Time deadline,
                                     transport::Scratch* scratch) {
  const size_t block = c.count * DTypeSize(c.dtype);
  if (block == 0) return absl::OkStatus();  // every daemon knows: count is in the signature
  const int n = p.nodes(), me = p.node_index;
  const int root_node = p.node_of_rank[c.root];
  const int root_local = LocalIndex(p, c.root);  // -1 off the root's daemon
  const std::vector<int>& local = p.local_ranks();
  const bool gather = c.kind == CollectiveKind::kGather;
  const Reducer& red = c.reduce();
  // One staging area, one region per other daemon this one talks to (the
  // root's daemon: every other one; the others: the root's alone).
  std::vector<size_t> at(n, 0), len(n, 0);
  std::vector<bool> peer(n, false);
  size_t total = 0;
  for (int q = 0; q < n; ++q) {
    if (q == me || (me != root_node && q != root_node)) continue;
    peer[q] = true;
    at[q] = total;
    len[q] = (me == root_node ? p.ranks_of_node[q].size() : local.size()) * block;
    total += len[q];
  }
  ASSIGN_OR_RETURN(const transport::MemoryRegion* staging,
                   scratch->ReserveRegistered(ctx, std::max<size_t>(total, 1)));
  std::vector<transport::RegionView> views;
  for (int q = 0; q < n; ++q) views.emplace_back(*staging, at[q], len[q]);
  const std::vector<bool> none(n, false);
  if (gather) {
    if (me != root_node) {  // this daemon's ranks' own blocks, to the root's daemon
      char* w = views[root_node].data();
      for (size_t i = 0; i < local.size(); ++i, w += block) {
        red.Copy(w, Block(c.bufs[i], local[i], block), block);
      }
      return ExchangeWithNodes(ctx, seq, views, views, deadline, peer, none);
    }
    char* dst = c.bufs[root_local];
    for (size_t i = 0; i < local.size(); ++i) {
      if (static_cast<int>(i) != root_local) {
        red.Copy(Block(dst, local[i], block), Block(c.bufs[i], local[i], block), block);
      }
    }
    RETURN_IF_ERROR(ExchangeWithNodes(ctx, seq, views, views, deadline, none, peer));
    for (int q = 0; q < n; ++q) {
      if (!peer[q]) continue;
      const char* r = views[q].data();
      for (int s : p.ranks_of_node[q]) {
        red.Copy(Block(dst, s, block), r, block);
        r += block;
      }
    }
    return absl::OkStatus();
  }
  // scatter
  if (me != root_node) {
    RETURN_IF_ERROR(ExchangeWithNodes(ctx, seq, views, views, deadline, none, peer));
    const char* r = views[root_node].data();
    for (size_t i = 0; i < local.size(); ++i, r += block) {
      red.Copy(Block(c.bufs[i], local[i], block), r, block);
    }
    return absl::OkStatus();
  }
  char* src = c.bufs[root_local];  // only read
  for (int q = 0; q < n; ++q) {
    if (!peer[q]) continue;
    char* w = views[q].data();
    for (int s : p.ranks_of_node[q]) {
      red.Copy(w, Block(src, s, block), block);
      w += block;
    }
  }
  for (size_t i = 0; i < local.size(); ++i) {
    if (static_cast<int>(i) != root_local) {
      red.Copy(Block(c.bufs[i], local[i], block), Block(src, local[i], block),
               block);
    }
  }
  return ExchangeWithNodes(ctx, seq, views, views, deadline, peer, none);
}

// allgather and alltoall across daemons: the blocks each daemon's ranks send
// to the ranks of every other daemon, in one message per pair of daemons.
absl::Status BlocksAcrossNodes(transport::Context& ctx, const JobPlacement& p,
                               const LocalCollective& c, uint64_t seq, absl::Time deadline,
                               transport::Scratch* scratch) {
  const size_t block = c.count * DTypeSize(c.dtype);
  const int n = p.nodes(), me = p.node_index;
  const std::vector<int>& local = p.local_ranks();
  const bool all = c.kind == CollectiveKind::kAlltoall;
  const Reducer& red = c.reduce();
  // One staging area: every outgoing message, then every incoming one.
  // allgather: each local rank's own block; alltoall: for each local source,
  // its blocks for each of q's ranks.
  std::vector<size_t> out_at(n, 0), out_len(n, 0), in_at(n, 0), in_len(n, 0);
  size_t total = 0;
  for (int q = 0; q < n; ++q) {
    if (q == me) continue;
    const size_t theirs = p.ranks_of_node[q].size();
    out_len[q] = (all ? local.size() * theirs : local.size()) * block;
    in_len[q] = (all ? theirs * local.size() : theirs) * block;
  }
  for (int q = 0; q < n; ++q) out_at[q] = total, total += out_len[q];
  for (int q = 0; q < n; ++q) in_at[q] = total, total += in_len[q];
  ASSIGN_OR_RETURN(const transport::MemoryRegion* staging, scratch->ReserveRegistered(ctx, total));
  std::vector<transport::RegionView> out, in;
  for (int q = 0; q < n; ++q) {
    out.emplace_back(*staging, out_at[q], out_len[q]);
    in.emplace_back(*staging, in_at[q], in_len[q]);
  }
  for (int q = 0; q < n; ++q) {
    if (q == me) continue;
    char* w = out[q].data();
    for (size_t i = 0; i < local.size(); ++i) {
      if (all) {
        for (int d : p.ranks_of_node[q]) {
          red.Copy(w, Block(c.bufs[i], d, block), block);
          w += block;
        }
      } else {
        red.Copy(w, Block(c.bufs[i], local[i], block), block);
        w += block;
      }
    }
  }
  RETURN_IF_ERROR(ExchangeWithNodes(ctx, seq, out, in, deadline));
  for (int q = 0; q < n; ++q) {
    if (q == me) continue;
    const char* r = in[q].data();
    for (int s : p.ranks_of_node[q]) {
      if (all) {
        for (size_t i = 0; i < local.size(); ++i) {
          red.Copy(Block(c.bufs[i], s, block), r, block);
          r += block;
        }
      } else {
        for (size_t i = 0; i < local.size(); ++i) red.Copy(Block(c.bufs[i], s, block), r, block);
        r += block;
      }
    }
  }
  if (all) return LocalAlltoall(p, c, block, scratch);
  for (size_t i = 0; i < local.size(); ++i) {
    for (size_t j = 0; j < local.size(); ++j) {
      if (i != j) red.Copy(Block(c.bufs[j], local[i], block), Block(c.bufs[i], local[i], block), block);
    }
  }
  return absl::OkStatus();
}

// Runs fn over [0, count) in slices on the pool, or at once.
void Sliced(Slicing slicing, size_t count, size_t es,
            const std::function<void(size_t begin, size_t end)>& fn) {
  if (slicing.pool == nullptr || slicing.min_bytes == 0 || count * es < 2 * slicing.min_bytes) {
    fn(0, count);
  } else {
    slicing.pool->ForRanges(count, es, slicing.min_bytes, fn);
  }
}

// The local stage of an allreduce on [begin, end): combined into bufs[0] in
// rank order; with `finish` also divided (avg) and copied to the others.
void ReduceSlice(const LocalCollective& c, size_t begin, size_t end, int divide_by, bool copy) {
  const size_t es = DTypeSize(c.dtype);
  std::vector<char*> part(c.bufs.size());
  for (size_t j = 0; j < c.bufs.size(); ++j) part[j] = c.bufs[j] + begin * es;
  ReduceInOrder(c.reduce(), part, end - begin, c.dtype, c.op, divide_by);
  if (!copy) return;
  for (size_t j = 1; j < part.size(); ++j) c.reduce().Copy(part[j], part[0], (end - begin) * es);
}

}  // namespace

void ReduceInOrder(const Reducer& red, const std::vector<char*>& bufs, size_t count, DType dtype,
                   ReduceOp op, int divide_by) {
  if (bufs.empty() || count == 0) return;
  for (size_t j = 1; j < bufs.size(); ++j) red.Reduce(dtype, CombineOp(op), bufs[0], bufs[j], count);
  if (op == ReduceOp::kAvg && divide_by > 0) red.Divide(dtype, bufs[0], count, divide_by);
}

void ReduceLocalShare(const LocalCollective& c, Slicing slicing) {
  Sliced(slicing, c.count, DTypeSize(c.dtype),
         [&](size_t b, size_t e) { ReduceSlice(c, b, e, 0, false); });
}

void SpreadLocalResult(const LocalCollective& c, int world, Slicing slicing) {
  const size_t es = DTypeSize(c.dtype);
  const Reducer& red = c.reduce();
  Sliced(slicing, c.count, es, [&](size_t b, size_t e) {
    if (c.op == ReduceOp::kAvg) red.Divide(c.dtype, c.bufs[0] + b * es, e - b, world);
    for (size_t j = 1; j < c.bufs.size(); ++j) {
      red.Copy(c.bufs[j] + b * es, c.bufs[0] + b * es, (e - b) * es);
    }
  });
}

absl::Status RunInMemory(const JobPlacement& p, const LocalCollective& c,
                         transport::Scratch* scratch, Slicing slicing) {
  const int world = p.world;
  const size_t es = DTypeSize(c.dtype);
  const size_t block = c.count * es;
  const Reducer& red = c.reduce();
  switch (c.kind) {
    case CollectiveKind::kAllreduce:
      Sliced(slicing, c.count, es, [&](size_t b, size_t e) { ReduceSlice(c, b, e, world, true); });
      return absl::OkStatus();
    case CollectiveKind::kReduceScatter: {
      ASSIGN_OR_RETURN(transport::Buffer tmp, scratch->Reserve(block));
      for (int b = 0; b < world; ++b) {
        red.Copy(tmp.ptr, Block(c.bufs[0], b, block), block);
        for (int j = 1; j < world; ++j) {
          red.Reduce(c.dtype, CombineOp(c.op), tmp.ptr, Block(c.bufs[j], b, block), c.count);
        }
        if (c.op == ReduceOp::kAvg) red.Divide(c.dtype, tmp.ptr, c.count, world);
        red.Copy(Block(c.bufs[b], b, block), tmp.ptr, block);
      }
      return absl::OkStatus();
    }
    case CollectiveKind::kAllgather:
      for (int r = 0; r < world; ++r) {
        for (int j = 0; j < world; ++j) {
          if (j != r) red.Copy(Block(c.bufs[j], r, block), Block(c.bufs[r], r, block), block);
        }
      }
      return absl::OkStatus();
    case CollectiveKind::kBroadcast:
      for (int j = 0; j < world; ++j) {
        if (j != c.root) red.Copy(c.bufs[j], c.bufs[c.root], block);
      }
      return absl::OkStatus();
    case CollectiveKind::kReduce: {
      ASSIGN_OR_RETURN(transport::Buffer tmp, scratch->Reserve(block));
      ReduceLocalInto(c, c.count, tmp.bytes());
      if (c.op == ReduceOp::kAvg) red.Divide(c.dtype, tmp.ptr, c.count, world);
      red.Copy(c.bufs[c.root], tmp.ptr, block);
      return absl::OkStatus();
    }
    case CollectiveKind::kAlltoall:
      return LocalAlltoall(p, c, block, scratch);
    case CollectiveKind::kGather:
      for (int j = 0; j < world; ++j) {
        if (j != c.root) red.Copy(Block(c.bufs[c.root], j, block), Block(c.bufs[j], j, block), block);
      }
      return absl::OkStatus();
    case CollectiveKind::kScatter:
      for (int j = 0; j < world; ++j) {
        if (j != c.root) red.Copy(Block(c.bufs[j], j, block), Block(c.bufs[c.root], j, block), block);
      }
      return absl::OkStatus();
    case CollectiveKind::kBarrier:
      return absl::OkStatus();
    case CollectiveKind::kSend:
    case CollectiveKind::kRecv: break;  // not collectives
  }
  return absl::InternalError("unknown collective");
}

absl::Status RunAcrossNodes(transport::Context& ctx, const JobPlacement& p,
                            const LocalCollective& c, Algorithm node_algo, uint64_t seq,
                            absl::Time deadline, const RingOptions& ring,
                            transport::Scratch* scratch, transport::Scratch* algo_scratch,
                            Slicing slicing) {
  const int world = p.world;
  const size_t es = DTypeSize(c.dtype);
  const size_t block = c.count * es;
  const std::vector<int>& local = p.local_ranks();
  const Reducer& red = c.reduce();
  const transport::MemKind kind = red.kind();
  CollectiveCall call;
  call.reducer = &red;
  call.dtype = c.dtype;
  call.op = CombineOp(c.op);
  call.seq = seq;
  call.deadline = deadline;
  call.ring = ring;
  call.codec = c.codec;
  call.codec_feedback = c.codec_feedback;
  if (c.kind == CollectiveKind::kAllreduce) call.sparse = c.sparse;
  // The allreduce among the daemons (`call` as set up), timed where the
  // caller asked.
  auto allreduce_between = [&]() {
    const absl::Time start = absl::Now();
    absl::Status s = RunCollective(ctx, call, node_algo, algo_scratch);
    if (c.between_time != nullptr) *c.between_time = absl::Now() - start;
    return s;
  };
  auto between = [&](absl::Status s) {
    if (s.ok()) return s;
    return absl::Status(s.code(), absl::StrCat("between daemons (node ", p.node_index, " of ",
                                               p.nodes(), "): ", s.message()));
  };
  switch (c.kind) {
    case CollectiveKind::kAllreduce: {
      ReduceLocalShare(c, slicing);
      call.kind = CollectiveKind::kAllreduce;
      call.buffer = transport::Buffer{c.bufs[0], block, kind};
      call.region = c.region0;
      call.count = c.count;
      RETURN_IF_ERROR(between(allreduce_between()));
      SpreadLocalResult(c, world, slicing);
      return absl::OkStatus();
    }
    case CollectiveKind::kReduceScatter: {
      const size_t elems = c.count * static_cast<size_t>(world);
      ASSIGN_OR_RETURN(const transport::MemoryRegion* acc,
                       scratch->ReserveRegistered(ctx, elems * es));
      ReduceLocalInto(c, elems, acc->data());
      call.kind = CollectiveKind::kAllreduce;
      call.buffer = transport::Buffer{acc->data(), elems * es, kind};
      call.region = acc;
      call.count = elems;
      RETURN_IF_ERROR(between(allreduce_between()));
      for (size_t i = 0; i < local.size(); ++i) {
        char* mine = Block(c.bufs[i], local[i], block);
        red.Copy(mine, Block(acc->data(), local[i], block), block);
        if (c.op == ReduceOp::kAvg) red.Divide(c.dtype, mine, c.count, world);
      }
      return absl::OkStatus();
    }
    case CollectiveKind::kAllgather:
    case CollectiveKind::kAlltoall:
      return between(BlocksAcrossNodes(ctx, p, c, seq, deadline, scratch));
    case CollectiveKind::kGather:
    case CollectiveKind::kScatter:
      return between(RootedBlocksAcrossNodes(ctx, p, c, seq, deadline, scratch));
    case CollectiveKind::kBroadcast: {
      const int root_local = LocalIndex(p, c.root);
      char* src = root_local >= 0 ? c.bufs[root_local] : c.bufs[0];
      call.kind = CollectiveKind::kBroadcast;
      call.buffer = transport::Buffer{src, block, kind};
      call.region = src == c.bufs[0] ? c.region0 : nullptr;
      call.count = c.count;
      call.root = p.node_of_rank[c.root];
      RETURN_IF_ERROR(between(RunCollective(ctx, call, node_algo, algo_scratch)));
      for (char* b : c.bufs) {
        if (b != src) red.Copy(b, src, block);
      }
      return absl::OkStatus();
    }
    case CollectiveKind::kReduce: {
      ASSIGN_OR_RETURN(const transport::MemoryRegion* acc, scratch->ReserveRegistered(ctx, block));
      ReduceLocalInto(c, c.count, acc->data());
      call.kind = CollectiveKind::kReduce;
      call.buffer = transport::Buffer{acc->data(), block, kind};
      call.region = acc;
      call.count = c.count;
      call.root = p.node_of_rank[c.root];
      RETURN_IF_ERROR(between(RunCollective(ctx, call, node_algo, algo_scratch)));
      const int root_local = LocalIndex(p, c.root);
      if (root_local >= 0) {
        if (c.op == ReduceOp::kAvg) red.Divide(c.dtype, acc->data(), c.count, world);
        red.Copy(c.bufs[root_local], acc->data(), block);
      }
      return absl::OkStatus();
    }
    case CollectiveKind::kBarrier:
      return absl::OkStatus();
    case CollectiveKind::kSend:
    case CollectiveKind::kRecv: break;  // not collectives
  }
  return absl::InternalError("unknown collective");
}

}  // namespace gradsync
