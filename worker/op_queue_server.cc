#include "worker/op_queue_server.h"

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <deque>
#include <iterator>
#include <random>
#include <thread>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/clock.h"
#include "common/logging.h"
#include "common/process.h"
#include "common/status_macros.h"
#include "ipc/shared_memory.h"

namespace gradsync {
namespace {

// "/gradsync.<pid>.<nonce>-q": the same shape as the buffers' names
// (worker/session.cc), so SweepStaleSegments removes queues a SIGKILLed
// daemon left behind.
std::string DefaultNamePrefix() {
  std::random_device rd;
  return absl::StrCat("/gradsync.", ::getpid(), ".", absl::Hex(rd(), absl::kZeroPad8), "-q");
}

}  // namespace

class OpQueueServer::Queue : public std::enable_shared_from_this<Queue> {
 public:
  Queue(std::shared_ptr<OpQueueBackend> backend, std::unique_ptr<ipc::SharedMemory> mem,
        ipc::DaemonEnd end, const OpQueueServerOptions& options)
      : backend_(std::move(backend)), mem_(std::move(mem)), end_(end), options_(options) {}

  ~Queue() {
    Stop(absl::UnavailableError("op queue destroyed"));
    Join();
  }

  const std::string& session_id() const { return backend_->session_id(); }
  const std::string& name() const { return mem_->name(); }
  UniqueFd TakeFd() { return mem_->TakeFd(); }
  bool finished() const { return finished_.load(); }

  // Registers the completion listener and the feed, and starts the poller.
  void Start() {
    std::weak_ptr<Queue> weak = weak_from_this();
    backend_->SetCompletionListener([weak](uint64_t op_id, const ipc::OpCompletion& outcome) {
      std::shared_ptr<Queue> q = weak.lock();
      return q != nullptr && q->OnCompletion(op_id, outcome);
    });
    fed_.store(true);  // before the session can call us through the feed
    if (!backend_->SetSubmissionFeed(std::make_shared<Feed>(weak, options_.spin))) {
      fed_.store(false);
    }
    thread_ = std::thread([this] { Run(); });
    NameThread(thread_, "gs-opqueue");
  }

  // Asks the poller to close the queue with `reason` and end.
  // Whether the daemon closed the session, and the reason the queue gives then.
  bool backend_closed() const { return backend_->closed(); }
  absl::Status closed_reason() const { return ClosedReason(); }

  void Stop(const absl::Status& reason) {
    {
      absl::MutexLock l(&mu_);
      if (stop_reason_.ok()) stop_reason_ = reason;
    }
    stop_.store(true);
    end_.submission_bell().Ring();
    WakePoller();
  }

  void Join() {
    if (thread_.joinable() && thread_.get_id() != std::this_thread::get_id()) thread_.join();
  }

 private:
  // The queue as its session's SubmissionFeed. Holds the queue only while a
  // call runs, so a closed queue goes away even if the session keeps the feed.
  class Feed final : public SubmissionFeed {
   public:
    Feed(std::weak_ptr<Queue> q, absl::Duration spin) : q_(std::move(q)), spin_(spin) {}
    uint32_t Snapshot() override {
      auto q = q_.lock();
      return q != nullptr ? q->end_.submission_bell().Snapshot() : 0;
    }
    void Pump() override {
      if (auto q = q_.lock()) q->PumpFromFeed();
    }
    bool Spin(uint32_t snapshot, absl::Duration limit) override {
      auto q = q_.lock();
      return q != nullptr && q->end_.submission_bell().Spin(snapshot, limit);
    }
    void Wait(uint32_t snapshot, absl::Duration timeout) override {
      if (auto q = q_.lock()) {
        q->end_.submission_bell().Wait(snapshot, timeout);
      } else {  // the queue is gone; the session drops the feed in a moment
        absl::SleepFor(std::min(timeout, absl::Milliseconds(1)));
      }
    }
    void Wake() override {
      if (auto q = q_.lock()) q->end_.submission_bell().Ring();
    }
    absl::Duration spin() const override { return spin_; }

   private:
    const std::weak_ptr<Queue> q_;
    const absl::Duration spin_;
  };

  // The executor's side of the feed: takes what is waiting now.
  void PumpFromFeed() {
    if (stop_.load()) return;
    bool progress = false;
    bool ring = false;
    absl::Status s;
    {
      absl::MutexLock l(&mu_);
      if (closed_ || !fatal_.ok()) return;
      s = PumpLocked(&progress, &ring);
      if (!s.ok()) fatal_ = s;  // the poller closes the queue with it
    }
    if (ring) end_.completion_bell().Ring();
    if (!s.ok()) WakePoller();
  }

