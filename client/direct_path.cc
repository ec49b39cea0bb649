#include "client/direct_path.h"

#include <algorithm>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/clock.h"
#include "common/status_macros.h"

namespace gradsync {
namespace client {
namespace internal {
namespace {

// While a direct op of this rank waits for the others, a wait on one of its
// daemon ops comes back this often to move the direct op along, and a wait
// on a direct op comes back this often to look at the daemon's ops.
constexpr absl::Duration kSlice = absl::Milliseconds(1);
// Ops submitted and not yet reported (as the daemon and the op queue allow).
constexpr size_t kMaxPending = 4096;
// The progress thread looks for an exchange no caller has looked after this
// often while ops come, and takes it over; it sleeps in one this long at a
// time; after this long without an exchange, and with none waiting to start,
// it sleeps until a Submit (so it does not wake every millisecond through a
// large op at the daemon).
constexpr absl::Duration kWatch = absl::Milliseconds(1);
constexpr absl::Duration kBackgroundSlice = absl::Milliseconds(100);
constexpr absl::Duration kQuiet = absl::Milliseconds(20);
// While ops run, whether the daemon still serves the session is looked at
// this often: once it stopped answering, closed the session or the job's
// epoch failed, the ops that have not reached it fail with its reason, as
// its own ops do.
constexpr absl::Duration kAliveEvery = absl::Milliseconds(100);

int CounterKind(CollectiveKind k) {
  return k == CollectiveKind::kBarrier ? ipc::kOpCounterBarrier : ipc::kOpCounterAllreduce;
}

}  // namespace

absl::StatusOr<std::unique_ptr<transport::TcpListener>> DirectPath::Listen() {
  transport::ListenerOptions lo;
  lo.listen = {"0.0.0.0", 0};
  return transport::TcpListener::Start(lo);
}

absl::StatusOr<std::unique_ptr<DirectPath>> DirectPath::Connect(
    std::unique_ptr<transport::TcpListener> listener, DirectPathOptions options,
    OpChannel* channel, std::string session_id) {
  if (static_cast<int>(options.peers.size()) != options.world_size || options.world_size < 2 ||
      options.rank < 0 || options.rank >= options.world_size) {
    return absl::InvalidArgumentError(absl::StrCat(
        "direct path: ", options.peers.size(), " endpoints for rank ", options.rank, " of ",
        options.world_size));
  }
  transport::TcpContextOptions co;
  co.job_id = options.job_id;
  co.epoch = options.epoch;
  co.rank = options.rank;
  co.world_size = options.world_size;
  co.peers = options.peers;
  co.deadline = absl::Now() + options.connect_timeout;
  co.streams = 1;
  co.spin_us = static_cast<int>(absl::ToInt64Microseconds(options.spin));
  absl::StatusOr<std::unique_ptr<transport::TcpContext>> ctx =
      transport::TcpContext::Connect(co, listener.get());
  if (!ctx.ok()) {
    return absl::Status(ctx.status().code(),
                        absl::StrCat("direct path of job '", options.job_id, "' rank ",
                                     options.rank, ": ", ctx.status().message()));
  }
  // Every connection is made: the listener has nothing more to take.
  listener.reset();
  return std::unique_ptr<DirectPath>(
      new DirectPath(*std::move(ctx), std::move(options), channel, std::move(session_id)));
}

DirectPath::DirectPath(std::unique_ptr<transport::TcpContext> ctx, DirectPathOptions options,
                       OpChannel* channel, std::string session_id)
    : ctx_(std::move(ctx)),
      options_(std::move(options)),
      channel_(channel),
      session_id_(std::move(session_id)),
      // As the daemons pick theirs (worker/daemon.cc), from the same facts.
      pattern_(DefaultSignaturePattern(options_.world_size, AllOnOneHost(options_.peers))) {
  progress_ = std::thread([this] { ProgressLoop(); });
}

DirectPath::~DirectPath() {
  {
    absl::MutexLock l(&mu_);
    stop_ = true;
    progress_cv_.Signal();
  }
  ctx_->Interrupt();
  progress_.join();
  // Ops still running fail at the peers at once (the connections close).
  channel_->SetDirectCurrent(nullptr);
  channel_->SetDirectInFlight(0);
}

void DirectPath::ProgressLoop() {
  absl::MutexLock l(&mu_);
  absl::Time last_active = FastNow();
  while (!stop_) {
    const absl::Time now = FastNow();
    ProgressLocked(now);
    if (active_ != 0) last_active = now;
    // Idle a while: sleep until a Submit wakes it. Otherwise look every
    // kWatch (a timer, not a wake-up per op: callers that submit and wait at
    // once never wake this thread).
    if (active_ == 0 && NextQueuedLocked() == nullptr && now - last_active >= kQuiet) {
      watching_ = false;
      progress_cv_.WaitWithTimeout(&mu_, absl::Seconds(1));
      watching_ = true;
      continue;
    }
    // A caller that waits moves its exchange on itself, spinning; only an
    // exchange nobody has looked after for kWatch is taken here (a rank that
    // submitted and went on with other work), so a caller seldom has to take
    // it back.
    if (active_ == 0 || driving_ || app_waiting_ > 0 || now - last_call_ < kWatch) {
      progress_cv_.WaitWithTimeout(&mu_, kWatch);
      continue;
    }
    Entry& a = pending_.at(active_);
    driving_ = true;
    background_driving_ = true;
    mu_.Unlock();
    // Sleep in poll(2) while the others' messages are on their way; a
    // caller that comes to wait interrupts (Wait).
    ctx_->SetSpin(absl::ZeroDuration());
    absl::StatusOr<bool> advanced = exchange_.Advance(std::min(a.deadline, now + kBackgroundSlice));
    ctx_->SetSpin(options_.spin);
    mu_.Lock();
    driving_ = false;
    background_driving_ = false;
    AfterAdvanceLocked(a, advanced, FastNow());
    done_cv_.SignalAll();
  }
}

absl::Status DirectPath::Annotate(const Entry& e, const absl::Status& why) const {
  return absl::Status(why.code(), absl::StrCat(e.sig.Describe(), " (op ", e.seq, ") failed at rank ",
                                               options_.rank, ": ", why.message()));
}

absl::Status DirectPath::Unusable() const {
  return absl::FailedPreconditionError(absl::StrCat(
      "session ", session_id_, ": the direct path failed (open a new session): ",
      failed_.message()));
}

absl::StatusOr<SubmitTicket> DirectPath::Submit(const PathOp& op) {
  absl::MutexLock submitting(&submit_mu_);
  // A daemon that stopped, or that takes no new ops for the session (it
  // drains, the epoch failed): refused as the daemon refuses its own. The
  // ops already submitted go on (a draining daemon waits for them).
  RETURN_IF_ERROR(channel_->Health());
  absl::MutexLock l(&mu_);
  if (!failed_.ok()) return Unusable();
  if (pending_.size() >= kMaxPending) {
    return absl::ResourceExhaustedError(absl::StrCat(
        pending_.size(), " ops are queued or unreported; Wait for some before submitting more"));
  }
  const uint64_t seq = next_seq_++;
  const absl::Time now = FastNow();
  const absl::Duration timeout = op.args.timeout_ms > 0 ? absl::Milliseconds(op.args.timeout_ms)
                                                        : options_.default_op_timeout;
  Entry& e = pending_[seq];
  e.seq = seq;
  e.op = op;
  e.op.args.sequence = seq;
  e.submitted = now;
  e.deadline = now + timeout;
  // The views in args point at the caller's strings; a queued op outlives them.
  e.sig.name = std::string(op.args.name);
  e.algorithm = std::string(op.args.algorithm);
  e.op.args.name = e.sig.name;
  e.op.args.algorithm = e.algorithm;
  e.sig.seq = seq;
  e.sig.kind = op.args.kind;
  e.sig.dtype = op.args.dtype;
  e.sig.op = op.args.reduce_op;
  e.sig.count = op.args.count;
  e.sig.root = IsRootedCollective(op.args.kind) ? op.args.root : 0;
  e.sig.forced = op.forced;
  e.shown.seq = seq;
  e.shown.at_us = absl::ToUnixMicros(now);
  e.shown.kind = op.args.kind;
  e.shown.dtype = op.args.dtype;
  e.shown.reduce_op = op.args.reduce_op;
  e.shown.count = op.args.count;
  e.shown.name = e.sig.name;
  unfinished_.insert(seq);
  channel_->SetDirectInFlight(++in_flight_);
  last_call_ = now;
  ProgressLocked(now);
  if (!watching_) progress_cv_.Signal();  // the progress thread looks after what this started
  return SubmitTicket{seq, seq};
}

const DirectPath::Entry* DirectPath::BlockerLocked(const Entry& e) const {
  const bool e_barrier = e.op.args.kind == CollectiveKind::kBarrier;
  if (!e_barrier && !e.op.local) return nullptr;  // a daemon op's exchange carries no data
  for (uint64_t seq : unfinished_) {
    if (seq >= e.seq) break;
    const Entry& other = pending_.at(seq);
    if (e_barrier || Overlap(other.op, e.op)) return &other;
  }
  return nullptr;
}

DirectPath::Entry* DirectPath::NextQueuedLocked() {
  for (uint64_t seq : unfinished_) {
    Entry& e = pending_.at(seq);
    if (e.state == State::kQueued) return &e;
  }
  return nullptr;
}

void DirectPath::StartLocked(Entry& e, absl::Time now) {
  FusedAllreduce* fused = nullptr;
  if (e.op.local && e.op.args.kind == CollectiveKind::kAllreduce && e.op.bytes > 0) {
    e.fused = FusedAllreduce{e.op.data, e.op.args.dtype, e.op.args.reduce_op, e.op.args.count};
    fused = &e.fused;
  }
  e.started = now;
  e.state = State::kExchanging;
  active_ = e.seq;
  channel_->SetDirectCurrent(&e.shown);
  absl::Status s = exchange_.Start(*ctx_, e.sig, pattern_, nullptr, fused, &scratch_);
  if (!s.ok()) AfterAdvanceLocked(e, s, now);
}

void DirectPath::AfterAdvanceLocked(Entry& e, const absl::StatusOr<bool>& advanced,
                                    absl::Time now) {
  if (advanced.ok() && !*advanced && now < e.deadline) return;  // not yet
  active_ = 0;
  channel_->SetDirectInFlight(--in_flight_);  // done here, or on its way to the daemon
  if (advanced.ok() && *advanced) {
    if (!e.op.local) {  // the ranks agree: now the daemon runs it
      channel_->SetDirectCurrent(nullptr);
      absl::StatusOr<SubmitTicket> t = channel_->Submit(e.op.args);
      if (!t.ok()) {
        CompleteLocked(e, t.status(), now);
        return;
      }
      e.state = State::kAtDaemon;
      at_daemon_.insert(e.seq);
      return;
    }
    e.outcome.done = true;
    e.outcome.algorithm = AlgorithmCodeName(kDirectCode);
    e.outcome.queued_us = absl::ToInt64Microseconds(e.started - e.submitted);
    e.outcome.run_us = absl::ToInt64Microseconds(now - e.started);
    CompleteLocked(e, absl::OkStatus(), now);
    return;
  }
  if (!failed_.ok()) {  // the path failed while this exchange ran (FailLocked woke it)
    CompleteLocked(e, failed_annotate_ ? Annotate(e, failed_) : failed_, now);
    return;
  }
  const absl::Status why = advanced.ok() ? exchange_.TimedOut() : advanced.status();
  if (absl::IsInvalidArgument(why)) {  // a mismatch: every message was read, the path goes on
    CompleteLocked(e, why, now);
    return;
  }
  const absl::Status annotated = Annotate(e, why);
  CompleteLocked(e, annotated, now);
  FailLocked(annotated, now);
}

void DirectPath::AfterChannelLocked(Entry& e, const absl::StatusOr<WaitOutcome>& w,
                                    absl::Time now) {
  if (!w.ok()) {
    CompleteLocked(e, w.status(), now);
  } else if (w->done) {
    e.outcome = *w;
    CompleteLocked(e, absl::OkStatus(), now);
  }
}

void DirectPath::CompleteLocked(Entry& e, absl::Status s, absl::Time now) {
  const bool at_daemon = e.state == State::kAtDaemon;
  if (at_daemon) at_daemon_.erase(e.seq);
  e.status = std::move(s);
  e.state = State::kDone;
  unfinished_.erase(e.seq);
  done_cv_.SignalAll();
  if (at_daemon) return;  // the daemon counts and shows its own ops
  // Finished here: the daemon's status shows it as this rank's last op.
  e.shown.at_us = absl::ToUnixMicros(now);
  e.shown.code = static_cast<int32_t>(e.status.code());
  channel_->SetDirectLast(e.shown);
  const int code = static_cast<int>(e.status.code());
  if (!e.op.local) {  // failed before it reached the daemon: counted for it
    const int kind = static_cast<int>(e.op.args.kind);
    ipc::UnsentFailures* u = channel_->DirectUnsent();
    if (u != nullptr && kind > 0 && kind < ipc::kCollectiveSlots && code > 0 &&
        code < ipc::kOpStatusCodes) {
      u->failed[kind][code].fetch_add(1, std::memory_order_relaxed);
    }
    return;
  }
  ipc::OpCounters* c = channel_->DirectCounters(CounterKind(e.op.args.kind));
  if (c == nullptr) return;
  if (!e.status.ok()) {
    if (code > 0 && code < ipc::kOpStatusCodes) c->failed[code].fetch_add(1, std::memory_order_relaxed);
    return;
  }
  c->ok.fetch_add(1, std::memory_order_relaxed);
  c->bytes.fetch_add(e.op.bytes, std::memory_order_relaxed);
  c->run_ns.fetch_add(static_cast<uint64_t>(absl::ToInt64Nanoseconds(now - e.submitted)),
                      std::memory_order_relaxed);
  // wait_ns stays: the exchange does not tell waiting for the last rank
  // apart from the rest of the op.
}

void DirectPath::FailLocked(const absl::Status& why, absl::Time now, bool annotate) {
  if (!failed_.ok()) return;
  failed_ = why;
  failed_annotate_ = annotate;
  // The peers hear it (an abort frame each): from the thread that drives the
  // exchange, if one does (Abort wakes it), else from here.
  if (driving_) {
    ctx_->Abort(why);
  } else {
    (void)ctx_->Fail(why);
  }
  const std::vector<uint64_t> todo(unfinished_.begin(), unfinished_.end());
  for (uint64_t seq : todo) {
    Entry& e = pending_.at(seq);
    if (e.state == State::kQueued || (e.state == State::kExchanging && !driving_)) {
      if (e.seq == active_) active_ = 0;
      channel_->SetDirectInFlight(--in_flight_);
      CompleteLocked(e, annotate ? Annotate(e, why) : why, now);
    }
  }
}

void DirectPath::ProgressLocked(absl::Time now) {
  if (now >= next_alive_check_ && !unfinished_.empty()) {
    next_alive_check_ = now + kAliveEvery;
    // A daemon that stopped answering or closed the session, or whose job
    // epoch failed, will run none of these ops (and the other ranks'
    // daemons none of theirs): they fail with its reason. A draining daemon
    // (Unavailable while it answers) still takes what was submitted before.
    const absl::Status alive = channel_->Alive();
    const absl::Status why = alive.ok() ? channel_->Health() : alive;
    if (!why.ok() && !(alive.ok() && absl::IsUnavailable(why))) {
      FailLocked(why, now, /*annotate=*/false);
    }
  }
  // The daemon's ops: it runs a session's ops one at a time, in order, so
  // once one is not done the later ones are not either. One another thread
  // waits for is that thread's to take.
  while (!at_daemon_.empty()) {
    Entry& e = pending_.at(*at_daemon_.begin());
    if (e.in_channel_wait) break;
    AfterChannelLocked(e, channel_->Wait(e.seq, absl::InfinitePast()), now);
    if (e.state != State::kDone) break;  // (done: CompleteLocked took it out of at_daemon_)
  }
  // The exchanges, in sequence order: the running one, then the next ones
  // (several may finish at once when the others are ahead).
  for (int rounds = 0; rounds < 64; ++rounds) {
    if (active_ != 0) {
      if (driving_) return;  // another thread moves it on, without mu_
      Entry& a = pending_.at(active_);
      AfterAdvanceLocked(a, exchange_.Advance(absl::InfinitePast()), FastNow());
      if (active_ != 0) return;  // not done yet
    }
    if (!failed_.ok()) return;
    Entry* next = NextQueuedLocked();
    if (next == nullptr || BlockerLocked(*next) != nullptr) return;
    StartLocked(*next, FastNow());
  }
}

absl::StatusOr<WaitOutcome> DirectPath::Wait(uint64_t op_id, absl::Time deadline) {
  absl::MutexLock l(&mu_);
  while (true) {
    const absl::Time now = FastNow();
    last_call_ = now;
    ProgressLocked(now);
    if (auto done = TakeIfDone(pending_, op_id, session_id_,
                               [](const Entry& e) { return e.state == State::kDone; })) {
      return *std::move(done);
    }
    Entry& e = pending_.at(op_id);
    if (now >= deadline) return WaitOutcome{};
    // What it waits for: the daemon, for an op there; else the exchanges,
    // which may wait for a daemon op themselves (a blocked next exchange).
    const Entry* target = &e;
    if (e.state != State::kAtDaemon && active_ == 0) {
      const Entry* next = NextQueuedLocked();
      const Entry* blocker = next != nullptr ? BlockerLocked(*next) : nullptr;
      // (A blocker is at the daemon: an earlier queued op would be next.)
      if (blocker != nullptr) target = blocker;
    }
    const bool mesh_waiting = active_ != 0 || NextQueuedLocked() != nullptr;
    if (target->state == State::kAtDaemon) {
      if (target->in_channel_wait) {  // another thread waits for it: it tells us
        done_cv_.WaitWithDeadline(&mu_, std::min(deadline, now + kSlice));
        continue;
      }
      const uint64_t id = target->seq;
      pending_.at(id).in_channel_wait = true;
      const absl::Time until =
          std::min(deadline, mesh_waiting ? now + kSlice : absl::InfiniteFuture());
      mu_.Unlock();
      absl::StatusOr<WaitOutcome> w = channel_->Wait(id, until);
      mu_.Lock();
      // Still there: nobody reports an unfinished op, and only this thread
      // may finish one it is in a channel wait for.
      Entry& b = pending_.at(id);
      b.in_channel_wait = false;
      AfterChannelLocked(b, w, FastNow());
      done_cv_.SignalAll();
      continue;
    }
    if (active_ != 0 && background_driving_) {
      // The progress thread sleeps in it: take it over (it lets go at once).
      ++app_waiting_;
      ctx_->Interrupt();
      while (driving_) done_cv_.WaitWithDeadline(&mu_, FastNow() + kSlice);
      --app_waiting_;
      continue;
    }
    if (active_ == 0 || driving_) {
      // Another caller moves the exchange on (it tells us), or another
      // thread waits for the daemon op the next exchange waits for.
      done_cv_.WaitWithDeadline(&mu_, std::min(deadline, now + kSlice));
      continue;
    }
    // Move the running exchange on, without the mutex (other threads may
    // submit meanwhile; only this one touches the exchange).
    Entry& a = pending_.at(active_);
    const bool daemon_waiting = !at_daemon_.empty();
    const absl::Time until = std::min(
        {deadline, a.deadline, now + (daemon_waiting ? kSlice : kAliveEvery)});
    driving_ = true;
    mu_.Unlock();
    absl::StatusOr<bool> advanced = exchange_.Advance(until);
    mu_.Lock();
    driving_ = false;
    AfterAdvanceLocked(a, advanced, FastNow());
    done_cv_.SignalAll();
  }
}

}  // namespace internal
}  // namespace client
}  // namespace gradsync
