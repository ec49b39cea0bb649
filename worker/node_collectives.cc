#include "worker/node_collectives.h"

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
#include "kernels/cpu_reduce.h"

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
  std::memcpy(out, c.bufs[0], bytes);
  for (size_t j = 1; j < c.bufs.size(); ++j) ReduceInto(c.dtype, CombineOp(c.op), out, c.bufs[j], elems);
}

void SwapBytes(char* a, char* b, size_t n) {
  for (size_t i = 0; i < n; ++i) std::swap(a[i], b[i]);
}

// alltoall among local ranks: rank s's block d and rank d's block s trade
// places (the diagonal stays).
void LocalAlltoall(const JobPlacement& p, const LocalCollective& c, size_t block_bytes) {
  const std::vector<int>& local = p.local_ranks();
  for (size_t i = 0; i < local.size(); ++i) {
    for (size_t j = i + 1; j < local.size(); ++j) {
      SwapBytes(Block(c.bufs[i], local[j], block_bytes), Block(c.bufs[j], local[i], block_bytes),
                block_bytes);
    }
  }
}

// Sends out[q] to every other node q and receives into in[q] (capacity:
// its size; exactly `exact[q]` bytes), on slot 1 of op `seq`.
absl::Status ExchangeWithNodes(transport::Context& ctx, uint64_t seq,
                               std::vector<std::vector<char>>& out,
                               std::vector<std::vector<char>>& in, absl::Time deadline) {
  const int n = ctx.size(), me = ctx.rank();
  std::vector<std::unique_ptr<transport::MemoryRegion>> mrs;
  std::vector<transport::Request> sends(n), recvs(n);
  transport::MessageTag tag;
  tag.op_seq = seq;
  tag.slot = 1;
  for (int q = 0; q < n; ++q) {
    if (q == me) continue;
    ASSIGN_OR_RETURN(auto rin, ctx.RegisterMemory(in[q].data(), in[q].size()));
    RETURN_IF_ERROR(ctx.PostRecv(q, *rin, 0, in[q].size(), /*exact=*/true, tag, &recvs[q]));
    mrs.push_back(std::move(rin));
  }
  for (int q = 0; q < n; ++q) {
    if (q == me) continue;
    ASSIGN_OR_RETURN(auto rout, ctx.RegisterMemory(out[q].data(), out[q].size()));
    RETURN_IF_ERROR(ctx.PostSend(q, *rout, 0, out[q].size(), tag, &sends[q]));
    mrs.push_back(std::move(rout));
  }
  auto all_done = [&] {
    for (int q = 0; q < n; ++q) {
      if (q != me && (!sends[q].done || !recvs[q].done)) return false;
    }
    return true;
  };
  while (!all_done()) {
    absl::Status s = ctx.Progress(deadline);
    if (absl::IsDeadlineExceeded(s)) {
      std::vector<int> waiting;
      for (int q = 0; q < n; ++q) {
        if (q != me && !recvs[q].done) waiting.push_back(q);
      }
      return absl::DeadlineExceededError(absl::StrCat(
          "op ", seq, ": timed out waiting for the blocks of daemon(s) ",
          absl::StrJoin(waiting, ","), " (node indices)"));
    }
    RETURN_IF_ERROR(s);
  }
  return absl::OkStatus();
}

// allgather and alltoall across daemons: the blocks each daemon's ranks send
// to the ranks of every other daemon, in one message per pair of daemons.
absl::Status BlocksAcrossNodes(transport::Context& ctx, const JobPlacement& p,
                               const LocalCollective& c, uint64_t seq, absl::Time deadline) {
  const size_t block = c.count * DTypeSize(c.dtype);
  const int n = p.nodes(), me = p.node_index;
  const std::vector<int>& local = p.local_ranks();
  const bool all = c.kind == CollectiveKind::kAlltoall;
  std::vector<std::vector<char>> out(n), in(n);
  for (int q = 0; q < n; ++q) {
    if (q == me) continue;
    const std::vector<int>& theirs = p.ranks_of_node[q];
    // allgather: each local rank's own block; alltoall: for each local
    // source, its blocks for each of q's ranks.
    const size_t out_blocks = all ? local.size() * theirs.size() : local.size();
    const size_t in_blocks = all ? theirs.size() * local.size() : theirs.size();
    out[q].resize(out_blocks * block);
    in[q].resize(in_blocks * block);
    char* w = out[q].data();
    for (size_t i = 0; i < local.size(); ++i) {
      if (all) {
        for (int d : theirs) {
          std::memcpy(w, Block(c.bufs[i], d, block), block);
          w += block;
        }
      } else {
        std::memcpy(w, Block(c.bufs[i], local[i], block), block);
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
          std::memcpy(Block(c.bufs[i], s, block), r, block);
          r += block;
        }
      } else {
        for (size_t i = 0; i < local.size(); ++i) std::memcpy(Block(c.bufs[i], s, block), r, block);
        r += block;
      }
    }
  }
  if (all) {
    LocalAlltoall(p, c, block);
  } else {
    for (size_t i = 0; i < local.size(); ++i) {
      for (size_t j = 0; j < local.size(); ++j) {
        if (i != j) std::memcpy(Block(c.bufs[j], local[i], block), Block(c.bufs[i], local[i], block), block);
      }
    }
  }
  return absl::OkStatus();
}

