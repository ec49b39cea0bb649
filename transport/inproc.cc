#include "transport/inproc.h"

#include <algorithm>
#include <cstring>
#include <deque>
#include <set>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "common/clock.h"

namespace gradsync::transport {
namespace {

struct Message {
  MessageTag tag;
  std::vector<char> bytes;
  absl::Time deliver_at;
};

bool SameTag(const MessageTag& a, const MessageTag& b) {
  return a.op_seq == b.op_seq && a.slot == b.slot && a.dtype == b.dtype && a.offset == b.offset;
}

std::string TagText(const MessageTag& t) {
  return absl::StrCat("op ", t.op_seq, " slot ", t.slot, " offset ", t.offset);
}

}  // namespace

// Everything the contexts of one device share, under one mutex.
class InProcDevice::Fabric {
 public:
  Fabric(int n, InProcFaults faults)
      : n(n), faults(faults), inbox(static_cast<size_t>(n) * n), failed(n), lost(n, false),
        sends(n, 0), created(n, false) {}

  const int n;
  const InProcFaults faults;
  absl::Mutex mu;
  absl::CondVar cv;
  // inbox[dst * n + src]: messages from src to dst, in posting order.
  std::vector<std::deque<Message>> inbox ABSL_GUARDED_BY(mu);
  std::vector<absl::Status> failed ABSL_GUARDED_BY(mu);  // a rank's context failed: why
  std::vector<bool> lost ABSL_GUARDED_BY(mu);
  std::vector<uint64_t> sends ABSL_GUARDED_BY(mu);
  std::vector<bool> created ABSL_GUARDED_BY(mu);
  uint64_t registrations ABSL_GUARDED_BY(mu) = 0;
};

namespace {

// The live registrations of one context (shared with its regions, which may
// outlive it).
struct RegionTable {
  absl::Mutex mu;
  std::set<const MemoryRegion*> live ABSL_GUARDED_BY(mu);
};

class InProcRegion final : public MemoryRegion {
 public:
  InProcRegion(char* data, size_t size, MemKind kind, std::shared_ptr<RegionTable> table)
      : MemoryRegion(data, size, kind), table_(std::move(table)) {
    absl::MutexLock l(&table_->mu);
    table_->live.insert(this);
  }
  ~InProcRegion() override {
    absl::MutexLock l(&table_->mu);
    table_->live.erase(this);
  }

 private:
  std::shared_ptr<RegionTable> table_;
};

class InProcContext final : public Context {
 public:
  InProcContext(std::shared_ptr<InProcDevice::Fabric> fabric, int rank)
      : f_(std::move(fabric)), rank_(rank), recvs_(f_->n), sent_(f_->n, 0), received_(f_->n, 0) {}
  ~InProcContext() override { Abort(absl::CancelledError("context destroyed")); }

  int rank() const override { return rank_; }
  int size() const override { return f_->n; }

  using Context::RegisterMemory;
  absl::StatusOr<std::unique_ptr<MemoryRegion>> RegisterMemory(void* data, size_t size,
                                                               MemKind kind) override {
    if (kind.type != MemKind::kHost) {
      return absl::FailedPreconditionError(absl::StrCat(
          "the in-process device moves host memory only; ", kind.ToString(), " memory cannot be "
          "registered"));
    }
    if (data == nullptr && size != 0) return absl::InvalidArgumentError("null memory region");
    {
      absl::MutexLock l(&f_->mu);
      ++f_->registrations;
    }
    return std::make_unique<InProcRegion>(static_cast<char*>(data), size, kind, regions_);
  }

  int max_in_flight() const override { return InProcDevice::kMaxInFlight; }

  absl::Status PostSend(int peer, const MemoryRegion& mr, size_t offset, size_t len,
                        const MessageTag& tag, Request* req) override {
    if (peer < 0 || peer >= f_->n || peer == rank_) {
      return absl::InvalidArgumentError(absl::StrCat("bad peer rank ", peer));
    }
    if (offset > mr.size() || len > mr.size() - offset) {
      return absl::InvalidArgumentError(absl::StrCat("send range [", offset, ", +", len,
                                                     ") outside region of ", mr.size()));
    }
    if (absl::Status s = CheckRegistered(mr, "send"); !s.ok()) return s;
    absl::MutexLock l(&f_->mu);
    if (!error_.ok()) return error_;
    const uint64_t n = ++f_->sends[rank_];
    const InProcFaults& fault = f_->faults;
    if (fault.lost_rank == rank_ && n > fault.lost_after) {
      f_->lost[rank_] = true;
      FailLocked(absl::UnavailableError(
          absl::StrCat("rank ", rank_, ": cut off from its peers (in-process fault)")));
      return error_;
    }
    Message m;
    m.tag = tag;
    size_t bytes = len;
    if (fault.truncate_rank == rank_ && n == fault.truncate_at) bytes = len / 2;
    m.bytes.assign(mr.data() + offset, mr.data() + offset + bytes);
    m.deliver_at = FastNow();
    if (fault.slow_rank == rank_) m.deliver_at += fault.slow_delay;
    f_->inbox[static_cast<size_t>(peer) * f_->n + rank_].push_back(std::move(m));
    sent_[peer] += len;
    req->done = true;
    req->bytes = len;
    f_->cv.SignalAll();
    return absl::OkStatus();
  }

