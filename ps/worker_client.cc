#include "ps/worker_client.h"

#include <errno.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/logging.h"
#include "common/status_macros.h"
#include "ps/protocol.h"
#include "transport/wire.h"

namespace gradsync::ps {

using transport::FrameHeader;
using transport::FrameType;

namespace {

constexpr size_t kHeaderBytes = sizeof(FrameHeader);

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
  Run(PsWorker& w, uint64_t step, char* data, DType dtype, absl::Time deadline)
      : w_(w), step_(step), data_(data), dtype_(dtype), deadline_(deadline), shards_(w.shards()) {}

  struct Shard {
    std::vector<const Partition*> parts;  // id order
    std::string header_payload;
    FrameHeader header_frame;
    // Sending.
    bool header_sent = false;
    size_t started = 0;         // partition frames started
    std::vector<uint8_t> sent;  // partition frame fully written
    bool sending = false;       // a frame is partly written
    FrameHeader out;
    const char* out_payload = nullptr;
    size_t out_done = 0;
    int out_local = -1;  // -1: the step header
    // Receiving.
    enum class In { kResult, kAbort, kDiscard };
    FrameHeader in;
    size_t in_header_got = 0;
    In in_kind = In::kDiscard;
    size_t in_got = 0;
    int in_local = -1;
    std::string in_msg;
    std::vector<uint8_t> got;
    size_t pulled = 0;
    bool dead = false;  // the connection broke or is out of step
  };

  std::vector<Shard>& shards() { return shards_; }

  absl::Status Go() {
    std::vector<struct pollfd> pfds;
    std::vector<int> owner;
    while (true) {
      bool done = true;
      // Every shard's connection is read before any error is returned: when
      // one shard is lost and another reports the step's failure (often
      // the same loss, seen through another worker that left), the loss is
      // the cause and wins.
      absl::Status failed;
      bool failed_lost = false;
      for (int k = 0; k < static_cast<int>(shards_.size()); ++k) {
        if (shards_[k].parts.empty()) continue;
        absl::Status r = PumpRecv(k);
        if (r.ok() || failed_lost) continue;
        if (failed.ok() || shards_[k].dead) {
          failed = std::move(r);
          failed_lost = shards_[k].dead;
        }
      }
      if (!failed.ok()) return failed;
      for (int k = 0; k < static_cast<int>(shards_.size()); ++k) {
        Shard& s = shards_[k];
        if (s.parts.empty()) continue;
        RETURN_IF_ERROR(PumpSend(k));
        if (s.pulled < s.parts.size()) done = false;
      }
      if (done) return absl::OkStatus();
      pfds.clear();
      owner.clear();
      pfds.push_back({w_.wake_fd_.get(), POLLIN, 0});
      owner.push_back(-1);
      for (int k = 0; k < static_cast<int>(shards_.size()); ++k) {
        Shard& s = shards_[k];
        if (s.parts.empty()) continue;
        short events = POLLIN;
        if (WantsToSend(s)) events |= POLLOUT;
        pfds.push_back({w_.links_[k].get(), events, 0});
        owner.push_back(k);
      }
      const int n = ::poll(pfds.data(), pfds.size(), PollTimeoutMs(deadline_, 1000));
      if (n < 0 && errno != EINTR) return absl::InternalError("poll: " + ErrnoString(errno));
      if (w_.is_aborted_) {
        absl::MutexLock l(&w_.mu_);
        return w_.aborted_;
      }
      if (n == 0 && absl::Now() >= deadline_) return Timeout();
    }
  }

  // Whether shard k's send side is between frames (an ABORT may follow).
  bool FrameAligned(int k) const { return !shards_[k].dead && !shards_[k].sending; }

 private:
  bool WantsToSend(const Shard& s) const {
    return s.sending || !s.header_sent ||
           (s.started < s.parts.size() &&
            s.started - s.pulled < static_cast<size_t>(w_.options_.max_inflight));
  }

  // The first partition of shard k not pulled yet (its id), for messages.
  uint32_t Waiting(const Shard& s) const {
    if (s.in_kind == Shard::In::kResult && s.in_header_got == kHeaderBytes) {
      return s.parts[s.in_local]->id;
    }
    for (size_t i = 0; i < s.parts.size(); ++i) {
      if (!s.got[i]) return s.parts[i]->id;
    }
    return s.parts.back()->id;
  }

