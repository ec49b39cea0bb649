// What every rank must agree on before an op moves data, and the check.
#ifndef GRADSYNC_COLLECTIVE_OP_SIGNATURE_H_
#define GRADSYNC_COLLECTIVE_OP_SIGNATURE_H_

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "collective/algorithm.h"
#include "common/types.h"
#include "transport/transport.h"

namespace gradsync {

// CollectiveKind and CollectiveName live in common/types.h.

inline constexpr size_t kMaxOpNameBytes = 256;

struct OpSignature {
  uint64_t seq = 0;
  CollectiveKind kind = CollectiveKind::kAllreduce;
  DType dtype = DType::kF32;
  ReduceOp op = ReduceOp::kSum;
  uint64_t count = 0;
  int32_t root = 0;  // broadcast and reduce; 0 for the others
  std::string name;
  // The algorithm forced for this op (a code, see AlgorithmCode), compared
  // like every field above: ranks forcing different algorithms is a mismatch.
  uint8_t forced = kNoAlgorithm;
  // This rank's proposed algorithm (its cost model's choice). NOT compared:
  // every rank runs rank 0's proposal, so ranks whose link estimates drifted
  // apart still agree (see CheckSignatures' `agreed`).
  uint8_t proposal = kNoAlgorithm;
  // This rank's proposed TCP stream count for the op (collective/stream_tuner.h;
  // 0: no proposal, keep the current one). NOT compared; rank 0's wins.
  uint8_t streams = 0;

  static constexpr uint8_t kNoAlgorithm = kAutoCode;

  // e.g. "allreduce 'layer1.grad' f32[1024] sum", "broadcast 'w' f32[10] root 2",
  // "reduce 'g' f32[10] sum root 3", "allgather 'p' bf16[512]", "barrier 'step'".
  // The reduce op is shown only for reducing collectives, the root only for
  // rooted ones, dtype and count for all but barrier.
  std::string Describe() const;
  std::string Encode() const;
  // Encode into `out`, reusing its capacity.
  void EncodeTo(std::string* out) const;
  static absl::StatusOr<OpSignature> Decode(const std::string& bytes);
  bool operator==(const OpSignature& o) const;
};

// Every rank's encoded signature (index = rank): OK if all are equal (the
// proposals aside), else the InvalidArgument every rank returns alike, naming
// the ranks and both signatures, e.g. "op 5 does not match across ranks:
// rank 2 submitted allreduce 'g' f32[1000] sum, ranks 0,1,3 submitted
// allreduce 'g' f32[1024] sum".
absl::Status CompareSignatures(uint64_t seq, const std::vector<std::string>& encoded_by_rank);
// The `proposal` field of an encoded signature (kNoAlgorithm if malformed).
uint8_t SignatureProposal(absl::string_view encoded);
// The `streams` field of an encoded signature (0 if malformed).
uint8_t SignatureStreams(absl::string_view encoded);

// An allreduce whose data ride in the signature messages (oneshot, in the
// daemon): one exchange does both. On success `data` holds the result, the
// same bits on every rank; on any error it is left as it was. The order of
// the reduction follows the exchange's pattern (SignaturePatternFor in
// collective/algorithm.h):
//   - all-to-all: every rank combines the n contributions in rank order,
//     ((x0 OP x1) OP x2) ... (ReduceInRankOrder in collectives.h);
//   - recursive doubling: every round combines two halves' partial results,
//     the lower-ranked half's as the first operand, e.g. at 4 ranks
//     (x0 OP x1) OP (x2 OP x3); folded ranks first combine into their
//     partner, x0 OP x4 at 5 ranks.
// avg sums and divides by n once at the end. Every receive has room for the
// signatures plus kOneShotMaxBytes, so a peer that sent data when this rank
// did not (or the reverse) is still read whole: a signature mismatch stays
// an InvalidArgument with the streams intact, and so do equal signatures
// with data from some ranks only (ranks that disagree on running oneshot).
struct FusedAllreduce {
  void* data = nullptr;
  DType dtype = DType::kF32;
  ReduceOp op = ReduceOp::kSum;
  uint64_t count = 0;  // count * DTypeSize(dtype) <= kOneShotMaxBytes
};

// What CheckSignatures keeps from one op to the next, so that a small op
// allocates nothing: the receive and send memory with their registrations
// (a transport registers memory once, not per op), the recursive-doubling
// schedule of this rank, and the bookkeeping of the signatures it learns.
// One per thread that runs ops (a session's executor); not thread-safe. It
// may serve several contexts one after the other (a registration is redone
// when the context or the memory changes).
class SignatureScratch {
 public:
  SignatureScratch();
  ~SignatureScratch();
  SignatureScratch(const SignatureScratch&) = delete;
  SignatureScratch& operator=(const SignatureScratch&) = delete;