  void WakePoller() {
    absl::MutexLock l(&wake_mu_);
    wake_ = true;
  }

  // The poller's sleep while the executor takes submissions: until a
  // Stop()/error or `timeout`.
  void SleepPoller(absl::Duration timeout) {
    absl::MutexLock l(&wake_mu_);
    wake_mu_.AwaitWithTimeout(absl::Condition(&wake_), timeout);
    wake_ = false;
  }

  void Run() {
    uint64_t client_heartbeat = end_.client_heartbeat();
    absl::Time next_tick = absl::InfinitePast();
    absl::Time last_active = absl::InfinitePast();
    absl::Status reason;
    while (true) {
      // Snapshot first: a Stop() or submission after it makes the wait below return at once.
      ipc::Doorbell bell = end_.submission_bell();
      const uint32_t snapshot = bell.Snapshot();
      if (stop_.load()) {
        absl::MutexLock l(&mu_);
        reason = stop_reason_;
        break;
      }
      const absl::Time now = FastNow();
      if (now >= next_tick) {
        end_.BumpHeartbeat();
        if (backend_->closed()) {
          reason = ClosedReason();
          break;
        }
        absl::Status header = end_.CheckHeader();
        if (!header.ok()) {
          GS_LOG(ERROR) << "session " << session_id() << ": closing op queue " << name() << ": "
                        << header.message();
          reason = header;
          break;
        }
        const uint64_t hb = end_.client_heartbeat();
        if (hb != client_heartbeat) {  // a client blocked in a wait is using its session
          client_heartbeat = hb;
          backend_->Touch();
        }
        end_.SetRefusal(backend_->refusal());
        next_tick = now + options_.poll_interval;
      }
      bool progress = false;
      bool ring = false;
      bool pressure = false;  // a client waits for ring space or for overflowed completions
      absl::Status s;
      {
        absl::MutexLock l(&mu_);
        s = fatal_;
        if (s.ok()) s = PumpLocked(&progress, &ring);
        pressure = backpressured_ || !overflow_.empty();
      }
      if (ring) end_.completion_bell().Ring();
      if (!s.ok()) {
        GS_LOG(ERROR) << "session " << session_id() << ": closing op queue " << name() << ": "
                      << s.message();
        reason = s;
        break;
      }
      if (fed_.load()) {
        // The executor takes submissions while it is idle. While it runs a
        // long op, a client blocked on a full ring or on overflowed
        // completions is served here within a millisecond, not a tick.
        SleepPoller(pressure ? absl::Milliseconds(1)
                             : std::clamp(next_tick - FastNow(), absl::Milliseconds(1),
                                          options_.poll_interval));
      } else if (progress) {
        last_active = now;
      } else if (!bell.Spin(snapshot, last_active + options_.spin - now)) {
        bell.Wait(snapshot, std::clamp(next_tick - now, absl::Milliseconds(1),
                                       options_.poll_interval));
      }
    }
    {
      absl::MutexLock l(&mu_);
      closed_ = true;
      end_.Close(reason);
    }
    mem_->Unlink();
    if (fed_.load()) backend_->SetSubmissionFeed(nullptr);
    backend_->SetCompletionListener(nullptr);
    GS_LOG(INFO) << "session " << session_id() << ": op queue " << name()
                 << " closed: " << reason.message();
    finished_.store(true);
  }

  absl::Status ClosedReason() const {
    const absl::Status h = backend_->health();
    if (h.ok() || absl::IsCancelled(h)) {
      return absl::FailedPreconditionError(
          absl::StrCat("session ", session_id(), " is closed", h.ok() ? "" : ": ", h.message()));
    }
    return absl::Status(h.code(), absl::StrCat("session ", session_id(), " is closed: ", h.message()));
  }

  // Moves overflowed completions into the ring, then takes submissions while
  // the outstanding bound allows. An error means the client broke an index.
  absl::Status PumpLocked(bool* progress, bool* ring) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    while (!overflow_.empty()) {
      ASSIGN_OR_RETURN(const bool pushed, end_.PushCompletion(overflow_.front()));
      if (!pushed) break;
      overflow_.pop_front();
      *progress = *ring = true;
    }
    end_.SetOverflow(!overflow_.empty());
    bool took = false;
    while (op_to_token_.size() + overflow_.size() < options_.max_outstanding) {
      ipc::SubmissionEntry entry;
      ASSIGN_OR_RETURN(const bool got, end_.PopSubmission(&entry));
      if (!got) break;
      took = *progress = true;
      absl::Status refused = SubmitLocked(entry);
      if (!refused.ok()) {
        ipc::OpCompletion c;
        c.token = entry.token;
        c.status = std::move(refused);
        RETURN_IF_ERROR(PostLocked(c, ring));
      }
    }
    backpressured_ = end_.PendingSubmissions() > 0;
    if (took) end_.NotifySpaceIfWanted();
    return absl::OkStatus();
  }

