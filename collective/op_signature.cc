#include "collective/op_signature.h"

#include <cstddef>
#include <cstring>
#include <algorithm>
#include <map>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "collective/collectives.h"
#include "kernels/cpu_reduce.h"
#include "common/clock.h"
#include "common/status_macros.h"
#include "transport/wire.h"

namespace gradsync {

std::string OpSignature::Describe() const {
  std::string out = absl::StrCat(CollectiveName(kind), " '", name, "'");
  if (kind != CollectiveKind::kBarrier) {
    absl::StrAppend(&out, " ", DTypeName(dtype), "[", count, "]");
  }
  if (IsReducingCollective(kind)) absl::StrAppend(&out, " ", ReduceOpName(op));
  if (IsRootedCollective(kind)) absl::StrAppend(&out, " root ", root);
  if (forced != kNoAlgorithm) absl::StrAppend(&out, " algo ", AlgorithmCodeName(forced));
  return out;
}

namespace {
// The encoded form: this header, then the name bytes (at most kMaxOpNameBytes).
struct PackedSignature {
  uint64_t seq;
  uint64_t count;
  uint8_t kind;
  uint8_t dtype;
  uint8_t op;
  uint8_t forced;  // compared
  uint32_t name_len;
  int32_t root;
  uint8_t proposal;  // not compared (CompareSignatures masks it)
  uint8_t streams;   // not compared either
  uint8_t reserved[2];
};
constexpr size_t kProposalOffset = offsetof(PackedSignature, proposal);
constexpr size_t kStreamsOffset = offsetof(PackedSignature, streams);
static_assert(kStreamsOffset == kProposalOffset + 1, "the two uncompared bytes are adjacent");
constexpr size_t kUncompared = 2;  // bytes from kProposalOffset
static_assert(sizeof(PackedSignature) == 32, "packed signature layout");
}  // namespace

std::string OpSignature::Encode() const {
  std::string out;
  EncodeTo(&out);
  return out;
}

void OpSignature::EncodeTo(std::string* out) const {
  PackedSignature p{seq,
                    count,
                    static_cast<uint8_t>(kind),
                    static_cast<uint8_t>(dtype),
                    static_cast<uint8_t>(op),
                    forced,
                    static_cast<uint32_t>(name.size()),
                    root,
                    proposal,
                    streams,
                    {0, 0}};
  out->resize(sizeof(p) + name.size());
  std::memcpy(out->data(), &p, sizeof(p));
  std::memcpy(out->data() + sizeof(p), name.data(), name.size());
}

absl::StatusOr<OpSignature> OpSignature::Decode(const std::string& bytes) {
  PackedSignature p;
  if (bytes.size() < sizeof(p)) return absl::DataLossError("short op signature");
  std::memcpy(&p, bytes.data(), sizeof(p));
  if (p.name_len > kMaxOpNameBytes || bytes.size() != sizeof(p) + p.name_len ||
      !IsValidDType(p.dtype) || !IsValidReduceOp(p.op) || !IsValidCollective(p.kind)) {
    return absl::DataLossError("malformed op signature");
  }
  OpSignature s;
  s.seq = p.seq;
  s.count = p.count;
  s.kind = static_cast<CollectiveKind>(p.kind);
  s.dtype = static_cast<DType>(p.dtype);
  s.op = static_cast<ReduceOp>(p.op);
  s.root = p.root;
  s.forced = p.forced;
  s.proposal = p.proposal;
  s.streams = p.streams;
  s.name = bytes.substr(sizeof(p));
  return s;
}

bool OpSignature::operator==(const OpSignature& o) const {
  return seq == o.seq && kind == o.kind && dtype == o.dtype && op == o.op && count == o.count &&
         root == o.root && name == o.name && forced == o.forced;
}

uint8_t SignatureProposal(absl::string_view encoded) {
  if (encoded.size() < sizeof(PackedSignature)) return OpSignature::kNoAlgorithm;
  return static_cast<uint8_t>(encoded[kProposalOffset]);
}

uint8_t SignatureStreams(absl::string_view encoded) {
  if (encoded.size() < sizeof(PackedSignature)) return 0;
  return static_cast<uint8_t>(encoded[kStreamsOffset]);
}

namespace {
// Data start at a multiple of 16 in every message, so the reductions read
// aligned elements (the inbox slots are 16-byte aligned).
constexpr size_t kDataAlign = 16;
size_t AlignUp(size_t x) { return (x + kDataAlign - 1) / kDataAlign * kDataAlign; }
constexpr size_t kMaxSignatureBytes = sizeof(PackedSignature) + kMaxOpNameBytes;
static_assert(kMaxSignatureBytes % kDataAlign == 0, "slots stay aligned");

// The length of the encoded signature at the start of a message (the rest is
// data); the whole message if it is too short to say, so that the comparison
// reports it as malformed.
size_t EncodedLength(const char* msg, size_t len) {
  if (len < sizeof(PackedSignature)) return len;
  PackedSignature p;
  std::memcpy(&p, msg, sizeof(p));
  if (p.name_len > kMaxOpNameBytes || sizeof(p) + p.name_len > len) return len;
  return sizeof(p) + p.name_len;
}

// Two encoded signatures compared with their proposals masked, as
// CompareSignatures compares them.
bool SameOp(absl::string_view a, absl::string_view b) {
  if (a.size() != b.size()) return false;
  if (a.size() < kProposalOffset + kUncompared) return a == b;
  constexpr size_t kAfter = kProposalOffset + kUncompared;
  return std::memcmp(a.data(), b.data(), kProposalOffset) == 0 &&
         std::memcmp(a.data() + kAfter, b.data() + kAfter, a.size() - kAfter) == 0;
}

absl::Status MissingDataError(const OpSignature& mine, int me, int peer, size_t got, size_t want) {
  return absl::InvalidArgumentError(absl::StrCat(
      "op ", mine.seq, " (", mine.Describe(), "): rank ", peer, " sent ", got,
      " bytes of data with its signature; rank ", me, " expected ", want,
      " (the ranks disagree on whether the op runs oneshot)"));
}

absl::Status DeadlineError(const OpSignature& mine, int me, const std::vector<int>& missing,
                           int through) {
  std::string msg = absl::StrCat("timed out at rank ", me, " waiting for rank(s) ",
                                 absl::StrJoin(missing, ","), " to submit op ", mine.seq, " (",
                                 mine.Describe(), ")");
  if (through >= 0 && (missing.size() > 1 || missing.front() != through)) {
    absl::StrAppend(&msg, "; their signatures come through rank ", through,
                    " (recursive doubling), so some of them may have submitted and wait for "
                    "the others");
  }
  return absl::DeadlineExceededError(msg);
}

}  // namespace

// ---- What CheckSignatures keeps across ops (SignatureScratch).
namespace signature_internal {

// Recursive doubling: how a received message is taken in.
enum class Take {
  kLower,  // combine; this rank's half comes first
  kUpper,  // combine; the peer's half comes first
  kAdopt,  // the final result from the rank this one is folded into
};
struct RdStep {
  int peer = 0;
  uint64_t round = 0;  // the tag's offset field: the same on both sides
  bool send = false;
  bool recv = false;
  Take take = Take::kLower;
  int ranks_in = 0;  // the most ranks the incoming message can describe
  size_t slot = 0;   // the receive's slot in the inbox
  transport::Request sreq, rreq;
  bool announced = false;  // its ranks passed to on_arrival already
};
struct RdSlot {
  size_t offset;
  size_t cap;
};
// Ranks whose signatures (and data lengths) are equal. The signature lives
// in `sig`, whose capacity is kept from op to op.
struct SigGroup {
  std::string sig;
  uint32_t data_len = 0;
  std::vector<int> ranks;
};
// One rank's entry in a received message.
struct RdEntry {
  int rank;
  const char* sig;
  uint32_t sig_len;
  uint32_t data_len;
};

// One op's exchange in either pattern, run in steps (SignatureExchange).
class ExchangeImpl {
 public:
  virtual ~ExchangeImpl() = default;
  // Done (true), `until` passed (false), or the exchange failed.
  virtual absl::StatusOr<bool> Advance(absl::Time until) = 0;
  // The error for the op's deadline, which passed before it was done.
  virtual absl::Status TimedOut() const = 0;
  uint8_t agreed = OpSignature::kNoAlgorithm;
  uint8_t agreed_streams = 0;
};

}  // namespace signature_internal

struct SignatureScratch::State {
  // Memory registered with a context; registered again only when the
  // context or the memory changes.
  struct Registered {
    std::vector<char> bytes;
    std::unique_ptr<transport::MemoryRegion> mr;
    const transport::Context* ctx = nullptr;
  };
  // `r` with at least `size` bytes, registered with `ctx`.
  static absl::StatusOr<const transport::MemoryRegion*> Register(transport::Context& ctx,
                                                                 Registered& r, size_t size) {
    if (r.bytes.size() < size) {
      r.bytes.resize(size);
      r.mr.reset();
    }
    if (r.mr == nullptr || r.ctx != &ctx || r.mr->data() != r.bytes.data() ||
        r.mr->size() != r.bytes.size()) {
      r.mr.reset();
      ASSIGN_OR_RETURN(r.mr, ctx.RegisterMemory(r.bytes.data(), r.bytes.size()));
      r.ctx = &ctx;
    }
    return r.mr.get();
  }

