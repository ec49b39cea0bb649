#include "worker/job_executor.h"

#include <sched.h>

#include <algorithm>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "collective/collectives.h"
#include "collective/trace.h"
#include "common/clock.h"
#include "common/logging.h"
#include "common/process.h"
#include "kernels/cpu_reduce.h"
#include "worker/session.h"
#include "worker/submission_feed.h"
#include "worker/timeline.h"

namespace gradsync {
namespace {

// The executor whose thread this is (its own Kicks need no wake-up).
thread_local const JobExecutor* t_executor = nullptr;

// Sleep bounds while local ranks are missing: the executor sleeps on one
// missing rank's doorbell and looks at the others this often.
constexpr absl::Duration kWaitingPoll = absl::Milliseconds(1);
constexpr absl::Duration kIdlePoll = absl::Milliseconds(1);
constexpr absl::Duration kLongIdlePoll = absl::Milliseconds(10);
constexpr absl::Duration kLongIdleAfter = absl::Milliseconds(100);
constexpr absl::Duration kSingleIdlePoll = absl::Milliseconds(100);

std::string RankList(const std::vector<int>& ranks) {
  return absl::StrCat(ranks.size() == 1 ? "rank " : "ranks ", absl::StrJoin(ranks, ","));
}

}  // namespace

JobExecutor::JobExecutor(JobExecutorOptions options, std::unique_ptr<transport::Context> node_ctx)
    : options_(std::move(options)),
      node_ctx_(std::move(node_ctx)),
      local_(options_.placement.local_ranks()),
      one_rank_per_daemon_(options_.placement.nodes() == options_.placement.world) {
  const JobPlacement& p = options_.placement;
  PlanTopology topology;  // the network stage: one participant per daemon
  topology.world = p.nodes();
  topology.ranks = p.world;
  topology.every_rank_here = node_ctx_ == nullptr;
  topology.ps_shards = static_cast<int>(options_.ps_shards.size());
  const transport::TcpControls* tcp = node_ctx_ != nullptr ? node_ctx_->tcp() : nullptr;
  topology.streams = tcp != nullptr ? tcp->streams() : 1;
  topology.probe_streams = tcp != nullptr ? tcp->active_streams() : 1;
  if (!options_.ps_shards.empty()) {
    ps::PsWorkerOptions po;
    po.job_id = options_.job_id;
    po.epoch = static_cast<uint64_t>(options_.epoch);
    po.shards = options_.ps_shards;
    po.shard_keys = options_.ps_shard_keys;
    po.encrypt = options_.data_tls;
    po.device = options_.device;
    auto w = ps::PsWorker::Create(po);
    if (w.ok()) {
      ps_ = std::move(*w);
    } else {
      topology.ps_shards = 0;
      GS_LOG(WARNING) << "job '" << options_.job_id << "': no parameter-server path: "
                      << w.status().message();
    }
  }
  planner_ = std::make_unique<Planner>(options_.planner, topology, options_.link);
  const int cores = std::max(1, static_cast<int>(std::thread::hardware_concurrency()));
  if (local_.size() > 1 && cores > 1) {
    pool_ = std::make_unique<SlicePool>(std::min(static_cast<int>(local_.size()), cores));
  }
  slots_.resize(local_.size());
  encoded_.resize(local_.size());
  members_.resize(local_.size());
  peer_sent_.assign(p.nodes(), 0);
  peer_received_.assign(p.nodes(), 0);
  peer_retrans_.assign(p.nodes(), 0);
  progress_arrived_.assign(p.world, false);
  thread_ = std::thread([this] { Run(); });
  NameThread(thread_, "gs-exec");
}

JobExecutor::~JobExecutor() {
  std::shared_ptr<SubmissionFeed> feed;
  {
    absl::MutexLock l(&mu_);
    stop_ = true;
    feed = sleep_feed_;
    cv_.SignalAll();
  }
  if (feed != nullptr) feed->Wake();
  if (node_ctx_ != nullptr) node_ctx_->Abort(absl::CancelledError("job executor stopped"));
  GS_CHECK(thread_.get_id() != std::this_thread::get_id())
      << "a job executor destroyed on its own thread";
  if (thread_.joinable()) thread_.join();
}

std::shared_ptr<JobExecutor> JobExecutor::Start(JobExecutorOptions options,
                                                std::unique_ptr<transport::Context> node_ctx) {
  return std::shared_ptr<JobExecutor>(
      new JobExecutor(std::move(options), std::move(node_ctx)), [](JobExecutor* e) {
        if (e->thread_.get_id() == std::this_thread::get_id()) {
          // The executor's Run() goes on after this returns: it stops once
          // the destructor, on this new thread, tells it to, and is joined.
          std::thread([e] { delete e; }).detach();
        } else {
          delete e;
        }
      });
}

void JobExecutor::Attach(Session* session) {
  const auto it = std::find(local_.begin(), local_.end(), session->info().rank);
  if (it == local_.end()) return;
  {
    absl::MutexLock l(&mu_);
    members_[it - local_.begin()] = session;
  }
  Kick();
}

void JobExecutor::Detach(int rank, const absl::Status& why) {
  const auto it = std::find(local_.begin(), local_.end(), rank);
  if (it == local_.end()) return;
  uint64_t generation = 0;
  {
    absl::MutexLock l(&mu_);
    members_[it - local_.begin()] = nullptr;
    if (broken_.ok()) broken_ = why;
    generation = generation_;
  }
  // Tells the other daemons (their ops cannot complete without this rank)
  // and ends a running op here.
  if (node_ctx_ != nullptr) node_ctx_->Abort(why);
  Kick();
  if (t_executor == this) return;
  // A running op ends quickly once the context is aborted; an in-memory one
  // is short. The bound only guards against a bug.
  absl::MutexLock l(&mu_);
  auto released = [this, generation]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return !using_ || generation_ != generation || stop_;
  };
  if (!mu_.AwaitWithTimeout(absl::Condition(&released), absl::Seconds(30))) {
    GS_LOG(ERROR) << "job '" << options_.job_id << "': rank " << rank
                  << "'s session waited 30 s for the executor to let it go";
  }
}

