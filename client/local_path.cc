#include "client/local_path.h"

#include <algorithm>
#include <cstring>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "collective/op_signature.h"
#include "common/clock.h"
#include "kernels/cpu_reduce.h"

namespace gradsync {
namespace client {
namespace internal {
namespace {

// Longest single futex sleep while waiting for the other ranks (the op's
// deadline and the arena's failure are looked at between sleeps).
constexpr absl::Duration kMaxSleep = absl::Milliseconds(10);
// While a local op of this rank waits for the others, a wait on one of its
// daemon ops comes back this often to move the local op along.
constexpr absl::Duration kDaemonSlice = absl::Milliseconds(1);
// Ops submitted and not yet reported (as the daemon and the op queue allow).
constexpr size_t kMaxPending = 4096;

int CounterKind(CollectiveKind k) {
  return k == CollectiveKind::kBarrier ? ipc::kArenaCounterBarrier : ipc::kArenaCounterAllreduce;
}

}  // namespace

absl::StatusOr<std::unique_ptr<LocalPath>> LocalPath::Open(std::unique_ptr<ipc::SharedMemory> mem,
                                                           int rank, int world_size,
                                                           OpChannel* channel,
                                                           std::string session_id,
                                                           LocalPathOptions options) {
  absl::StatusOr<ipc::ArenaView> arena = ipc::ArenaView::Attach(mem->data(), mem->size());
  if (!arena.ok()) return arena.status();
  if (arena->world_size() != world_size || rank < 0 || rank >= world_size) {
    return absl::FailedPreconditionError(absl::StrCat("the job's arena has ", arena->world_size(),
                                                      " ranks; this session is rank ", rank, " of ",
                                                      world_size));
  }
  return std::unique_ptr<LocalPath>(new LocalPath(std::move(mem), *arena, rank, channel,
                                                  std::move(session_id), options));
}

LocalPath::LocalPath(std::unique_ptr<ipc::SharedMemory> mem, ipc::ArenaView arena, int rank,
                     OpChannel* channel, std::string session_id, LocalPathOptions options)
    : mem_(std::move(mem)),
      arena_(arena),
      rank_(rank),
      world_(arena.world_size()),
      channel_(channel),
      session_id_(std::move(session_id)),
      options_(options) {}

std::string LocalPath::Describe(const Entry& e) {
  absl::StatusOr<OpSignature> sig = OpSignature::Decode(e.signature);
  return sig.ok() ? sig->Describe() : "an op";
}

absl::Status LocalPath::Annotate(const Entry& e, const absl::Status& why) const {
  return absl::Status(why.code(), absl::StrCat(Describe(e), " (op ", e.seq, ") failed at rank ",
                                               rank_, ": ", why.message()));
}

std::string LocalPath::Missing(uint64_t seq) const {
  std::vector<int> missing;
  for (int r = 0; r < world_; ++r) {
    if (!arena_.Published(r, seq)) missing.push_back(r);
  }
  return absl::StrJoin(missing, ",");
}

absl::StatusOr<SubmitTicket> LocalPath::Submit(const PathOp& op) {
  absl::MutexLock submitting(&submit_mu_);
  // A local op never reaches the daemon: see that it is still there (a
  // stopped daemon, a closed session), as an op through it would. The other
  // ranks would wait for this rank's op: tell them (a dead daemon cannot).
  if (absl::Status health = channel_->Health(); !health.ok()) {
    arena_.Fail(absl::Status(health.code(),
                             absl::StrCat("rank ", rank_, ": ", health.message())));
    return health;
  }
  absl::MutexLock l(&mu_);
  if (arena_.has_failed()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "session ", session_id_, ": the job's epoch is no longer usable (open a new session): ",
        arena_.failure().message()));
  }
  if (pending_.size() >= kMaxPending) {
    return absl::ResourceExhaustedError(absl::StrCat(
        pending_.size(), " ops are queued or unreported; Wait for some before submitting more"));
  }
  const uint64_t seq = next_seq_;
  const absl::Time submitted = FastNow();
  const absl::Duration timeout = op.args.timeout_ms > 0 ? absl::Milliseconds(op.args.timeout_ms)
                                                        : options_.default_op_timeout;
  const absl::Time deadline = submitted + timeout;
  // Frame `seq` is free once every rank is done with op seq - frames; a rank
  // that far behind holds this one back (it frees frames when it next calls in).
  while (!arena_.FrameFree(seq)) {
    ProgressLocked(FastNow());  // this rank's own consumption may be what is missing
    if (arena_.FrameFree(seq)) break;
    if (arena_.has_failed()) {
      return absl::FailedPreconditionError(absl::StrCat(
          "session ", session_id_, ": the job's epoch is no longer usable (open a new session): ",
          arena_.failure().message()));
    }
    const absl::Time now = FastNow();
    if (now >= deadline) {
      absl::Status late = absl::DeadlineExceededError(absl::StrCat(
          CollectiveName(op.args.kind), " '", op.args.name, "' (op ", seq, ") failed at rank ",
          rank_, ": rank(s) ", absl::StrJoin(arena_.RanksHolding(seq), ","), " are still on op ",
          seq - arena_.frames(), " or earlier after ", absl::FormatDuration(timeout), " (the arena holds ",
          arena_.frames(), " ops per rank)"));
      arena_.Fail(late);
      return late;
    }
    ipc::Doorbell bell = arena_.bell();
    const uint32_t snapshot = bell.Snapshot();
    if (arena_.FrameFree(seq)) break;
    mu_.Unlock();
    // Ops submitted back to back get here every `frames` ops: poll first,
    // as a Wait does (the rank that frees the frame is usually a few
    // microseconds away, and a futex wake-up costs tens on a virtual CPU).
    if (now - submitted < options_.spin) {
      bell.Spin(snapshot, std::min(options_.spin - (now - submitted), deadline - now));
    } else {
      bell.Wait(snapshot, std::min(kMaxSleep, deadline - now));
    }
    mu_.Lock();
  }
  ++next_seq_;
  Entry& e = pending_[seq];
  e.seq = seq;
  e.op = op;
  e.op.args.sequence = seq;
  e.submitted = submitted;
  e.deadline = deadline;
  OpSignature sig;
  sig.seq = seq;
  sig.kind = op.args.kind;
  sig.dtype = op.args.dtype;
  sig.op = op.args.reduce_op;
  sig.count = op.args.count;
  sig.root = IsRootedCollective(op.args.kind) ? op.args.root : 0;
  sig.name = std::string(op.args.name);
  sig.forced = op.forced;
  e.signature = sig.Encode();
  // The views in args point at the caller's strings; a held op outlives them.
  e.name = std::string(op.args.name);
  e.algorithm = std::string(op.args.algorithm);
  e.op.args.name = e.name;
  e.op.args.algorithm = e.algorithm;
  unfinished_.insert(seq);
  if (!e.op.local) {
    // The signature first (no data): the daemon checks it in the arena.
    PublishOrFailLocked(e, submitted);
    if (e.state != State::kDone && BlockerLocked(e) == nullptr) SendLocked(e);
  } else if (BlockerLocked(e) == nullptr) {
    PublishOrFailLocked(e, submitted);
  }
  ProgressLocked(FastNow());
  return SubmitTicket{seq, seq};
}

absl::Status LocalPath::PublishLocked(Entry& e) {
  e.published = FastNow();
  const bool with_data = e.op.local && e.op.args.kind == CollectiveKind::kAllreduce;
  absl::Status s = arena_.Publish(rank_, e.seq, e.signature, with_data ? e.op.data : nullptr,
                                  with_data ? e.op.bytes : 0);
  if (s.ok() && e.op.local) e.state = State::kPublished;
  return s;
}

void LocalPath::PublishOrFailLocked(Entry& e, absl::Time now) {
  absl::Status published = PublishLocked(e);
  if (published.ok()) return;
  CompleteLocked(e, Annotate(e, published), now);
  arena_.Fail(Annotate(e, published));
}

void LocalPath::SendLocked(Entry& e) {
  absl::StatusOr<SubmitTicket> t = channel_->Submit(e.op.args);
  if (!t.ok()) {
    // The others wait for this rank's op at the daemon: fail them now rather
    // than at their deadline.
    CompleteLocked(e, t.status(), FastNow());
    arena_.Fail(Annotate(e, t.status()));
    return;
  }
  e.state = State::kPublished;
}

const LocalPath::Entry* LocalPath::BlockerLocked(const Entry& e) const {
  const bool e_barrier = e.op.args.kind == CollectiveKind::kBarrier;
  for (uint64_t seq : unfinished_) {
    if (seq >= e.seq) break;
    const Entry& other = pending_.at(seq);
    if (e_barrier || other.op.args.kind == CollectiveKind::kBarrier) return &other;
    if (e.op.local || other.op.local) {
      if (Overlap(other.op, e.op)) return &other;
    } else if (other.state == State::kHeld) {
      return &other;  // daemon ops go out in sequence order
    }
  }
  return nullptr;
}

int LocalPath::LeftRankMissing(uint64_t seq, uint64_t* done_up_to) const {
  for (int r = 0; r < world_; ++r) {
    if (!arena_.Published(r, seq) && arena_.Left(r, done_up_to)) return r;
  }
  return -1;
}

void LocalPath::CompleteLocked(Entry& e, absl::Status s, absl::Time now) {
  e.status = std::move(s);
  e.state = State::kDone;
  unfinished_.erase(e.seq);
  done_cv_.SignalAll();
  arena_.SetOutcome(rank_, e.seq, e.status.code());  // for the daemon's status
  if (!e.op.local) return;  // the daemon counts its own ops
  ipc::ArenaCounters& c = arena_.counters(rank_, CounterKind(e.op.args.kind));
  if (!e.status.ok()) {
    const int code = static_cast<int>(e.status.code());
    if (code > 0 && code < ipc::kArenaStatusCodes) c.failed[code].fetch_add(1, std::memory_order_relaxed);
    return;
  }
  c.ok.fetch_add(1, std::memory_order_relaxed);
  c.bytes.fetch_add(e.op.bytes, std::memory_order_relaxed);
  c.run_ns.fetch_add(static_cast<uint64_t>(absl::ToInt64Nanoseconds(now - e.submitted)),
                     std::memory_order_relaxed);
  c.wait_ns.fetch_add(static_cast<uint64_t>(absl::ToInt64Nanoseconds(e.arrival_wait)),
                      std::memory_order_relaxed);
}

void LocalPath::FinishLocalLocked(Entry& e, absl::Time now) {
  // Frames of op e.seq stay put until this rank's consumed passes it.
  const absl::string_view mine = e.signature;
  bool equal = true;
  std::vector<ipc::ArenaFrame> frames(world_);
  int64_t last_us = 0;
  for (int r = 0; r < world_; ++r) {
    absl::StatusOr<ipc::ArenaFrame> f = arena_.Read(r, e.seq);
    if (!f.ok()) {
      arena_.Fail(Annotate(e, f.status()));
      CompleteLocked(e, Annotate(e, f.status()), now);
      return;
    }
    frames[r] = *f;
    last_us = std::max(last_us, f->published_us);
    if (f->signature != mine) equal = false;
  }
  if (!equal) {
    std::vector<std::string> by_rank;
    for (const ipc::ArenaFrame& f : frames) by_rank.emplace_back(f.signature);
    absl::Status mismatch = CompareSignatures(e.seq, by_rank);
    // Equal signatures cannot reach here; a corrupted one compares unequal.
    CompleteLocked(e, mismatch.ok() ? absl::InternalError("signature compare") : mismatch, now);
    return;
  }
  const PathOp& op = e.op;
  if (op.args.kind == CollectiveKind::kAllreduce && op.bytes > 0) {
    for (int r = 0; r < world_; ++r) {
      if (frames[r].data_len != op.bytes) {
        absl::Status bad = absl::DataLossError(absl::StrCat(
            "rank ", r, "'s arena frame of op ", e.seq, " holds ", frames[r].data_len,
            " bytes of data; the op has ", op.bytes));
        arena_.Fail(Annotate(e, bad));
        CompleteLocked(e, Annotate(e, bad), now);
        return;
      }
    }
    // Rank order, as JobGroup::ReduceLocal: every rank gets the same bits.
    const ReduceOp combine = op.args.reduce_op == ReduceOp::kAvg ? ReduceOp::kSum : op.args.reduce_op;
    std::memcpy(op.data, frames[0].data, op.bytes);
    for (int r = 1; r < world_; ++r) {
      ReduceInto(op.args.dtype, combine, op.data, frames[r].data, op.args.count);
    }
    if (op.args.reduce_op == ReduceOp::kAvg) DivideBy(op.args.dtype, op.data, op.args.count, world_);
  }
  e.outcome.done = true;
  e.outcome.algorithm = "local";
  e.outcome.queued_us = absl::ToInt64Microseconds(e.published - e.submitted);
  e.outcome.run_us = absl::ToInt64Microseconds(now - e.published);
  e.arrival_wait =
      absl::Microseconds(std::max<int64_t>(0, last_us - absl::ToUnixMicros(e.published)));
  CompleteLocked(e, absl::OkStatus(), now);
}

void LocalPath::ProgressLocked(absl::Time now) {
  // A copy: finishing an op erases it from unfinished_.
  const std::vector<uint64_t> todo(unfinished_.begin(), unfinished_.end());
  bool daemon_behind = false;  // an earlier daemon op is still running
  for (uint64_t seq : todo) {
    Entry& e = pending_.at(seq);
    if (e.state == State::kDone) continue;
    if (e.state == State::kHeld) {
      if (BlockerLocked(e) != nullptr) continue;
      if (!e.op.local) {
        SendLocked(e);
        daemon_behind = true;  // just sent: it cannot be done yet
        continue;
      }
      PublishOrFailLocked(e, now);
      if (e.state == State::kDone) continue;
    }
    if (!e.op.local) {
      // The daemon runs a session's ops one at a time, in order: once one
      // is not done, the later ones are not either (and over gRPC each look
      // is an RPC). One another thread waits for is that thread's to take.
      if (daemon_behind || e.in_channel_wait) {
        daemon_behind = true;
        continue;
      }
      absl::StatusOr<WaitOutcome> w = channel_->Wait(seq, absl::InfinitePast());
      if (!w.ok()) {
        CompleteLocked(e, w.status(), now);
      } else if (w->done) {
        e.outcome = *w;
        CompleteLocked(e, absl::OkStatus(), now);
      } else {
        daemon_behind = true;
      }
      continue;
    }
    bool all = true;
    for (int r = 0; r < world_ && all; ++r) all = arena_.Published(r, seq);
    uint64_t left_after = 0;
    int left = -1;
    if (all) {
      FinishLocalLocked(e, now);
    } else if (arena_.has_failed()) {
      CompleteLocked(e, Annotate(e, arena_.failure()), now);
    } else if ((left = LeftRankMissing(seq, &left_after)) >= 0) {
      // The others are still in step; the daemon ends the epoch.
      CompleteLocked(e,
                     Annotate(e, absl::CancelledError(absl::StrCat(
                                     "rank ", left, " closed its session after op ", left_after,
                                     " and will not submit op ", seq))),
                     now);
    } else if (now >= e.deadline) {
      absl::Status late = absl::DeadlineExceededError(
          absl::StrCat("timed out at rank ", rank_, " waiting for rank(s) ", Missing(seq),
                       " to submit op ", seq, " (", Describe(e), ")"));
      // The ranks are out of step now: the others must not wait on.
      arena_.Fail(Annotate(e, late));
      CompleteLocked(e, Annotate(e, late), now);
    }
  }
  const uint64_t consumed = unfinished_.empty() ? next_seq_ - 1 : *unfinished_.begin() - 1;
  if (consumed != consumed_) {
    consumed_ = consumed;
    arena_.SetConsumed(rank_, consumed);
    arena_.bell().Ring();  // a rank may wait for a frame to come free
  }
}

absl::StatusOr<WaitOutcome> LocalPath::Wait(uint64_t op_id, absl::Time deadline) {
  absl::MutexLock l(&mu_);
  const absl::Time start = FastNow();
  while (true) {
    const absl::Time now = FastNow();
    ProgressLocked(now);
    if (auto done = TakeIfDone(pending_, op_id, session_id_,
                               [](const Entry& e) { return e.state == State::kDone; })) {
      return *std::move(done);
    }
    Entry& e = pending_.at(op_id);
    if (now >= deadline) return WaitOutcome{};
    // What this op waits for: a local op (its own, or the one a held daemon
    // op waits behind) waits for the other ranks' frames; a daemon op (or a
    // local op held behind one) for the daemon.
    const Entry* blocker = &e;
    // (A chain of held ops: follow it to the first one that can move.)
    while (blocker->state == State::kHeld) {
      const Entry* b = BlockerLocked(*blocker);
      if (b == nullptr) break;
      blocker = b;
    }
    // A local op of this rank still to move (published and waiting for the
    // others, or held): a wait on the daemon comes back often to move it.
    const bool local_waiting = std::any_of(unfinished_.begin(), unfinished_.end(),
                                           [this](uint64_t seq) { return pending_.at(seq).op.local; });
    if (!blocker->op.local && blocker->state == State::kPublished) {
      if (blocker->in_channel_wait) {  // another thread waits for it: it tells us
        done_cv_.WaitWithDeadline(&mu_, std::min(deadline, now + kDaemonSlice));
        continue;
      }
      const uint64_t id = blocker->seq;
      pending_.at(id).in_channel_wait = true;
      const absl::Time until =
          std::min(deadline, local_waiting ? now + kDaemonSlice : absl::InfiniteFuture());
      mu_.Unlock();
      absl::StatusOr<WaitOutcome> w = channel_->Wait(id, until);
      mu_.Lock();
      // Still there: nobody reports an unfinished op, and only this thread
      // may finish one it is in a channel wait for.
      Entry& b = pending_.at(id);
      b.in_channel_wait = false;
      if (!w.ok()) {
        CompleteLocked(b, w.status(), FastNow());
      } else if (w->done) {
        b.outcome = *w;
        CompleteLocked(b, absl::OkStatus(), FastNow());
      }
      done_cv_.SignalAll();
      continue;
    }
    // Wait on the arena's bell: every publication and failure rings it.
    ipc::Doorbell bell = arena_.bell();
    const uint32_t snapshot = bell.Snapshot();
    ProgressLocked(FastNow());
    if (pending_.count(op_id) == 0 || pending_[op_id].state == State::kDone) continue;
    const absl::Time wake = std::min({deadline, blocker->deadline, FastNow() + kMaxSleep});
    mu_.Unlock();
    const absl::Time t = FastNow();
    if (t - start < options_.spin) {
      bell.Spin(snapshot, std::min(options_.spin - (t - start), wake - t));
    } else {
      bell.Wait(snapshot, wake - t);
    }
    mu_.Lock();
  }
}

}  // namespace internal
}  // namespace client
}  // namespace gradsync