  Registered in;   // what arrives (and, for recursive doubling, what leaves)
  Registered out;  // all-to-all: what leaves
  std::string my_sig;

  // All-to-all.
  std::vector<transport::Request> sends, recvs;
  std::vector<uint8_t> reported;
  std::vector<size_t> data_len, data_at;
  std::vector<const char*> peers;
  std::vector<char> own;

  // Recursive doubling: this rank's schedule, built for (rd_n, rd_me).
  int rd_n = 0, rd_me = -1;
  std::vector<signature_internal::RdStep> steps;
  std::vector<signature_internal::RdSlot> slots;  // [0] own first message, [1..] receives, back() spill
  size_t inbox_bytes = 0;
  // What this rank knows of the op: groups_[0, n_groups) are in use (the
  // rest keep their capacity for the next op).
  std::vector<signature_internal::SigGroup> groups;
  size_t n_groups = 0;
  std::vector<uint8_t> known, announced, was_known, seen, heard;
  std::vector<signature_internal::RdEntry> entries;
  std::vector<int> arrived;
};

SignatureScratch::SignatureScratch() : state_(std::make_unique<State>()) {}
SignatureScratch::~SignatureScratch() = default;

namespace {
using signature_internal::RdEntry;
using signature_internal::RdSlot;
using signature_internal::RdStep;
using signature_internal::SigGroup;
using signature_internal::ExchangeImpl;
using signature_internal::Take;

// What both patterns hold: the op, where it goes, and the scratch state.
class ExchangeBase : public ExchangeImpl {
 public:  // (the patterns inherit it; the class stays abstract)
  ExchangeBase(transport::Context& ctx, const OpSignature& mine,
               const std::function<void(int rank)>& on_arrival, FusedAllreduce* fused,
               SignatureScratch::State& st)
      : ctx_(ctx), mine_(mine), on_arrival_(on_arrival), fused_(fused), st_(st),
        n_(ctx.size()), me_(ctx.rank()),
        want_(fused != nullptr ? fused->count * DTypeSize(fused->dtype) : 0) {}

