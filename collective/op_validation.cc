#include "collective/op_validation.h"

#include <cmath>
#include <string>

#include "absl/strings/str_cat.h"
#include "collective/algorithm.h"
#include "collective/codec_request.h"
#include "collective/plan_code.h"

namespace gradsync {
namespace {

// "allreduce 'grad/w' on rank 2": how every message starts. Built only for
// an error, not for every op. `kind` may be invalid ("op 'g' on rank 2"); an
// empty or too long name is left out.
std::string What(CollectiveKind kind, absl::string_view name, const OpContext& ctx) {
  std::string what = IsValidCollective(static_cast<int>(kind)) ? CollectiveName(kind) : "op";
  if (!name.empty() && name.size() <= kMaxOpNameBytes) absl::StrAppend(&what, " '", name, "'");
  if (ctx.rank >= 0) absl::StrAppend(&what, " on rank ", ctx.rank);
  return what;
}

absl::Status Invalid(const OpDesc& op, const OpContext& ctx, absl::string_view problem) {
  return absl::InvalidArgumentError(absl::StrCat(What(op.kind, op.name, ctx), ": ", problem));
}

// The enum checks on the values as they came (SetOpEnums: before narrowing).
absl::Status CheckEnums(int kind, int dtype, int reduce_op, absl::string_view name,
                        const OpContext& ctx) {
  auto invalid = [&](absl::string_view problem) {
    return absl::InvalidArgumentError(absl::StrCat(
        What(IsValidCollective(kind) ? static_cast<CollectiveKind>(kind) : CollectiveKind{},
             name, ctx),
        ": ", problem));
  };
  if (!IsValidCollective(kind)) {
    return invalid(absl::StrCat("collective ", kind, " is not a valid value (",
                                ValidCollectivesText(), ")"));
  }
  if (!IsValidDType(dtype)) {
    return invalid(absl::StrCat("dtype ", dtype, " is not a valid value (", ValidDTypesText(), ")"));
  }
  if (!IsValidReduceOp(reduce_op)) {
    return invalid(absl::StrCat("reduce op ", reduce_op, " is not a valid value (",
                                ValidReduceOpsText(), ")"));
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status SetOpEnums(int kind, int dtype, int reduce_op, const OpContext& ctx, OpDesc* op) {
  if (absl::Status s = CheckEnums(kind, dtype, reduce_op, op->name, ctx); !s.ok()) return s;
  op->kind = static_cast<CollectiveKind>(kind);
  op->dtype = static_cast<DType>(dtype);
  op->op = static_cast<ReduceOp>(reduce_op);
  return absl::OkStatus();
}

absl::Status CheckOpValues(CollectiveKind kind, DType dtype, ReduceOp op, int root,
                           const OpContext& ctx, absl::string_view name) {
  if (absl::Status s = CheckEnums(static_cast<int>(kind), static_cast<int>(dtype),
                                  static_cast<int>(op), name, ctx);
      !s.ok()) {
    return s;
  }
  if (IsRootedCollective(kind) && (root < 0 || root >= ctx.world_size)) {
    return absl::InvalidArgumentError(
        absl::StrCat(What(kind, name, ctx), ": root ", root, " out of range for world size ",
                     ctx.world_size, " (expected 0..", ctx.world_size - 1, ")"));
  }
  if (IsPointToPoint(kind)) {
    const bool any_source = kind == CollectiveKind::kRecv && root == -1;
    if (!any_source && (root < 0 || root >= ctx.world_size)) {
      return absl::InvalidArgumentError(absl::StrCat(
          What(kind, name, ctx), ": peer rank ", root, " is not in the group of world size ",
          ctx.world_size, " (expected 0..", ctx.world_size - 1,
          kind == CollectiveKind::kRecv ? ", or -1: any source)" : ")"));
    }
    if (ctx.rank >= 0 && root == ctx.rank) {
      return absl::InvalidArgumentError(absl::StrCat(What(kind, name, ctx), ": peer rank ", root,
                                                     " is this rank itself"));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<OpShape> ValidateOp(const OpDesc& op, const OpContext& ctx) {
  if (absl::Status s = CheckOpValues(op.kind, op.dtype, op.op, op.root, ctx, op.name); !s.ok()) {
    return s;
  }
  if (op.op == ReduceOp::kPremulSum && IsReducingCollective(op.kind)) {
    if (op.kind != CollectiveKind::kAllreduce && op.kind != CollectiveKind::kReduceScatter) {
      return Invalid(op, ctx, "reduce op premul_sum applies to allreduce and reduce_scatter only");
    }
    if (!IsFloatDType(op.dtype)) {
      return Invalid(op, ctx, absl::StrCat("reduce op premul_sum needs a float dtype (f32, f64, "
                                           "f16, bf16, f8e4m3, f8e5m2), got ",
                                           DTypeName(op.dtype)));
    }
    if (!std::isfinite(op.premul_factor)) {
      return Invalid(op, ctx, absl::StrCat("premul_sum factor must be finite, got ",
                                           op.premul_factor));
    }
  }
  if (op.name.size() > kMaxOpNameBytes) {
    return Invalid(op, ctx, absl::StrCat("op name is ", op.name.size(), " bytes; the limit is ",
                                         kMaxOpNameBytes));
  }
  if (op.timeout < absl::ZeroDuration() || op.timeout == absl::InfiniteDuration()) {
    return Invalid(op, ctx, absl::StrCat("timeout must be finite and >= 0 (0: the job's "
                                         "default), got ",
                                         absl::FormatDuration(op.timeout)));
  }
  if (op.buffer_id == 0) {
    if (op.kind != CollectiveKind::kBarrier) {
      return Invalid(op, ctx, "no buffer (only a barrier may have none)");
    }
    if (op.count != 0) {
      return Invalid(op, ctx, absl::StrCat("a barrier without a buffer must have count 0, got ",
                                           op.count));
    }
  }
  OpShape shape;
  const uint64_t esize = DTypeSize(op.dtype);
  shape.blocks = IsBlockedCollective(op.kind) ? static_cast<uint64_t>(ctx.world_size) : 1;
  if (shape.blocks == 0 || op.count > kMaxOpBytes / esize / shape.blocks) {  // divides: no overflow
    return Invalid(op, ctx,
                   absl::StrCat("count ", op.count,
                                shape.blocks > 1 ? absl::StrCat(" x ", shape.blocks, " blocks") : "",
                                " x ", esize, "-byte ", DTypeName(op.dtype), " is more than ",
                                kMaxOpBytes, " bytes (the largest op)"));
  }
  shape.bytes = op.count * esize * shape.blocks;
  const absl::string_view algo_name =
      !op.algorithm.empty() && op.algorithm != "auto" ? absl::string_view(op.algorithm)
                                                      : ctx.job_algorithm;
  if (IsPointToPoint(op.kind)) {
    // No plan: the message goes straight to the peer (worker/point_to_point.h).
    shape.plan_code = kAutoCode;
    if (!op.algorithm.empty() && op.algorithm != "auto") {
      return Invalid(op, ctx, absl::StrCat("algorithm '", op.algorithm,
                                           "' does not apply to point-to-point ops"));
    }
    return shape;
  }
  absl::StatusOr<uint8_t> code = RequestedPlanCode(algo_name, op.kind, shape.bytes);
  if (!code.ok()) return Invalid(op, ctx, code.status().message());
  if (*code == kParameterServerPlanCode && ctx.has_ps.has_value() && !*ctx.has_ps) {
    return Invalid(op, ctx, absl::StrCat("algorithm 'ps' needs parameter-server shards; job '",
                                         ctx.job_id,
                                         "' has none (create it with ps_shards > 0 and start "
                                         "gradsync-ps)"));
  }
  if (*code == kHierarchicalPlanCode && ctx.one_rank_per_daemon.value_or(false)) {
    return Invalid(op, ctx, absl::StrCat("algorithm 'hier' needs ranks that share a daemon; job '",
                                         ctx.job_id, "' has one rank per daemon"));
  }
  shape.plan_code = *code;
  absl::StatusOr<CodecRequest> codecs = EffectiveCodecRequest(op.codec, ctx.job_codec);
  if (!codecs.ok()) return Invalid(op, ctx, codecs.status().message());
  if (!codecs->none() && !codecs->lenient) {
    const bool topk = codecs->topk.on();
    const std::string name = topk ? codecs->topk.ToString() : CodecName(codecs->only());
    auto refuse = [&](absl::string_view why) {
      return Invalid(op, ctx, absl::StrCat("codec '", name, "' does not apply: ", why));
    };
    if (topk && op.kind != CollectiveKind::kAllreduce) {
      return refuse("topk sparsifies allreduce only");
    }
    if (op.kind != CollectiveKind::kAllreduce && op.kind != CollectiveKind::kReduceScatter) {
      return refuse("codecs compress allreduce and reduce_scatter only");
    }
    if (topk && op.name.empty()) {
      return refuse("topk keeps each op's residual by the op's name, and this op has none");
    }
    if (topk && op.count > kMaxSparseCount) {
      return refuse(absl::StrCat(op.count, " elements; topk indexes at most ", kMaxSparseCount));
    }
    if (op.dtype != DType::kF32) {
      return refuse(absl::StrCat("codecs encode f32 values, not ", DTypeName(op.dtype)));
    }
    if (CombineOp(op.op) != ReduceOp::kSum && op.op != ReduceOp::kAvg) {
      return refuse(absl::StrCat("codecs sum (sum, avg, premul_sum), not ", ReduceOpName(op.op)));
    }
    if (*code != kAutoCode && *code != static_cast<uint8_t>(Algorithm::kRing) &&
        *code != kHierarchicalPlanCode) {
      return refuse(absl::StrCat("compressed ops run the ring algorithm ('ring' or 'hier'), not '",
                                 algo_name, "'"));
    }
    if (op.count < kCodecBlockElements) {
      return refuse(absl::StrCat(op.count, " elements per rank are fewer than one codec block (",
                                 kCodecBlockElements, ")"));
    }
  }
  shape.codecs = codecs->Code();
  shape.sparse = codecs->topk.Code();
  return shape;
}

absl::Status CheckOpBuffer(const OpDesc& op, const OpContext& ctx, const OpShape& shape,
                           uint64_t buffer_bytes) {
  const uint64_t esize = DTypeSize(op.dtype);
  if (op.offset_bytes % esize != 0) {
    return Invalid(op, ctx, absl::StrCat("offset_bytes ", op.offset_bytes,
                                         " is not a multiple of the ", DTypeName(op.dtype),
                                         " element size ", esize));
  }
  if (op.offset_bytes > buffer_bytes || shape.bytes > buffer_bytes - op.offset_bytes) {
    // Divides, never multiplies: no overflow.
    const uint64_t fit =
        op.offset_bytes >= buffer_bytes ? 0 : (buffer_bytes - op.offset_bytes) / esize / shape.blocks;
    const bool blocked = shape.blocks > 1;
    return Invalid(
        op, ctx,
        absl::StrCat("count ", op.count, blocked ? absl::StrCat(" x ", shape.blocks, " blocks") : "",
                     " x ", esize, "-byte ", DTypeName(op.dtype), " (", shape.bytes,
                     " bytes) at offset_bytes ", op.offset_bytes, " does not fit in buffer ",
                     op.buffer_id, " (", buffer_bytes, " bytes; at most ", fit, " elements",
                     blocked ? " per block" : "", " fit)"));
  }
  return absl::OkStatus();
}

}  // namespace gradsync
