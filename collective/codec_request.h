// Which wire codecs an op may use (kernels/codec.h), as a user names them
// and as an op signature carries them (one byte, compared across ranks).
//
//   ""            the job's codec (for an op), none (for a job)
//   "none"        the values as they are
//   "bf16", ...   that codec. Named on an op it is required: an op it does
//                 not apply to is refused. Named for a job it is the
//                 default of every op it applies to; the others run dense.
//   "auto"        the planner chooses among bf16, fp16, int8 and none, by
//                 modelled time on the measured link (planner.h)
//   "auto:a,b"    the planner chooses among the codecs listed and none.
//                 Under auto the 8-bit codecs (int8, fp8) run only on named
//                 ops, whose quantization loss the daemon feeds back
//                 (worker/error_feedback_store.h).
//   "topk:R[,warmup=N][,momentum=M]"
//                 top-k sparsification with error feedback kept by the
//                 daemon (kernels/topk.h, collective/sparse_allreduce.h);
//                 named only, never chosen by "auto": it changes what the
//                 optimizer sees (values arrive late, and with momentum
//                 correction the momentum is applied here)
//
// Under "auto" (and a job's codec) an op a codec does not apply to runs
// dense; the reason is in the daemon's log at -v.
#ifndef GRADSYNC_COLLECTIVE_CODEC_REQUEST_H_
#define GRADSYNC_COLLECTIVE_CODEC_REQUEST_H_

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "kernels/codec.h"
#include "kernels/topk.h"

namespace gradsync {

struct CodecRequest {
  uint8_t allowed = 0;     // bit i: CodecId i may run (bit 0 unused: none always may)
  bool lenient = false;    // an op the codecs do not apply to runs dense
  bool automatic = false;  // the planner chooses by modelled time (implies lenient)
  SparseSpec topk;         // on: top-k sparsification (allowed is then 0)

  bool none() const { return allowed == 0 && !topk.on(); }
  bool allows(CodecId id) const { return (allowed >> static_cast<int>(id)) & 1; }
  // The one codec of a request that is not automatic.
  CodecId only() const;

  // The signature byte: bits 1..5 the codecs, bit 6 lenient, bit 7 automatic.
  uint8_t Code() const;
  static CodecRequest FromCode(uint8_t code);
  // With the top-k parameters, which a signature carries apart
  // (OpSignature::sparse): topk.Code().
  static CodecRequest FromCodes(uint8_t code, uint64_t sparse);
  // "none", "bf16", "bf16 (job)", "auto:bf16,fp16", "topk:0.01 (job)".
  std::string ToString() const;
};

// Parses an op's codec (`job`: false) or a job's (true): lenient for a job.
// "" gives none. InvalidArgument naming the unknown codec and the choices.
absl::StatusOr<CodecRequest> ParseCodecRequest(absl::string_view text, bool job);

// The request an op runs with: its own codec if it names one, else the job's.
absl::StatusOr<CodecRequest> EffectiveCodecRequest(absl::string_view op_codec,
                                                   absl::string_view job_codec);

}  // namespace gradsync

#endif  // GRADSYNC_COLLECTIVE_CODEC_REQUEST_H_