 protected:
  transport::Context& ctx_;
  const OpSignature& mine_;
  const std::function<void(int rank)>& on_arrival_;
  FusedAllreduce* fused_;  // null: a signature only
  SignatureScratch::State& st_;
  const int n_, me_;
  const size_t want_;  // this rank's data bytes (fused)
};

// ---- All-to-all: every rank sends its signature (and fused data) to every
// other rank, one round.
class AllToAll final : public ExchangeBase {
 public:
  using ExchangeBase::ExchangeBase;

  absl::Status Start();
  absl::StatusOr<bool> Advance(absl::Time until) override;
  absl::Status TimedOut() const override;

 private:
  static constexpr size_t kCap = kMaxSignatureBytes + kOneShotMaxBytes;
  static_assert(kCap % kDataAlign == 0, "inbox slots stay aligned");
  bool AllDone() const;
  void Report();
  // Every message is in: compare, reduce.
  absl::Status Finish();

};

absl::Status AllToAll::Start() {
  mine_.EncodeTo(&st_.my_sig);
  const size_t sig_len = st_.my_sig.size();
  const size_t out_len = want_ > 0 ? AlignUp(sig_len) + want_ : sig_len;
  ASSIGN_OR_RETURN(const transport::MemoryRegion* in_mr,
                   SignatureScratch::State::Register(ctx_, st_.in, kCap * n_));
  ASSIGN_OR_RETURN(const transport::MemoryRegion* out_mr,
                   SignatureScratch::State::Register(ctx_, st_.out, kCap));
  char* const outbox = st_.out.bytes.data();
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
  return DeadlineError(mine_, me_, missing, -1);
}

absl::Status AllToAll::Finish() {
  const char* const in = st_.in.bytes.data();
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
    ReduceInRankOrder(fused_->dtype, fused_->op, fused_->data, fused_->count, me_, st_.peers,
                      &st_.own);
  }
  const absl::string_view rank0 =
      me_ == 0 ? my_sig : absl::string_view(in, EncodedLength(in, st_.recvs[0].bytes));
  agreed = SignatureProposal(rank0);
  agreed_streams = SignatureStreams(rank0);
  return absl::OkStatus();
}

// ---- Recursive doubling. Ranks [0, p) (p the largest power of two <= n)
// exchange with rank ^ 2^k in round k; a rank e >= p first sends to e - p,
// which folds it in, and gets the final message from it at the end. Every
// message is
//   RdPrefix | data_bytes of the sender's partial result | the groups,
// each group an RdGroup header, n_ranks uint32 ranks and sig_len bytes of
// encoded signature (padded to 4): the ranks whose signature (and data
// length) the sender knows, grouped by equal signatures, so a message stays
// small when the ranks agree. A rank's partial result is valid while every
// signature it knows matches its own with the same data length; the data
// ride only then.
constexpr uint32_t kRdMagic = 0x44525347;  // "GSRD"
constexpr uint32_t kRdDataValid = 1;
struct RdPrefix {
  uint32_t magic;
  uint32_t data_bytes;
  uint32_t groups_bytes;
  uint32_t flags;
};
static_assert(sizeof(RdPrefix) == kDataAlign, "data start aligned");
struct RdGroup {
  uint32_t sig_len;
  uint32_t data_len;
  uint32_t n_ranks;
  uint32_t reserved;
};
size_t Pad4(size_t x) { return (x + 3) / 4 * 4; }
// Room for the groups of a message that describes up to `ranks` ranks.
size_t GroupsCap(int ranks) {
  return static_cast<size_t>(ranks) * (sizeof(RdGroup) + 4 + Pad4(kMaxSignatureBytes));
}

class RdExchange final : public ExchangeBase {
 public:
  using ExchangeBase::ExchangeBase;

