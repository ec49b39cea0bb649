#include "collective/signature_exchange.h"

#include <algorithm>
#include <cstring>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "collective/collectives.h"
#include "collective/signature_exchange_impl.h"
#include "common/clock.h"
#include "common/status_macros.h"

namespace gradsync {
namespace signature_internal {

absl::Status MissingDataError(const OpSignature& mine, int me, int peer, size_t got, size_t want) {
  return absl::InvalidArgumentError(absl::StrCat(
      "op ", mine.seq, " (", mine.Describe(), "): rank ", peer, " sent ", got,
      " bytes of data with its signature; rank ", me, " expected ", want,
      " (the ranks disagree on whether the op runs oneshot)"));
}

absl::Status DeadlineError(const OpSignature& mine, int me, const std::vector<int>& missing,
                           int through, const std::vector<std::vector<int>>* participants) {
  // Participants stand for job ranks (several per daemon) or are the ranks.
  auto ranks = [participants](const std::vector<int>& ps) {
    if (participants == nullptr) return absl::StrJoin(ps, ",");
    std::vector<int> out;
    for (int p : ps) out.insert(out.end(), (*participants)[p].begin(), (*participants)[p].end());
    std::sort(out.begin(), out.end());
    return absl::StrJoin(out, ",");
  };
  const std::string at = ranks({me});
  std::string msg = absl::StrCat("timed out at rank", at.find(',') != std::string::npos ? "s " : " ",
                                 at, " waiting for rank(s) ", ranks(missing), " to submit op ",
                                 mine.seq, " (", mine.Describe(), ")");
  if (through >= 0 && (missing.size() > 1 || missing.front() != through)) {
    absl::StrAppend(&msg, "; their signatures come through rank",
                    participants == nullptr ? " " : "(s) ", ranks({through}),
                    " (recursive doubling), so some of them may have submitted and wait for "
                    "the others");
  }
  return absl::DeadlineExceededError(msg);
}


}  // namespace signature_internal

SignatureScratch::SignatureScratch() : state_(std::make_unique<State>()) {}
SignatureScratch::~SignatureScratch() = default;

namespace signature_internal {

// ---- All-to-all: every rank sends its signature (and fused data) to every
// other rank, one round.

absl::Status AllToAll::Start() {
  mine_.EncodeTo(&st_.my_sig);
  const size_t sig_len = st_.my_sig.size();
  const size_t out_len = want_ > 0 ? AlignUp(sig_len) + want_ : sig_len;
  ASSIGN_OR_RETURN(const transport::MemoryRegion* in_mr,
                   st_.in.ReserveRegistered(ctx_, kCap * n_));
  ASSIGN_OR_RETURN(const transport::MemoryRegion* out_mr,
                   st_.out.ReserveRegistered(ctx_, kCap));
  char* const outbox = st_.out.data();
  std::memcpy(outbox, st_.my_sig.data(), sig_len);
  if (want_ > 0) {
    std::memset(outbox + sig_len, 0, AlignUp(sig_len) - sig_len);
    std::memcpy(outbox + AlignUp(sig_len), fused_->data, want_);
  }
  st_.sends.assign(n_, transport::Request{});
  st_.recvs.assign(n_, transport::Request{});
  st_.reported.assign(n_, 0);
  const transport::MessageTag tag{mine_.seq, transport::kControlSlot, 0, 0};
  for (int p = 0; p < n_; ++p) {
    if (p == me_) continue;
    RETURN_IF_ERROR(
        ctx_.PostRecv(p, *in_mr, kCap * p, kCap, /*exact=*/false, tag, &st_.recvs[p]));
  }
  for (int p = 0; p < n_; ++p) {
    if (p == me_) continue;
    RETURN_IF_ERROR(ctx_.PostSend(p, *out_mr, 0, out_len, tag, &st_.sends[p]));
  }
  return absl::OkStatus();
}

bool AllToAll::AllDone() const {
  for (int p = 0; p < n_; ++p) {
    if (p != me_ && (!st_.sends[p].done || !st_.recvs[p].done)) return false;
  }
  return true;
}

void AllToAll::Report() {
  if (!on_arrival_) return;
  for (int p = 0; p < n_; ++p) {
    if (p != me_ && st_.recvs[p].done && !st_.reported[p]) {
      st_.reported[p] = 1;
      on_arrival_(p);
    }
  }
}

absl::StatusOr<bool> AllToAll::Advance(absl::Time until) {
  Report();
  while (!AllDone()) {
    absl::Status s = ctx_.Progress(until);
    Report();
    if (absl::IsDeadlineExceeded(s)) return false;
    if (!s.ok()) return s;
  }
  RETURN_IF_ERROR(Finish());
  return true;
}

absl::Status AllToAll::TimedOut() const {
  std::vector<int> missing;
  for (int p = 0; p < n_; ++p) {
    if (p != me_ && !st_.recvs[p].done) missing.push_back(p);
  }
  if (missing.empty()) return absl::DeadlineExceededError("deadline exceeded");  // a send is stuck
  return DeadlineError(mine_, me_, missing, -1, participants);
}

absl::Status AllToAll::Finish() {
  const char* const in = st_.in.data();
  // The usual case, every signature equal to this rank's, is checked in
  // place; only a mismatch builds the strings for the error.
  const absl::string_view my_sig(st_.my_sig);
  st_.data_len.assign(n_, 0);
  st_.data_at.assign(n_, 0);
  bool all_same = true;
  for (int p = 0; p < n_; ++p) {
    if (p == me_) continue;
    const char* msg = in + kCap * p;
    const size_t len = EncodedLength(msg, st_.recvs[p].bytes);
    all_same = all_same && SameOp(absl::string_view(msg, len), my_sig);
    st_.data_at[p] = st_.recvs[p].bytes > len ? AlignUp(len) : len;
    st_.data_len[p] = st_.recvs[p].bytes > st_.data_at[p] ? st_.recvs[p].bytes - st_.data_at[p] : 0;
  }
  if (!all_same) {
    std::vector<std::string> by_rank(n_);
    for (int p = 0; p < n_; ++p) {
      by_rank[p] = p == me_ ? std::string(my_sig)
                            : std::string(in + kCap * p,
                                          EncodedLength(in + kCap * p, st_.recvs[p].bytes));
    }
    RETURN_IF_ERROR(CompareSignatures(mine_.seq, by_rank));
  }
  // Equal signatures: every rank decided the same way whether data rides
  // along, unless the ranks disagree on something outside the signature
  // (their link figures, or mixed daemon versions). Every message was read
  // whole, so the streams are intact: a clean error, and the job goes on.
  st_.peers.assign(n_, nullptr);
  for (int p = 0; p < n_; ++p) {
    if (p == me_) continue;
    if (st_.data_len[p] != want_) return MissingDataError(mine_, me_, p, st_.data_len[p], want_);
    st_.peers[p] = in + kCap * p + st_.data_at[p];
  }
  if (fused_ != nullptr) {
    st_.own.resize(want_);
    ReduceInRankOrder(fused_->dtype, fused_->op, fused_->data, fused_->count, me_, st_.peers,
                      st_.own.data(), &fused_->reduce());
  }
  const absl::string_view rank0 =
      me_ == 0 ? my_sig : absl::string_view(in, EncodedLength(in, st_.recvs[0].bytes));
  agreed = SignatureProposal(rank0);
  agreed_streams = SignatureStreams(rank0);
  agreed_codec = SignatureCodec(rank0);
  return absl::OkStatus();
}

}  // namespace signature_internal

using signature_internal::AllToAll;
using signature_internal::ExchangeImpl;
using signature_internal::RdExchange;

absl::Status CheckSignatures(transport::Context& ctx, const OpSignature& mine,
                             SignaturePattern pattern, absl::Time deadline,
                             const std::function<void(int rank)>& on_arrival,
                             uint8_t* agreed, FusedAllreduce* fused, SignatureScratch* scratch,
                             uint8_t* agreed_streams,
                             const std::vector<std::vector<int>>* participants,
                             uint8_t* agreed_codec) {
  const int n = ctx.size();
  if (fused != nullptr) {
    const size_t bytes = fused->count * DTypeSize(fused->dtype);
    if (bytes > kOneShotMaxBytes || scratch == nullptr) {
      return absl::InvalidArgumentError(absl::StrCat(
          "op ", mine.seq, ": ", bytes, " bytes cannot ride with the signature (at most ",
          kOneShotMaxBytes, ", with a scratch)"));
    }
  }
  if (n == 1) {
    if (agreed != nullptr) *agreed = mine.proposal;
    if (agreed_streams != nullptr) *agreed_streams = mine.streams;
    if (agreed_codec != nullptr) *agreed_codec = mine.codec;
    return absl::OkStatus();
  }
  std::unique_ptr<SignatureScratch> local_scratch;
  if (scratch == nullptr) {
    local_scratch = std::make_unique<SignatureScratch>();
    scratch = local_scratch.get();
  }
  auto run = [&](ExchangeImpl& x) -> absl::Status {
    while (true) {
      ASSIGN_OR_RETURN(const bool done, x.Advance(deadline));
      if (done) break;
      if (FastNow() >= deadline) return x.TimedOut();
    }
    if (agreed != nullptr) *agreed = x.agreed;
    if (agreed_streams != nullptr) *agreed_streams = x.agreed_streams;
    if (agreed_codec != nullptr) *agreed_codec = x.agreed_codec;
    return absl::OkStatus();
  };
  if (pattern == SignaturePattern::kAllToAll || n == 2) {
    AllToAll x(ctx, mine, on_arrival, fused, scratch->state());
    x.participants = participants;
    RETURN_IF_ERROR(x.Start());
    return run(x);
  }
  RdExchange x(ctx, mine, on_arrival, fused, scratch->state());
  x.participants = participants;
  RETURN_IF_ERROR(x.Start());
  return run(x);
}

}  // namespace gradsync