  absl::Status Lost(int k, const std::string& what, absl::string_view why,
                    absl::StatusCode code = absl::StatusCode::kUnavailable) {
    shards_[k].dead = true;
    return absl::Status(
        code, absl::StrCat(w_.ShardName(k), " lost while ", what, " of step ", step_, ": ", why));
  }
  absl::Status LostPulling(int k, absl::string_view why,
                           absl::StatusCode code = absl::StatusCode::kUnavailable) {
    return Lost(k, absl::StrCat("pulling partition ", Waiting(shards_[k])), why, code);
  }
  absl::Status ProtocolError(int k, absl::string_view what) {
    shards_[k].dead = true;
    return absl::DataLossError(
        absl::StrCat(w_.ShardName(k), ": protocol error in step ", step_, ": ", what));
  }

  absl::Status Timeout() {
    for (int k = 0; k < static_cast<int>(shards_.size()); ++k) {
      const Shard& s = shards_[k];
      if (s.pulled >= s.parts.size()) continue;
      size_t i = 0;
      while (i < s.parts.size() && s.got[i]) ++i;
      size_t pushed = 0;
      for (uint8_t v : s.sent) pushed += v;
      return absl::DeadlineExceededError(
          absl::StrCat(w_.ShardName(k), ": step ", step_, " timed out ",
                       s.sent[i] ? "waiting for partition " : "waiting to push partition ",
                       s.parts[i]->id, " (pulled ", s.pulled, " of ", s.parts.size(),
                       " partitions from this shard, pushed ", pushed, ")"));
    }
    return absl::DeadlineExceededError(absl::StrCat("ps step ", step_, " timed out"));
  }

  absl::Status PumpSend(int k) {
    Shard& s = shards_[k];
    const int fd = w_.links_[k].get();
    while (true) {
      if (!s.sending) {
        if (!s.header_sent) {
          s.out = s.header_frame;
          s.out_payload = s.header_payload.data();
          s.out_local = -1;
        } else if (s.started < s.parts.size() &&
                   s.started - s.pulled < static_cast<size_t>(w_.options_.max_inflight)) {
          const Partition& p = *s.parts[s.started];
          s.out = MakeFrame(FrameType::kData, w_.job_tag_, w_.options_.epoch, step_, p.id,
                            static_cast<uint8_t>(dtype_), p.offset_bytes,
                            static_cast<uint32_t>(p.bytes));
          s.out_payload = data_ + p.offset_bytes;
          s.out_local = static_cast<int>(s.started);
          ++s.started;
        } else {
          return absl::OkStatus();
        }
        s.sending = true;
        s.out_done = 0;
      }
      const size_t total = kHeaderBytes + s.out.length;
      struct iovec iov[2];
      int n = 0;
      if (s.out_done < kHeaderBytes) {
        iov[n++] = {reinterpret_cast<char*>(&s.out) + s.out_done, kHeaderBytes - s.out_done};
        if (s.out.length > 0) iov[n++] = {const_cast<char*>(s.out_payload), s.out.length};
      } else {
        iov[n++] = {const_cast<char*>(s.out_payload) + (s.out_done - kHeaderBytes),
                    total - s.out_done};
      }
      struct msghdr m = {};
      m.msg_iov = iov;
      m.msg_iovlen = n;
      const ssize_t wr = ::sendmsg(fd, &m, MSG_NOSIGNAL | MSG_DONTWAIT);
      if (wr < 0) {
        if (errno == EAGAIN || errno == EWOULDBLOCK) return absl::OkStatus();
        if (errno == EINTR) continue;
        const std::string what = s.out_local < 0
                                     ? std::string("sending the step header")
                                     : absl::StrCat("pushing partition ", s.parts[s.out_local]->id);
        return Lost(k, what, ErrnoString(errno));
      }
      s.out_done += static_cast<size_t>(wr);
      if (s.out_done == total) {
        s.sending = false;
        if (s.out_local < 0) {
          s.header_sent = true;
        } else {
          s.sent[s.out_local] = 1;
          w_.bytes_pushed_.fetch_add(s.out.length, std::memory_order_relaxed);
        }
      }
    }
  }

