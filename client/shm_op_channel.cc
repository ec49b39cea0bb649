#include "client/shm_op_channel.h"

#include <sys/eventfd.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstring>
#include <thread>
#include <cstdlib>
#include <deque>
#include <utility>

#include <grpcpp/client_context.h>

#include "absl/base/thread_annotations.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "common/clock.h"
#include "common/logging.h"
#include "common/status_macros.h"
#include "ipc/fd_registration.h"
#include "ipc/op_queue.h"

namespace gradsync {
namespace client {
namespace internal {
namespace {

// "3 s", "0.3 s".
std::string Seconds(absl::Duration d) { return absl::StrCat(absl::ToDoubleSeconds(d), " s"); }

class ShmOpChannel final : public OpChannel {
  // An op submitted and not yet reported (see ops_).
  struct Tracked {
    uint64_t token = 0;
    bool done = false;      // its completion arrived
    bool reported = false;  // Wait returned it
    ipc::OpCompletion completion;
  };

 public:
  ShmOpChannel(std::unique_ptr<ipc::SharedMemory> mem, ipc::ClientEnd end, std::string target,
               std::string session_id, ShmOpChannelOptions options)
      : mem_(std::move(mem)),
        end_(end),
        target_(std::move(target)),
        session_id_(std::move(session_id)),
        options_(options) {
    last_heartbeat_ = end_.daemon_heartbeat();
    last_heartbeat_change_ = FastNow();
  }

  ~ShmOpChannel() override {
    {
      absl::MutexLock l(&mu_);
      stop_ = true;
      cv_.SignalAll();
    }
    if (notifier_.joinable()) notifier_.join();  // it sleeps at most max_sleep
    if (event_fd_ >= 0) ::close(event_fd_);
  }

  absl::StatusOr<int> CompletionFd() override {
    absl::MutexLock l(&mu_);
    if (event_fd_ >= 0) return event_fd_;
    const int fd = ::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    if (fd < 0) {
      return absl::InternalError(absl::StrCat("eventfd: ", std::strerror(errno)));
    }
    event_fd_ = fd;
    // A thread that sleeps on the completion bell, so completions are seen
    // (and the fd written) while nobody waits.
    notifier_ = std::thread([this] { NotifierLoop(); });
    return event_fd_;
  }

  absl::StatusOr<SubmitTicket> Submit(const OpDesc& op) override {
    absl::MutexLock submit_lock(&submit_mu_);  // one producer at a time
    const uint64_t token = next_token_;
    ipc::SubmissionEntry entry;
    RETURN_IF_ERROR(ipc::EncodeSubmission(token, op, &entry));
    {
      absl::MutexLock l(&mu_);
      RETURN_IF_ERROR(CheckUsableLocked());
      if (unreported_ >= kMaxUnreportedOps) {
        return absl::ResourceExhaustedError(absl::StrCat(
            unreported_, " ops are queued or unreported; Wait for some before submitting more"));
      }
      ops_.push_back(Tracked{token});  // tokens grow: ops_ stays sorted
      ++unreported_;
    }
    absl::Status pushed = Push(entry, op.timeout);
    if (!pushed.ok()) {
      absl::MutexLock l(&mu_);
      ops_.pop_back();  // still the last: later tokens come from this (serialized) submitter
      --unreported_;
      return pushed;
    }
    ++next_token_;
    end_.submission_bell().Ring();
    end_.BumpHeartbeat();
    return SubmitTicket{token, 0};
  }

  absl::StatusOr<WaitOutcome> Wait(uint64_t op_id, absl::Time deadline) override {
    mu_.Lock();
    absl::StatusOr<WaitOutcome> result = WaitLocked(op_id, deadline);
    mu_.Unlock();
    return result;
  }

  absl::Status Health() override {
    absl::MutexLock l(&mu_);
    end_.BumpHeartbeat();  // the client is alive too
    RETURN_IF_ERROR(CheckUsableLocked());
    return end_.refusal();
  }

  absl::Status Alive() override {
    absl::MutexLock l(&mu_);
    end_.BumpHeartbeat();
    return CheckUsableLocked();
  }


