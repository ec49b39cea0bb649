// What every rank must agree on before an op moves data, and how two ranks'
// signatures compare. The exchange that carries them: signature_exchange.h.
#ifndef GRADSYNC_COLLECTIVE_OP_SIGNATURE_H_
#define GRADSYNC_COLLECTIVE_OP_SIGNATURE_H_

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "collective/algorithm.h"
#include "common/op_desc.h"
#include "common/types.h"
#include "kernels/codec.h"

namespace gradsync {

// CollectiveKind and CollectiveName live in common/types.h.

// kMaxOpNameBytes (the longest op name) lives in common/types.h.

struct OpSignature {
  uint64_t seq = 0;
  CollectiveKind kind = CollectiveKind::kAllreduce;
  DType dtype = DType::kF32;
  ReduceOp op = ReduceOp::kSum;
  uint64_t count = 0;
  int32_t root = 0;  // broadcast, reduce, gather, scatter; send, recv: the peer
                     // (recv: -1 any source); 0 for the others
  int32_t tag = 0;   // send, recv (never encoded: they are matched by the peers' daemons)
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
  // The codecs the op may use (collective/codec_request.h's code), compared;
  // and this rank's proposed codec (kernels/codec.h), NOT compared: rank 0's
  // wins like its plan.
  uint8_t codecs = 0;
  uint8_t codec = 0;  // Plan::CodecCode (a CodecId, or top-k)
  // The op's top-k parameters (kernels/topk.h SparseSpec::Code; 0: none),
  // compared.
  uint64_t sparse = 0;

  static constexpr uint8_t kNoAlgorithm = kAutoCode;

  // The signature of `op` (seq 0: the session numbers it), with the plan code
  // and codecs its validation gave (ValidateOp's OpShape::plan_code, codecs,
  // sparse). The root only for
  // rooted collectives (and the peer of send and recv), so ranks that leave
  // it unset still match.
  static OpSignature Of(const OpDesc& op, uint8_t plan_code, uint8_t codecs = 0,
                        uint64_t sparse = 0);

  // e.g. "allreduce 'layer1.grad' f32[1024] sum", "broadcast 'w' f32[10] root 2",
  // "reduce 'g' f32[10] sum root 3", "allgather 'p' bf16[512]", "barrier 'step'",
  // "send 'a' f32[8] to rank 1 tag 0", "recv 'a' f32[8] from any rank tag 0".
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
// The `codec` field of an encoded signature (0, none, if malformed).
uint8_t SignatureCodec(absl::string_view encoded);
// The `streams` field of an encoded signature (0 if malformed).
uint8_t SignatureStreams(absl::string_view encoded);

// The length of the encoded signature at the start of a message of `len`
// bytes (the rest is data); `len` if it is too short to say, so that a
// comparison reports it as malformed.
size_t EncodedSignatureLength(const char* msg, size_t len);
// Two encoded signatures compared as CompareSignatures compares them (the
// uncompared proposal fields masked).
bool SameSignature(absl::string_view a, absl::string_view b);
// The longest encoded signature (header and kMaxOpNameBytes of name).
inline constexpr size_t kMaxEncodedSignatureBytes = 40 + kMaxOpNameBytes;

}  // namespace gradsync

#endif  // GRADSYNC_COLLECTIVE_OP_SIGNATURE_H_