// Runs fn over [0, count) in slices on `pool`, or at once.
void Sliced(SlicePool* pool, size_t count, size_t es,
            const std::function<void(size_t begin, size_t end)>& fn) {
  if (pool == nullptr || count * es < 2 * kMinSliceBytes) {
    fn(0, count);
  } else {
    pool->ForRanges(count, es, kMinSliceBytes, fn);
  }
}

// The local stage of an allreduce on [begin, end): combined into bufs[0] in
// rank order; with `finish` also divided (avg) and copied to the others.
void ReduceSlice(const LocalCollective& c, size_t begin, size_t end, int divide_by, bool copy) {
  const size_t es = DTypeSize(c.dtype);
  std::vector<char*> part(c.bufs.size());
  for (size_t j = 0; j < c.bufs.size(); ++j) part[j] = c.bufs[j] + begin * es;
  ReduceInOrder(part, end - begin, c.dtype, c.op, divide_by);
  if (!copy) return;
  for (size_t j = 1; j < part.size(); ++j) std::memcpy(part[j], part[0], (end - begin) * es);
}

}  // namespace

void ReduceInOrder(const std::vector<char*>& bufs, size_t count, DType dtype, ReduceOp op,
                   int divide_by) {
  if (bufs.empty() || count == 0) return;
  for (size_t j = 1; j < bufs.size(); ++j) ReduceInto(dtype, CombineOp(op), bufs[0], bufs[j], count);
  if (op == ReduceOp::kAvg && divide_by > 0) DivideBy(dtype, bufs[0], count, divide_by);
}

void RunInMemory(const JobPlacement& p, const LocalCollective& c, std::vector<char>* scratch,
                 SlicePool* pool) {
  const int world = p.world;
  const size_t es = DTypeSize(c.dtype);
  const size_t block = c.count * es;
  switch (c.kind) {
    case CollectiveKind::kAllreduce:
      Sliced(pool, c.count, es, [&](size_t b, size_t e) { ReduceSlice(c, b, e, world, true); });
      return;
    case CollectiveKind::kReduceScatter:
      scratch->resize(std::max(scratch->size(), block));
      for (int b = 0; b < world; ++b) {
        std::memcpy(scratch->data(), Block(c.bufs[0], b, block), block);
        for (int j = 1; j < world; ++j) {
          ReduceInto(c.dtype, CombineOp(c.op), scratch->data(), Block(c.bufs[j], b, block), c.count);
        }
        if (c.op == ReduceOp::kAvg) DivideBy(c.dtype, scratch->data(), c.count, world);
        std::memcpy(Block(c.bufs[b], b, block), scratch->data(), block);
      }
      return;
    case CollectiveKind::kAllgather:
      for (int r = 0; r < world; ++r) {
        for (int j = 0; j < world; ++j) {
          if (j != r) std::memcpy(Block(c.bufs[j], r, block), Block(c.bufs[r], r, block), block);
        }
      }
      return;
    case CollectiveKind::kBroadcast:
      for (int j = 0; j < world; ++j) {
        if (j != c.root) std::memcpy(c.bufs[j], c.bufs[c.root], block);
      }
      return;
    case CollectiveKind::kReduce:
      scratch->resize(std::max(scratch->size(), block));
      ReduceLocalInto(c, c.count, scratch->data());
      if (c.op == ReduceOp::kAvg) DivideBy(c.dtype, scratch->data(), c.count, world);
      std::memcpy(c.bufs[c.root], scratch->data(), block);
      return;
    case CollectiveKind::kAlltoall:
      LocalAlltoall(p, c, block);
      return;
    case CollectiveKind::kBarrier:
      return;
  }
}