  absl::Status Start();
  absl::StatusOr<bool> Advance(absl::Time until) override;
  absl::Status TimedOut() const override;

 private:
  // The steps this rank takes and the inbox's slots, built once per (n, me).
  void Plan();
  // Writes the prefix and the groups around the partial result in the message
  // at msg_slot_ (moving it to the spill slot if the groups do not fit) and
  // returns the message's length.
  size_t Build();
  // Checks the message received in `step` and lists its ranks in st_.entries.
  absl::Status Parse(const RdStep& step, RdPrefix* prefix) const;
  // Takes the message received in `step` in: its ranks' signatures, and its
  // data into this rank's partial result.
  absl::Status Merge(const RdStep& step);
  // The ranks this rank has not heard from (for the deadline's error).
  std::vector<int> Unheard() const;
  // Passes every rank named by a message that is in, but of a round still to
  // come, to on_arrival_: they submitted, so the status shows this rank
  // waiting only for the ones it has not heard of (as the deadline's error).
  void AnnounceEarly(size_t current);
  // on_arrival_(rank), once per rank.
  void Announce(int rank);
  void Know(absl::string_view sig, uint32_t data_len, int rank);
  void ForgetAll();
  size_t GroupsBytes() const;
  char* Inbox() const { return st_.in.bytes.data(); }