  // Decodes (entry is already a private copy) and submits one op.
  absl::Status SubmitLocked(const ipc::SubmissionEntry& entry) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    OpDesc op;
    RETURN_IF_ERROR(ipc::DecodeSubmission(entry, &op));
    if (entry.token <= last_token_) {
      return absl::InvalidArgumentError(absl::StrCat("op '", op.name, "': token ", entry.token,
                                                     " is not above the previous token ",
                                                     last_token_));
    }
    last_token_ = entry.token;
    // Under mu_, so the listener cannot see the op finish before its token is known.
    ASSIGN_OR_RETURN(const uint64_t op_id, backend_->Submit(op));
    // Op ids grow with every submission (the session numbers them), so this
    // appends, and completions mostly take the front.
    auto at = op_to_token_.end();
    while (at != op_to_token_.begin() && std::prev(at)->first > op_id) --at;
    op_to_token_.emplace(at, op_id, entry.token);
    return absl::OkStatus();
  }

  absl::Status PostLocked(const ipc::OpCompletion& c, bool* ring) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    ipc::CompletionEntry entry;
    ipc::EncodeCompletion(c, &entry);
    if (overflow_.empty()) {
      ASSIGN_OR_RETURN(const bool pushed, end_.PushCompletion(entry));
      if (pushed) {
        *ring = true;
        return absl::OkStatus();
      }
    }
    overflow_.push_back(entry);
    end_.SetOverflow(true);
    return absl::OkStatus();
  }

  // The session's completion listener (the job's executor thread).
  bool OnCompletion(uint64_t op_id, const ipc::OpCompletion& outcome) {
    bool ring = false;
    bool wake_poller = false;
    {
      absl::MutexLock l(&mu_);
      auto it = std::lower_bound(op_to_token_.begin(), op_to_token_.end(), op_id,
                                 [](const auto& e, uint64_t id) { return e.first < id; });
      if (it == op_to_token_.end() || it->first != op_id) {
        return false;  // submitted over gRPC: Worker.Wait reports it
      }
      ipc::OpCompletion c = outcome;
      c.token = it->second;
      c.op_id = op_id;
      op_to_token_.erase(it);
      if (closed_) return true;  // nobody to tell
      absl::Status s = PostLocked(c, &ring);
      if (!s.ok() && fatal_.ok()) {
        fatal_ = s;
        wake_poller = true;
      }
      if (backpressured_) wake_poller = true;  // room for more outstanding ops now
    }
    if (ring) end_.completion_bell().Ring();
    if (wake_poller) {
      end_.submission_bell().Ring();
      if (fed_.load()) WakePoller();
    }
    return true;
  }

  const std::shared_ptr<OpQueueBackend> backend_;
  const std::unique_ptr<ipc::SharedMemory> mem_;
  ipc::DaemonEnd end_;  // the ring indices it owns are used under mu_ only
  const OpQueueServerOptions options_;

  absl::Mutex mu_;
  // (op id, client token) of the ops taken from the ring and not yet
  // completed, in op id order.
  std::deque<std::pair<uint64_t, uint64_t>> op_to_token_ ABSL_GUARDED_BY(mu_);
  std::deque<ipc::CompletionEntry> overflow_ ABSL_GUARDED_BY(mu_);
  uint64_t last_token_ ABSL_GUARDED_BY(mu_) = 0;
  bool closed_ ABSL_GUARDED_BY(mu_) = false;
  bool backpressured_ ABSL_GUARDED_BY(mu_) = false;
  absl::Status fatal_ ABSL_GUARDED_BY(mu_);
  absl::Status stop_reason_ ABSL_GUARDED_BY(mu_);
  std::atomic<bool> stop_{false};
  std::atomic<bool> finished_{false};
  std::atomic<bool> fed_{false};  // the job's executor takes the submissions
  absl::Mutex wake_mu_;
  bool wake_ ABSL_GUARDED_BY(wake_mu_) = false;
  std::thread thread_;
};

