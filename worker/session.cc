#include "worker/session.h"

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <limits>
#include <random>

#include "absl/strings/str_cat.h"
#include "common/clock.h"
#include "common/logging.h"
#include "common/status_macros.h"
#include "common/process.h"

namespace gradsync {
namespace {
std::atomic<uint64_t> g_segment_counter{0};

// Per-process random part: pids repeat across containers and sandboxes that
// share /dev/shm.
const std::string& ProcessNonce() {
  static const std::string* nonce = [] {
    std::random_device rd;
    return new std::string(absl::StrCat(absl::Hex(rd(), absl::kZeroPad8)));
  }();
  return *nonce;
}
constexpr size_t kMaxUnreportedOps = 4096;
}  // namespace

Session::Session(SessionInfo info, std::unique_ptr<transport::Context> ctx,
                 RingOptions ring_options, std::shared_ptr<JobGroup> group,
                 DaemonObserver* observer)
    : info_(std::move(info)),
      ctx_(std::move(ctx)),
      ring_options_(ring_options),
      group_(std::move(group)),
      observer_(observer),
      peer_sent_(info_.world_size, 0),
      peer_received_(info_.world_size, 0),
      peer_retrans_(info_.world_size, 0) {
  if (observer_ != nullptr) observer_->OnSessionOpened(info_.job_id);
  if (!info_.ps_shards.empty()) {
    ps::PsWorkerOptions po;
    po.job_id = info_.job_id;
    po.epoch = static_cast<uint64_t>(info_.epoch);
    po.shards = info_.ps_shards;
    auto w = ps::PsWorker::Create(po);
    if (w.ok()) {
      ps_ = std::move(*w);
    } else {
      GS_LOG(WARNING) << "job '" << info_.job_id << "': no parameter-server path: "
                      << w.status().message();
    }
  }
  PlanTopology topology;
  topology.world = info_.world_size;
  topology.nodes = group_ != nullptr ? group_->layout().nodes : info_.world_size;
  topology.shares_daemons = group_ != nullptr;
  topology.ps_shards = ps_ != nullptr ? ps_->shards() : 0;
  const transport::TcpControls* tcp = ctx_ != nullptr ? ctx_->tcp() : nullptr;
  topology.streams = tcp != nullptr ? tcp->streams() : 1;
  topology.probe_streams = tcp != nullptr ? tcp->active_streams() : 1;
  planner_ = std::make_unique<Planner>(info_.planner, topology, info_.link);
  if (!info_.timeline_path.empty()) {
    auto t = Timeline::Open(info_.timeline_path, info_.rank,
                            absl::StrCat("rank ", info_.rank, " (job ", info_.job_id, ")"));
    if (t.ok()) {
      timeline_ = std::move(*t);
    } else {
      GS_LOG(WARNING) << "job '" << info_.job_id << "': no timeline: " << t.status().message();
    }
  }
  last_used_ = FastNow();
  executor_ = std::thread([this] { ExecutorLoop(); });
  NameThread(executor_, absl::StrCat("gs-exec-r", info_.rank).c_str());
}

Session::~Session() {
  Close();
  if (observer_ != nullptr) observer_->OnSessionClosed(info_.job_id);
}

SessionStatus Session::Status() const {
  SessionStatus st = OwnStatus();
  // Every rank on this daemon: the in-memory rendezvous knows who arrived.
  if (st.has_current && st.phase == "negotiating" && group_ != nullptr &&
      group_->layout().nodes == 1) {
    st.arrived = group_->ArrivedAt(st.current_seq);
    if (std::find(st.arrived.begin(), st.arrived.end(), info_.rank) == st.arrived.end()) {
      st.arrived.push_back(info_.rank);
    }
    std::sort(st.arrived.begin(), st.arrived.end());
    st.missing.clear();
    for (int r = 0; r < info_.world_size; ++r) {
      if (!std::binary_search(st.arrived.begin(), st.arrived.end(), r)) st.missing.push_back(r);
    }
  }
  return st;
}

SessionStatus Session::OwnStatus() const {
  SessionStatus st;
  st.info = info_;
  absl::MutexLock l(&mu_);
  st.health = epoch_error_;
  st.queued = static_cast<int>(queue_.size());
  st.last_completed_seq = last_completed_seq_;
  if (last_completed_seq_ != 0) {
    st.last_completed = absl::StrCat(last_completed_sig_.Describe(), " (op ", last_completed_seq_,
                                     "): ",
                                     last_completed_code_ == absl::StatusCode::kOk
                                         ? "OK"
                                         : absl::StatusCodeToString(last_completed_code_));
  }
  st.last_completed_at = last_completed_at_;
  if (current_seq_ != 0) {
    st.has_current = true;
    st.current_seq = current_seq_;
    st.current = absl::StrCat(current_sig_.Describe(), " (op ", current_seq_, ")");
    st.phase = current_phase_;
    st.current_since = current_since_;
    st.arrived = current_arrived_;
    std::sort(st.arrived.begin(), st.arrived.end());
    if (current_phase_ == "negotiating") {
      for (int r = 0; r < info_.world_size; ++r) {
        if (!std::binary_search(st.arrived.begin(), st.arrived.end(), r)) st.missing.push_back(r);
      }
    }
  }
  return st;
}

void Session::Touch() {
  absl::MutexLock l(&mu_);
  last_used_ = FastNow();
}

absl::Time Session::last_used() const {
  absl::MutexLock l(&mu_);
  return last_used_;
}

bool Session::has_pending_ops() const {
  absl::MutexLock l(&mu_);
  for (const auto& [seq, op] : ops_) {
    if (!op->outcome.done) return true;
  }
  return false;
}

bool Session::closed() const {
  absl::MutexLock l(&mu_);
  return closing_;
}

absl::Status Session::health() const {
  absl::MutexLock l(&mu_);
  return epoch_error_;
}

absl::Status Session::Refusal() const {
  absl::MutexLock l(&mu_);
  return RefusalLocked();
}

absl::Status Session::RefusalLocked() const {
  if (closing_) return absl::FailedPreconditionError("session is closed");
  if (!not_accepting_.empty()) return absl::UnavailableError(not_accepting_);
  if (!epoch_error_.ok()) {
    return absl::FailedPreconditionError(
        absl::StrCat("job '", info_.job_id, "' epoch ", info_.epoch,
                     " is no longer usable (open a new session): ", epoch_error_.message()));
  }
  return absl::OkStatus();
}

absl::StatusOr<BufferInfo> Session::AllocateBuffer(uint64_t size) {
  constexpr uint64_t kMaxBuffer = 64ull << 30;
  if (size > kMaxBuffer) {
    return absl::InvalidArgumentError(
        absl::StrCat("buffer of ", size, " bytes exceeds the limit of ", kMaxBuffer, " bytes"));
  }
  const std::string name = absl::StrCat("/gradsync.", ::getpid(), ".", ProcessNonce(), "-",
                                       ++g_segment_counter);
  auto seg = ShmSegment::Create(name, size);
  if (!seg.ok()) return seg.status();
  absl::MutexLock l(&mu_);
  if (closing_) return absl::FailedPreconditionError("session is closing");
  const uint64_t id = next_buffer_id_++;
  buffers_[id] = std::shared_ptr<ShmSegment>(std::move(*seg));
  return BufferInfo{id, name, size};
}

absl::Status Session::FreeBuffer(uint64_t id) {
  absl::MutexLock l(&mu_);
  if (buffers_.erase(id) == 0) {
    return absl::NotFoundError(absl::StrCat("buffer ", id, " does not exist in session ",
                                            info_.session_id));
  }
  return absl::OkStatus();  // an op still using it keeps the mapping alive
}

absl::StatusOr<uint64_t> Session::Submit(const SubmitArgs& a) {
  std::shared_ptr<SubmissionFeed> wake;
  absl::StatusOr<uint64_t> seq = Enqueue(a, &wake);
  // Submitted over gRPC while the executor sleeps on the feed's doorbell: ring
  // it outside mu_ (a feed's Pump takes its own lock, then ours).
  if (wake != nullptr) wake->Wake();
  return seq;
}

absl::StatusOr<uint64_t> Session::Enqueue(const SubmitArgs& a,
                                          std::shared_ptr<SubmissionFeed>* wake) {
  // Only error messages use it: built on demand, not for every op.
  auto what = [&a] { return absl::StrCat(CollectiveName(a.kind), " '", a.name, "'"); };
  if (IsRootedCollective(a.kind) && (a.root < 0 || a.root >= info_.world_size)) {
    return absl::InvalidArgumentError(absl::StrCat(what(), ": root ", a.root,
                                                   " out of range for world size ",
                                                   info_.world_size));
  }
  if (a.name.size() > kMaxOpNameBytes) {
    return absl::InvalidArgumentError(absl::StrCat("op name is ", a.name.size(),
                                                   " bytes; the limit is ", kMaxOpNameBytes));
  }
  const uint64_t esize = DTypeSize(a.dtype);
  const uint64_t blocks = IsBlockedCollective(a.kind) ? static_cast<uint64_t>(info_.world_size) : 1;
  if (a.count > (uint64_t{1} << 40) / esize / blocks) {
    return absl::InvalidArgumentError(absl::StrCat("count ", a.count, " is too large"));
  }
  const uint64_t bytes = a.count * esize * blocks;
  const absl::string_view algo_name = !a.algorithm.empty() && a.algorithm != "auto"
                                          ? a.algorithm
                                          : absl::string_view(info_.job_algorithm);
  absl::StatusOr<uint8_t> code = RequestedPlanCode(algo_name, a.kind, bytes);
  if (!code.ok()) return absl::InvalidArgumentError(absl::StrCat(what(), ": ", code.status().message()));
  if (*code == kParameterServerPlanCode && ps_ == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat(
        what(), ": algorithm 'ps' needs parameter-server shards; job '", info_.job_id,
        "' has none (create it with ps_shards > 0 and start gradsync-ps)"));
  }
  if (*code == kHierarchicalPlanCode && group_ == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat(
        what(), ": algorithm 'hier' needs ranks that share a daemon; job '", info_.job_id,
        "' has one rank per daemon"));
  }
  if (a.timeout < absl::ZeroDuration()) {
    return absl::InvalidArgumentError("negative op timeout");
  }
  absl::MutexLock l(&mu_);
  last_used_ = FastNow();
  RETURN_IF_ERROR(RefusalLocked());
  const bool no_buffer = a.kind == CollectiveKind::kBarrier && a.buffer_id == 0;
  if (no_buffer && a.count != 0) {
    return absl::InvalidArgumentError(what() + ": a barrier without a buffer must have count 0");
  }
  auto it = buffers_.find(a.buffer_id);
  if (!no_buffer && it == buffers_.end()) {
    return absl::NotFoundError(absl::StrCat("buffer ", a.buffer_id, " does not exist in session ",
                                            info_.session_id));
  }
  if (!no_buffer &&
      (a.offset_bytes > it->second->size() || bytes > it->second->size() - a.offset_bytes)) {
    return absl::InvalidArgumentError(absl::StrCat(
        what(), ": ", DTypeName(a.dtype), "[", a.count, "]", blocks > 1 ? absl::StrCat(" x ", blocks, " blocks") : "",
        " (", bytes, " bytes) at offset ", a.offset_bytes,
        " does not fit in buffer ", a.buffer_id, " of ", it->second->size(), " bytes"));
  }
  if (a.offset_bytes % esize != 0) {
    return absl::InvalidArgumentError(absl::StrCat("offset ", a.offset_bytes,
                                                   " is not a multiple of the ",
                                                   DTypeName(a.dtype), " element size ", esize));
  }
  if (ops_.size() >= kMaxUnreportedOps) {
    return absl::ResourceExhaustedError(absl::StrCat(
        ops_.size(), " ops are queued or unreported; Wait for some before submitting more"));
  }
  auto op = std::make_shared<Op>();
  op->seq = next_seq_++;
  op->sig.seq = op->seq;
  op->sig.kind = a.kind;
  op->sig.dtype = a.dtype;
  op->sig.op = a.op;
  op->sig.count = a.count;
  op->sig.name.assign(a.name.data(), a.name.size());
  op->sig.root = IsRootedCollective(a.kind) ? a.root : 0;
  op->sig.forced = *code;
  if (!no_buffer) op->buffer = it->second;
  op->offset = a.offset_bytes;
  op->submitted = FastNow();
  op->deadline =
      op->submitted + (a.timeout > absl::ZeroDuration() ? a.timeout : info_.default_op_timeout);
  ops_[op->seq] = op;
  queue_.push_back(op);
  if (observer_ != nullptr) observer_->OnOpQueued();
  if (waiting_on_feed_) *wake = feed_;
  return op->seq;
}

