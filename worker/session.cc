#include "worker/session.h"

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <random>

#include "absl/strings/str_cat.h"
#include "collective/collectives.h"
#include "collective/op_validation.h"
#include "collective/planner.h"
#include "common/clock.h"
#include "common/logging.h"
#include "common/status_macros.h"
#include "worker/job_executor.h"

namespace gradsync {

absl::Status CheckOwner(const SessionInfo& info, int64_t caller_uid, absl::string_view what) {
  if (info.owner_uid < 0 || caller_uid == info.owner_uid) return absl::OkStatus();
  return absl::PermissionDeniedError(absl::StrCat(
      "session ", info.session_id, " belongs to uid ", info.owner_uid, "; uid ",
      caller_uid < 0 ? std::string("(unknown)") : absl::StrCat(caller_uid), " may not ", what,
      " it"));
}
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

Session::Session(SessionInfo info, std::shared_ptr<JobExecutor> executor,
                 DaemonObserver* observer, std::shared_ptr<TenantMemory> tenant_memory)
    : info_(std::move(info)),
      executor_(std::move(executor)),
      observer_(observer),
      tenant_memory_(std::move(tenant_memory)),
      memory_account_(MemoryAccount(info_.tenant, info_.owner_uid)) {
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
  last_used_ = FastNow();
}

Session::~Session() {
  Close();
  if (observer_ != nullptr) observer_->OnSessionClosed(info_.job_id);
}

SessionStatus Session::Status() const {
  SessionStatus st;
  st.info = info_;
  uint64_t current = 0;
  {
    absl::MutexLock l(&mu_);
    st.health = epoch_error_;
    st.queued = static_cast<int>(queue_.size());
    st.last_completed_seq = last_completed_seq_;
    if (last_completed_seq_ != 0) {
      st.last_completed = absl::StrCat(
          last_completed_sig_.Describe(), " (op ", last_completed_seq_, "): ",
          last_completed_code_ == absl::StatusCode::kOk ? "OK"
                                                        : absl::StatusCodeToString(last_completed_code_));
    }
    st.last_completed_at = last_completed_at_;
    if (current_seq_ != 0) {
      current = current_seq_;
      st.has_current = true;
      st.current_seq = current_seq_;
      st.current = absl::StrCat(current_sig_.Describe(), " (op ", current_seq_, ")");
      st.current_since = current_since_;
    }
  }
  if (current == 0) return st;
  // The executor knows who has submitted it and what it is doing.
  JobExecutor::OpProgress p = executor_->Progress(current);
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

absl::StatusOr<BufferInfo> Session::AllocateBuffer(uint64_t size, bool by_descriptor) {
  RETURN_IF_ERROR(CheckNewBuffer(size, "buffer of ", "allocating"));
  {
    absl::MutexLock l(&mu_);
    if (by_descriptor && unfetched_ >= kMaxUnfetchedBuffers) {
      return absl::ResourceExhaustedError(absl::StrCat(
          "session ", info_.session_id, ": ", unfetched_,
          " buffers were allocated and their descriptors never fetched on the fd socket; at most ",
          kMaxUnfetchedBuffers, " may wait"));
    }
  }
  const uint64_t n = ++g_segment_counter;
  auto seg = by_descriptor
                 ? ShmSegment::CreateSealed(absl::StrCat("gradsync-buffer-", n), size)
                 : ShmSegment::Create(absl::StrCat("/gradsync.", ::getpid(), ".", ProcessNonce(),
                                                   "-", n),
                                      size, info_.owner_uid);
  if (!seg.ok()) return seg.status();
  return AddBuffer(std::move(*seg));
}

absl::StatusOr<UniqueFd> Session::TakeBufferFd(uint64_t id) {
  absl::MutexLock l(&mu_);
  auto it = buffers_.find(id);
  if (it == buffers_.end()) {
    return absl::NotFoundError(
        absl::StrCat("session ", info_.session_id, " has no buffer ", id));
  }
  if (!it->second->by_descriptor()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "buffer ", id, " of session ", info_.session_id, " is not handed out by descriptor"));
  }
  UniqueFd fd = it->second->TakeFd();
  if (!fd.valid()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "the descriptor of buffer ", id, " of session ", info_.session_id,
        " was already fetched (each is handed out once)"));
  }
  --unfetched_;
  return fd;
}

absl::StatusOr<BufferInfo> Session::RegisterBuffer(int fd, uint64_t offset, uint64_t size,
                                                   const std::string& description) {
  RETURN_IF_ERROR(CheckNewBuffer(size, "a registered range of ", "registering"));
  auto seg = ShmSegment::MapFd(fd, offset, size, description);
  if (!seg.ok()) return seg.status();
  return AddBuffer(std::move(*seg));
}