  absl::Status PostRecv(int peer, const MemoryRegion& mr, size_t offset, size_t capacity,
                        bool exact, const MessageTag& tag, Request* req) override {
    if (peer < 0 || peer >= f_->n || peer == rank_) {
      return absl::InvalidArgumentError(absl::StrCat("bad peer rank ", peer));
    }
    if (offset > mr.size() || capacity > mr.size() - offset) {
      return absl::InvalidArgumentError(absl::StrCat("receive range [", offset, ", +", capacity,
                                                     ") outside region of ", mr.size()));
    }
    if (absl::Status s = CheckRegistered(mr, "receive"); !s.ok()) return s;
    absl::MutexLock l(&f_->mu);
    if (!error_.ok()) return error_;
    if (recvs_[peer].size() >= static_cast<size_t>(InProcDevice::kMaxInFlight)) {
      return absl::ResourceExhaustedError(absl::StrCat(
          InProcDevice::kMaxInFlight, " receives from rank ", peer,
          " already posted (the context's bound); post again once one completed"));
    }
    recvs_[peer].push_back(RecvItem{mr.data() + offset, capacity, exact, tag, req});
    return absl::OkStatus();
  }

  absl::Status Progress(absl::Time deadline) override {
    absl::MutexLock l(&f_->mu);
    while (true) {
      if (!error_.ok()) return error_;
      if (interrupted_) {
        interrupted_ = false;
        return absl::DeadlineExceededError("interrupted");
      }
      if (absl::Status s = PeersLocked(); !s.ok()) return s;
      int completed = 0;
      bool waiting = false;
      const absl::Time now = FastNow();
      absl::Time next_due = deadline;
      for (int p = 0; p < f_->n; ++p) {
        std::deque<Message>& in = f_->inbox[static_cast<size_t>(rank_) * f_->n + p];
        while (!recvs_[p].empty() && !in.empty()) {
          Message& m = in.front();
          if (m.deliver_at > now) {
            next_due = std::min(next_due, m.deliver_at);
            break;
          }
          // The posted receive with the message's tag (the first of equals).
          auto match = std::find_if(recvs_[p].begin(), recvs_[p].end(),
                                    [&](const RecvItem& r) { return SameTag(m.tag, r.tag); });
          if (match == recvs_[p].end()) {
            return FailLocked(absl::DataLossError(absl::StrCat(
                "rank ", rank_, ": protocol error from rank ", p, ": message for ",
                TagText(m.tag), " where ", TagText(recvs_[p].front().tag),
                recvs_[p].size() > 1 ? " (or another posted receive)" : "", " was expected")));
          }
          RecvItem& r = *match;
          const size_t got = m.bytes.size();
          if (got > r.capacity || (r.exact && got != r.capacity)) {
            return FailLocked(absl::DataLossError(absl::StrCat(
                "rank ", rank_, ": rank ", p, " sent ", got, " bytes for ", TagText(m.tag),
                "; expected ", r.exact ? "exactly " : "at most ", r.capacity)));
          }
          if (got > 0) std::memcpy(r.data, m.bytes.data(), got);
          r.req->done = true;
          r.req->bytes = got;
          received_[p] += got;
          recvs_[p].erase(match);
          in.pop_front();
          ++completed;
        }
        waiting = waiting || !recvs_[p].empty();
      }
      if (completed > 0 || !waiting) return absl::OkStatus();
      if (now >= deadline) return absl::DeadlineExceededError("deadline exceeded");
      f_->cv.WaitWithDeadline(&f_->mu, next_due);
    }
  }

  void Abort(const absl::Status& reason) override {
    absl::MutexLock l(&f_->mu);
    FailLocked(reason);
  }

  void Interrupt() override {
    absl::MutexLock l(&f_->mu);
    interrupted_ = true;
    f_->cv.SignalAll();
  }

  absl::Status Fail(const absl::Status& reason) override {
    absl::MutexLock l(&f_->mu);
    return FailLocked(reason);
  }