void JobExecutor::Abort(const absl::Status& reason) {
  {
    absl::MutexLock l(&mu_);
    tell_peers_ = true;
  }
  Break(reason);
  if (node_ctx_ != nullptr) node_ctx_->Abort(reason);
}

void JobExecutor::Break(const absl::Status& reason) {
  {
    absl::MutexLock l(&mu_);
    if (broken_.ok()) broken_ = reason;
  }
  Kick();
}

void JobExecutor::Kick() {
  kicks_.fetch_add(1, std::memory_order_acq_rel);
  if (t_executor == this) return;
  std::shared_ptr<SubmissionFeed> feed;
  {
    absl::MutexLock l(&mu_);
    if (!sleeping_) return;
    feed = sleep_feed_;
    cv_.SignalAll();
  }
  if (feed != nullptr) feed->Wake();
}

JobExecutor::OpProgress JobExecutor::Progress(uint64_t seq) const {
  OpProgress p;
  absl::MutexLock l(&progress_mu_);
  if (seq != progress_seq_) return p;
  p.phase = progress_phase_;
  for (int r = 0; r < static_cast<int>(progress_arrived_.size()); ++r) {
    if (progress_arrived_[r]) p.arrived.push_back(r);
  }
  return p;
}

void JobExecutor::NoteArrived(int rank) {
  absl::MutexLock l(&progress_mu_);
  if (rank >= 0 && rank < static_cast<int>(progress_arrived_.size())) progress_arrived_[rank] = true;
}

void JobExecutor::SetPhase(std::string phase) {
  absl::MutexLock l(&progress_mu_);
  progress_phase_ = std::move(phase);
}