absl::Status RunAcrossNodes(transport::Context& ctx, const JobPlacement& p,
                            const LocalCollective& c, Algorithm node_algo, uint64_t seq,
                            absl::Time deadline, const RingOptions& ring,
                            std::vector<char>* scratch, std::vector<char>* algo_scratch,
                            SlicePool* pool) {
  const int world = p.world;
  const size_t es = DTypeSize(c.dtype);
  const size_t block = c.count * es;
  const std::vector<int>& local = p.local_ranks();
  CollectiveCall call;
  call.dtype = c.dtype;
  call.op = CombineOp(c.op);
  call.seq = seq;
  call.deadline = deadline;
  call.ring = ring;
  auto between = [&](absl::Status s) {
    if (s.ok()) return s;
    return absl::Status(s.code(), absl::StrCat("between daemons (node ", p.node_index, " of ",
                                               p.nodes(), "): ", s.message()));
  };
  switch (c.kind) {
    case CollectiveKind::kAllreduce: {
      Sliced(pool, c.count, es, [&](size_t b, size_t e) { ReduceSlice(c, b, e, 0, false); });
      call.kind = CollectiveKind::kAllreduce;
      call.data = c.bufs[0];
      call.count = c.count;
      RETURN_IF_ERROR(between(RunCollective(ctx, call, node_algo, algo_scratch)));
      Sliced(pool, c.count, es, [&](size_t b, size_t e) {
        if (c.op == ReduceOp::kAvg) DivideBy(c.dtype, c.bufs[0] + b * es, e - b, world);
        for (size_t j = 1; j < c.bufs.size(); ++j) {
          std::memcpy(c.bufs[j] + b * es, c.bufs[0] + b * es, (e - b) * es);
        }
      });
      return absl::OkStatus();
    }
    case CollectiveKind::kReduceScatter: {
      const size_t elems = c.count * static_cast<size_t>(world);
      scratch->resize(std::max(scratch->size(), elems * es));
      ReduceLocalInto(c, elems, scratch->data());
      call.kind = CollectiveKind::kAllreduce;
      call.data = scratch->data();
      call.count = elems;
      RETURN_IF_ERROR(between(RunCollective(ctx, call, node_algo, algo_scratch)));
      for (size_t i = 0; i < local.size(); ++i) {
        char* mine = Block(c.bufs[i], local[i], block);
        std::memcpy(mine, Block(scratch->data(), local[i], block), block);
        if (c.op == ReduceOp::kAvg) DivideBy(c.dtype, mine, c.count, world);
      }
      return absl::OkStatus();
    }
    case CollectiveKind::kAllgather:
    case CollectiveKind::kAlltoall:
      return between(BlocksAcrossNodes(ctx, p, c, seq, deadline));
    case CollectiveKind::kBroadcast: {
      const int root_local = LocalIndex(p, c.root);
      char* src = root_local >= 0 ? c.bufs[root_local] : c.bufs[0];
      call.kind = CollectiveKind::kBroadcast;
      call.data = src;
      call.count = c.count;
      call.root = p.node_of_rank[c.root];
      RETURN_IF_ERROR(between(RunCollective(ctx, call, node_algo, algo_scratch)));
      for (char* b : c.bufs) {
        if (b != src) std::memcpy(b, src, block);
      }
      return absl::OkStatus();
    }
    case CollectiveKind::kReduce: {
      scratch->resize(std::max(scratch->size(), block));
      ReduceLocalInto(c, c.count, scratch->data());
      call.kind = CollectiveKind::kReduce;
      call.data = scratch->data();
      call.count = c.count;
      call.root = p.node_of_rank[c.root];
      RETURN_IF_ERROR(between(RunCollective(ctx, call, node_algo, algo_scratch)));
      const int root_local = LocalIndex(p, c.root);
      if (root_local >= 0) {
        if (c.op == ReduceOp::kAvg) DivideBy(c.dtype, scratch->data(), c.count, world);
        std::memcpy(c.bufs[root_local], scratch->data(), block);
      }
      return absl::OkStatus();
    }
    case CollectiveKind::kBarrier:
      return absl::OkStatus();
  }
  return absl::InternalError("unknown collective");
}

}  // namespace gradsync
