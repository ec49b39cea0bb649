#include "ps/worker_client.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/logging.h"
#include "common/status_macros.h"
#include "ps/protocol.h"
#include "transport/tcp_device.h"
#include "transport/wire.h"

namespace gradsync::ps {

using transport::MessageTag;
using transport::PeerFault;
using transport::Request;

namespace {

// Checks a slicer's output against the Slicer contract.
absl::Status CheckPartitions(const std::vector<Partition>& parts, uint64_t bytes, size_t es,
                             int shards) {
  if (parts.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("the slicer returned no partitions for ", bytes, " bytes (at most ",
                     kMaxPartitions, " partitions of at most ", kMaxPartitionBytes, " bytes)"));
  }
  if (parts.size() > kMaxPartitions) {
    return absl::InvalidArgumentError(absl::StrCat("the slicer returned ", parts.size(),
                                                   " partitions, more than ", kMaxPartitions));
  }
  std::vector<const Partition*> by_offset;
  by_offset.reserve(parts.size());
  for (size_t i = 0; i < parts.size(); ++i) {
    const Partition& p = parts[i];
    if (p.id != i || p.shard < 0 || p.shard >= shards || p.bytes == 0 || p.bytes % es != 0 ||
        p.offset_bytes % es != 0 || p.bytes > kMaxPartitionBytes || p.offset_bytes > bytes ||
        p.bytes > bytes - p.offset_bytes) {
      return absl::InvalidArgumentError(
          absl::StrCat("the slicer returned a bad partition at index ", i, ": id ", p.id, " [",
                       p.offset_bytes, ", +", p.bytes, ") on shard ", p.shard, " (tensor of ",
                       bytes, " bytes, ", es, "-byte elements, ", shards, " shards)"));
    }
    by_offset.push_back(&p);
  }
  std::sort(by_offset.begin(), by_offset.end(), [](const Partition* a, const Partition* b) {
    return a->offset_bytes < b->offset_bytes;
  });
  uint64_t next = 0;
  for (const Partition* p : by_offset) {
    if (p->offset_bytes != next) {
      return absl::InvalidArgumentError(
          absl::StrCat("the slicer's partitions do not tile the tensor: partition ", p->id,
                       " starts at ", p->offset_bytes, ", expected ", next));
    }
    next += p->bytes;
  }
  if (next != bytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("the slicer's partitions cover ", next, " of ", bytes, " bytes"));
  }
  return absl::OkStatus();
}

}  // namespace

// The state of one PushPull over the shards that own partitions.
class PsWorker::Run {
 public:
  Run(PsWorker& w, transport::Context& ctx, uint64_t step, char* data, uint64_t bytes,
      DType dtype, absl::Time deadline, const PsMemory* memory)
      : w_(w),
        memory_(memory),
        ctx_(ctx),
        step_(step),
        data_(data),
        bytes_(bytes),
        dtype_(dtype),
        deadline_(deadline),
        shards_(w.shards()) {
    const int bound = ctx.max_in_flight();  // sends: the header and the pushes
    inflight_ = static_cast<size_t>(
        bound > 1 ? std::min(w.options_.max_inflight, bound - 1) : w.options_.max_inflight);
  }

  struct Shard {
    std::vector<const Partition*> parts;  // id order
    std::string header_payload;
    std::unique_ptr<transport::MemoryRegion> header_mr;
    Request header_req;
    // By local partition index; stable addresses once the step runs.
    std::vector<Request> push, pull;
    std::vector<uint8_t> sent, got;
    size_t started = 0;     // partitions posted (receive, then push)
    size_t sent_count = 0;  // pushes completed, a prefix (sends complete in order)
    size_t pulled = 0;
  };

  std::vector<Shard>& shards() { return shards_; }