void JobExecutor::Run() {
  t_executor = this;
  absl::Time last_active = FastNow();
  std::vector<Session*> members;
  {
    absl::MutexLock l(&progress_mu_);
    progress_seq_ = next_seq_;
    progress_phase_ = "negotiating";
  }
  // Marks the end of one look at the members (Detach waits for it).
  struct Release {
    JobExecutor* e;
    ~Release() {
      absl::MutexLock l(&e->mu_);
      e->using_ = false;
    }
  };
  bool told_peers = false;  // of an Abort
  while (true) {
    absl::Status broken;
    bool tell_peers = false;
    {
      absl::MutexLock l(&mu_);
      if (stop_) break;
      members = members_;
      broken = broken_;
      tell_peers = tell_peers_;
      using_ = true;
      ++generation_;
    }
    Release release{this};
    if (tell_peers && !told_peers && node_ctx_ != nullptr) {
      // Abort() from another thread only marks the context; its driver (this
      // thread) sends the ABORTs, or the other daemons would learn of it
      // (e.g. a client here that died) only at their op deadline. A session
      // that merely closed (Detach) tells nobody: the others' running op may
      // still complete without it, and its connections close with the
      // executor.
      (void)node_ctx_->Fail(broken);
      told_peers = true;
    }
    const bool took = TakeArrivals(members);
    const bool any = std::any_of(slots_.begin(), slots_.end(), [](const auto& s) { return s != nullptr; });
    const bool all = std::all_of(slots_.begin(), slots_.end(), [](const auto& s) { return s != nullptr; });
    if (!broken.ok() && any) {
      FailTaken(members, absl::Status(broken.code(), absl::StrCat("the epoch failed earlier: ",
                                                                  broken.message())));
      last_active = FastNow();
      continue;
    }
    if (broken.ok() && all) {
      RunCurrent(members);
      last_active = FastNow();
      continue;
    }
    if (broken.ok() && any && FastNow() >= EarliestDeadline()) {
      const absl::Status late = LateRankError();
      GS_LOG(WARNING) << "job '" << options_.job_id << "' epoch " << options_.epoch << ": "
                      << late.message();
      Break(late);
      if (node_ctx_ != nullptr) (void)node_ctx_->Fail(late);
      FailTaken(members, late);
      continue;
    }
    if (took) {
      last_active = FastNow();
      continue;
    }
    Idle(members, last_active);
  }
  // Stopping: the sessions are gone or going; what was taken is dropped.
  for (auto& slot : slots_) slot.reset();
}

bool JobExecutor::TakeArrivals(const std::vector<Session*>& members) {
  bool took = false;
  for (size_t i = 0; i < slots_.size(); ++i) {
    if (slots_[i] != nullptr || members[i] == nullptr) continue;
    slots_[i] = members[i]->TakeNext();
    if (slots_[i] == nullptr) continue;
    took = true;
    NoteArrived(local_[i]);
  }
  return took;
}

absl::Time JobExecutor::EarliestDeadline() const {
  absl::Time t = absl::InfiniteFuture();
  for (const auto& op : slots_) {
    if (op != nullptr) t = std::min(t, op->deadline);
  }
  return t;
}

absl::Status JobExecutor::LateRankError() const {
  std::vector<int> have, missing;
  const QueuedOp* any = nullptr;
  for (size_t i = 0; i < slots_.size(); ++i) {
    if (slots_[i] != nullptr) {
      have.push_back(local_[i]);
      any = slots_[i].get();
    } else {
      missing.push_back(local_[i]);
    }
  }
  return absl::DeadlineExceededError(absl::StrCat(
      "timed out at ", RankList(have), " waiting for rank(s) ", absl::StrJoin(missing, ","),
      " to submit op ", any->seq, " (", any->sig.Describe(), ")"));
}

void JobExecutor::FailTaken(const std::vector<Session*>& members,
                            const absl::Status& why) {
  const absl::Time end = FastNow();
  for (size_t i = 0; i < slots_.size(); ++i) {
    std::shared_ptr<QueuedOp> op = std::move(slots_[i]);
    if (op == nullptr) continue;
    const absl::Status s(why.code(), absl::StrCat(op->sig.Describe(), " (op ", op->seq,
                                                  ") failed at rank ", local_[i], ": ",
                                                  why.message()));
    bool newly_failed = false;
    if (members[i] == nullptr) continue;
    if (members[i]->Finish(*op, s, "", end, &newly_failed) && options_.observer != nullptr) {
      options_.observer->OnOpDone(members[i]->Record(*op, absl::ZeroDuration()));
      if (newly_failed) options_.observer->OnEpochFailed(EpochFailureCause(s));
    }
  }
  ++next_seq_;
  absl::MutexLock l(&progress_mu_);
  progress_seq_ = next_seq_;
  progress_phase_ = "negotiating";
  std::fill(progress_arrived_.begin(), progress_arrived_.end(), false);
}

