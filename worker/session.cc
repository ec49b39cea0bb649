#include "worker/session.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "collective/collectives.h"
#include "collective/op_validation.h"
#include "common/clock.h"
#include "common/logging.h"
#include "common/status_macros.h"

namespace gradsync {

absl::Status CheckOwner(const SessionInfo& info, int64_t caller_uid, absl::string_view what) {
  if (info.owner_uid < 0 || caller_uid == info.owner_uid) return absl::OkStatus();
  return absl::PermissionDeniedError(absl::StrCat(
      "session ", info.session_id, " belongs to uid ", info.owner_uid, "; uid ",
      caller_uid < 0 ? std::string("(unknown)") : absl::StrCat(caller_uid), " may not ", what,
      " it"));
}

namespace {
SessionBuffers::Options BufferOptions(const SessionInfo& info) {
  SessionBuffers::Options o;
  o.session_id = info.session_id;
  o.job_id = info.job_id;
  o.rank = info.rank;
  o.memory_limit_bytes = info.memory_limit_bytes;
  o.owner_uid = info.owner_uid;
  o.tenant = info.tenant;
  return o;
}
}  // namespace

Session::Session(SessionInfo info, std::shared_ptr<SessionExecutor> executor,
                 DaemonObserver* observer, std::shared_ptr<TenantMemory> tenant_memory)
    : info_(std::move(info)),
      executor_(std::move(executor)),
      observer_(observer),
      epoch_(info_.job_id, info_.epoch),
      buffers_(std::make_shared<SessionBuffers>(BufferOptions(info_), std::move(tenant_memory))),
      ops_(info_.session_id, &epoch_) {
  if (observer_ != nullptr) observer_->OnSessionOpened(info_.job_id);
  if (!info_.timeline_path.empty()) {
    auto t = Timeline::Open(info_.timeline_path, info_.rank,
                            absl::StrCat("rank ", info_.rank, " (job ", info_.job_id, ")"));
    if (t.ok()) {
      timeline_ = std::move(*t);
    } else {
      GS_LOG(WARNING) << "job '" << info_.job_id << "': no timeline: " << t.status().message();
    }
  }
  lease_.Touch();
}

Session::~Session() {
  Close();
  if (observer_ != nullptr) observer_->OnSessionClosed(info_.job_id);
}

SessionStatus Session::Status() const {
  SessionStatus st;
  st.info = info_;
  st.health = epoch_.health();
  OpsStatus ops = ops_.Status();
  st.queued = ops.queued;
  st.last_completed_seq = ops.last_completed_seq;
  st.last_completed = std::move(ops.last_completed);
  st.last_completed_at = ops.last_completed_at;
  st.has_current = ops.has_current;
  st.current_seq = ops.current_seq;
  st.current = std::move(ops.current);
  st.current_since = ops.current_since;
  if (!st.has_current) return st;
  // The executor knows who has submitted it and what it is doing.
  OpProgress p = executor_->Progress(st.current_seq);
  st.phase = p.phase.empty() ? "negotiating" : p.phase;
  st.arrived = std::move(p.arrived);
  if (std::find(st.arrived.begin(), st.arrived.end(), info_.rank) == st.arrived.end()) {
    st.arrived.push_back(info_.rank);
  }
  std::sort(st.arrived.begin(), st.arrived.end());
  if (st.phase == "negotiating") {
    for (int r = 0; r < info_.world_size; ++r) {
      if (!std::binary_search(st.arrived.begin(), st.arrived.end(), r)) st.missing.push_back(r);
    }
  }
  return st;
}

void Session::Touch() { lease_.Touch(); }
absl::Time Session::last_used() const { return lease_.last_used(); }
bool Session::has_pending_ops() const { return ops_.has_pending(); }
bool Session::closed() const { return epoch_.closed(); }
absl::Status Session::health() const { return epoch_.health(); }
absl::Status Session::Refusal() const { return epoch_.Refusal(); }

absl::StatusOr<BufferInfo> Session::AllocateBuffer(uint64_t size, bool by_descriptor) {
  return buffers_->Allocate(size, by_descriptor);
}

absl::StatusOr<UniqueFd> Session::TakeBufferFd(uint64_t id) { return buffers_->TakeFd(id); }

absl::StatusOr<BufferInfo> Session::RegisterBuffer(int fd, uint64_t offset, uint64_t size,
                                                   const std::string& description) {
  return buffers_->Register(fd, offset, size, description);
}

absl::StatusOr<BufferInfo> Session::AllocateDeviceBuffer(const std::string& gpu_uuid,
                                                         uint64_t size) {
  return buffers_->AllocateDevice(gpu_uuid, size);
}

absl::StatusOr<BufferInfo> Session::RegisterDeviceBuffer(const std::string& gpu_uuid,
                                                         const std::string& ipc_handle,
                                                         uint64_t offset, uint64_t size,
                                                         int64_t client_pid) {
  return buffers_->RegisterDevice(gpu_uuid, ipc_handle, offset, size, client_pid);
}

absl::Status Session::FreeBuffer(uint64_t id) { return buffers_->Free(id); }

uint64_t Session::buffer_bytes() const { return buffers_->bytes(); }

absl::StatusOr<uint64_t> Session::Submit(const OpDesc& a) {
  absl::StatusOr<uint64_t> seq = Enqueue(a);
  if (seq.ok()) executor_->Kick();
  return seq;
}

absl::StatusOr<uint64_t> Session::Enqueue(const OpDesc& a) {
  OpContext job;
  job.rank = info_.rank;
  job.job_id = info_.job_id;
  job.world_size = info_.world_size;
  job.job_algorithm = info_.job_algorithm;
  job.job_codec = info_.job_codec;
  job.has_ps = executor_->has_ps();
  job.one_rank_per_daemon = executor_->placement().nodes() == executor_->placement().world;
  ASSIGN_OR_RETURN(const OpShape shape, ValidateOp(a, job));
  lease_.Touch();
  // Refused before the buffer is looked up (a closed session has none);
  // ops_.Push checks again, atomically with queueing.
  RETURN_IF_ERROR(epoch_.Refusal());
  auto op = std::make_shared<QueuedOp>();
  const bool no_buffer = a.kind == CollectiveKind::kBarrier && a.buffer_id == 0;
  if (!no_buffer) {
    ASSIGN_OR_RETURN(BufferRef buffer, buffers_->Find(a.buffer_id));
    RETURN_IF_ERROR(CheckOpBuffer(a, job, shape, buffer.segment->size()));
    op->buffer = std::move(buffer.segment);
    op->device = std::move(buffer.device);
  }
  op->sig = OpSignature::Of(a, shape.plan_code, shape.codecs, shape.sparse);
  op->quota = buffers_;
  op->offset = a.offset_bytes;
  op->premul_factor = a.premul_factor;
  const bool p2p = IsPointToPoint(a.kind);
  if (p2p && op->device != nullptr) {
    return absl::InvalidArgumentError(absl::StrCat(
        op->sig.Describe(), " on rank ", info_.rank,
        ": point-to-point ops take host buffers; buffer ", a.buffer_id,
        " is device memory (stage the tensor through a host buffer)"));
  }
  std::shared_ptr<QueuedOp> queued = p2p ? op : nullptr;
  ASSIGN_OR_RETURN(const uint64_t id,
                   ops_.Push(std::move(op), a.timeout > absl::ZeroDuration()
                                                ? a.timeout
                                                : info_.default_op_timeout));
  if (observer_ != nullptr) observer_->OnOpQueued();
  if (p2p) executor_->SubmitPointToPoint(this, std::move(queued));
  return id;
}

absl::StatusOr<OpOutcome> Session::Wait(uint64_t op_id, absl::Duration timeout) {
  const absl::Time deadline = FastNow() + timeout;
  lease_.Touch();
  return ops_.Wait(op_id, deadline);
}

void Session::StopAccepting(const std::string& reason) { epoch_.StopAccepting(reason); }

void Session::SetCompletionListener(CompletionListener listener) {
  ops_.SetCompletionListener(std::move(listener));
}

void Session::SetSubmissionFeed(std::shared_ptr<SubmissionFeed> feed) {
  ops_.SetFeed(std::move(feed));
  executor_->Kick();  // it takes the new feed (or stops sleeping on the old one)
}

std::shared_ptr<SubmissionFeed> Session::feed() const { return ops_.feed(); }

void Session::EndEpoch(const absl::Status& reason) { epoch_.Fail(reason); }

void Session::AbortEpoch(const absl::Status& reason) {
  epoch_.Fail(reason);
  executor_->Abort(reason);
}

void Session::Close() {
  Close(absl::CancelledError(absl::StrCat("rank ", info_.rank, " closed its session")));
}

void Session::Close(const absl::Status& why) {
  std::call_once(close_once_, [this, &why] {
    // Refuses ops and buffers first; an op pushed before is in the queue
    // taken next (SessionOps::Push checks the epoch under its lock).
    epoch_.Close(why);
    buffers_->Close();
    std::deque<std::shared_ptr<QueuedOp>> queued = ops_.TakeQueued();
    // The executor fails the op it runs for this rank (the epoch is broken);
    // the ones it never took fail here.
    executor_->Detach(info_.rank, why);
    ops_.FailUntaken(queued, why);
    buffers_->FreeAll();
  });
}

std::shared_ptr<QueuedOp> Session::TakeNext() { return ops_.TakeNext(); }

bool Session::FinishPointToPoint(QueuedOp& op, const absl::Status& s, int source,
                                 absl::Time end) {
  bool newly_failed = false;
  return ops_.Finish(op, s, "p2p", end, &newly_failed, /*may_break_epoch=*/false, source);
}

bool Session::Finish(QueuedOp& op, const absl::Status& s, absl::string_view plan,
                     absl::Time end, bool* newly_failed) {
  return ops_.Finish(op, s, plan, end, newly_failed);
}

OpRecord Session::Record(const QueuedOp& op, absl::Duration arrival_wait) const {
  OpRecord rec;
  rec.job_id = info_.job_id;  // views: valid while op is
  rec.kind = op.sig.kind;
  rec.algorithm = op.outcome.algorithm;
  rec.code = op.outcome.status.code();
  rec.bytes = CollectiveBufferBytes(op.sig.kind, op.sig.count, op.sig.dtype, info_.world_size);
  rec.world = info_.world_size;
  rec.queued = op.outcome.queued_time;
  rec.run = op.outcome.run_time;
  rec.arrival_wait = arrival_wait;
  return rec;
}

}  // namespace gradsync
