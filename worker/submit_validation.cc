#include "worker/submit_validation.h"

#include <string>

#include "absl/strings/str_cat.h"
#include "collective/op_signature.h"
#include "collective/planner.h"
#include "transport/wire.h"

namespace gradsync {

absl::StatusOr<SubmitArgs> SubmitArgsFromRequest(const v1::SubmitRequest& req) {
  if (!IsValidCollective(req.collective())) {
    return absl::InvalidArgumentError(
        absl::StrCat("invalid collective type ", req.collective(), " for op '", req.name(), "'"));
  }
  if (!IsValidDType(req.dtype())) {
    return absl::InvalidArgumentError(
        absl::StrCat("invalid dtype ", req.dtype(), " for op '", req.name(), "'"));
  }
  if (!IsValidReduceOp(req.reduce_op())) {
    return absl::InvalidArgumentError(
        absl::StrCat("invalid reduce op ", req.reduce_op(), " for op '", req.name(), "'"));
  }
  if (req.timeout_ms() < 0) return absl::InvalidArgumentError("timeout_ms must not be negative");
  SubmitArgs a;
  a.kind = static_cast<CollectiveKind>(req.collective());
  a.root = req.root();
  a.algorithm = req.algorithm();
  a.name = req.name();
  a.dtype = static_cast<DType>(req.dtype());
  a.op = static_cast<ReduceOp>(req.reduce_op());
  a.count = req.count();
  a.buffer_id = req.buffer_id();
  a.offset_bytes = req.offset_bytes();
  a.timeout = absl::Milliseconds(req.timeout_ms());
  return a;
}

absl::StatusOr<SubmitShape> CheckSubmit(const SubmitArgs& a, const SubmitJob& job) {
  // Only error messages use it: built on demand, not for every op.
  auto what = [&a] { return absl::StrCat(CollectiveName(a.kind), " '", a.name, "'"); };
  if (IsRootedCollective(a.kind) && (a.root < 0 || a.root >= job.world_size)) {
    return absl::InvalidArgumentError(absl::StrCat(what(), ": root ", a.root,
                                                   " out of range for world size ",
                                                   job.world_size));
  }
  if (a.name.size() > kMaxOpNameBytes) {
    return absl::InvalidArgumentError(absl::StrCat("op name is ", a.name.size(),
                                                   " bytes; the limit is ", kMaxOpNameBytes));
  }
  SubmitShape shape;
  const uint64_t esize = DTypeSize(a.dtype);
  shape.blocks = IsBlockedCollective(a.kind) ? static_cast<uint64_t>(job.world_size) : 1;
  if (a.count > (uint64_t{1} << 40) / esize / shape.blocks) {
    return absl::InvalidArgumentError(absl::StrCat("count ", a.count, " is too large"));
  }
  shape.bytes = a.count * esize * shape.blocks;
  const absl::string_view algo_name =
      !a.algorithm.empty() && a.algorithm != "auto" ? a.algorithm : job.job_algorithm;
  absl::StatusOr<uint8_t> code = RequestedPlanCode(algo_name, a.kind, shape.bytes);
  if (!code.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(what(), ": ", code.status().message()));
  }
  if (*code == kParameterServerPlanCode && !job.has_ps) {
    return absl::InvalidArgumentError(absl::StrCat(
        what(), ": algorithm 'ps' needs parameter-server shards; job '", job.job_id,
        "' has none (create it with ps_shards > 0 and start gradsync-ps)"));
  }
  if (*code == kHierarchicalPlanCode && job.one_rank_per_daemon) {
    return absl::InvalidArgumentError(absl::StrCat(
        what(), ": algorithm 'hier' needs ranks that share a daemon; job '", job.job_id,
        "' has one rank per daemon"));
  }
  shape.plan_code = *code;
  if (a.timeout < absl::ZeroDuration()) return absl::InvalidArgumentError("negative op timeout");
  if (a.kind == CollectiveKind::kBarrier && a.buffer_id == 0 && a.count != 0) {
    return absl::InvalidArgumentError(what() + ": a barrier without a buffer must have count 0");
  }
  return shape;
}

absl::Status CheckBufferRange(const SubmitArgs& a, const SubmitShape& shape,
                              uint64_t buffer_bytes) {
  if (a.offset_bytes > buffer_bytes || shape.bytes > buffer_bytes - a.offset_bytes) {
    return absl::InvalidArgumentError(absl::StrCat(
        CollectiveName(a.kind), " '", a.name, "': ", DTypeName(a.dtype), "[", a.count, "]",
        shape.blocks > 1 ? absl::StrCat(" x ", shape.blocks, " blocks") : "", " (", shape.bytes,
        " bytes) at offset ", a.offset_bytes, " does not fit in buffer ", a.buffer_id, " of ",
        buffer_bytes, " bytes"));
  }
  const uint64_t esize = DTypeSize(a.dtype);
  if (a.offset_bytes % esize != 0) {
    return absl::InvalidArgumentError(absl::StrCat("offset ", a.offset_bytes,
                                                   " is not a multiple of the ",
                                                   DTypeName(a.dtype), " element size ", esize));
  }
  return absl::OkStatus();
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
