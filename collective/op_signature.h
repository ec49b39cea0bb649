// What every rank must agree on before an op moves data, and the check.
#ifndef GRADSYNC_COLLECTIVE_OP_SIGNATURE_H_
#define GRADSYNC_COLLECTIVE_OP_SIGNATURE_H_

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
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

  static constexpr uint8_t kNoAlgorithm = kAutoCode;

  // e.g. "allreduce 'layer1.grad' f32[1024] sum", "broadcast 'w' f32[10] root 2",
  // "reduce 'g' f32[10] sum root 3", "allgather 'p' bf16[512]", "barrier 'step'".
  // The reduce op is shown only for reducing collectives, the root only for
  // rooted ones, dtype and count for all but barrier.
  std::string Describe() const;
  std::string Encode() const;
  static absl::StatusOr<OpSignature> Decode(const std::string& bytes);
  bool operator==(const OpSignature& o) const;
};

// Sends `mine` to every peer and receives theirs (one small message each way
// per peer, on the op's control slot). If any rank disagrees, returns the same
// InvalidArgument on every rank, naming the ranks and both signatures, e.g.
// "op 5 does not match across ranks: rank 2 submitted allreduce 'g' f32[1000]
// sum, ranks 0,1,3 submitted allreduce 'g' f32[1024] sum". Transport errors
// and the deadline come back as they are.
// The check itself, given every rank's encoded signature (index = rank):
// OK if all are equal, else the InvalidArgument described above.
absl::Status CompareSignatures(uint64_t seq, const std::vector<std::string>& encoded_by_rank);
// The `proposal` field of an encoded signature (kNoAlgorithm if malformed).
uint8_t SignatureProposal(const std::string& encoded);

// Data that rides with the signatures (oneshot): this rank sends `bytes`
// bytes from `data` right after its signature (padded to 16 bytes), in the
// same message, and on success `received[p]` points at rank p's `bytes` bytes
// (16-byte aligned; p != me; null for me), inside CheckSignatures' `inbox`. Every receive has room for a
// signature plus kOneShotMaxBytes, so a peer that sent data when this rank did
// not (or the reverse) is still read whole: a signature mismatch stays an
// InvalidArgument with the streams intact, and so does equal signatures with
// data from some ranks only (ranks that disagree on running oneshot).
struct EagerData {
  const void* data = nullptr;
  size_t bytes = 0;  // <= kOneShotMaxBytes
  std::vector<const char*> received;  // out
};

// `on_arrival(rank)`, if set, is called (on this thread) as each peer's
// signature arrives: the straggler signal for status and metrics.
// On success `agreed`, if set, receives rank 0's proposal.
// `eager`: data to exchange with the signatures (see EagerData); when null, a
// peer that sent data is an error. `inbox`: receive memory reused across ops
// (grown as needed); required with `eager`, whose pointers point into it.
absl::Status CheckSignatures(transport::Context& ctx, const OpSignature& mine,
                             absl::Time deadline,
                             const std::function<void(int rank)>& on_arrival = nullptr,
                             uint8_t* agreed = nullptr, EagerData* eager = nullptr,
                             std::vector<char>* inbox = nullptr);

}  // namespace gradsync

#endif  // GRADSYNC_COLLECTIVE_OP_SIGNATURE_H_