 private:
  // Writes `entry` into the submission ring, waiting for room if it is full.
  absl::Status Push(const ipc::SubmissionEntry& entry, absl::Duration timeout)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(submit_mu_) {
    const absl::Duration bound =
        timeout > absl::ZeroDuration() ? timeout : options_.default_op_timeout;
    const absl::Time deadline = FastNow() + bound;
    bool wanted = false;
    absl::Status result;
    while (true) {
      absl::StatusOr<bool> pushed = end_.PushSubmission(entry);
      if (!pushed.ok()) {
        absl::MutexLock l(&mu_);
        result = Break(pushed.status());
        break;
      }
      if (*pushed) break;
      // Full: ask the daemon to ring the completion bell when it takes one,
      // then look again before sleeping (it may have taken one meanwhile).
      ipc::Doorbell bell = end_.completion_bell();
      const uint32_t snapshot = bell.Snapshot();
      if (!wanted) {
        end_.SetSpaceWanted(true);
        wanted = true;
        continue;
      }
      {
        absl::MutexLock l(&mu_);
        // Read completions meanwhile: a daemon with many undelivered
        // completions stops taking submissions until they are read.
        DrainLocked();
        result = CheckUsableLocked();
        if (!result.ok()) break;
      }
      const absl::Time now = FastNow();
      if (now >= deadline) {
        result = absl::DeadlineExceededError(absl::StrCat(
            "op '", absl::string_view(entry.name, entry.name_len), "': the submission queue of session ",
            session_id_, " stayed full (", end_.capacity(), " entries) for ",
            absl::FormatDuration(bound), "; gradsyncd at ", target_, " is not taking ops"));
        break;
      }
      end_.BumpHeartbeat();
      if (!end_.SubmissionFull()) continue;
      bell.Wait(snapshot, std::min(options_.max_sleep, deadline - now));
    }
    if (wanted) end_.SetSpaceWanted(false);
    return result;
  }

  absl::StatusOr<WaitOutcome> WaitLocked(uint64_t op_id, absl::Time deadline)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    bool spun = false;  // spin once per Wait, before its first sleep
    while (true) {
      DrainLocked();
      Tracked* t = Find(op_id);
      if (t != nullptr && t->done) {
        ipc::OpCompletion c = std::move(t->completion);
        t->reported = true;
        --unreported_;
        while (!ops_.empty() && ops_.front().reported) ops_.pop_front();
        if (!c.status.ok()) return c.status;
        return WaitOutcome{std::move(c), /*done=*/true};
      }
      if (t == nullptr) {
        return absl::NotFoundError(absl::StrCat("op ", op_id, " is not pending in session ",
                                                session_id_,
                                                " (already reported, or never submitted)"));
      }
      RETURN_IF_ERROR(CheckUsableLocked());
      const absl::Time now = FastNow();
      if (now >= deadline) return WaitOutcome{};
      end_.BumpHeartbeat();
      const absl::Time slice_end = std::min(deadline, now + options_.max_sleep);
      if (sleeper_) {
        // Another thread sleeps on the doorbell and wakes us when it drains.
        cv_.WaitWithDeadline(&mu_, slice_end);
        continue;
      }
      sleeper_ = true;
      ipc::Doorbell bell = end_.completion_bell();
      const uint32_t snapshot = bell.Snapshot();
      if (DrainLocked()) {  // arrived between the drain above and the snapshot
        sleeper_ = false;
        continue;
      }
      mu_.Unlock();
      bool rang = false;
      if (!spun) {
        spun = true;
        rang = bell.Spin(snapshot, std::min(options_.spin, slice_end - now));
      }
      if (!rang) bell.Wait(snapshot, slice_end - FastNow());
      mu_.Lock();
      sleeper_ = false;
      cv_.SignalAll();  // someone else may take over the sleeping
    }
  }

  // CompletionFd's thread: the session's sleeper on the completion bell
  // while the fd exists (a Wait then sleeps on cv_ and is woken by its
  // drains, as with any other sleeper).
  void NotifierLoop() {
    absl::MutexLock l(&mu_);
    bool told_broken = false;
    while (!stop_) {
      DrainLocked();
      if (!CheckUsableLocked().ok()) {
        if (!told_broken) Notify();  // the caller's next call returns the error
        told_broken = true;
        cv_.WaitWithTimeout(&mu_, options_.max_sleep);
        continue;
      }
      if (sleeper_) {
        cv_.WaitWithTimeout(&mu_, options_.max_sleep);
        continue;
      }
      sleeper_ = true;
      ipc::Doorbell bell = end_.completion_bell();
      const uint32_t snapshot = bell.Snapshot();
      if (!DrainLocked()) {
        mu_.Unlock();
        bell.Wait(snapshot, options_.max_sleep);
        mu_.Lock();
      }
      sleeper_ = false;
      cv_.SignalAll();
    }
  }