  // recv() into dst: > 0 bytes, 0 would block, or an error status.
  absl::StatusOr<size_t> Read(int k, char* dst, size_t n) {
    while (true) {
      const ssize_t r = ::recv(w_.links_[k].get(), dst, n, MSG_DONTWAIT);
      if (r > 0) return static_cast<size_t>(r);
      if (r < 0 && errno == EINTR) continue;
      if (r < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return size_t{0};
      return LostPulling(k, r == 0 ? std::string("closed by peer") : ErrnoString(errno));
    }
  }

  absl::Status StartFrame(int k) {
    Shard& s = shards_[k];
    const FrameHeader& h = s.in;
    absl::Status v = transport::ValidateFrameHeader(h);
    if (v.ok() && (h.job_tag != w_.job_tag_ || h.epoch != w_.options_.epoch)) {
      v = absl::DataLossError(
          absl::StrCat("frame of another job or epoch ", transport::DescribeFrame(h)));
    }
    if (!v.ok()) return ProtocolError(k, v.message());
    s.in_got = 0;
    if (h.type == static_cast<uint8_t>(FrameType::kAbort)) {
      s.in_kind = Shard::In::kAbort;
      s.in_msg.assign(h.length, '\0');
      return absl::OkStatus();
    }
    if (h.op_seq < step_) {  // a leftover of an older step
      s.in_kind = Shard::In::kDiscard;
      return absl::OkStatus();
    }
    auto it = std::lower_bound(s.parts.begin(), s.parts.end(), h.slot,
                               [](const Partition* p, uint32_t id) { return p->id < id; });
    const int i =
        it == s.parts.end() || (*it)->id != h.slot ? -1 : static_cast<int>(it - s.parts.begin());
    if (h.op_seq != step_ || h.slot == transport::kControlSlot || i < 0 ||
        h.offset != s.parts[i]->offset_bytes || h.length != s.parts[i]->bytes ||
        h.dtype != static_cast<uint8_t>(dtype_) || s.got[i] || !s.sent[i]) {
      return ProtocolError(k,
                           absl::StrCat("unexpected result frame ", transport::DescribeFrame(h)));
    }
    s.in_kind = Shard::In::kResult;
    s.in_local = i;
    return absl::OkStatus();
  }

  absl::Status FinishFrame(int k) {
    Shard& s = shards_[k];
    const FrameHeader& h = s.in;
    s.in_header_got = 0;
    switch (s.in_kind) {
      case Shard::In::kResult:
        s.got[s.in_local] = 1;
        ++s.pulled;
        w_.bytes_pulled_.fetch_add(h.length, std::memory_order_relaxed);
        return absl::OkStatus();
      case Shard::In::kDiscard:
        return absl::OkStatus();
      case Shard::In::kAbort:
        break;
    }
    const absl::Status reported = AbortStatus(h, s.in_msg);
    if (h.op_seq == kConnectionStep) {
      return LostPulling(k, absl::StrCat("the shard closed the connection: ", reported.message()),
                         reported.code());
    }
    if (h.op_seq == step_) return reported;  // verbatim
    GS_LOG(DEBUG) << w_.ShardName(k) << ": ignoring an error for step " << h.op_seq
                  << " during step " << step_ << ": " << reported.message();
    return absl::OkStatus();
  }

  absl::Status PumpRecv(int k) {
    Shard& s = shards_[k];
    char scratch[16 << 10];
    while (true) {
      if (s.in_header_got < kHeaderBytes) {
        ASSIGN_OR_RETURN(size_t r, Read(k, reinterpret_cast<char*>(&s.in) + s.in_header_got,
                                        kHeaderBytes - s.in_header_got));
        if (r == 0) return absl::OkStatus();
        s.in_header_got += r;
        if (s.in_header_got < kHeaderBytes) continue;
        RETURN_IF_ERROR(StartFrame(k));
      }
      while (s.in_got < s.in.length) {
        const size_t left = s.in.length - s.in_got;
        char* dst;
        size_t want = left;
        switch (s.in_kind) {
          case Shard::In::kResult:
            dst = data_ + s.in.offset + s.in_got;
            break;
          case Shard::In::kAbort:
            dst = s.in_msg.data() + s.in_got;
            break;
          default:
            dst = scratch;
            want = std::min(left, sizeof(scratch));
            break;
        }
        ASSIGN_OR_RETURN(size_t r, Read(k, dst, want));
        if (r == 0) return absl::OkStatus();
        s.in_got += r;
      }
      RETURN_IF_ERROR(FinishFrame(k));
    }
  }

  PsWorker& w_;
  const uint64_t step_;
  char* const data_;
  const DType dtype_;
  const absl::Time deadline_;
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
  std::unique_ptr<PsWorker> w(new PsWorker(std::move(options), std::move(ps_job_id)));
  w->wake_fd_.Reset(::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC));
  if (!w->wake_fd_.valid()) return absl::InternalError("eventfd: " + ErrnoString(errno));
  return w;
}

PsWorker::PsWorker(PsWorkerOptions options, std::string ps_job_id)
    : options_(std::move(options)),
      ps_job_id_(std::move(ps_job_id)),
      job_tag_(transport::JobTag(ps_job_id_)),
      links_(options_.shards.size()) {}

PsWorker::~PsWorker() = default;

std::string PsWorker::ShardName(int k) const {
  return absl::StrCat("ps shard ", k, " (", options_.shards[k].ToString(), ")");
}

void PsWorker::Abort(const absl::Status& reason) {
  {
    absl::MutexLock l(&mu_);
    if (aborted_.ok()) aborted_ = reason.ok() ? absl::AbortedError("aborted") : reason;
  }
  is_aborted_ = true;
  uint64_t one = 1;
  (void)!::write(wake_fd_.get(), &one, sizeof(one));
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

absl::Status PsWorker::Connect(int k, uint64_t step, absl::Time deadline) {
  UniqueFd& fd = links_[k];
  if (fd.valid()) {
    // A connection that died since the last step (the shard restarted, say)
    // is replaced now rather than failing this step. Readable bytes are
    // frames for older steps; the step skips them.
    struct pollfd p = {fd.get(), POLLIN, 0};
    if (::poll(&p, 1, 0) <= 0) return absl::OkStatus();
    char c;
    const ssize_t r = ::recv(fd.get(), &c, 1, MSG_PEEK | MSG_DONTWAIT);
    if (r > 0) return absl::OkStatus();
    fd.Reset();
  }
  absl::StatusOr<UniqueFd> c = ConnectToShard(options_.shards[k], ps_job_id_, options_.epoch, rank_,
                                              world_, k, deadline, options_.socket_buffer_bytes);
  if (!c.ok()) {
    return absl::Status(c.status().code(), absl::StrCat(ShardName(k), ": cannot connect for step ",
                                                        step, ": ", c.status().message()));
  }
  fd = std::move(*c);
  ++connects_;
  return absl::OkStatus();
}

void PsWorker::Disconnect(uint64_t step, const absl::Status& why,
                          const std::vector<bool>& can_abort) {
  const absl::Time deadline = absl::Now() + absl::Milliseconds(200);
  for (size_t k = 0; k < links_.size(); ++k) {
    if (!links_[k].valid()) continue;
    if (k < can_abort.size() && can_abort[k]) {
      std::string payload;
      const FrameHeader h = MakeAbortFrame(job_tag_, options_.epoch, step, why, &payload);
      (void)WriteFrame(links_[k].get(), h, payload.data(), deadline);
    }
    links_[k].Reset();
  }
}

absl::Status PsWorker::PushPull(uint64_t step, void* data, size_t count, DType dtype, ReduceOp op,
                                int world, int rank, uint64_t partition_bytes, const Slicer& slicer,
                                absl::Time deadline) {
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
    Disconnect(step, absl::OkStatus(), {});
    world_ = world;
    rank_ = rank;
  }
  Run run(*this, step, static_cast<char*>(data), dtype, deadline);
  std::vector<Run::Shard>& shards = run.shards();
  shards.resize(K);
  for (const Partition& p : parts) shards[p.shard].parts.push_back(&p);
  absl::Status status;
  for (int k = 0; k < K && status.ok(); ++k) {
    Run::Shard& s = shards[k];
    if (s.parts.empty()) continue;
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
    s.header_frame =
        MakeFrame(FrameType::kData, job_tag_, options_.epoch, step, transport::kControlSlot,
                  static_cast<uint8_t>(dtype), 0, static_cast<uint32_t>(s.header_payload.size()));
    status = Connect(k, step, deadline);
  }
  if (status.ok()) status = run.Go();
  if (status.ok()) {
    ++steps_;
    return status;
  }
  ++steps_failed_;
  std::vector<bool> can_abort(K);
  for (int k = 0; k < K; ++k) {
    can_abort[k] = shards[k].parts.empty() ? links_[k].valid() : run.FrameAligned(k);
  }
  Disconnect(step, status, can_abort);
  return status;
}

}  // namespace gradsync::ps