absl::StatusOr<OpOutcome> Session::Wait(uint64_t op_id, absl::Duration timeout) {
  const absl::Time deadline = FastNow() + timeout;
  absl::MutexLock l(&mu_);
  last_used_ = FastNow();
  auto it = ops_.find(op_id);
  if (it == ops_.end()) {
    return absl::NotFoundError(absl::StrCat("op ", op_id, " is not pending in session ",
                                            info_.session_id, " (already reported, or never submitted)"));
  }
  std::shared_ptr<Op> op = it->second;
  auto done = [&op]() { return op->outcome.done; };
  mu_.AwaitWithDeadline(absl::Condition(&done), deadline);
  OpOutcome out = op->outcome;
  if (out.done) ops_.erase(op_id);
  return out;
}

void Session::StopAccepting(const std::string& reason) {
  absl::MutexLock l(&mu_);
  not_accepting_ = reason;
}

void Session::SetCompletionListener(CompletionListener listener) {
  absl::MutexLock l(&mu_);
  listener_ = listener ? std::make_shared<const CompletionListener>(std::move(listener)) : nullptr;
}

void Session::SetSubmissionFeed(std::shared_ptr<SubmissionFeed> feed) {
  std::shared_ptr<SubmissionFeed> old;
  {
    absl::MutexLock l(&mu_);
    old = std::move(feed_);
    feed_ = std::move(feed);
  }
  if (old != nullptr) old->Wake();  // an executor sleeping on it looks again
}

