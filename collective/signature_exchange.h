// The op signature exchange: every rank sends its signature (and, for a small
// allreduce, its data) to the others and learns theirs, before the op runs.
#ifndef GRADSYNC_COLLECTIVE_SIGNATURE_EXCHANGE_H_
#define GRADSYNC_COLLECTIVE_SIGNATURE_EXCHANGE_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "collective/algorithm.h"
#include "collective/op_signature.h"
#include "collective/reducer.h"
#include "common/types.h"
#include "transport/transport.h"

namespace gradsync {

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
  const Reducer* reducer = nullptr;  // host memory; null: the CPU's
  const Reducer& reduce() const { return reducer != nullptr ? *reducer : CpuReducer(); }
};

// What CheckSignatures keeps from one op to the next, so that a small op
// allocates nothing: the receive and send memory with their registrations
// (a transport registers memory once, not per op), the recursive-doubling
// schedule of this rank, and the bookkeeping of the signatures it learns.
// One per thread that runs ops (a job's executor); not thread-safe. It
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
// `agreed_streams`, if set, rank 0's stream count proposal, and
// `agreed_codec`, if set, rank 0's codec proposal.
// `fused`: an allreduce to run in the same exchange (see FusedAllreduce);
// when null, a peer that sent data is an error. `scratch`: memory reused
// across ops (see SignatureScratch); required with `fused`.
// On a deadline the error names the ranks whose signatures have not reached
// this rank ("timed out at rank 1 waiting for rank(s) 2,3 to submit op 5
// (...)"); with recursive doubling it also names the peer they come through.
// `participants`: the job ranks each context rank stands for (a daemon's
// ranks, when the exchange runs among daemons), for the deadline's error;
// null: the context's ranks are the job's.
absl::Status CheckSignatures(transport::Context& ctx, const OpSignature& mine,
                             SignaturePattern pattern, absl::Time deadline,
                             const std::function<void(int rank)>& on_arrival = nullptr,
                             uint8_t* agreed = nullptr, FusedAllreduce* fused = nullptr,
                             SignatureScratch* scratch = nullptr,
                             uint8_t* agreed_streams = nullptr,
                             const std::vector<std::vector<int>>* participants = nullptr,
                             uint8_t* agreed_codec = nullptr);

}  // namespace gradsync

#endif  // GRADSYNC_COLLECTIVE_SIGNATURE_EXCHANGE_H_
