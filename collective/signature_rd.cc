#include <algorithm>
#include <cstring>
#include <vector>

#include "absl/strings/str_cat.h"
#include "collective/collectives.h"
#include "collective/signature_exchange_impl.h"
#include "common/clock.h"
#include "common/status_macros.h"

// Recursive doubling (the message format and the schedule: signature_exchange_impl.h).
namespace gradsync {
namespace signature_internal {


void RdExchange::Plan() {
  if (st_.rd_n == n_ && st_.rd_me == me_) return;
  int p = 1, rounds = 0;
  while (p * 2 <= n_) {
    p *= 2;
    ++rounds;
  }
  const int extra = n_ - p;
  // The steps this rank takes, in order; `round` numbers the exchanges alike
  // on both sides: 0 folds in, 1..rounds double, rounds + 1 folds out.
  std::vector<RdStep>& steps = st_.steps;
  steps.clear();
  auto add = [&steps](int peer, uint64_t round, bool send, bool recv, Take take, int ranks_in) {
    steps.push_back(RdStep{peer, round, send, recv, take, ranks_in});
  };
  if (me_ >= p) {
    add(me_ - p, 0, true, false, Take::kLower, 0);
    add(me_ - p, rounds + 1, false, true, Take::kAdopt, n_);
  } else {
    if (me_ < extra) add(me_ + p, 0, false, true, Take::kLower, 1);
    for (int k = 0; k < rounds; ++k) {
      const int bit = 1 << k;
      const int partner = me_ ^ bit;
      const int block = partner & ~(bit - 1);  // the partner's block of `bit` ranks
      int ranks_in = 0;
      for (int r = block; r < block + bit; ++r) ranks_in += r < extra ? 2 : 1;
      add(partner, k + 1, true, true, me_ < partner ? Take::kLower : Take::kUpper, ranks_in);
    }
    if (me_ < extra) add(me_ + p, rounds + 1, true, false, Take::kLower, 0);
  }
  // The inbox: slot 0 for this rank's first message, one per receive, and a
  // spill slot with room for every rank's group, for a message whose groups
  // outgrow the slot it is built in (only when many ranks disagree).
  constexpr int kRoomFor = 16;  // ranks' groups any slot holds besides the data
  const size_t base = sizeof(RdPrefix) + kOneShotMaxBytes;
  const int room = std::min(n_, kRoomFor);
  st_.slots.clear();
  size_t total = 0;
  auto add_slot = [&](size_t cap) {
    cap = AlignUp(cap);
    st_.slots.push_back(RdSlot{total, cap});
    total += cap;
    return st_.slots.size() - 1;
  };
  add_slot(base + GroupsCap(room));
  for (RdStep& s : steps) {
    if (s.recv) s.slot = add_slot(base + GroupsCap(std::max(s.ranks_in, room)));
  }
  add_slot(base + GroupsCap(n_));
  st_.inbox_bytes = total;
  st_.rd_n = n_;
  st_.rd_me = me_;
}

void RdExchange::ForgetAll() {
  st_.known.assign(n_, 0);
  st_.n_groups = 0;
  known_count_ = 0;
  valid_ = true;
}

void RdExchange::Know(absl::string_view sig, uint32_t data_len, int rank) {
  st_.known[rank] = 1;
  ++known_count_;
  if (data_len != want_ || !SameOp(sig, st_.my_sig)) valid_ = false;
  for (size_t i = 0; i < st_.n_groups; ++i) {
    SigGroup& g = st_.groups[i];
    if (g.data_len == data_len && g.sig == sig) {
      g.ranks.push_back(rank);
      return;
    }
  }
  if (st_.n_groups == st_.groups.size()) st_.groups.emplace_back();
  SigGroup& g = st_.groups[st_.n_groups++];
  g.sig.assign(sig.data(), sig.size());
  g.data_len = data_len;
  g.ranks.clear();
  g.ranks.push_back(rank);
}

size_t RdExchange::GroupsBytes() const {
  size_t bytes = 0;
  for (size_t i = 0; i < st_.n_groups; ++i) {
    const SigGroup& g = st_.groups[i];
    bytes += sizeof(RdGroup) + 4 * g.ranks.size() + Pad4(g.sig.size());
  }
  return bytes;
}

size_t RdExchange::Build() {
  const uint32_t data_bytes = valid_ ? static_cast<uint32_t>(want_) : 0;
  const size_t groups_bytes = GroupsBytes();
  if (sizeof(RdPrefix) + data_bytes + groups_bytes > st_.slots[msg_slot_].cap) {
    const size_t spill = st_.slots.size() - 1;
    std::memcpy(Inbox() + st_.slots[spill].offset + sizeof(RdPrefix),
                Inbox() + st_.slots[msg_slot_].offset + sizeof(RdPrefix), data_bytes);
    msg_slot_ = spill;
  }
  char* const msg = Inbox() + st_.slots[msg_slot_].offset;
  const RdPrefix prefix{kRdMagic, data_bytes, static_cast<uint32_t>(groups_bytes),
                        valid_ ? kRdDataValid : 0};
  std::memcpy(msg, &prefix, sizeof(prefix));
  char* at = msg + sizeof(RdPrefix) + data_bytes;
  for (size_t i = 0; i < st_.n_groups; ++i) {
    const SigGroup& g = st_.groups[i];
    const RdGroup h{static_cast<uint32_t>(g.sig.size()), g.data_len,
                    static_cast<uint32_t>(g.ranks.size()), 0};
    std::memcpy(at, &h, sizeof(h));
    at += sizeof(h);
    for (int r : g.ranks) {
      const uint32_t r32 = static_cast<uint32_t>(r);
      std::memcpy(at, &r32, sizeof(r32));
      at += sizeof(r32);
    }
    std::memcpy(at, g.sig.data(), g.sig.size());
    std::memset(at + g.sig.size(), 0, Pad4(g.sig.size()) - g.sig.size());
    at += Pad4(g.sig.size());
  }
  return static_cast<size_t>(at - msg);
}

absl::Status RdExchange::Parse(const RdStep& step, RdPrefix* prefix) const {
  const char* const msg = Inbox() + st_.slots[step.slot].offset;
  const size_t len = step.rreq.bytes;
  auto malformed = [&](absl::string_view why) {
    return absl::DataLossError(absl::StrCat("op ", mine_.seq,
                                            ": malformed signature message from rank ", step.peer,
                                            ": ", why));
  };
  if (len < sizeof(*prefix)) return malformed("too short");
  std::memcpy(prefix, msg, sizeof(*prefix));
  if (prefix->magic != kRdMagic) return malformed("bad magic");
  if (prefix->data_bytes > kOneShotMaxBytes ||
      sizeof(*prefix) + static_cast<size_t>(prefix->data_bytes) + prefix->groups_bytes != len) {
    return malformed("bad lengths");
  }
  std::vector<RdEntry>& entries = st_.entries;
  entries.clear();
  const char* at = msg + sizeof(*prefix) + prefix->data_bytes;
  const char* const end = msg + len;
  std::vector<uint8_t>& seen = st_.seen;
  seen.assign(n_, 0);
  while (at < end) {
    RdGroup h;
    if (static_cast<size_t>(end - at) < sizeof(h)) return malformed("truncated group");
    std::memcpy(&h, at, sizeof(h));
    at += sizeof(h);
    if (h.sig_len > kMaxSignatureBytes || h.n_ranks == 0 ||
        h.n_ranks > static_cast<uint32_t>(n_) ||
        static_cast<size_t>(end - at) < h.n_ranks * size_t{4} + Pad4(h.sig_len)) {
      return malformed("bad group");
    }
    const char* ranks = at;
    at += h.n_ranks * size_t{4};
    for (uint32_t i = 0; i < h.n_ranks; ++i) {
      uint32_t r;
      std::memcpy(&r, ranks + 4 * i, sizeof(r));
      if (r >= static_cast<uint32_t>(n_) || seen[r]) {
        return malformed(absl::StrCat("rank ", r, " is out of range or named twice"));
      }
      seen[r] = 1;
      entries.push_back(RdEntry{static_cast<int>(r), at, h.sig_len, h.data_len});
    }
    at += Pad4(h.sig_len);
  }
  return absl::OkStatus();
}

absl::Status RdExchange::Merge(const RdStep& step) {
  RdPrefix prefix;
  RETURN_IF_ERROR(Parse(step, &prefix));
  const bool adopt = step.take == Take::kAdopt;
  if (adopt) {  // the final state replaces this rank's
    st_.was_known = st_.known;
    ForgetAll();
  }
  st_.arrived.clear();
  for (const RdEntry& e : st_.entries) {
    if (st_.known[e.rank]) {
      return absl::DataLossError(absl::StrCat("op ", mine_.seq, ": malformed signature message "
                                              "from rank ", step.peer, ": rank ", e.rank,
                                              " came twice"));
    }
    Know(absl::string_view(e.sig, e.sig_len), e.data_len, e.rank);
    if (!adopt || !st_.was_known[e.rank]) st_.arrived.push_back(e.rank);
  }
  if ((prefix.flags & kRdDataValid) == 0 || prefix.data_bytes != want_) valid_ = false;
  if (valid_ && want_ > 0) {
    char* mine_data = Inbox() + st_.slots[msg_slot_].offset + sizeof(RdPrefix);
    char* theirs = Inbox() + st_.slots[step.slot].offset + sizeof(RdPrefix);
    const ReduceOp combine = CombineOp(fused_->op);
    switch (step.take) {
      case Take::kLower:  // the result stays where this rank's half is
        fused_->reduce().Reduce(fused_->dtype, combine, mine_data, theirs, fused_->count);
        break;
      case Take::kUpper:  // the lower half comes first (min/max are not
                          // commutative for NaN and signed zero): combine
                          // into the received message, which now holds it
        fused_->reduce().Reduce(fused_->dtype, combine, theirs, mine_data, fused_->count);
        msg_slot_ = step.slot;
        break;
      case Take::kAdopt:
        msg_slot_ = step.slot;
        break;
    }
  }
  for (int r : st_.arrived) Announce(r);
  return absl::OkStatus();
}

void RdExchange::Announce(int rank) {
  if (!on_arrival_ || rank == me_ || st_.announced[rank]) return;
  st_.announced[rank] = 1;
  on_arrival_(rank);
}

void RdExchange::AnnounceEarly(size_t current) {
  for (size_t i = current + 1; i < st_.steps.size(); ++i) {
    RdStep& s = st_.steps[i];
    if (!s.recv || !s.rreq.done || s.announced) continue;
    s.announced = true;
    RdPrefix prefix;
    if (!Parse(s, &prefix).ok()) continue;  // Merge reports it in turn
    for (const RdEntry& e : st_.entries) Announce(e.rank);
  }
}

std::vector<int> RdExchange::Unheard() const {
  // Messages of later rounds may be in already: their senders submitted,
  // and so did every rank they name.
  std::vector<uint8_t> heard = st_.known;
  for (const RdStep& s : st_.steps) {
    if (!s.recv || !s.rreq.done) continue;
    RdPrefix prefix;
    if (!Parse(s, &prefix).ok()) continue;
    for (const RdEntry& e : st_.entries) heard[e.rank] = 1;
  }
  std::vector<int> missing;
  for (int r = 0; r < n_; ++r) {
    if (!heard[r]) missing.push_back(r);
  }
  return missing;
}

absl::Status RdExchange::Start() {
  Plan();
  ASSIGN_OR_RETURN(const transport::MemoryRegion* mr,
                   st_.in.ReserveRegistered(ctx_, st_.inbox_bytes));
  for (RdStep& s : st_.steps) {
    s.sreq = transport::Request{};
    s.rreq = transport::Request{};
    s.announced = false;
  }
  mine_.EncodeTo(&st_.my_sig);
  st_.announced.assign(n_, 0);
  ForgetAll();
  msg_slot_ = 0;
  step_ = 0;
  sent_ = false;
  Know(st_.my_sig, static_cast<uint32_t>(want_), me_);
  if (want_ > 0) std::memcpy(Inbox() + sizeof(RdPrefix), fused_->data, want_);
  for (RdStep& s : st_.steps) {
    if (!s.recv) continue;
    const transport::MessageTag tag{mine_.seq, transport::kControlSlot, 0, s.round};
    RETURN_IF_ERROR(ctx_.PostRecv(s.peer, *mr, st_.slots[s.slot].offset, st_.slots[s.slot].cap,
                                  /*exact=*/false, tag, &s.rreq));
  }
  // The first message needs nothing from the others: out it goes, so a rank
  // that started is heard from even before its first Advance.
  return PostStepSend();
}

absl::Status RdExchange::PostStepSend() {
  RdStep& s = st_.steps[step_];
  if (!s.send || sent_) return absl::OkStatus();
  // Built in whichever slot holds the partial result: slot 0, or a slot
  // whose receive is done.
  const size_t len = Build();
  const transport::MessageTag tag{mine_.seq, transport::kControlSlot, 0, s.round};
  RETURN_IF_ERROR(
      ctx_.PostSend(s.peer, *st_.in.region(), st_.slots[msg_slot_].offset, len, tag, &s.sreq));
  sent_ = true;
  return absl::OkStatus();
}

absl::StatusOr<bool> RdExchange::Advance(absl::Time until) {
  std::vector<RdStep>& steps = st_.steps;
  for (; step_ < steps.size(); ++step_, sent_ = false) {
    RdStep& s = steps[step_];
    RETURN_IF_ERROR(PostStepSend());
    while ((s.send && !s.sreq.done) || (s.recv && !s.rreq.done)) {
      absl::Status st = ctx_.Progress(until);
      if (absl::IsDeadlineExceeded(st)) return false;
      if (!st.ok()) return st;
      if (on_arrival_) AnnounceEarly(step_);
    }
    if (s.recv) RETURN_IF_ERROR(Merge(s));
  }
  RETURN_IF_ERROR(Finish());
  return true;
}

absl::Status RdExchange::TimedOut() const {
  const std::vector<int> missing = Unheard();
  // Everyone submitted; only a send is stuck.
  if (missing.empty()) return absl::DeadlineExceededError("deadline exceeded");
  const int through = step_ < st_.steps.size() ? st_.steps[step_].peer : -1;
  return DeadlineError(mine_, me_, missing, through, participants);
}

absl::Status RdExchange::Finish() {
  if (known_count_ != n_) {
    return absl::DataLossError(absl::StrCat("op ", mine_.seq, ": rank ", me_, " learnt ",
                                            known_count_, " of ", n_, " signatures"));
  }
  if (st_.n_groups > 1) {
    std::vector<std::string> by_rank(n_);
    for (size_t i = 0; i < st_.n_groups; ++i) {
      for (int r : st_.groups[i].ranks) by_rank[r] = st_.groups[i].sig;
    }
    RETURN_IF_ERROR(CompareSignatures(mine_.seq, by_rank));
    // Equal signatures, different data lengths: name the lowest rank whose
    // length differs from this rank's.
    int odd = -1;
    uint32_t got = 0;
    for (size_t i = 0; i < st_.n_groups; ++i) {
      const SigGroup& g = st_.groups[i];
      if (g.data_len == want_) continue;
      for (int r : g.ranks) {
        if (odd < 0 || r < odd) {
          odd = r;
          got = g.data_len;
        }
      }
    }
    if (odd >= 0) return MissingDataError(mine_, me_, odd, got, want_);
  }
  for (size_t i = 0; i < st_.n_groups; ++i) {
    const SigGroup& g = st_.groups[i];
    if (std::find(g.ranks.begin(), g.ranks.end(), 0) == g.ranks.end()) continue;
    agreed = SignatureProposal(g.sig);
    agreed_streams = SignatureStreams(g.sig);
    agreed_codec = SignatureCodec(g.sig);
  }
  if (want_ > 0) {
    if (!valid_) {  // equal signatures and lengths, yet a peer sent no partial result
      return absl::DataLossError(absl::StrCat("op ", mine_.seq, ": rank ", me_,
                                              " got no partial result from its peers"));
    }
    std::memcpy(fused_->data, Inbox() + st_.slots[msg_slot_].offset + sizeof(RdPrefix), want_);
    if (fused_->op == ReduceOp::kAvg) {
      fused_->reduce().Divide(fused_->dtype, fused_->data, fused_->count, n_);
    }
  }
  return absl::OkStatus();
}

}  // namespace signature_internal
}  // namespace gradsync