  // Makes the completion fd readable (if there is one).
  void Notify() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (event_fd_ < 0) return;
    const uint64_t one = 1;
    (void)!::write(event_fd_, &one, sizeof(one));  // EAGAIN: already readable enough
  }

  // The unreported op with this token, or null.
  Tracked* Find(uint64_t token) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    auto it = std::lower_bound(ops_.begin(), ops_.end(), token,
                               [](const Tracked& t, uint64_t v) { return t.token < v; });
    if (it == ops_.end() || it->token != token || it->reported) return nullptr;
    return &*it;
  }

  // Moves every completion in the ring to its op. True if there were any.
  bool DrainLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (!broken_.ok()) return false;
    bool any = false;
    ipc::CompletionEntry entry;
    while (true) {
      absl::StatusOr<bool> got = end_.PopCompletion(&entry);
      if (!got.ok()) {
        Break(got.status()).IgnoreError();  // sticky in broken_; callers see it next
        break;
      }
      if (!*got) break;
      absl::StatusOr<ipc::OpCompletion> c = ipc::DecodeCompletion(entry);
      if (!c.ok()) {
        Break(c.status()).IgnoreError();
        break;
      }
      any = true;
      const uint64_t token = c->token;
      if (Tracked* t = Find(token)) {
        t->completion = *std::move(c);
        t->done = true;
      }
    }
    if (any) {
      // The daemon keeps completions that did not fit; tell it there is room.
      if (end_.overflow()) end_.submission_bell().Ring();
      cv_.SignalAll();
      Notify();
    }
    return any;
  }

  absl::Status Break(const absl::Status& cause) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (broken_.ok()) {
      broken_ = absl::DataLossError(absl::StrCat("op queue of session ", session_id_, " (",
                                                 mem_->name(), ") is corrupted: ", cause.message()));
      GS_LOG(ERROR) << broken_.message();
    }
    return broken_;
  }

  // OK while the daemon serves the queue and is alive.
  absl::Status CheckUsableLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (!broken_.ok()) return broken_;
    absl::Status closed = end_.closed_status();
    if (!closed.ok()) return closed;
    const absl::Time now = FastNow();
    const uint64_t hb = end_.daemon_heartbeat();
    if (hb != last_heartbeat_) {
      last_heartbeat_ = hb;
      last_heartbeat_change_ = now;
    } else if (now - last_heartbeat_change_ > options_.heartbeat_timeout) {
      broken_ = absl::UnavailableError(absl::StrCat("gradsyncd at ", target_,
                                                    " stopped answering (no heartbeat for ",
                                                    Seconds(options_.heartbeat_timeout), ")"));
      return broken_;
    }
    return absl::OkStatus();
  }

  const std::unique_ptr<ipc::SharedMemory> mem_;
  // Its submission side is used under submit_mu_, its completion side under mu_.
  ipc::ClientEnd end_;
  const std::string target_;
  const std::string session_id_;
  const ShmOpChannelOptions options_;

  absl::Mutex submit_mu_ ABSL_ACQUIRED_BEFORE(mu_);
  uint64_t next_token_ ABSL_GUARDED_BY(submit_mu_) = 1;

  absl::Mutex mu_;
  absl::CondVar cv_;
  bool sleeper_ ABSL_GUARDED_BY(mu_) = false;  // a thread sleeps on the completion bell
  // The ops submitted and not yet reported, in token order; a reported op
  // leaves once every earlier one has. No allocation per op.
  std::deque<Tracked> ops_ ABSL_GUARDED_BY(mu_);
  size_t unreported_ ABSL_GUARDED_BY(mu_) = 0;
  absl::Status broken_ ABSL_GUARDED_BY(mu_);  // sticky: dead daemon or corrupted queue
  uint64_t last_heartbeat_ ABSL_GUARDED_BY(mu_) = 0;
  absl::Time last_heartbeat_change_ ABSL_GUARDED_BY(mu_);
  int event_fd_ ABSL_GUARDED_BY(mu_) = -1;  // CompletionFd, once asked for
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  std::thread notifier_;
};

std::atomic<bool> g_logged_no_op_queue{false};

}  // namespace

