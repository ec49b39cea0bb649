// The one validator of an op (OpDesc, common/op_desc.h): the C API, the C++
// SDK and gradsyncd (the gRPC Submit and the shared-memory op queue) all run
// these checks, so a bad op gets the same words wherever it is caught. Each
// message starts with the op ("allreduce 'grad/w' on rank 2: ...") and names
// the value and what was expected. The SDK runs them before anything is sent;
// the daemon runs them again, since any process may talk to it.
//
// It lives in collective/ because it checks the requested plan
// (collective/plan_code.h); it links nothing else of the collectives.
#ifndef GRADSYNC_COLLECTIVE_OP_VALIDATION_H_
#define GRADSYNC_COLLECTIVE_OP_VALIDATION_H_

#include <cstdint>
#include <optional>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "common/op_desc.h"

namespace gradsync {

// What an op is checked against. The views must outlive the call.
struct OpContext {
  int rank = -1;  // the submitting rank, for the messages; -1: not known
  int world_size = 1;
  absl::string_view job_id;
  absl::string_view job_algorithm;  // forced for the job; "" = cost model
  absl::string_view job_codec;      // the job's codec (collective/codec_request.h); "" = none
  // What only gradsyncd knows (the SDK leaves them unset: not checked).
  std::optional<bool> has_ps;               // the epoch has parameter-server shards
  std::optional<bool> one_rank_per_daemon;  // no two ranks share a daemon ("hier" has nothing to do)
};

// What the checks found.
struct OpShape {
  uint64_t bytes = 0;     // of the op in its buffer (count x element size x blocks)
  uint64_t blocks = 1;    // world size for the blocked collectives, else 1
  uint8_t plan_code = 0;  // RequestedPlanCode
  uint8_t codecs = 0;     // the op's CodecRequest code (its own, else the job's)
  uint64_t sparse = 0;    // and its top-k parameters (SparseSpec::Code; 0: none)
};

// The largest op, in bytes of its buffer.
inline constexpr uint64_t kMaxOpBytes = uint64_t{1} << 40;

// Everything but the buffer's size, in this order: the collective, dtype
// and reduce op values, the root for the rooted collectives (CheckOpValues),
// the name's length, the timeout (finite, >= 0), a buffer for every op but a barrier
// (a barrier without one has count 0), the op's size (<= kMaxOpBytes), the
// requested plan for this collective and size, the codec (one the op names
// must apply to it: codecs_request.h), and against the job ("ps"
// needs shards, "hier" ranks that share a daemon) where `ctx` knows it.
// InvalidArgument.
absl::StatusOr<OpShape> ValidateOp(const OpDesc& op, const OpContext& ctx);

// The op (as ValidateOp measured it) in a buffer of `buffer_bytes`: the
// offset a multiple of the element size, and the op's bytes inside the
// buffer. InvalidArgument saying how many elements would fit.
absl::Status CheckOpBuffer(const OpDesc& op, const OpContext& ctx, const OpShape& shape,
                           uint64_t buffer_bytes);

// The first of ValidateOp's checks, on an op's own values: the collective,
// dtype and reduce op are valid values and, for broadcast, reduce, gather and scatter, `root`
// is a rank of ctx.world_size. Also run by RunCollective
// (collective/collectives.h) for callers that come without the SDK or the
// daemon (tests, benchmarks, the parameter server). `name` may be empty.
absl::Status CheckOpValues(CollectiveKind kind, DType dtype, ReduceOp op, int root,
                           const OpContext& ctx, absl::string_view name = "");

// The edges that carry the enums as wider integers (the C API's int32, the
// protobuf's enums) narrow them with this: sets op->kind/dtype/op, or
// InvalidArgument with ValidateOp's words for a value that is not valid (a
// plain cast could wrap 257 to a valid byte). op->name must be set first.
absl::Status SetOpEnums(int kind, int dtype, int reduce_op, const OpContext& ctx, OpDesc* op);

}  // namespace gradsync

#endif  // GRADSYNC_COLLECTIVE_OP_VALIDATION_H_