  absl::Status Go() {
    const transport::MemoryRegion* registered = nullptr;
    if (memory_ != nullptr) {
      ASSIGN_OR_RETURN(registered,
                       w_.registrations_.Get(ctx_, memory_->whole, memory_->owner));
    }
    absl::StatusOr<std::unique_ptr<transport::MemoryRegion>> mr =
        transport::RegionFor(ctx_, transport::Buffer{data_, bytes_}, registered);
    if (!mr.ok()) return mr.status();
    data_mr_ = std::move(*mr);
    for (int k = 0; k < static_cast<int>(shards_.size()); ++k) {
      Shard& s = shards_[k];
      if (s.parts.empty()) continue;
      mr = ctx_.RegisterMemory(s.header_payload.data(), s.header_payload.size());
      if (!mr.ok()) return mr.status();
      s.header_mr = std::move(*mr);
      RETURN_IF_ERROR(Posted(k, ctx_.PostSend(k, *s.header_mr, 0, s.header_payload.size(),
                                              MessageTag{step_, transport::kControlSlot,
                                                         static_cast<uint8_t>(dtype_), 0},
                                              &s.header_req)));
    }
    while (true) {
      bool done = true;
      for (int k = 0; k < static_cast<int>(shards_.size()); ++k) {
        RETURN_IF_ERROR(PostMore(k));
        if (shards_[k].pulled < shards_[k].parts.size()) done = false;
      }
      if (done) return absl::OkStatus();
      const absl::Status s = ctx_.Progress(deadline_);
      if (absl::IsDeadlineExceeded(s) && ctx_.health().ok()) return Timeout();
      if (!s.ok()) return Failure(s);
      for (int k = 0; k < static_cast<int>(shards_.size()); ++k) Collect(k);
    }
  }

 private:
  // Posts receive-then-push for shard k's next partitions, up to the bound.
  absl::Status PostMore(int k) {
    Shard& s = shards_[k];
    while (s.started < s.parts.size() && s.started - s.pulled < inflight_) {
      const size_t i = s.started;
      const Partition& p = *s.parts[i];
      const MessageTag tag{step_, p.id, static_cast<uint8_t>(dtype_), p.offset_bytes};
      RETURN_IF_ERROR(Posted(k, ctx_.PostRecv(k, *data_mr_, p.offset_bytes, p.bytes,
                                              /*exact=*/true, tag, &s.pull[i])));
      RETURN_IF_ERROR(
          Posted(k, ctx_.PostSend(k, *data_mr_, p.offset_bytes, p.bytes, tag, &s.push[i])));
      ++s.started;
    }
    return absl::OkStatus();
  }

  // A post's error: a shard's fault named the PS way, else as it is.
  absl::Status Posted(int k, const absl::Status& s) {
    (void)k;
    if (s.ok()) return s;
    return ctx_.health().ok() ? s : Failure(s);
  }

  void Collect(int k) {
    Shard& s = shards_[k];
    while (s.sent_count < s.started && s.push[s.sent_count].done) {
      if (!s.sent[s.sent_count]) {
        s.sent[s.sent_count] = 1;
        w_.bytes_pushed_.fetch_add(s.parts[s.sent_count]->bytes, std::memory_order_relaxed);
      }
      ++s.sent_count;
    }
    for (size_t i = 0; i < s.started; ++i) {
      if (s.got[i] || !s.pull[i].done) continue;
      s.got[i] = 1;
      ++s.pulled;
      w_.bytes_pulled_.fetch_add(s.parts[i]->bytes, std::memory_order_relaxed);
      if (!s.sent[i]) {  // its push completed before its result could come back
        s.sent[i] = 1;
        w_.bytes_pushed_.fetch_add(s.parts[i]->bytes, std::memory_order_relaxed);
      }
    }
  }

  // The first partition of shard k not pulled yet (its id), for messages.
  uint32_t Waiting(const Shard& s) const {
    for (size_t i = 0; i < s.parts.size(); ++i) {
      if (!s.got[i] && !s.pull[i].done) return s.parts[i]->id;
    }
    return s.parts.back()->id;
  }

  // What the context's failure means for this step.
  absl::Status Failure(const absl::Status& s) {
    const PeerFault f = ctx_.fault();
    if (f.peer < 0 || f.peer >= static_cast<int>(shards_.size())) return ctx_.health();
    const int k = f.peer;
    Shard& sh = shards_[k];
    const std::string name = w_.ShardName(k);
    switch (f.kind) {
      case PeerFault::kLost: {
        std::string what;
        if (f.while_sending && !sh.parts.empty()) {
          size_t i = 0;
          while (i < sh.started && sh.push[i].done) ++i;
          what = !sh.header_req.done ? std::string("sending the step header")
                                     : absl::StrCat("pushing partition ",
                                                    sh.parts[std::min(i, sh.parts.size() - 1)]->id);
        } else {
          what = absl::StrCat("pulling partition ", sh.parts.empty() ? 0 : Waiting(sh));
        }
        return absl::UnavailableError(
            absl::StrCat(name, " lost while ", what, " of step ", step_, ": ", f.cause));
      }
      case PeerFault::kAborted:
        if (f.op_seq == kConnectionStep) {
          return absl::Status(
              f.code, absl::StrCat(name, " lost while pulling partition ",
                                   sh.parts.empty() ? 0 : Waiting(sh), " of step ", step_,
                                   ": the shard closed the connection: ", f.cause));
        }
        return absl::Status(f.code, f.cause);  // the shard's error, verbatim
      case PeerFault::kProtocol:
        return absl::DataLossError(
            absl::StrCat(name, ": protocol error in step ", step_, ": ", f.cause));
      case PeerFault::kNone:
        break;
    }
    return s;
  }