  struct State;  // collective/op_signature.cc
  State& state() { return *state_; }

 private:
  std::unique_ptr<State> state_;
};

namespace signature_internal {
class ExchangeImpl;
}  // namespace signature_internal

// One op's signature exchange (CheckSignatures), run in steps: Start posts
// this rank's receives and first message, Advance moves it on until it is
// done or a given time passes. A caller can do other work in between (the
// client's direct path runs an exchange inside its session's calls). An
// exchange is one op's; Start again for the next (after this one is done or
// failed: a failed exchange leaves its context failed or out of step, except
// for a mismatch, which keeps the streams intact). Not thread-safe.
class SignatureExchange {
 public:
  SignatureExchange();
  ~SignatureExchange();
  SignatureExchange(const SignatureExchange&) = delete;
  SignatureExchange& operator=(const SignatureExchange&) = delete;

  // Begins `mine`'s exchange on `ctx` in `pattern`, with `on_arrival` and
  // `fused` as CheckSignatures takes them. `ctx`, `mine`, `fused` (with its
  // data) and `scratch` must outlive the exchange; `scratch` is required
  // with `fused`.
  absl::Status Start(transport::Context& ctx, const OpSignature& mine, SignaturePattern pattern,
                     std::function<void(int rank)> on_arrival, FusedAllreduce* fused,
                     SignatureScratch* scratch);
  // Moves the exchange on until it is done (true) or `until` passes (false;
  // a past `until` looks once without waiting). Errors as CheckSignatures'.
  absl::StatusOr<bool> Advance(absl::Time until);
  // The error when the op's deadline passed first: the ranks not heard from
  // (CheckSignatures' deadline error).
  absl::Status TimedOut() const;
  // Once done: rank 0's proposals.
  uint8_t agreed() const { return agreed_; }
  uint8_t agreed_streams() const { return agreed_streams_; }

  static constexpr size_t kImplBytes = 160;

 private:
  void Reset();

  alignas(std::max_align_t) unsigned char storage_[kImplBytes];
  signature_internal::ExchangeImpl* impl_ = nullptr;  // in storage_, or null
  std::unique_ptr<SignatureScratch> local_scratch_;   // when Start got none
  std::function<void(int rank)> on_arrival_;
  bool done_ = false;
  uint8_t agreed_ = OpSignature::kNoAlgorithm;
  uint8_t agreed_streams_ = 0;
};

// Sends `mine` to the peers and learns theirs, on the op's control slot, in
// `pattern` (every rank of a context must use the same; a world of 2 is the
// same exchange either way): all-to-all (one round, one message each way per
// peer) or recursive doubling (log2 n rounds of one message each way; a message carries every
// signature its sender knows, grouped, so every rank learns all n).
// `on_arrival(rank)`, if set, is called (on this thread) as each rank's
// signature becomes known here: the straggler signal for status and metrics.
// If any two ranks' signatures differ, every rank returns the same
// InvalidArgument (CompareSignatures); transport errors come back as they are.
// On success `agreed`, if set, receives rank 0's proposal, and
// `agreed_streams`, if set, rank 0's stream count proposal.
// `fused`: an allreduce to run in the same exchange (see FusedAllreduce);
// when null, a peer that sent data is an error. `scratch`: memory reused
// across ops (see SignatureScratch); required with `fused`.
// On a deadline the error names the ranks whose signatures have not reached
// this rank ("timed out at rank 1 waiting for rank(s) 2,3 to submit op 5
// (...)"); with recursive doubling it also names the peer they come through.
absl::Status CheckSignatures(transport::Context& ctx, const OpSignature& mine,
                             SignaturePattern pattern, absl::Time deadline,
                             const std::function<void(int rank)>& on_arrival = nullptr,
                             uint8_t* agreed = nullptr, FusedAllreduce* fused = nullptr,
                             SignatureScratch* scratch = nullptr,
                             uint8_t* agreed_streams = nullptr);

}  // namespace gradsync

#endif  // GRADSYNC_COLLECTIVE_OP_SIGNATURE_H_