absl::Status Session::CheckNewBuffer(uint64_t size, const char* noun, const char* verb) const {
  if (size > kMaxBufferBytes) {
    return absl::InvalidArgumentError(absl::StrCat(noun, size, " bytes exceeds the limit of ",
                                                   kMaxBufferBytes, " bytes"));
  }
  absl::MutexLock l(&mu_);
  return CheckQuotaLocked(size, verb);
}

absl::Status Session::CheckQuotaLocked(uint64_t size, const char* what) const {
  const uint64_t limit = info_.memory_limit_bytes;
  if (limit == 0 || (size <= limit && buffer_bytes_ <= limit - size)) {
    if (tenant_memory_ == nullptr) return absl::OkStatus();
    return tenant_memory_->Check(memory_account_, size,
                                 absl::StrCat("session ", info_.session_id, ": ", what));
  }
  return absl::ResourceExhaustedError(absl::StrCat(
      "session ", info_.session_id, " (job '", info_.job_id, "' rank ", info_.rank, "): ", what,
      " a buffer of ", size, " bytes would exceed the session's buffer quota of ", limit,
      " bytes (", buffer_bytes_, " in use; gradsyncd --session_memory_limit_mb)"));
}

void Session::ReleaseTenantMemory(uint64_t bytes) {
  if (tenant_memory_ != nullptr && bytes > 0) tenant_memory_->Release(memory_account_, bytes);
}

uint64_t Session::buffer_bytes() const {
  absl::MutexLock l(&mu_);
  return buffer_bytes_;
}

absl::StatusOr<BufferInfo> Session::AddBuffer(std::unique_ptr<ShmSegment> segment) {
  absl::MutexLock l(&mu_);
  if (closing_) return absl::FailedPreconditionError("session is closing");
  RETURN_IF_ERROR(CheckQuotaLocked(segment->size(), "adding"));
  if (tenant_memory_ != nullptr) {
    RETURN_IF_ERROR(tenant_memory_->Charge(
        memory_account_, segment->size(), absl::StrCat("session ", info_.session_id, ": adding")));
  }
  const uint64_t id = next_buffer_id_++;
  BufferInfo info{id, segment->name(), segment->size(), segment->by_descriptor()};
  buffer_bytes_ += segment->size();
  if (segment->by_descriptor()) ++unfetched_;
  buffers_[id] = std::shared_ptr<ShmSegment>(std::move(segment));
  return info;
}

absl::StatusOr<BufferInfo> Session::AllocateDeviceBuffer(const std::string& gpu_uuid, uint64_t size) {
  RETURN_IF_ERROR(CheckNewBuffer(size, "device buffer of ", "allocating"));
  ASSIGN_OR_RETURN(std::shared_ptr<DeviceMemory> device, DeviceMemory::Allocate(gpu_uuid, size));
  return AddDeviceBuffer(std::move(device));
}

absl::StatusOr<BufferInfo> Session::RegisterDeviceBuffer(const std::string& gpu_uuid,
                                                         const std::string& ipc_handle,
                                                         uint64_t offset, uint64_t size,
                                                         int64_t client_pid) {
  RETURN_IF_ERROR(CheckNewBuffer(size, "a registered device range of ", "registering"));
  ASSIGN_OR_RETURN(std::shared_ptr<DeviceMemory> device,
                   DeviceMemory::Open(gpu_uuid, ipc_handle, offset, size, client_pid));
  return AddDeviceBuffer(std::move(device));
}

absl::StatusOr<BufferInfo> Session::AddDeviceBuffer(std::shared_ptr<DeviceMemory> device) {
  absl::MutexLock l(&mu_);
  if (closing_) return absl::FailedPreconditionError("session is closing");
  const uint64_t size = device->size();
  RETURN_IF_ERROR(CheckQuotaLocked(size, "adding"));
  if (tenant_memory_ != nullptr) {
    RETURN_IF_ERROR(tenant_memory_->Charge(
        memory_account_, size, absl::StrCat("session ", info_.session_id, ": adding")));
  }
  const uint64_t id = next_buffer_id_++;
  BufferInfo info{id, absl::StrCat("device buffer on ", device->uuid()), size, false,
                  device->uuid(), device->ipc_handle()};
  buffer_bytes_ += size;
  buffers_[id] = device->host();
  devices_[id] = std::move(device);
  return info;
}