absl::Duration WaitSpin(absl::Duration fallback) {
  // Documented in client.h, read only here.
  if (const char* spin = std::getenv("GRADSYNC_WAIT_SPIN_US")) {
    int us = 0;
    if (absl::SimpleAtoi(spin, &us) && us >= 0) return absl::Microseconds(us);
  }
  return fallback;
}

absl::StatusOr<std::unique_ptr<OpChannel>> NewShmOpChannel(std::unique_ptr<ipc::SharedMemory> mem,
                                                           std::string target,
                                                           std::string session_id,
                                                           ShmOpChannelOptions options) {
  ASSIGN_OR_RETURN(ipc::ClientEnd end, ipc::ClientEnd::Attach(mem->data(), mem->size()));
  return std::unique_ptr<OpChannel>(new ShmOpChannel(std::move(mem), end, std::move(target),
                                                     std::move(session_id), options));
}

namespace {
// The op queue of a daemon that hands it out by descriptor (a sealed memfd).
absl::StatusOr<std::unique_ptr<ipc::SharedMemory>> FetchQueue(const std::string& fd_socket,
                                                              const std::string& session_id,
                                                              const std::string& token,
                                                              uint64_t size) {
  if (fd_socket.empty()) {
    return absl::InternalError(
        "gradsyncd hands out the op queue by descriptor but announced no fd socket");
  }
  ipc::FetchRequest request;
  request.session_id = session_id;
  request.token = token;
  request.kind = ipc::SegmentKind::kOpQueue;
  ASSIGN_OR_RETURN(ipc::FetchedSegment fetched,
                   ipc::FetchSegment(fd_socket, request, absl::Now() + kRpcTimeout));
  return ipc::SharedMemory::MapFd(fetched.fd.get(), size,
                                  absl::StrCat("op queue of session ", session_id));
}
}  // namespace

std::unique_ptr<OpChannel> NewSessionOpChannel(const std::shared_ptr<WorkerConnection>& conn,
                                               const std::string& session_id,
                                               absl::Duration default_op_timeout,
                                               const std::string& fd_socket,
                                               const std::string& token) {
  // The one place this environment variable is read (documented in client.h).
  const char* forced = std::getenv("GRADSYNC_OP_CHANNEL");
  if (forced != nullptr && std::string(forced) == "grpc") {
    return NewGrpcOpChannel(conn, session_id);
  }
  v1::OpenOpQueueRequest req;
  req.set_session_id(session_id);
  req.set_capacity(0);  // the daemon's default
  grpc::ClientContext ctx;
  const absl::Time deadline = FastNow() + kRpcTimeout;
  ctx.set_deadline(absl::ToChronoTime(deadline));
  v1::OpenOpQueueResponse resp;
  grpc::Status s = conn->stub->OpenOpQueue(&ctx, req, &resp);
  if (s.error_code() == grpc::StatusCode::UNIMPLEMENTED) {
    if (!g_logged_no_op_queue.exchange(true)) {
      GS_LOG(INFO) << "gradsyncd at " << conn->target
                   << " has no shared-memory op queue (an older daemon): ops go over gRPC "
                      "Submit/Wait, about 1 ms each";
    }
    return NewGrpcOpChannel(conn, session_id);
  }
  absl::Status error = RpcError(s, *conn, "OpenOpQueue", deadline, kRpcTimeout);
  if (error.ok()) {
    absl::StatusOr<std::unique_ptr<ipc::SharedMemory>> mem =
        resp.by_descriptor()
            ? FetchQueue(fd_socket, session_id, token, resp.size_bytes())
            : ipc::SharedMemory::Open(resp.shm_name(), resp.size_bytes());
    if (mem.ok()) {
      absl::StatusOr<std::unique_ptr<OpChannel>> channel = NewShmOpChannel(
          *std::move(mem), conn->target, session_id,
          [&] {
            ShmOpChannelOptions o;
            if (default_op_timeout > absl::ZeroDuration()) o.default_op_timeout = default_op_timeout;
            o.spin = WaitSpin(o.spin);
            return o;
          }());
      if (channel.ok()) return *std::move(channel);
      error = channel.status();
    } else {
      error = mem.status();
    }
  }
  GS_LOG(WARNING) << "session " << session_id << ": cannot use the shared-memory op queue of "
                  << "gradsyncd at " << conn->target << " (" << error
                  << "); ops go over gRPC Submit/Wait";
  return NewGrpcOpChannel(conn, session_id);
}

}  // namespace internal
}  // namespace client
}  // namespace gradsync