void Session::WakeExecutor() {
  std::shared_ptr<SubmissionFeed> feed;
  {
    absl::MutexLock l(&mu_);
    if (waiting_on_feed_) feed = feed_;
  }
  if (feed != nullptr) feed->Wake();
}

void Session::EndEpoch(const absl::Status& reason) {
  {
    absl::MutexLock l(&mu_);
    if (epoch_error_.ok()) epoch_error_ = reason;
  }
}

void Session::AbortEpoch(const absl::Status& reason) {
  {
    absl::MutexLock l(&mu_);
    if (epoch_error_.ok()) epoch_error_ = reason;
  }
  ctx_->Abort(reason);
  if (group_ != nullptr) group_->Abort(reason);
  if (ps_ != nullptr) ps_->Abort(reason);
}

void Session::Close() {
  std::call_once(close_once_, [this] {
    {
      absl::MutexLock l(&mu_);
      closing_ = true;
      if (epoch_error_.ok()) epoch_error_ = absl::CancelledError("session closed");
    }
    WakeExecutor();
    const absl::Status why =
        absl::CancelledError(absl::StrCat("rank ", info_.rank, " closed its session"));
    ctx_->Abort(why);
    if (group_ != nullptr) group_->Abort(why);
    if (ps_ != nullptr) ps_->Abort(why);
    if (executor_.joinable()) executor_.join();
    absl::MutexLock l(&mu_);
    buffers_.clear();
  });
}