absl::Status Session::FreeBuffer(uint64_t id) {
  absl::MutexLock l(&mu_);
  auto it = buffers_.find(id);
  if (it == buffers_.end()) {
    return absl::NotFoundError(absl::StrCat("buffer ", id, " does not exist in session ",
                                            info_.session_id));
  }
  buffer_bytes_ -= it->second->size();
  ReleaseTenantMemory(it->second->size());
  if (it->second->holds_fd()) --unfetched_;
  buffers_.erase(it);
  devices_.erase(id);
  return absl::OkStatus();  // an op still using it keeps the mapping alive
}

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
  job.has_ps = executor_->has_ps();
  job.one_rank_per_daemon = executor_->placement().nodes() == executor_->placement().world;
  ASSIGN_OR_RETURN(const OpShape shape, ValidateOp(a, job));
  absl::MutexLock l(&mu_);
  last_used_ = FastNow();
  RETURN_IF_ERROR(RefusalLocked());
  const bool no_buffer = a.kind == CollectiveKind::kBarrier && a.buffer_id == 0;
  auto it = buffers_.find(a.buffer_id);
  if (!no_buffer && it == buffers_.end()) {
    return absl::NotFoundError(absl::StrCat("buffer ", a.buffer_id, " does not exist in session ",
                                            info_.session_id));
  }
  if (!no_buffer) RETURN_IF_ERROR(CheckOpBuffer(a, job, shape, it->second->size()));
  if (ops_.size() >= kMaxUnreportedOps) {
    return absl::ResourceExhaustedError(absl::StrCat(
        ops_.size(), " ops are queued or unreported; Wait for some before submitting more"));
  }
  auto op = std::make_shared<QueuedOp>();
  op->seq = next_seq_++;
  op->sig.seq = op->seq;
  op->sig.kind = a.kind;
  op->sig.dtype = a.dtype;
  op->sig.op = a.op;
  op->sig.count = a.count;
  op->sig.name.assign(a.name.data(), a.name.size());
  op->sig.root = IsRootedCollective(a.kind) ? a.root : 0;
  op->sig.forced = shape.plan_code;
  if (!no_buffer) {
    op->buffer = it->second;
    if (auto d = devices_.find(a.buffer_id); d != devices_.end()) op->device = d->second;
  }
  op->offset = a.offset_bytes;
  op->submitted = FastNow();
  op->deadline =
      op->submitted + (a.timeout > absl::ZeroDuration() ? a.timeout : info_.default_op_timeout);
  ops_[op->seq] = op;
  queue_.push_back(op);
  if (observer_ != nullptr) observer_->OnOpQueued();
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
  std::shared_ptr<QueuedOp> op = it->second;
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
  {
    absl::MutexLock l(&mu_);
    feed_ = std::move(feed);
  }
  executor_->Kick();  // it takes the new feed (or stops sleeping on the old one)
}

std::shared_ptr<SubmissionFeed> Session::feed() const {
  absl::MutexLock l(&mu_);
  return feed_;
}

void Session::EndEpoch(const absl::Status& reason) {
  absl::MutexLock l(&mu_);
  if (epoch_error_.ok()) epoch_error_ = reason;
}

void Session::AbortEpoch(const absl::Status& reason) {
  {
    absl::MutexLock l(&mu_);
    if (epoch_error_.ok()) epoch_error_ = reason;
  }
  executor_->Abort(reason);
}

void Session::Close() {
  Close(absl::CancelledError(absl::StrCat("rank ", info_.rank, " closed its session")));
}

void Session::Close(const absl::Status& why) {
  std::call_once(close_once_, [this, &why] {
    std::deque<std::shared_ptr<QueuedOp>> queued;
    {
      absl::MutexLock l(&mu_);
      closing_ = true;
      if (epoch_error_.ok()) epoch_error_ = absl::CancelledError("session closed");
      queued.swap(queue_);
    }
    // The executor fails the op it runs for this rank (the epoch is broken);
    // the ones it never took fail here.
    executor_->Detach(info_.rank, why);
    const absl::Time now = FastNow();
    for (const auto& op : queued) {
      {
        absl::MutexLock l(&mu_);
        op->started = now;
      }
      bool newly_failed = false;
      Finish(*op, why, "", now, &newly_failed);
    }
    absl::MutexLock l(&mu_);
    buffers_.clear();
    devices_.clear();
    ReleaseTenantMemory(buffer_bytes_);
    buffer_bytes_ = 0;
    unfetched_ = 0;
  });
}

std::shared_ptr<QueuedOp> Session::TakeNext() {
  absl::MutexLock l(&mu_);
  if (queue_.empty()) return nullptr;
  std::shared_ptr<QueuedOp> op = std::move(queue_.front());
  queue_.pop_front();
  const absl::Time now = FastNow();
  op->started = now;
  current_seq_ = op->seq;
  current_sig_ = op->sig;  // described only when someone asks (Status)
  current_since_ = now;
  return op;
}

bool Session::Finish(QueuedOp& op, const absl::Status& s, absl::string_view plan,
                     absl::Time end, bool* newly_failed) {
  std::shared_ptr<const CompletionListener> listener;
  OpOutcome outcome;
  {
    absl::MutexLock l(&mu_);
    if (op.outcome.done) return false;
    op.outcome.status = s;
    op.outcome.algorithm = std::string(plan);
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
    outcome = op.outcome;
  }
  // The client first; metrics come after, overlapping with its next op.
  if (listener != nullptr && (*listener)(op.seq, outcome)) {
    absl::MutexLock l(&mu_);
    ops_.erase(op.seq);
  }
  return true;
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