OpQueueServer::OpQueueServer(OpQueueServerOptions options)
    : options_(std::move(options)),
      name_prefix_(options_.name_prefix.empty() ? DefaultNamePrefix() : options_.name_prefix) {}

OpQueueServer::~OpQueueServer() { Shutdown(); }

absl::StatusOr<OpQueueInfo> OpQueueServer::Open(std::shared_ptr<OpQueueBackend> backend,
                                                uint32_t capacity) {
  Reap();
  ASSIGN_OR_RETURN(const uint32_t cap, ipc::NormalizeCapacity(capacity));
  const std::string& id = backend->session_id();
  if (backend->closed()) {
    return absl::FailedPreconditionError(absl::StrCat("session ", id, " is closed"));
  }
  std::string name;
  {
    absl::MutexLock l(&mu_);
    if (shut_down_) return absl::UnavailableError("gradsyncd is shutting down");
    if (queues_.count(id) != 0) {
      return absl::AlreadyExistsError(absl::StrCat("session ", id, " already has an op queue"));
    }
    name = options_.by_descriptor ? absl::StrCat("gradsync-queue-", next_segment_++)
                                  : absl::StrCat(name_prefix_, next_segment_++);
  }
  ASSIGN_OR_RETURN(std::unique_ptr<ipc::SharedMemory> mem,
                   options_.by_descriptor
                       ? ipc::SharedMemory::CreateSealed(name, ipc::OpQueueBytes(cap))
                       : ipc::SharedMemory::Create(name, ipc::OpQueueBytes(cap), backend->owner_uid()));
  ASSIGN_OR_RETURN(ipc::DaemonEnd end, ipc::DaemonEnd::Format(mem->data(), mem->size(), cap));
  OpQueueInfo info{name, options_.by_descriptor, mem->size(), cap};
  auto queue = std::make_shared<Queue>(backend, std::move(mem), end, options_);
  {
    absl::MutexLock l(&mu_);
    if (shut_down_) return absl::UnavailableError("gradsyncd is shutting down");
    if (queues_.count(id) != 0) {
      return absl::AlreadyExistsError(absl::StrCat("session ", id, " already has an op queue"));
    }
    queues_[id] = queue;
    queue->Start();
  }
  GS_LOG(INFO) << "session " << id << ": op queue " << name << " (" << cap << " entries, "
               << info.size_bytes << " bytes)";
  return info;
}

absl::StatusOr<UniqueFd> OpQueueServer::TakeQueueFd(const std::string& session_id) {
  absl::MutexLock l(&mu_);
  auto it = queues_.find(session_id);
  if (it == queues_.end()) {
    return absl::NotFoundError(absl::StrCat("session ", session_id, " has no op queue"));
  }
  UniqueFd fd = it->second->TakeFd();
  if (!fd.valid()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "the op queue of session ", session_id,
        options_.by_descriptor ? " was already fetched (it is handed out once)"
                               : " is a named segment, not handed out by descriptor"));
  }
  return fd;
}

void OpQueueServer::CloseSession(const std::string& session_id, const absl::Status& reason) {
  std::shared_ptr<Queue> queue;
  {
    absl::MutexLock l(&mu_);
    auto it = queues_.find(session_id);
    if (it == queues_.end()) return;
    queue = std::move(it->second);
    queues_.erase(it);
  }
  queue->Stop(reason);
  queue->Join();
}

void OpQueueServer::Shutdown() {
  std::map<std::string, std::shared_ptr<Queue>> queues;
  {
    absl::MutexLock l(&mu_);
    shut_down_ = true;
    queues.swap(queues_);
  }
  // A session the daemon already closed gives its own reason (e.g. the
  // daemon's "daemon shutting down"), whether or not the queue's poller has
  // seen it yet.
  for (auto& [id, q] : queues) {
    q->Stop(q->backend_closed() ? q->closed_reason()
                                : absl::UnavailableError("gradsyncd is shutting down"));
  }
  for (auto& [id, q] : queues) q->Join();
}

void OpQueueServer::Reap() {
  std::vector<std::shared_ptr<Queue>> done;
  {
    absl::MutexLock l(&mu_);
    for (auto it = queues_.begin(); it != queues_.end();) {
      if (it->second->finished()) {
        done.push_back(std::move(it->second));
        it = queues_.erase(it);
      } else {
        ++it;
      }
    }
  }
  for (auto& q : done) q->Join();
}

size_t OpQueueServer::queue_count() {
  Reap();
  absl::MutexLock l(&mu_);
  return queues_.size();
}

}  // namespace gradsync