std::shared_ptr<Session::Op> Session::NextOp(absl::Time last_active) {
  std::shared_ptr<SubmissionFeed> feed;
  uint32_t snapshot = 0;
  {
    absl::MutexLock l(&mu_);
    if (queue_.empty() && !closing_ && feed_ != nullptr) feed = feed_;
  }
  if (feed != nullptr) {
    // Idle with a feed: take its submissions here; spin a little after
    // activity, then sleep on its doorbell (Submit and Close ring it).
    snapshot = feed->Snapshot();
    feed->Pump();
  }
  {
    absl::MutexLock l(&mu_);
    auto ready = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
      return closing_ || !queue_.empty() || feed_ != nullptr;
    };
    mu_.Await(absl::Condition(&ready));
    if (!queue_.empty()) {
      std::shared_ptr<Op> op = queue_.front();
      queue_.pop_front();
      return op;
    }
    if (closing_ || feed == nullptr || feed != feed_) {
      return nullptr;  // closing with nothing queued, or a feed appeared or changed: look again
    }
    waiting_on_feed_ = true;
  }
  const absl::Duration spin = last_active + feed->spin() - FastNow();
  if (!feed->Spin(snapshot, spin)) {
    OnIdle();
    feed->Wait(snapshot, absl::Milliseconds(100));
  }
  absl::MutexLock l(&mu_);
  waiting_on_feed_ = false;
  return nullptr;
}