void JobExecutor::Idle(const std::vector<Session*>& members,
                       absl::Time last_active) {
  const uint64_t seen = kicks_.load(std::memory_order_acquire);
  bool waiting = false;  // some local rank has submitted the next op
  std::shared_ptr<SubmissionFeed> feed;  // the doorbell to sleep on
  for (size_t i = 0; i < slots_.size(); ++i) {
    if (slots_[i] != nullptr) {
      waiting = true;
    } else if (feed == nullptr && members[i] != nullptr) {
      feed = members[i]->feed();
    }
  }
  const uint32_t snapshot = feed != nullptr ? feed->Snapshot() : 0;
  // Take the submissions waiting in the missing ranks' queues (they reach
  // the sessions, which Kick).
  for (size_t i = 0; i < slots_.size(); ++i) {
    if (slots_[i] != nullptr || members[i] == nullptr) continue;
    if (std::shared_ptr<SubmissionFeed> f = members[i]->feed()) f->Pump();
  }
  if (kicks_.load(std::memory_order_acquire) != seen) return;
  const absl::Time now = FastNow();
  if (now < last_active + options_.spin) {
    // Soon after activity: poll every missing rank's queue (yielding the
    // CPU), or the one doorbell when a single rank is missing.
    int missing = 0;
    for (size_t i = 0; i < slots_.size(); ++i) missing += slots_[i] == nullptr && members[i] != nullptr;
    if (missing == 1 && feed != nullptr) {
      feed->Spin(snapshot, last_active + options_.spin - now);
      return;
    }
    while (FastNow() < last_active + options_.spin &&
           kicks_.load(std::memory_order_acquire) == seen) {
      sched_yield();
      for (size_t i = 0; i < slots_.size(); ++i) {
        if (slots_[i] != nullptr || members[i] == nullptr) continue;
        if (std::shared_ptr<SubmissionFeed> f = members[i]->feed()) f->Pump();
      }
    }
    return;
  }
  if (peer_bytes_dirty_ && options_.observer != nullptr) FlushPeerBytes(absl::ZeroDuration(), now);
  absl::Duration timeout = slots_.size() == 1 ? kSingleIdlePoll
                           : waiting          ? kWaitingPoll
                           : now - last_active < kLongIdleAfter ? kIdlePoll
                                                                : kLongIdlePoll;
  timeout = std::max(absl::ZeroDuration(), std::min(timeout, EarliestDeadline() - now));
  {
    absl::MutexLock l(&mu_);
    if (stop_ || kicks_.load(std::memory_order_acquire) != seen) return;
    sleeping_ = true;
    sleep_feed_ = feed;
    if (feed == nullptr) {
      cv_.WaitWithTimeout(&mu_, timeout);
      sleeping_ = false;
      return;
    }
  }
  feed->Wait(snapshot, timeout);
  absl::MutexLock l(&mu_);
  sleeping_ = false;
  sleep_feed_ = nullptr;
}

