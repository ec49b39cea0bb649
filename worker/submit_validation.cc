#include "worker/submit_validation.h"

#include <string>

#include "absl/strings/str_cat.h"
#include "collective/op_validation.h"
#include "transport/wire.h"

namespace gradsync {

absl::StatusOr<OpDesc> OpDescFromRequest(const v1::SubmitRequest& req, int rank) {
  OpDesc op;
  op.name = req.name();
  OpContext ctx;
  ctx.rank = rank;
  absl::Status enums = SetOpEnums(req.collective(), req.dtype(), req.reduce_op(), ctx, &op);
  if (!enums.ok()) return enums;
  op.root = req.root();
  op.tag = req.tag();
  if (op.op == ReduceOp::kPremulSum && !req.has_premul_factor()) {
    return absl::InvalidArgumentError(absl::StrCat(
        CollectiveName(op.kind), " '", op.name, "' on rank ", rank,
        ": reduce op premul_sum needs premul_factor (this rank's multiplier)"));
  }
  op.premul_factor = req.has_premul_factor() ? req.premul_factor() : 1.0;
  op.count = req.count();
  op.buffer_id = req.buffer_id();
  op.offset_bytes = req.offset_bytes();
  op.algorithm = req.algorithm();
  op.codec = req.codec();
  op.timeout = absl::Milliseconds(req.timeout_ms());
  return op;
}

absl::Status CheckSessionShape(int world_size, int rank, int tcp_streams) {
  if (world_size < 1 || world_size > transport::kMaxWorldSize) {
    return absl::InvalidArgumentError(absl::StrCat("world_size ", world_size, " out of range [1, ",
                                                   transport::kMaxWorldSize, "]"));
  }
  if (tcp_streams < 0 || tcp_streams > 16) {
    return absl::InvalidArgumentError(
        absl::StrCat("tcp_streams ", tcp_streams, " out of range [0, 16]"));
  }
  if (rank < -1 || rank >= world_size) {
    return absl::InvalidArgumentError(
        absl::StrCat("rank ", rank, " out of range for world size ", world_size, " (-1 = any)"));
  }
  return absl::OkStatus();
}

}  // namespace gradsync