void Session::ExecutorLoop() {
  absl::Time last_active = FastNow();
  while (true) {
    std::shared_ptr<Op> op = NextOp(last_active);
    if (op == nullptr) {
      absl::MutexLock l(&mu_);
      if (closing_ && queue_.empty()) return;
      continue;
    }
    const absl::Time start = FastNow();
    {
      absl::MutexLock l(&mu_);
      current_seq_ = op->seq;
      current_sig_ = op->sig;  // described only when someone asks (Status)
      current_phase_ = "negotiating";
      current_since_ = start;
      current_arrived_ = {info_.rank};
      op->started = start;
    }
    arrival_wait_ = absl::ZeroDuration();
    absl::Status s;
    if (timeline_ != nullptr) {
      timeline_->SetOp(op->seq, op->sig.Describe());
      timeline_->Event("queued", "op", op->submitted, start);
      ScopedTracer tracing(timeline_.get());
      s = RunOp(*op);
      timeline_->Instant(s.ok() ? "done" : "failed", FastNow());
    } else {
      s = RunOp(*op);
    }
    const absl::Time end = FastNow();
    bool newly_failed = false;
    OpOutcome outcome;
    Finish(*op, s, end, &newly_failed, &outcome);  // no-op if another rank's thread did it
    last_active = FastNow();
    if (observer_ != nullptr) Account(*op, outcome, newly_failed, end);
  }
}

bool Session::Finish(Op& op, const absl::Status& s, absl::Time end, bool* newly_failed,
                     OpOutcome* outcome) {
  std::shared_ptr<const CompletionListener> listener;
  {
    absl::MutexLock l(&mu_);
    if (op.outcome.done) {  // completed early (JobGroup::LocalAllreduce::complete)
      *outcome = op.outcome;
      return false;
    }
    op.outcome.status = s;
    op.outcome.queued_time = op.started - op.submitted;
    op.outcome.run_time = end - op.started;
    op.outcome.done = true;
    *newly_failed = !s.ok() && !absl::IsInvalidArgument(s) && epoch_error_.ok();
    if (*newly_failed) epoch_error_ = s;
    last_completed_seq_ = op.seq;
    last_completed_sig_ = op.sig;
    last_completed_code_ = s.code();
    last_completed_at_ = end;
    if (current_seq_ == op.seq) current_seq_ = 0;
    listener = listener_;
    *outcome = op.outcome;
  }
  // The client first; metrics come after, overlapping with its next op.
  if (listener != nullptr && (*listener)(op.seq, *outcome)) {
    absl::MutexLock l(&mu_);
    ops_.erase(op.seq);
  }
  return true;
}