void JobExecutor::RunCurrent(const std::vector<Session*>& members) {
  const size_t k = slots_.size();
  std::vector<QueuedOp*> ops(k);
  for (size_t i = 0; i < k; ++i) ops[i] = slots_[i].get();
  const QueuedOp& lead = *ops[0];
  const uint64_t seq = lead.seq;
  const JobPlacement& place = options_.placement;
  const size_t bytes = CollectiveBufferBytes(lead.sig.kind, lead.sig.count, lead.sig.dtype, place.world);
  // Only errors and debug logs use it: built on demand, not for every op.
  auto what = [&lead] { return absl::StrCat(lead.sig.Describe(), " (op ", lead.seq, ")"); };
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
      s = absl::InternalError(absl::StrCat("rank ", local_[i], " is at op ", ops[i]->seq,
                                           ", rank ", local_[0], " at op ", seq));
    }
    absl::Status health = members[i]->health();
    if (s.ok() && !health.ok()) {
      s = absl::Status(health.code(), absl::StrCat("the epoch failed earlier: ", health.message()));
    }
  }
  // The local ranks' signatures, compared in memory.
  bool local_mismatch = false;
  if (s.ok() && k > 1) {
    for (size_t i = 0; i < k; ++i) ops[i]->sig.EncodeTo(&encoded_[i]);
    for (size_t i = 1; i < k; ++i) local_mismatch = local_mismatch || !SameSignature(encoded_[0], encoded_[i]);
  }
  // What the planner needs to know of the op here; it decides the rest
  // (collective/planner.h). A device path is made for device buffers where
  // the planner would use one and one can be made (worker/device_path.h).
  const bool device_buffers =
      std::all_of(ops.begin(), ops.end(), [](const QueuedOp* op) { return op->device != nullptr; });
  DevicePath* device_path =
      s.ok() && planner_->WantsDevicePath(device_buffers) ? DevicePathFor(ops) : nullptr;
  PlanRequest request;
  request.kind = lead.sig.kind;
  request.bytes = bytes;
  request.forced = lead.sig.forced;
  request.local_mismatch = local_mismatch;
  request.device_path = device_path != nullptr;
  Plan mine;
  if (s.ok()) mine = planner_->Propose(request);
  if (s.ok() && !mine.on_device) s = StageDeviceBuffers(ops, bytes, /*in=*/true);
  std::string plan_name;
  Plan plan = mine;
  absl::Duration exchange;
  if (s.ok() && mine.in_memory) {
    // Every rank is here: the whole op in memory.
    if (local_mismatch) {
      s = CompareSignatures(seq, encoded_);  // local index = rank
    } else {
      plan_name = plan.shown_name;
      SetPhase(absl::StrCat("running ", plan_name));
      if (plan.on_device) {
        s = RunInMemoryOnDevice(*device_path, ops);
      } else {
        LocalCollective c{lead.sig.kind, lead.sig.dtype, lead.sig.op, lead.sig.count,
                          lead.sig.root, {}};
        for (QueuedOp* op : ops) c.bufs.push_back(op->data());
        s = RunInMemory(place, c, &scratch_, Slicing{pool_.get(), plan.slice_min_bytes});
      }
    }
    exchange = FastNow() - negotiate_start;
  } else if (s.ok()) {
    uint8_t agreed_code = OpSignature::kNoAlgorithm, agreed_streams = 0;
    s = Exchange(ops, mine, local_mismatch, &agreed_code, &agreed_streams);
    exchange = FastNow() - negotiate_start;
    TraceEvent("negotiate", "op", negotiate_start);
    if (s.ok()) {
      absl::StatusOr<Plan> agreed = planner_->Agree(request, mine, agreed_code, agreed_streams);
      if (agreed.ok()) {
        plan = *agreed;
      } else {
        s = agreed.status();
      }
    }
    if (s.ok()) {
      plan_name = plan.shown_name;
      if (mine.on_device && !plan.on_device) s = StageDeviceBuffers(ops, bytes, /*in=*/true);
      if (!plan.fused && s.ok()) {  // a fused op is done with the exchange
        SetPhase(absl::StrCat("running ", plan_name));
        const absl::Time run_start = TraceNow();
        s = RunAgreed(ops, plan, plan.on_device ? device_path : nullptr);
        TraceEvent(plan_name, "op", run_start);
      }
      if (s.ok()) {
        const std::string line = planner_->Observe(
            plan, lead.sig.kind, bytes, plan.streams,
            absl::ToDoubleMicroseconds(FastNow() - negotiate_start),
            absl::ToDoubleMicroseconds(exchange), place.node_index == 0);
        if (!line.empty()) GS_LOG(INFO) << "job '" << options_.job_id << "': " << line;
        GS_LOG(DEBUG) << "job '" << options_.job_id << "' " << what() << ": plan " << plan_name
                      << " (rank 0's; this daemon proposed " << mine.Name() << ")";
      }
    }
  }
  if (s.ok() && !plan.on_device) s = StageDeviceBuffers(ops, bytes, /*in=*/false);
  const absl::Time end = FastNow();
  absl::Status first_failure;
  for (size_t i = 0; i < k; ++i) {
    absl::Status st = s;
    if (!s.ok() && !absl::IsInvalidArgument(s)) {
      st = absl::Status(s.code(), absl::StrCat(ops[i]->sig.Describe(), " (op ", seq, ") failed at rank ",
                                               local_[i], ": ", s.message()));
      if (first_failure.ok()) first_failure = st;
    }
    bool newly_failed = false;
    if (!members[i]->Finish(*ops[i], st, st.ok() ? plan_name : "", end, &newly_failed)) continue;
    if (Timeline* t = members[i]->timeline()) t->Instant(st.ok() ? "done" : "failed", end);
    if (options_.observer != nullptr) {
      options_.observer->OnOpDone(
          members[i]->Record(*ops[i], std::max(absl::ZeroDuration(), negotiate_start - ops[i]->started) + exchange));
      if (newly_failed) options_.observer->OnEpochFailed(EpochFailureCause(st));
    }
  }
  if (absl::IsInvalidArgument(s)) {
    GS_LOG(WARNING) << "job '" << options_.job_id << "' on daemon " << place.node_index << ": "
                    << s.message();
  } else if (!first_failure.ok()) {
    GS_LOG(WARNING) << "job '" << options_.job_id << "' epoch " << options_.epoch << ": "
                    << first_failure.message();
    Break(first_failure);
    if (node_ctx_ != nullptr) (void)node_ctx_->Fail(first_failure);  // tells the other daemons
  }
  for (auto& slot : slots_) slot.reset();
  ++next_seq_;
  {
    absl::MutexLock l(&progress_mu_);
    progress_seq_ = next_seq_;
    progress_phase_ = "negotiating";
    std::fill(progress_arrived_.begin(), progress_arrived_.end(), false);
  }
  if (options_.observer != nullptr) Account(bytes, end - negotiate_start, end);
}



}  // namespace gradsync
