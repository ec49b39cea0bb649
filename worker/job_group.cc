#include "worker/job_group.h"

#include <algorithm>
#include <cstring>
#include <functional>

#include <sched.h>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "collective/op_signature.h"
#include "collective/planner.h"
#include "common/clock.h"
#include "common/logging.h"
#include "collective/collectives.h"
#include "kernels/cpu_reduce.h"

namespace gradsync {

JobGroup::JobGroup(GroupLayout layout, std::unique_ptr<transport::Context> node_ctx,
                   LinkParams link, RingOptions ring, size_t small_bytes)
    : layout_(std::move(layout)),
      node_ctx_(std::move(node_ctx)),
      link_(link),
      ring_(ring),
      small_bytes_(small_bytes) {}

int JobGroup::LocalIndex(int rank) const {
  auto it = std::find(layout_.local_ranks.begin(), layout_.local_ranks.end(), rank);
  return it == layout_.local_ranks.end() ? -1 : static_cast<int>(it - layout_.local_ranks.begin());
}

void JobGroup::ReduceLocal(const std::vector<char*>& bufs, size_t count, DType dtype, ReduceOp op,
                           int world_size) {
  const size_t bytes = count * DTypeSize(dtype);
  if (bytes == 0 || bufs.empty()) return;
  const ReduceOp combine = op == ReduceOp::kAvg ? ReduceOp::kSum : op;
  for (size_t j = 1; j < bufs.size(); ++j) ReduceInto(dtype, combine, bufs[0], bufs[j], count);
  if (op == ReduceOp::kAvg) DivideBy(dtype, bufs[0], count, world_size);
  for (size_t j = 1; j < bufs.size(); ++j) std::memcpy(bufs[j], bufs[0], bytes);
}

void JobGroup::Abort(const absl::Status& reason) {
  {
    absl::MutexLock l(&mu_);
    if (broken_.ok()) broken_ = reason;
  }
  if (node_ctx_ != nullptr) node_ctx_->Abort(reason);
}

absl::Status JobGroup::WaitFor(Slot& slot, const std::function<bool()>& cond, absl::Time deadline,
                               const std::string& what) {
  auto ready = [&]() { return cond() || !slot.status.ok() || !broken_.ok(); };
  while (!ready()) {
    if (mu_.AwaitWithDeadline(absl::Condition(&ready), deadline)) break;
    if (FastNow() >= deadline) {
      if (slot.status.ok()) slot.status = absl::DeadlineExceededError(what);
      break;
    }
  }
  // The stage is complete: a rank that finished the op and closed its
  // session right after (breaking the group) must not fail the others' op.
  if (cond() && slot.status.ok()) return absl::OkStatus();
  if (!broken_.ok()) return broken_;
  return slot.status;
}

absl::Status JobGroup::CheckLocalSignatures(int rank, uint64_t seq, const std::string& encoded,
                                            absl::Time deadline, uint8_t* agreed,
                                            LocalAllreduce* small) {
  const int local = static_cast<int>(layout_.local_ranks.size());
  const int idx = LocalIndex(rank);
  if (idx < 0) return absl::InternalError(absl::StrCat("rank ", rank, " is not local"));
  absl::MutexLock l(&mu_);
  if (!broken_.ok()) return broken_;
  SigSlot& slot = sig_slots_[seq];
  if (slot.encoded.empty()) {
    slot.encoded.assign(local, std::string());
    slot.small.assign(local, nullptr);
  }
  slot.encoded[idx] = encoded;
  slot.small[idx] = small;
  ++slot.arrived;
  absl::Status s;
  if (slot.arrived == local) {
    // The last to arrive decides for everyone, and does a small op alone.
    slot.result = CompareSignatures(seq, slot.encoded);  // index = rank when nodes == 1
    if (slot.result.ok()) {
      slot.agreed = SignatureProposal(slot.encoded[0]);
      const bool all_small =
          std::all_of(slot.small.begin(), slot.small.end(), [](auto* p) { return p != nullptr; });
      if (all_small && slot.agreed == kHierarchicalPlanCode && layout_.nodes == 1) {
        const LocalAllreduce a = *slot.small[0];
        std::vector<char*> bufs(local);
        for (int j = 0; j < local; ++j) bufs[j] = slot.small[j]->data;
        const std::vector<LocalAllreduce*> ops = slot.small;
        slot.running = true;  // the waiters stay (and keep their buffers) until it is done
        mu_.Unlock();
        ReduceLocal(bufs, a.count, a.dtype, a.op, layout_.world_size);
        // Every rank's waiter stays until `decided`, so its LocalAllreduce lives.
        for (int j = 0; j < local; ++j) {
          if (ops[j]->complete) ops[j]->complete();
        }
        mu_.Lock();
        slot.small_done = true;
      }
    }
    slot.compared = true;
    slot.decided.store(true, std::memory_order_release);
  } else {
    // Poll briefly before sleeping (the slot stays put until this rank leaves):
    // this executor is back for its client's next op sooner.
    const std::atomic<bool>& decided = slot.decided;
    mu_.Unlock();
    const absl::Time spin_end = std::min(deadline, FastNow() + kSpin);
    while (!decided.load(std::memory_order_acquire) && FastNow() < spin_end) sched_yield();
    mu_.Lock();
    auto ready = [&]() { return slot.compared || !broken_.ok(); };
    auto finished = [&]() { return slot.compared; };
    (void)mu_.AwaitWithDeadline(absl::Condition(&ready), deadline);
    // Never leave while the last arriver writes into this rank's buffer: a
    // local reduction of <= small_bytes_ per rank and the completions, well
    // under a second; the bound only guards against a bug.
    if (slot.running &&
        !mu_.AwaitWithDeadline(absl::Condition(&finished), FastNow() + absl::Seconds(30))) {
      GS_LOG(ERROR) << "hierarchical op " << seq << ": rank " << rank
                    << " waited 30 s for the last rank's local reduction";
    }
    if (!slot.compared && broken_.ok()) {
      slot.small[idx] = nullptr;
      std::vector<int> missing;
      for (int i = 0; i < local; ++i) {
        if (slot.encoded[i].empty()) missing.push_back(layout_.local_ranks[i]);
      }
      absl::StatusOr<OpSignature> sig = OpSignature::Decode(encoded);
      s = absl::DeadlineExceededError(absl::StrCat(
          "timed out at rank ", rank, " waiting for rank(s) ", absl::StrJoin(missing, ","),
          " to submit op ", seq, sig.ok() ? absl::StrCat(" (", sig->Describe(), ")") : ""));
      // The ranks are out of step now (the late ones would match this op
      // against their next one): every later op of the group fails with this.
      broken_ = s;
    }
  }
  if (s.ok() && !slot.compared) s = broken_;
  if (s.ok()) {
    s = slot.result;
    if (s.ok()) {
      *agreed = slot.agreed;
      if (small != nullptr) small->done = slot.small_done;
    }
  }
  if (++slot.left == local) sig_slots_.erase(seq);
  return s;
}

std::vector<int> JobGroup::ArrivedAt(uint64_t seq) {
  std::vector<int> ranks;
  absl::MutexLock l(&mu_);
  auto it = sig_slots_.find(seq);
  if (it == sig_slots_.end()) return ranks;
  for (size_t i = 0; i < it->second.encoded.size(); ++i) {
    if (!it->second.encoded[i].empty()) ranks.push_back(layout_.local_ranks[i]);
  }
  return ranks;
}

absl::Status JobGroup::CrossDaemons(uint64_t seq, char* data, size_t count, DType dtype,
                                    ReduceOp op, absl::Time deadline) {
  const ReduceOp combine = op == ReduceOp::kAvg ? ReduceOp::kSum : op;
  absl::Status net = absl::OkStatus();
  if (node_ctx_ != nullptr && layout_.nodes > 1) {
    CollectiveCall call;
    call.kind = CollectiveKind::kAllreduce;
    call.data = data;
    call.count = count;
    call.dtype = dtype;
    call.op = combine;
    call.seq = seq;
    call.deadline = deadline;
    call.ring = ring_;
    const Algorithm algo = ChooseAlgorithm(CollectiveKind::kAllreduce, count * DTypeSize(dtype),
                                           layout_.nodes, link_);
    net = RunCollective(*node_ctx_, call, algo, &scratch_);
    if (!net.ok()) {
      net = absl::Status(net.code(), absl::StrCat("between daemons (node ", layout_.node_index,
                                                  " of ", layout_.nodes, "): ", net.message()));
      (void)node_ctx_->Fail(net);
    }
  }
  if (net.ok() && op == ReduceOp::kAvg) DivideBy(dtype, data, count, layout_.world_size);
  return net;
}

absl::Status JobGroup::HierAllreduce(int rank, uint64_t seq, char* data, size_t count,
                                     DType dtype, ReduceOp op, absl::Time deadline) {
  const int local = static_cast<int>(layout_.local_ranks.size());
  const int idx = LocalIndex(rank);
  if (idx < 0) return absl::InternalError(absl::StrCat("rank ", rank, " is not local"));
  const size_t es = DTypeSize(dtype);
  const ReduceOp combine = op == ReduceOp::kAvg ? ReduceOp::kSum : op;
  absl::MutexLock l(&mu_);
  if (!broken_.ok()) return broken_;
  Slot& slot = slots_[seq];
  if (slot.buffers.empty()) slot.buffers.assign(local, nullptr);
  slot.buffers[idx] = data;
  ++slot.arrived;
  if (count * es <= small_bytes_) {
    absl::Status s;
    if (slot.arrived < local) {
      s = WaitFor(slot, [&] { return slot.done; }, deadline,
                  absl::StrCat("hierarchical op ", seq, " timed out at rank ", rank,
                               ": not every rank on this daemon submitted it"));
    } else {
      std::vector<char*> bufs = slot.buffers;
      mu_.Unlock();
      for (int j = 1; j < local; ++j) ReduceInto(dtype, combine, bufs[0], bufs[j], count);
      s = CrossDaemons(seq, bufs[0], count, dtype, op, deadline);
      if (s.ok()) {
        for (int j = 1; j < local; ++j) std::memcpy(bufs[j], bufs[0], count * es);
      }
      mu_.Lock();
      if (!s.ok()) {
        if (slot.status.ok()) slot.status = s;
        if (broken_.ok() && !absl::IsDeadlineExceeded(s)) broken_ = s;
      }
      slot.done = true;
    }
    if (++slot.left == local) slots_.erase(seq);
    return s;
  }
  absl::Status s = WaitFor(
      slot, [&] { return slot.arrived == local; }, deadline,
      absl::StrCat("hierarchical op ", seq, " timed out at rank ", rank,
                   ": not every rank on this daemon submitted it"));
  // Stage B: reduce my slice across the local buffers into the leader's.
  if (s.ok() && local > 1) {
    const size_t b = count * idx / local, e = count * (idx + 1) / local;
    char* const dst = slot.buffers[0];
    std::vector<char*> bufs = slot.buffers;
    mu_.Unlock();
    for (int j = 1; j < local; ++j) ReduceInto(dtype, combine, dst + b * es, bufs[j] + b * es, e - b);
    mu_.Lock();
  }
  ++slot.reduced;
  if (s.ok()) {
    s = WaitFor(slot, [&] { return slot.reduced == local; }, deadline,
                absl::StrCat("hierarchical op ", seq, " timed out at rank ", rank,
                             " in the local reduction"));
  }
  // Stage C: the leader crosses the network and finalizes avg.
  if (idx == 0) {
    if (s.ok()) {
      mu_.Unlock();
      absl::Status net = CrossDaemons(seq, data, count, dtype, op, deadline);
      mu_.Lock();
      if (!net.ok()) {
        if (slot.status.ok()) slot.status = net;
        if (broken_.ok()) broken_ = net;
      }
      s = net;
    }
    slot.leader_done = true;
  } else if (s.ok()) {
    s = WaitFor(slot, [&] { return slot.leader_done; }, deadline,
                absl::StrCat("hierarchical op ", seq, " timed out at rank ", rank,
                             " waiting for the exchange between daemons"));
  }
  // Stage D: copy the result out.
  if (s.ok() && idx != 0) {
    const char* src = slot.buffers[0];
    mu_.Unlock();
    std::memcpy(data, src, count * es);
    mu_.Lock();
  }
  ++slot.copied;
  if (s.ok()) {
    s = WaitFor(slot, [&] { return slot.copied == local; }, deadline,
                absl::StrCat("hierarchical op ", seq, " timed out at rank ", rank,
                             " waiting for the local copies"));
  }
  if (!s.ok() && slot.status.ok()) slot.status = s;
  if (++slot.left == local) slots_.erase(seq);
  return s;
}

}  // namespace gradsync