  absl::Status Timeout() {
    for (int k = 0; k < static_cast<int>(shards_.size()); ++k) {
      const Shard& s = shards_[k];
      if (s.pulled >= s.parts.size()) continue;
      size_t i = 0;
      while (i < s.parts.size() && s.got[i]) ++i;
      size_t pushed = 0;
      for (size_t j = 0; j < s.started; ++j) pushed += s.push[j].done ? 1 : 0;
      const bool pushed_i = i < s.started && s.push[i].done;
      return absl::DeadlineExceededError(
          absl::StrCat(w_.ShardName(k), ": step ", step_, " timed out ",
                       pushed_i ? "waiting for partition " : "waiting to push partition ",
                       s.parts[i]->id, " (pulled ", s.pulled, " of ", s.parts.size(),
                       " partitions from this shard, pushed ", pushed, ")"));
    }
    return absl::DeadlineExceededError(absl::StrCat("ps step ", step_, " timed out"));
  }

  PsWorker& w_;
  const PsMemory* const memory_;
  transport::Context& ctx_;
  const uint64_t step_;
  char* const data_;
  const uint64_t bytes_;
  const DType dtype_;
  const absl::Time deadline_;
  size_t inflight_ = 1;
  std::unique_ptr<transport::MemoryRegion> data_mr_;
  std::vector<Shard> shards_;
};

absl::StatusOr<std::unique_ptr<PsWorker>> PsWorker::Create(PsWorkerOptions options) {
  ASSIGN_OR_RETURN(std::string ps_job_id, PsJobId(options.job_id));
  if (options.shards.empty() || options.shards.size() > transport::kMaxWorldSize) {
    return absl::InvalidArgumentError(absl::StrCat("ps worker: 1..", transport::kMaxWorldSize,
                                                   " shards needed, got ", options.shards.size()));
  }
  if (options.max_inflight < 1) {
    return absl::InvalidArgumentError("ps worker: max_inflight must be >= 1");
  }
  return std::unique_ptr<PsWorker>(new PsWorker(std::move(options), std::move(ps_job_id)));
}

PsWorker::PsWorker(PsWorkerOptions options, std::string ps_job_id)
    : options_(std::move(options)), ps_job_id_(std::move(ps_job_id)) {
  device_ = options_.device;
  if (device_ == nullptr) {
    own_device_ = transport::TcpDevice::DialOnly(options_.socket_buffer_bytes, options_.tls);
    device_ = own_device_.get();
  }
}

PsWorker::~PsWorker() = default;

std::string PsWorker::ShardName(int k) const {
  return absl::StrCat("ps shard ", k, " (", options_.shards[k].ToString(), ")");
}

void PsWorker::Abort(const absl::Status& reason) {
  absl::MutexLock l(&mu_);
  if (aborted_.ok()) aborted_ = reason.ok() ? absl::AbortedError("aborted") : reason;
  is_aborted_ = true;
  if (running_ != nullptr) running_->Abort(aborted_);
}

PsWorkerStats PsWorker::stats() const {
  PsWorkerStats s;
  s.steps = steps_;
  s.steps_failed = steps_failed_;
  s.bytes_pushed = bytes_pushed_;
  s.bytes_pulled = bytes_pulled_;
  s.connects = connects_;
  return s;
}

void PsWorker::DropContext() {
  {
    absl::MutexLock l(&mu_);
    running_ = nullptr;
  }
  registrations_.Clear();
  ctx_.reset();
}