  int known_count_ = 0;
  bool valid_ = true;
  size_t msg_slot_ = 0;  // the slot holding this rank's partial result
  size_t step_ = 0;      // the step under way
  bool sent_ = false;    // its send is posted
  // Posts the send of step step_, if it has one not yet posted.
  absl::Status PostStepSend();
  // Every message is in: check that the ranks agree, hand out the result.
  absl::Status Finish();
};

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
    const ReduceOp combine = fused_->op == ReduceOp::kAvg ? ReduceOp::kSum : fused_->op;
    switch (step.take) {
      case Take::kLower:  // the result stays where this rank's half is
        ReduceInto(fused_->dtype, combine, mine_data, theirs, fused_->count);
        break;
      case Take::kUpper:  // the lower half comes first (min/max are not
                          // commutative for NaN and signed zero): combine
                          // into the received message, which now holds it
        ReduceInto(fused_->dtype, combine, theirs, mine_data, fused_->count);
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
                   SignatureScratch::State::Register(ctx_, st_.in, st_.inbox_bytes));
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
      ctx_.PostSend(s.peer, *st_.in.mr, st_.slots[msg_slot_].offset, len, tag, &s.sreq));
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
  return DeadlineError(mine_, me_, missing, through);
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
  }
  if (want_ > 0) {
    if (!valid_) {  // equal signatures and lengths, yet a peer sent no partial result
      return absl::DataLossError(absl::StrCat("op ", mine_.seq, ": rank ", me_,
                                              " got no partial result from its peers"));
    }
    std::memcpy(fused_->data, Inbox() + st_.slots[msg_slot_].offset + sizeof(RdPrefix), want_);
    if (fused_->op == ReduceOp::kAvg) DivideBy(fused_->dtype, fused_->data, fused_->count, n_);
  }
  return absl::OkStatus();
}

}  // namespace

static_assert(sizeof(AllToAll) <= SignatureExchange::kImplBytes &&
                  sizeof(RdExchange) <= SignatureExchange::kImplBytes,
              "SignatureExchange::storage_ holds either exchange");
static_assert(alignof(AllToAll) <= alignof(std::max_align_t) &&
                  alignof(RdExchange) <= alignof(std::max_align_t),
              "SignatureExchange::storage_ alignment");

SignatureExchange::SignatureExchange() = default;
SignatureExchange::~SignatureExchange() { Reset(); }

void SignatureExchange::Reset() {
  if (impl_ != nullptr) impl_->~ExchangeImpl();
  impl_ = nullptr;
}