OpRecord Session::Record(const Op& op, const OpOutcome& outcome,
                         absl::Duration arrival_wait) const {
  OpRecord rec;
  rec.job_id = info_.job_id;  // views: valid while op and outcome are
  rec.kind = op.sig.kind;
  rec.algorithm = outcome.algorithm;
  rec.code = outcome.status.code();
  rec.bytes = CollectiveBufferBytes(op.sig.kind, op.sig.count, op.sig.dtype, info_.world_size);
  rec.world = info_.world_size;
  rec.queued = outcome.queued_time;
  rec.run = outcome.run_time;
  rec.arrival_wait = arrival_wait;
  return rec;
}

void Session::Account(const Op& op, const OpOutcome& outcome, bool newly_failed, absl::Time end) {
  const absl::Status& s = outcome.status;
  const OpRecord rec = Record(op, outcome, arrival_wait_);
  observer_->OnOpDone(rec);
  // Per-peer bytes after an op that moved at least 1 MiB (its per-link
  // bandwidth is reported too) or failed; after small ops at most every
  // kPeerBytesPeriod, and when the executor goes idle (OnIdle): looking at
  // every peer's counters after every 8-byte op would cost more than the op.
  if (rec.bytes >= kPeerBandwidthMinBytes || !s.ok() || end >= next_peer_flush_) {
    FlushPeerBytes(outcome.run_time, end);
  } else {
    peer_bytes_dirty_ = true;
  }
  // Retransmit counters cost a getsockopt(TCP_INFO) per connection: at most once a second.
  if (end >= next_retrans_sample_) {
    next_retrans_sample_ = end + absl::Seconds(1);
    for (int p = 0; p < info_.world_size; ++p) {
      if (p == info_.rank) continue;
      const uint64_t retrans = ctx_->tcp() != nullptr ? ctx_->tcp()->Retransmits(p) : 0;
      if (retrans > peer_retrans_[p]) {
        observer_->OnPeerRetransmits(PeerName(p), retrans - peer_retrans_[p]);
        peer_retrans_[p] = retrans;
      }
    }
  }
  if (!s.ok() && !absl::IsInvalidArgument(s) && newly_failed) {
    observer_->OnEpochFailed(EpochFailureCause(s));
  }
}

void Session::FlushPeerBytes(absl::Duration op_run, absl::Time now) {
  peer_bytes_dirty_ = false;
  next_peer_flush_ = now + kPeerBytesPeriod;
  const double secs = absl::ToDoubleSeconds(op_run);
  for (int p = 0; p < info_.world_size; ++p) {
    if (p == info_.rank) continue;
    const uint64_t sent = ctx_->BytesSentTo(p), recv = ctx_->BytesReceivedFrom(p);
    if (sent == peer_sent_[p] && recv == peer_received_[p]) continue;
    const std::string& peer = PeerName(p);
    observer_->OnPeerBytes(peer, sent - peer_sent_[p], recv - peer_received_[p]);
    // Since the last flush: the op just finished, plus at most a period of small ops.
    if (sent - peer_sent_[p] >= kPeerBandwidthMinBytes && secs > 0) {
      observer_->OnPeerBandwidth(peer, (sent - peer_sent_[p]) / secs);
    }
    peer_sent_[p] = sent;
    peer_received_[p] = recv;
  }
}

void Session::OnIdle() {
  if (peer_bytes_dirty_ && observer_ != nullptr) FlushPeerBytes(absl::ZeroDuration(), FastNow());
}

const std::string& Session::PeerName(int p) {
  if (peer_names_.empty()) {
    for (int r = 0; r < info_.world_size; ++r) {
      peer_names_.push_back(r < static_cast<int>(info_.peer_daemons.size())
                                ? info_.peer_daemons[r]
                                : absl::StrCat("rank", r));
    }
  }
  return peer_names_[p];
}

