#include "worker/job_executor.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "collective/collectives.h"
#include "collective/trace.h"
#include "common/clock.h"
#include "common/logging.h"
#include "common/process.h"
#include "worker/session.h"
#include "worker/timeline.h"

namespace gradsync {
namespace {

OpRunnerOptions RunnerOptions(const JobExecutorOptions& o, OpIntake* intake) {
  OpRunnerOptions r;
  static_cast<OpRunSettings&>(r) = o;
  r.note_arrived = [intake](int rank) { intake->NoteArrived(rank); };
  r.set_phase = [intake](const std::string& phase) { intake->SetPhase(phase); };
  return r;
}

}  // namespace

namespace {
PointToPointOptions P2pOptions(const JobExecutorOptions& o) {
  PointToPointOptions p;
  p.job_id = o.job_id;
  p.epoch = o.epoch;
  p.placement = o.placement;
  p.observer = o.observer;
  return p;
}
}  // namespace

JobExecutor::JobExecutor(JobExecutorOptions options, std::unique_ptr<transport::Context> node_ctx,
                         std::unique_ptr<transport::Context> p2p_ctx)
    : options_(std::move(options)),
      node_ctx_(std::move(node_ctx)),
      intake_(options_.job_id, options_.placement.local_ranks(), options_.placement.world,
              options_.spin),
      staging_(options_.job_id, options_.placement, options_.ring, node_ctx_.get(),
               options_.node_moves_device_memory),
      runner_(std::make_unique<OpRunner>(RunnerOptions(options_, &intake_), node_ctx_.get(),
                                         &staging_)),
      traffic_(options_.placement, options_.transport, node_ctx_.get(), options_.observer),
      p2p_(P2pOptions(options_), std::move(p2p_ctx)) {
  thread_ = std::thread([this] { Run(); });
  NameThread(thread_, "gs-exec");
}

JobExecutor::~JobExecutor() {
  intake_.Stop();
  if (node_ctx_ != nullptr) node_ctx_->Abort(absl::CancelledError("job executor stopped"));
  GS_CHECK(thread_.get_id() != std::this_thread::get_id())
      << "a job executor destroyed on its own thread";
  if (thread_.joinable()) thread_.join();
  if (feedback_reported_ && options_.observer != nullptr) {
    options_.observer->OnErrorFeedback(options_.job_id, options_.epoch, 0, 0,
                                       runner_->feedback().refusals(), /*ended=*/true);
  }
}

std::shared_ptr<JobExecutor> JobExecutor::Start(JobExecutorOptions options,
                                                std::unique_ptr<transport::Context> node_ctx,
                                                std::unique_ptr<transport::Context> p2p_ctx) {
  return std::shared_ptr<JobExecutor>(
      new JobExecutor(std::move(options), std::move(node_ctx), std::move(p2p_ctx)),
      [](JobExecutor* e) {
        if (e->thread_.get_id() == std::this_thread::get_id()) {
          // The executor's Run() goes on after this returns: it stops once
          // the destructor, on this new thread, tells it to, and is joined.
          std::thread([e] { delete e; }).detach();
        } else {
          delete e;
        }
      });
}

void JobExecutor::Attach(Session* session) { intake_.Attach(session); }

void JobExecutor::Detach(int rank, const absl::Status& why) {
  p2p_.Detach(rank, why);
  const std::optional<uint64_t> generation = intake_.Detach(rank, why);
  if (!generation.has_value()) return;
  // Tells the other daemons (their ops cannot complete without this rank)
  // and ends a running op here.
  if (node_ctx_ != nullptr) node_ctx_->Abort(why);
  intake_.Kick();
  intake_.AwaitRelease(rank, *generation);
}

void JobExecutor::Abort(const absl::Status& reason) {
  intake_.Break(reason, /*tell_peers=*/true);
  p2p_.Break(reason);
  if (node_ctx_ != nullptr) node_ctx_->Abort(reason);
}

void JobExecutor::Kick() { intake_.Kick(); }

void JobExecutor::SubmitPointToPoint(Session* session, std::shared_ptr<QueuedOp> op) {
  p2p_.Submit(session, std::move(op));
}

OpProgress JobExecutor::Progress(uint64_t seq) const {
  return intake_.ProgressOf(seq);
}

void JobExecutor::BreakAndTell(const absl::Status& reason) {
  intake_.Break(reason);
  p2p_.Break(reason);
  if (node_ctx_ != nullptr) (void)node_ctx_->Fail(reason);  // tells the other daemons
}

void JobExecutor::Run() {
  intake_.BindToThisThread();
  absl::Time last_active = FastNow();
  // Marks the end of one look at the members (Detach waits for it).
  struct Release {
    OpIntake* intake;
    ~Release() { intake->EndLook(); }
  };
  bool told_peers = false;  // of an Abort
  OpIntake::Look look;
  while (intake_.BeginLook(&look)) {
    Release release{&intake_};
    const std::vector<Session*>& members = look.members;
    const absl::Status& broken = look.broken;
    if (look.tell_peers && !told_peers && node_ctx_ != nullptr) {
      // Abort() from another thread only marks the context; its driver (this
      // thread) sends the ABORTs, or the other daemons would learn of it
      // (e.g. a client here that died) only at their op deadline. A session
      // that merely closed (Detach) tells nobody: the others' running op may
      // still complete without it, and its connections close with the
      // executor.
      (void)node_ctx_->Fail(broken);
      told_peers = true;
    }
    const bool took = intake_.TakeArrivals(members);
    const bool any = intake_.any_taken();
    if (!broken.ok() && any) {
      (void)FailTaken(members, absl::Status(broken.code(), absl::StrCat("the epoch failed earlier: ",
                                                                        broken.message())));
      last_active = FastNow();
      continue;
    }
    if (broken.ok() && intake_.all_taken()) {
      RunCurrent(members);
      last_active = FastNow();
      continue;
    }
    if (broken.ok() && any && FastNow() >= intake_.EarliestDeadline()) {
      const absl::Status late = intake_.LateRankError();
      GS_LOG(WARNING) << "job '" << options_.job_id << "' epoch " << options_.epoch << ": "
                      << late.message();
      BreakAndTell(late);
      (void)FailTaken(members, late);
      continue;
    }
    if (took) {
      last_active = FastNow();
      continue;
    }
    // Before each sleep (so every ~1 ms while local ranks are missing, never
    // in the spin): while some local ranks have submitted the op, a peer
    // daemon that failed the node context (its ABORT, a lost or closed
    // connection) fails the op now, not at its deadline. CheckPeers leaves
    // the other daemons' early signatures for the exchange.
    absl::Status peer_failure;
    intake_.WaitForArrivals(members, last_active, [&](absl::Time now) {
      traffic_.FlushIfDirty(now);
      if (!any || node_ctx_ == nullptr) return true;
      peer_failure = PeerFailure();
      return peer_failure.ok();
    });
    if (!peer_failure.ok()) {
      // As a failing exchange would: every local rank's op names the cause,
      // and the epoch breaks with the first rank's error.
      const absl::Status first = FailTaken(members, peer_failure);
      GS_LOG(WARNING) << "job '" << options_.job_id << "' epoch " << options_.epoch << ": "
                      << (first.ok() ? peer_failure : first).message();
      BreakAndTell(first.ok() ? peer_failure : first);
      last_active = FastNow();
    }
  }
  // Stopping: the sessions are gone or going; what was taken is dropped.
  intake_.DropTaken();
}

absl::Status JobExecutor::PeerFailure() {
  const absl::Status s = node_ctx_->CheckPeers();
  // Failed by this side (Abort from another thread): the intake's break,
  // which comes first, says why.
  if (s.ok() || node_ctx_->fault().kind == transport::PeerFault::kNone) return absl::OkStatus();
  return s;
}

absl::Status JobExecutor::FailTaken(const std::vector<Session*>& members,
                                    const absl::Status& why) {
  const absl::Time end = FastNow();
  const std::vector<int>& local = intake_.local_ranks();
  absl::Status first;
  for (size_t i = 0; i < members.size(); ++i) {
    QueuedOp* op = intake_.slot(i);
    if (op == nullptr || members[i] == nullptr) continue;
    const absl::Status s(why.code(), absl::StrCat(op->sig.Describe(), " (op ", op->seq,
                                                  ") failed at rank ", local[i], ": ",
                                                  why.message()));
    if (first.ok()) first = s;
    bool newly_failed = false;
    if (members[i]->Finish(*op, s, "", end, &newly_failed) && options_.observer != nullptr) {
      options_.observer->OnOpDone(members[i]->Record(*op, absl::ZeroDuration()));
      if (newly_failed) options_.observer->OnEpochFailed(EpochFailureCause(s));
    }
  }
  intake_.NextOp();
  return first;
}

void JobExecutor::RunCurrent(const std::vector<Session*>& members) {
  const std::vector<QueuedOp*> ops = intake_.taken();
  const std::vector<int>& local = intake_.local_ranks();
  const size_t k = ops.size();
  const QueuedOp& lead = *ops[0];
  const uint64_t seq = lead.seq;
  const JobPlacement& place = options_.placement;
  const size_t bytes = CollectiveBufferBytes(lead.sig.kind, lead.sig.count, lead.sig.dtype, place.world);
  Timeline* tracer = nullptr;
  for (size_t i = 0; i < k; ++i) {
    if (Timeline* t = members[i]->timeline()) {
      t->SetOp(seq, ops[i]->sig.Describe());
      t->Event("queued", "op", ops[i]->submitted, ops[i]->started);
      if (tracer == nullptr) tracer = t;
    }
  }
  ScopedTracer tracing(tracer);
  const absl::Time negotiate_start = FastNow();
  absl::Status s;
  for (size_t i = 0; i < k && s.ok(); ++i) {
    if (ops[i]->seq != seq) {
      s = absl::InternalError(absl::StrCat("rank ", local[i], " is at op ", ops[i]->seq,
                                           ", rank ", local[0], " at op ", seq));
    }
    absl::Status health = members[i]->health();
    if (s.ok() && !health.ok()) {
      s = absl::Status(health.code(), absl::StrCat("the epoch failed earlier: ", health.message()));
    }
  }
  OpRunner::Outcome outcome;
  if (s.ok()) s = runner_->Run(ops, negotiate_start, &outcome);
  const absl::Time end = FastNow();
  absl::Status first_failure;
  for (size_t i = 0; i < k; ++i) {
    absl::Status st = s;
    if (!s.ok() && !absl::IsInvalidArgument(s)) {
      st = absl::Status(s.code(), absl::StrCat(ops[i]->sig.Describe(), " (op ", seq, ") failed at rank ",
                                               local[i], ": ", s.message()));
      if (first_failure.ok()) first_failure = st;
    }
    bool newly_failed = false;
    if (!members[i]->Finish(*ops[i], st, st.ok() ? outcome.plan_name : "", end, &newly_failed)) {
      continue;
    }
    if (Timeline* t = members[i]->timeline()) t->Instant(st.ok() ? "done" : "failed", end);
    if (options_.observer != nullptr) {
      OpRecord record = members[i]->Record(
          *ops[i], std::max(absl::ZeroDuration(), negotiate_start - ops[i]->started) +
                       outcome.exchange);
      if (st.ok()) record.wire_ratio = outcome.wire_ratio;
      options_.observer->OnOpDone(record);
      if (newly_failed) options_.observer->OnEpochFailed(EpochFailureCause(st));
    }
  }
  if (absl::IsInvalidArgument(s)) {
    GS_LOG(WARNING) << "job '" << options_.job_id << "' on daemon " << place.node_index << ": "
                    << s.message();
  } else if (!first_failure.ok()) {
    GS_LOG(WARNING) << "job '" << options_.job_id << "' epoch " << options_.epoch << ": "
                    << first_failure.message();
    BreakAndTell(first_failure);
  }
  if (outcome.kept_state && options_.observer != nullptr) {
    // The norm reads every residual: at most once a second (the metrics'
    // resolution); the rest is cheap.
    const ErrorFeedbackStore& f = runner_->feedback();
    if (end - feedback_norm_at_ >= absl::Seconds(1)) {
      feedback_norm_ = f.ResidualNorm();
      feedback_norm_at_ = end;
    }
    options_.observer->OnErrorFeedback(options_.job_id, options_.epoch, f.bytes(), feedback_norm_,
                                       f.refusals(), /*ended=*/false);
    feedback_reported_ = true;
  }
  intake_.NextOp();
  traffic_.Account(bytes, end - negotiate_start, end);
}

}  // namespace gradsync
