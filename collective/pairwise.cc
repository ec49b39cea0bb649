// Pairwise exchange: alltoall, linear gather and scatter, and a one-round
// barrier.
//
// alltoall, ring-ordered: in step s = 1 .. n-1 rank r sends its block r+s to
// rank r+s and receives block r from rank r-s (mod n), so every step is a
// permutation and no rank receives from two peers at once. Works for every n.
// A block received in step s may still be due to leave in step n-s, so the
// buffer is first copied to scratch and every send reads the copy; receives
// land in place. Block r stays where it is. The tag offset of a message is
// where it lands: block (sender's rank) of the receiver.
//
// gather (linear): every rank but the root sends its block r to the root,
// which posts a receive of block p from every peer p at once and lets them
// land in place (the Exchange posts at most Context::max_in_flight() pieces
// per peer and direction, so the root's window is n-1 peers x that bound).
// One step, one message per non-root rank; the root's time is bound by its
// own link: (n-1) blocks in. The other ranks' buffers are not written.
//
// scatter (linear): the mirror: the root sends its block j to rank j (every
// send posted at once, windowed the same way) and every other rank receives
// its block r in place. The root's buffer is only read.
//
// Both: tag offset = the block's byte offset (r * block, the same at both
// ends), step 1. A rank outside the root's exchange posts one message only.
//
// barrier: one round in which every rank sends an empty message to every
// other rank and waits for one from each: n-1 messages each way, one
// latency.
#include <cstring>
#include <vector>

#include "absl/strings/str_cat.h"
#include "collective/algorithms.h"
#include "collective/exchange.h"
#include "common/status_macros.h"

namespace gradsync::internal {

absl::Status PairwiseAlltoall(transport::Context& ctx, const CollectiveCall& call,
                              transport::Scratch* scratch) {
  const int n = ctx.size();
  const int me = ctx.rank();
  if (n == 1 || call.count == 0) return absl::OkStatus();
  const size_t block = call.count * DTypeSize(call.dtype);
  const size_t bytes = static_cast<size_t>(n) * block;
  ASSIGN_OR_RETURN(const transport::MemoryRegion* s, scratch->ReserveRegistered(ctx, bytes));
  call.reduce().Copy(s->data(), call.data(), bytes);
  ASSIGN_OR_RETURN(auto data_mr, CallRegion(ctx, call, bytes));
  const transport::RegionView copy_view(*s, 0, bytes);
  const transport::MemoryRegion* copy_mr = &copy_view;
  for (int s = 1; s < n; ++s) {
    const int to = (me + s) % n;
    const int from = (me - s + n) % n;
    Exchange ex(ctx, call.seq, call.dtype, static_cast<uint32_t>(s), call.ring.segment_bytes);
    ex.Recv(from, *data_mr, from * block, call.count, from * block);
    ex.Send(to, *copy_mr, to * block, call.count, me * block);
    RETURN_IF_ERROR(
        ex.Run(call.deadline, absl::StrCat("pairwise alltoall step ", s, " of ", n - 1)));
  }
  return absl::OkStatus();
}

namespace {

// Gather (`to_root`) or scatter in one step: block p of the root's buffer
// moves between the root and rank p; every other rank moves only its own.
absl::Status LinearRooted(transport::Context& ctx, const CollectiveCall& call, bool to_root) {
  const int n = ctx.size();
  const int me = ctx.rank();
  if (n == 1 || call.count == 0) return absl::OkStatus();
  const size_t block = call.count * DTypeSize(call.dtype);
  ASSIGN_OR_RETURN(auto data_mr, CallRegion(ctx, call, static_cast<size_t>(n) * block));
  Exchange ex(ctx, call.seq, call.dtype, /*step=*/1, call.ring.segment_bytes);
  auto move = [&](bool receive, int peer, int at) {
    if (receive) {
      ex.Recv(peer, *data_mr, at * block, call.count, at * block);
    } else {
      ex.Send(peer, *data_mr, at * block, call.count, at * block);
    }
  };
  if (me == call.root) {
    for (int p = 0; p < n; ++p) {
      if (p != me) move(/*receive=*/to_root, p, p);
    }
  } else {
    move(/*receive=*/!to_root, call.root, me);
  }
  return ex.Run(call.deadline, to_root ? absl::StrCat("linear gather to root ", call.root)
                                       : absl::StrCat("linear scatter from root ", call.root));
}

}  // namespace

absl::Status LinearGather(transport::Context& ctx, const CollectiveCall& call) {
  return LinearRooted(ctx, call, /*to_root=*/true);
}

absl::Status LinearScatter(transport::Context& ctx, const CollectiveCall& call) {
  return LinearRooted(ctx, call, /*to_root=*/false);
}

absl::Status PairwiseBarrier(transport::Context& ctx, const CollectiveCall& call) {
  const int n = ctx.size();
  if (n == 1) return absl::OkStatus();
  char token = 0;
  ASSIGN_OR_RETURN(auto mr, ctx.RegisterMemory(&token, 0));
  Exchange ex = Exchange::Control(ctx, call.seq, 0);
  for (int p = 0; p < n; ++p) {
    if (p == ctx.rank()) continue;
    ex.Recv(p, *mr, 0, 0, 0);
    ex.Send(p, *mr, 0, 0, 0);
  }
  return ex.Run(call.deadline, "pairwise barrier");
}

}  // namespace gradsync::internal