absl::Status Session::RunOp(Op& op) {
  // Only errors and debug logs use it: built on demand, not for every op.
  auto what = [&op] { return absl::StrCat(op.sig.Describe(), " (op ", op.seq, ")"); };
  absl::Status pre;
  {
    absl::MutexLock l(&mu_);
    pre = epoch_error_;
  }
  if (!pre.ok()) {
    return absl::Status(pre.code(), absl::StrCat(what(), " not run at rank ", info_.rank,
                                                 ": the epoch failed earlier: ", pre.message()));
  }
  const size_t bytes =
      CollectiveBufferBytes(op.sig.kind, op.sig.count, op.sig.dtype, info_.world_size);
  // This rank's plan (collective/planner.h); every rank runs rank 0's.
  const Plan mine = planner_->Propose(op.sig.kind, bytes, op.sig.forced);
  op.sig.proposal = mine.Code();
  op.sig.streams = mine.streams;
  const bool one_daemon = group_ != nullptr && group_->layout().nodes == 1;
  // Whether the data ride on the signature exchange: decided alike on every
  // rank (the planner's fused choice), so it needs no agreement.
  const bool fused = mine.fused() && !one_daemon;
  uint8_t agreed_streams = 0;
  char* const data = op.buffer != nullptr ? op.buffer->data() + op.offset : nullptr;
  const absl::Time negotiate_start = FastNow();
  uint8_t agreed = OpSignature::kNoAlgorithm;
  absl::Status s;
  bool done = false;
  auto arrived = [this](int rank) {
    absl::MutexLock l(&mu_);
    current_arrived_.push_back(rank);
  };
  if (one_daemon) {
    // Every rank on this daemon: signatures meet in memory, and a small
    // hierarchical allreduce is done in the same rendezvous.
    const std::string encoded = op.sig.Encode();
    JobGroup::LocalAllreduce small;
    const bool small_hier = mine.path == PlanPath::kHierarchical &&
                            planner_->HierRendezvous(op.sig.kind, bytes);
    if (small_hier) {
      small = {data, op.sig.count, op.sig.dtype, op.sig.op};
      // The last rank to arrive tells this rank's client right after the
      // reduction, from its own thread: one wake-up less on the way back.
      small.complete = [this, &op, name = mine.Name()] {
        {
          absl::MutexLock l(&mu_);
          op.outcome.algorithm = name;
        }
        bool newly_failed = false;
        OpOutcome outcome;
        Finish(op, absl::OkStatus(), FastNow(), &newly_failed, &outcome);
      };
    }
    s = group_->CheckLocalSignatures(info_.rank, op.seq, encoded, op.deadline, &agreed,
                                     small_hier ? &small : nullptr);
    // A barrier needs nothing more than that rendezvous of every rank.
    done = small.done || (s.ok() && op.sig.kind == CollectiveKind::kBarrier &&
                          agreed == static_cast<uint8_t>(Algorithm::kOneShot));
  } else {
    FusedAllreduce small;
    const bool with_data = fused && op.sig.kind == CollectiveKind::kAllreduce;
    if (with_data) small = {data, op.sig.dtype, op.sig.op, op.sig.count};
    s = CheckSignatures(*ctx_, op.sig, info_.link.signatures, op.deadline, arrived, &agreed,
                        with_data ? &small : nullptr, &sig_scratch_, &agreed_streams);
    // Every rank switches alike, after the exchange (which uses stream 0).
    if (s.ok() && agreed_streams > 0 && ctx_->tcp() != nullptr) ctx_->tcp()->UseStreams(agreed_streams);
    done = s.ok() && fused;
  }
  Plan plan;
  if (s.ok()) {
    absl::StatusOr<Plan> p = PlanFromCode(agreed);
    if (p.ok()) {
      plan = *p;
    } else {
      s = absl::Status(p.status().code(), absl::StrCat("rank 0 proposed ", p.status().message()));
    }
  }
  arrival_wait_ = FastNow() - negotiate_start;
  if (s.ok() && done) {
    TraceEvent(plan.Name(), "op", negotiate_start);
    if (fused) {
      planner_->Observe(plan, op.sig.kind, bytes, 0, absl::ToDoubleMicroseconds(arrival_wait_),
                        absl::ToDoubleMicroseconds(arrival_wait_), info_.rank == 0);
    }
    GS_LOG(DEBUG) << "job '" << info_.job_id << "' rank " << info_.rank << " " << what()
                  << ": plan " << plan.Name()
                  << (fused ? " (data sent with the signatures)" : " (done in the local rendezvous)");
    absl::MutexLock l(&mu_);
    op.outcome.algorithm = plan.Name();
    return s;
  }
  TraceEvent("negotiate", "op", negotiate_start);
  const absl::Time run_start = TraceNow();
  if (s.ok()) s = RunPlan(op, plan, mine, data);
  TraceEvent(plan.Name(), "op", run_start);
  if (s.ok()) {
    const std::string line = planner_->Observe(
        plan, op.sig.kind, bytes, agreed_streams,
        absl::ToDoubleMicroseconds(FastNow() - negotiate_start),
        absl::ToDoubleMicroseconds(arrival_wait_), info_.rank == 0);
    if (!line.empty()) GS_LOG(INFO) << "job '" << info_.job_id << "': " << line;
    return s;
  }
  if (absl::IsInvalidArgument(s)) {  // signature mismatch: the streams are intact
    GS_LOG(WARNING) << "job '" << info_.job_id << "' rank " << info_.rank << ": " << s.message();
    return s;
  }
  absl::Status annotated(s.code(), absl::StrCat(what(), " failed at rank ", info_.rank, ": ",
                                                s.message()));
  // Tell every peer (no-op if the context already failed and told them).
  (void)ctx_->Fail(annotated);
  GS_LOG(WARNING) << "job '" << info_.job_id << "' epoch " << info_.epoch << ": "
                  << annotated.message();
  return annotated;
}