  absl::Status health() const override {
    absl::MutexLock l(&f_->mu);
    return error_;
  }

  // Messages stay in their queues (nothing is read); a peer's failure or
  // loss fails this context as in Progress.
  absl::Status CheckPeers() override {
    absl::MutexLock l(&f_->mu);
    if (!error_.ok()) return error_;
    return PeersLocked();
  }

  PeerFault fault() const override { return fault_; }

  uint64_t BytesSentTo(int peer) const override { return sent_[peer]; }
  uint64_t BytesReceivedFrom(int peer) const override { return received_[peer]; }

 private:
  struct RecvItem {
    char* data;
    size_t capacity;
    bool exact;
    MessageTag tag;
    Request* req;
  };

  // A lost or failed peer fails this context (the first one found), naming
  // it in fault_; OK if none.
  absl::Status PeersLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(f_->mu) {
    for (int p = 0; p < f_->n; ++p) {
      if (p == rank_) continue;
      if (f_->lost[p]) {
        fault_ = PeerFault{PeerFault::kLost, p, false, "lost (in-process fault)"};
        return FailLocked(absl::UnavailableError(absl::StrCat(
            "rank ", rank_, ": connection to rank ", p, " lost (in-process fault)")));
      }
      if (!f_->failed[p].ok()) {
        const absl::Status& why = f_->failed[p];
        fault_ = PeerFault{PeerFault::kAborted, p, false, std::string(why.message())};
        fault_.code = why.code();
        return FailLocked(
            absl::AbortedError(absl::StrCat("aborted by rank ", p, ": ", why.message())));
      }
    }
    return absl::OkStatus();
  }

  // The first reason wins; the peers see it (f_->failed).
  absl::Status FailLocked(const absl::Status& reason) ABSL_EXCLUSIVE_LOCKS_REQUIRED(f_->mu) {
    if (error_.ok()) {
      error_ = reason.ok() ? absl::AbortedError("aborted") : reason;
      if (!f_->lost[rank_]) f_->failed[rank_] = error_;
      f_->cv.SignalAll();
    }
    return error_;
  }

  // InvalidArgument unless mr lies in a live registration of this context.
  absl::Status CheckRegistered(const MemoryRegion& mr, const char* what) const {
    const MemoryRegion& root = mr.registered();
    absl::MutexLock l(&regions_->mu);
    if (regions_->live.count(&root) == 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          "rank ", rank_, ": ", what, " on memory this context has not registered (or whose "
          "registration is gone)"));
    }
    if (mr.data() < root.data() || mr.data() + mr.size() > root.data() + root.size()) {
      return absl::InvalidArgumentError(absl::StrCat("rank ", rank_, ": ", what,
                                                     " on a view outside its registration"));
    }
    return absl::OkStatus();
  }

  const std::shared_ptr<InProcDevice::Fabric> f_;
  const std::shared_ptr<RegionTable> regions_ = std::make_shared<RegionTable>();
  const int rank_;
  absl::Status error_;        // guarded by f_->mu
  PeerFault fault_;           // driving thread, under f_->mu
  bool interrupted_ = false;  // guarded by f_->mu
  std::vector<std::deque<RecvItem>> recvs_;  // by peer; driving thread, under f_->mu
  std::vector<uint64_t> sent_, received_;    // driving thread only
};

}  // namespace

InProcDevice::InProcDevice(int world_size, InProcFaults faults)
    : fabric_(std::make_shared<Fabric>(std::max(1, world_size), faults)) {
  properties_.name = "inproc";
  properties_.host_memory = true;
  properties_.cuda_memory = false;
  properties_.max_in_flight = kMaxInFlight;
}

InProcDevice::~InProcDevice() = default;

uint64_t InProcDevice::registrations() const {
  absl::MutexLock l(&fabric_->mu);
  return fabric_->registrations;
}

absl::StatusOr<std::unique_ptr<Context>> InProcDevice::CreateContext(const ContextSpec& spec) {
  if (spec.world_size != fabric_->n || spec.rank < 0 || spec.rank >= fabric_->n) {
    return absl::InvalidArgumentError(absl::StrCat("in-process device of ", fabric_->n,
                                                   " ranks: no rank ", spec.rank, " of ",
                                                   spec.world_size));
  }
  absl::MutexLock l(&fabric_->mu);
  if (fabric_->created[spec.rank]) {
    return absl::AlreadyExistsError(absl::StrCat("rank ", spec.rank, " already has a context"));
  }
  fabric_->created[spec.rank] = true;
  return std::unique_ptr<Context>(std::make_unique<InProcContext>(fabric_, spec.rank));
}

}  // namespace gradsync::transport