absl::Status PsWorker::EnsureContext(absl::Time deadline) {
  if (ctx_ != nullptr) {
    // A shard that closed the connection since the last step (it restarted,
    // say) is reconnected now rather than failing this step.
    (void)ctx_->Progress(absl::InfinitePast());
    bool usable = ctx_->health().ok();
    for (int k = 0; usable && k < shards(); ++k) usable = !ctx_->PeerClosed(k);
    if (usable) return absl::OkStatus();
    DropContext();
  }
  transport::ServerSetSpec spec;
  spec.job_id = ps_job_id_;
  spec.epoch = options_.epoch;
  spec.rank = rank_;
  spec.clients = world_;
  spec.servers = options_.shards;
  spec.server_keys = options_.shard_keys;
  spec.encrypt = options_.encrypt;
  for (int k = 0; k < shards(); ++k) spec.server_names.push_back(ShardName(k));
  spec.self_name = absl::StrCat("ps worker rank ", rank_);
  spec.deadline = deadline;
  ASSIGN_OR_RETURN(std::unique_ptr<transport::Context> ctx, device_->ConnectToServers(spec));
  connects_ += static_cast<uint64_t>(shards());
  ctx_ = std::move(ctx);
  absl::MutexLock l(&mu_);
  running_ = ctx_.get();
  if (!aborted_.ok()) running_->Abort(aborted_);
  return absl::OkStatus();
}

absl::Status PsWorker::PushPull(uint64_t step, void* data, size_t count, DType dtype, ReduceOp op,
                                int world, int rank, uint64_t partition_bytes, const Slicer& slicer,
                                absl::Time deadline, const PsMemory* memory) {
  if (is_aborted_) {
    absl::MutexLock l(&mu_);
    return aborted_;
  }
  auto invalid = [&](auto&&... args) {
    return absl::InvalidArgumentError(absl::StrCat("ps step ", step, ": ", args...));
  };
  if (!IsValidDType(static_cast<int>(dtype)) || !IsValidReduceOp(static_cast<int>(op))) {
    return invalid("bad dtype ", static_cast<int>(dtype), " or reduce op ", static_cast<int>(op));
  }
  if (world < 1 || world > transport::kMaxWorldSize || rank < 0 || rank >= world) {
    return invalid("bad rank ", rank, " of ", world, " workers");
  }
  if (step == kConnectionStep) return invalid("step ", step, " is reserved");
  if (partition_bytes == 0) return invalid("partition_bytes must be > 0");
  if (count == 0) return absl::OkStatus();
  if (data == nullptr) return invalid("null buffer");
  const size_t es = DTypeSize(dtype);
  if (count > kMaxTensorBytes / es) {
    return invalid(count, " ", DTypeName(dtype), " elements exceed ", kMaxTensorBytes, " bytes");
  }
  const uint64_t bytes = static_cast<uint64_t>(count) * es;
  const int K = shards();
  const std::vector<Partition> parts = slicer.Slice(bytes, es, partition_bytes, K);
  if (absl::Status s = CheckPartitions(parts, bytes, es, K); !s.ok()) return invalid(s.message());

  if (world != world_ || rank != rank_) {
    DropContext();
    world_ = world;
    rank_ = rank;
  }
  absl::Status status = EnsureContext(deadline);
  if (!status.ok()) {
    ++steps_failed_;
    return status;
  }
  ctx_->BeginOp(step);  // an abort before the first post still names this step
  Run run(*this, *ctx_, step, static_cast<char*>(data), bytes, dtype, deadline, memory);
  std::vector<Run::Shard>& shards = run.shards();
  shards.resize(K);
  for (const Partition& p : parts) shards[p.shard].parts.push_back(&p);
  for (int k = 0; k < K; ++k) {
    Run::Shard& s = shards[k];
    if (s.parts.empty()) continue;
    s.push.resize(s.parts.size());
    s.pull.resize(s.parts.size());
    s.sent.assign(s.parts.size(), 0);
    s.got.assign(s.parts.size(), 0);
    StepHeader h;
    h.step = step;
    h.dtype = dtype;
    h.op = op;
    h.workers = world;
    h.rank = rank;
    h.shards = K;
    h.shard = k;
    h.tensor_bytes = bytes;
    h.partition_bytes = partition_bytes;
    h.partitions = static_cast<uint32_t>(parts.size());
    for (const Partition* p : s.parts) h.table.push_back(*p);
    s.header_payload = EncodeStepHeader(h);
  }
  status = run.Go();
  if (status.ok()) {
    ++steps_;
    return status;
  }
  ++steps_failed_;
  // Tell every shard (those still connected) why, with the step's code; the
  // next step connects anew.
  (void)ctx_->Fail(status);
  DropContext();
  return status;
}

}  // namespace gradsync::ps