absl::Status Session::RunPlan(Op& op, const Plan& plan, const Plan& mine, char* data) {
  const bool hier = plan.path == PlanPath::kHierarchical;
  const bool use_ps = plan.path == PlanPath::kParameterServer;
  if (hier && group_ == nullptr) {
    return absl::FailedPreconditionError(
        "rank 0 chose the hierarchical path; this rank has no group");
  }
  if (use_ps && ps_ == nullptr) {
    return absl::FailedPreconditionError(
        "rank 0 chose the parameter server; this rank has no shards");
  }
  if (!hier && !use_ps && !Implements(plan.algorithm, op.sig.kind)) {
    return absl::InvalidArgumentError(absl::StrCat("rank 0 chose '", plan.Name(),
                                                   "', which does not implement ",
                                                   CollectiveName(op.sig.kind)));
  }
  {
    absl::MutexLock l(&mu_);
    op.outcome.algorithm = plan.Name();
    GS_LOG(DEBUG) << "job '" << info_.job_id << "' rank " << info_.rank << " "
                  << op.sig.Describe() << " (op " << op.seq << "): plan " << plan.Name()
                  << " (rank 0's proposal; this rank proposed " << mine.Name()
                  << (op.sig.forced != OpSignature::kNoAlgorithm ? ", forced" : "") << ")";
    current_phase_ = absl::StrCat("running ", plan.Name());
    current_arrived_.clear();
    for (int r = 0; r < info_.world_size; ++r) current_arrived_.push_back(r);
  }
  if (hier) {
    return group_->HierAllreduce(info_.rank, op.seq, data, op.sig.count, op.sig.dtype, op.sig.op,
                                 op.deadline);
  }
  if (use_ps) {
    return ps_->PushPull(op.seq, data, op.sig.count, op.sig.dtype, op.sig.op, info_.world_size,
                         info_.rank, info_.ps_partition_bytes, slicer_, op.deadline);
  }
  CollectiveCall call;
  call.kind = op.sig.kind;
  call.data = data;
  call.count = op.sig.count;
  call.dtype = op.sig.dtype;
  call.op = op.sig.op;
  call.root = op.sig.root;
  call.seq = op.seq;
  call.deadline = op.deadline;
  call.ring = ring_options_;
  return RunCollective(*ctx_, call, plan.algorithm, &scratch_);
}

}  // namespace gradsync
