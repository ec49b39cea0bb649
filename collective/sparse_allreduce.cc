#include "collective/sparse_allreduce.h"

#include <cstring>

#include "absl/strings/str_cat.h"
#include "collective/algorithms.h"
#include "collective/trace.h"
#include "kernels/cpu_reduce.h"

namespace gradsync::internal {

absl::Status CheckSparseApplies(CollectiveKind kind, DType dtype, ReduceOp op, size_t count,
                                transport::MemKind memory) {
  auto refuse = [&](const std::string& why) {
    return absl::InvalidArgumentError(
        absl::StrCat("codec 'topk' does not apply to this ", CollectiveName(kind), ": ", why));
  };
  if (kind != CollectiveKind::kAllreduce) return refuse("topk sparsifies allreduce only");
  if (dtype != DType::kF32) {
    return refuse(absl::StrCat("topk selects among f32 values, not ", DTypeName(dtype)));
  }
  if (CombineOp(op) != ReduceOp::kSum && op != ReduceOp::kAvg) {
    return refuse(absl::StrCat("topk sums (sum, avg, premul_sum), not ", ReduceOpName(op)));
  }
  if (count > kMaxSparseCount) {
    return refuse(absl::StrCat(count, " elements; topk indexes at most ", kMaxSparseCount));
  }
  if (!(memory == transport::MemKind::Host())) {
    return refuse(absl::StrCat("the buffer is ", memory.ToString(),
                               " memory; topk runs on host memory"));
  }
  return absl::OkStatus();
}

absl::Status SparseAllreduce(transport::Context& ctx, const CollectiveCall& call,
                             transport::Scratch* scratch) {
  const int n = ctx.size();
  const int me = ctx.rank();
  const size_t count = call.count;
  if (count == 0) return absl::OkStatus();
  const SparseSpec& spec = call.sparse.spec;
  const size_t k = spec.K(count);
  const size_t message = k * sizeof(SparseEntry);
  ErrorFeedback own;
  ErrorFeedback* ef = call.sparse.feedback != nullptr ? call.sparse.feedback : &own;
  auto area = scratch->ReserveRegistered(ctx, static_cast<size_t>(n) * message);
  if (!area.ok()) return area.status();
  auto* entries = reinterpret_cast<SparseEntry*>((*area)->data());
  SparseEntry* mine = entries + static_cast<size_t>(me) * k;
  float* data = reinterpret_cast<float*>(call.data());
  absl::Time start = TraceNow();
  // Kept per thread (an executor's), so that large ops do not map and
  // fault in their selection memory every time.
  static thread_local TopkWork work;
  SparsifyWithFeedback(data, count, spec, ef, mine, &work);
  TraceEvent("topk select", "reduce", start);
  if (n > 1) {
    CollectiveCall gather;
    gather.kind = CollectiveKind::kAllgather;
    gather.buffer = transport::Buffer{(*area)->data(), static_cast<size_t>(n) * message,
                                      transport::MemKind::Host()};
    gather.region = *area;
    gather.count = message;
    gather.dtype = DType::kU8;
    gather.seq = call.seq;
    gather.deadline = call.deadline;
    gather.ring = call.ring;
    transport::Scratch unused;  // the ring allgather forwards in place
    absl::Status s = RingAllgather(ctx, gather, &unused);
    if (!s.ok()) {
      // Not sent after all: the selected values stay owed.
      for (size_t j = 0; j < k; ++j) {
        if (mine[j].index < count) ef->residual[mine[j].index] += mine[j].value;
      }
      return absl::Status(s.code(), absl::StrCat("topk exchange: ", s.message()));
    }
  }
  start = TraceNow();
  std::memset(data, 0, count * sizeof(float));
  for (int r = 0; r < n; ++r) ScatterAdd(entries + static_cast<size_t>(r) * k, k, data, count);
  if (call.op == ReduceOp::kAvg) DivideBy(DType::kF32, data, count, n);
  TraceEvent("topk scatter", "reduce", start);
  return absl::OkStatus();
}

}  // namespace gradsync::internal