absl::Status SignatureExchange::Start(transport::Context& ctx, const OpSignature& mine,
                                      SignaturePattern pattern,
                                      std::function<void(int rank)> on_arrival,
                                      FusedAllreduce* fused, SignatureScratch* scratch) {
  Reset();
  done_ = false;
  agreed_ = OpSignature::kNoAlgorithm;
  agreed_streams_ = 0;
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
    agreed_ = mine.proposal;
    agreed_streams_ = mine.streams;
    done_ = true;
    return absl::OkStatus();
  }
  if (scratch == nullptr) {
    local_scratch_ = std::make_unique<SignatureScratch>();
    scratch = local_scratch_.get();
  }
  on_arrival_ = std::move(on_arrival);
  // Built in place (no allocation per op); they hold references, so each op
  // constructs anew.
  if (pattern == SignaturePattern::kAllToAll || n == 2) {
    AllToAll* a2a = new (&storage_) AllToAll(ctx, mine, on_arrival_, fused, scratch->state());
    impl_ = a2a;
    return a2a->Start();
  }
  RdExchange* rd = new (&storage_) RdExchange(ctx, mine, on_arrival_, fused, scratch->state());
  impl_ = rd;
  return rd->Start();
}

absl::StatusOr<bool> SignatureExchange::Advance(absl::Time until) {
  if (done_) return true;
  if (impl_ == nullptr) return absl::FailedPreconditionError("no signature exchange started");
  ASSIGN_OR_RETURN(done_, impl_->Advance(until));
  if (done_) {
    agreed_ = impl_->agreed;
    agreed_streams_ = impl_->agreed_streams;
  }
  return done_;
}

absl::Status SignatureExchange::TimedOut() const {
  if (impl_ == nullptr) return absl::DeadlineExceededError("deadline exceeded");
  return impl_->TimedOut();
}

absl::Status CheckSignatures(transport::Context& ctx, const OpSignature& mine,
                             SignaturePattern pattern, absl::Time deadline,
                             const std::function<void(int rank)>& on_arrival,
                             uint8_t* agreed, FusedAllreduce* fused, SignatureScratch* scratch,
                             uint8_t* agreed_streams) {
  SignatureExchange x;
  RETURN_IF_ERROR(x.Start(ctx, mine, pattern, on_arrival, fused, scratch));
  while (true) {
    ASSIGN_OR_RETURN(const bool done, x.Advance(deadline));
    if (done) break;
    if (FastNow() >= deadline) return x.TimedOut();
  }
  if (agreed != nullptr) *agreed = x.agreed();
  if (agreed_streams != nullptr) *agreed_streams = x.agreed_streams();
  return absl::OkStatus();
}

absl::Status CompareSignatures(uint64_t seq, const std::vector<std::string>& encoded_by_rank) {
  // Group ranks by signature; every rank computes the same message.
  std::map<std::string, std::vector<int>> groups;
  for (int p = 0; p < static_cast<int>(encoded_by_rank.size()); ++p) {
    std::string key = encoded_by_rank[p];
    for (size_t i = kProposalOffset; i < kProposalOffset + kUncompared && i < key.size(); ++i) {
      key[i] = 0;  // proposals may differ
    }
    groups[key].push_back(p);
  }
  if (groups.size() <= 1) return absl::OkStatus();
  std::vector<std::pair<std::string, std::vector<int>>> ordered(groups.begin(), groups.end());
  std::stable_sort(ordered.begin(), ordered.end(), [](const auto& a, const auto& b) {
    if (a.second.size() != b.second.size()) return a.second.size() < b.second.size();
    return a.second.front() < b.second.front();
  });
  std::vector<std::string> parts;
  for (const auto& [sig, ranks] : ordered) {
    auto decoded = OpSignature::Decode(sig);
    parts.push_back(absl::StrCat(ranks.size() == 1 ? "rank " : "ranks ", absl::StrJoin(ranks, ","),
                                 " submitted ",
                                 decoded.ok() ? decoded->Describe() : "a malformed signature"));
  }
  return absl::InvalidArgumentError(absl::StrCat("op ", seq, " does not match across ranks: ",
                                                 absl::StrJoin(parts, ", ")));
}

}  // namespace gradsync
