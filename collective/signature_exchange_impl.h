// Internal to signature_exchange.cc and signature_rd.cc: the two exchange
// patterns (all-to-all, recursive doubling) and the memory they keep across
// ops. Not for other users.
#ifndef GRADSYNC_COLLECTIVE_SIGNATURE_EXCHANGE_IMPL_H_
#define GRADSYNC_COLLECTIVE_SIGNATURE_EXCHANGE_IMPL_H_

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "collective/signature_exchange.h"
#include "common/status_macros.h"
#include "transport/memory.h"
#include "transport/transport.h"

namespace gradsync {

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

// One op's exchange in either pattern, run in steps (CheckSignatures drives it).
class ExchangeImpl {
 public:
  virtual ~ExchangeImpl() = default;
  // Done (true), `until` passed (false), or the exchange failed.
  virtual absl::StatusOr<bool> Advance(absl::Time until) = 0;
  // The error for the op's deadline, which passed before it was done.
  virtual absl::Status TimedOut() const = 0;
  uint8_t agreed = OpSignature::kNoAlgorithm;
  uint8_t agreed_streams = 0;
  uint8_t agreed_codec = 0;
  // The job ranks each participant stands for (its deadline error names
  // them), or null: the participants are the ranks.
  const std::vector<std::vector<int>>* participants = nullptr;
};


// Data start at a multiple of 16 in every message, so the reductions read
// aligned elements (the inbox slots are 16-byte aligned).
constexpr size_t kDataAlign = 16;
inline size_t AlignUp(size_t x) { return (x + kDataAlign - 1) / kDataAlign * kDataAlign; }
// A slot for the longest signature, rounded up to the alignment.
constexpr size_t kMaxSignatureBytes =
    (kMaxEncodedSignatureBytes + kDataAlign - 1) / kDataAlign * kDataAlign;
static_assert(kMaxSignatureBytes % kDataAlign == 0, "slots stay aligned");

inline size_t EncodedLength(const char* msg, size_t len) { return EncodedSignatureLength(msg, len); }
inline bool SameOp(absl::string_view a, absl::string_view b) { return SameSignature(a, b); }

absl::Status MissingDataError(const OpSignature& mine, int me, int peer, size_t got, size_t want);
absl::Status DeadlineError(const OpSignature& mine, int me, const std::vector<int>& missing,
                           int through, const std::vector<std::vector<int>>* participants);

}  // namespace signature_internal

struct SignatureScratch::State {
  // Host memory registered with the context (again only when it grows or
  // the context changes).
  transport::Scratch in;   // what arrives (and, for recursive doubling, what leaves)
  transport::Scratch out;  // all-to-all: what leaves
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

namespace signature_internal {

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
inline size_t Pad4(size_t x) { return (x + 3) / 4 * 4; }
// Room for the groups of a message that describes up to `ranks` ranks.
inline size_t GroupsCap(int ranks) {
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
  char* Inbox() const { return st_.in.data(); }

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

}  // namespace signature_internal
}  // namespace gradsync

#endif  // GRADSYNC_COLLECTIVE_SIGNATURE_EXCHANGE_IMPL_H_
