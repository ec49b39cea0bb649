// gradsyncd's side of the shared-memory op queues (ipc/op_queue.h): one
// segment and one poller thread per session that asked for one
// (Worker.OpenOpQueue).
//
// Submissions: the job's executor takes them itself while it is idle
// (the queue is its SubmissionFeed: it polls the submission doorbell, spinning
// briefly after activity (OpQueueServerOptions::spin), then sleeping on the
// futex), so an op goes from the client to the thread that runs it with no
// hand-off in between. A backend that takes no feed leaves it to the poller,
// which then waits on the doorbell itself. Either way each entry is copied
// out of shared memory, validated and handed to the session
// (OpQueueBackend::Submit); an entry the session refuses is answered at once
// with an error completion.
// Every poll_interval the poller also takes what is waiting, bumps the daemon heartbeat (clients call the
// daemon dead when it stops), checks the header, counts a moving client
// heartbeat as use of the session (Touch: the lease does not reap a session
// whose client is blocked in a long wait), and notices that the session was
// closed.
//
// Completions come from the session's completion listener (on the job's
// executor thread): the op's token goes with it into the completion ring, then
// FUTEX_WAKE if the client sleeps. A full ring never drops a completion: it
// waits in a daemon-side overflow list, flushed as the client frees room.
// Ops taken from the ring and not yet delivered are bounded
// (max_outstanding); past that the poller leaves entries in the ring, so a
// client that never reads completions only blocks itself.
//
// The queue stops (closed flag + reason for the client, segment unlinked)
// when the session closes (CloseSession, lease, daemon shutdown), when its
// header is overwritten or an index is impossible (logged as an error), and
// on Shutdown. Ops submitted over gRPC are not affected: the listener leaves
// every op it did not take from the queue to Worker.Wait.
//
// Thread-safe.
#ifndef GRADSYNC_WORKER_OP_QUEUE_SERVER_H_
#define GRADSYNC_WORKER_OP_QUEUE_SERVER_H_

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/net.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "ipc/op_queue.h"
#include "worker/submission_feed.h"

namespace gradsync {

// One session, as the op queue server sees it (worker_service.cc adapts
// Session to it; tests use fakes). Every method may be called from any
// thread and must not block for long.
class OpQueueBackend {
 public:
  // Called once per finished op, on the job's executor thread, with no
  // session lock held. `outcome.token` is 0 (the server fills it in). Return
  // true if the outcome was delivered (the session then forgets the op).
  using Listener = std::function<bool(uint64_t op_id, const ipc::OpCompletion& outcome)>;

  virtual ~OpQueueBackend() = default;
  virtual const std::string& session_id() const = 0;
  // The uid a named queue segment is created for (-1: the daemon's own).
  virtual int64_t owner_uid() const { return -1; }
  // Validates and queues an op; returns the daemon's op id. Errors go back
  // to the client verbatim.
  virtual absl::StatusOr<uint64_t> Submit(const OpDesc& op) = 0;
  // Replaces the listener (nullptr removes it).
  virtual void SetCompletionListener(Listener listener) = 0;
  // Offers the queue as a feed the job's executor polls itself (nullptr
  // withdraws it). Returns false if the backend does not take feeds; the
  // poller then takes every submission itself.
  virtual bool SetSubmissionFeed(std::shared_ptr<SubmissionFeed> feed) {
    (void)feed;
    return false;
  }
  // Marks the session as used now (its lease starts over).
  virtual void Touch() = 0;
  // OK while the session takes new ops; else why not (written into the
  // queue's header for the client's health check).
  virtual absl::Status refusal() const { return health(); }
  // True once the session is closing or closed.
  virtual bool closed() const = 0;
  // Why the session is unusable (OK while usable).
  virtual absl::Status health() const = 0;
};

struct OpQueueServerOptions {
  // Longest futex wait of a poller; also the heartbeat period and how soon a
  // closed session's queue is noticed.
  absl::Duration poll_interval = absl::Milliseconds(100);
  // Segment names are <prefix><n>; "" = "/gradsync.<pid>.<nonce>-q", which
  // the daemon's start-up sweep recognizes.
  std::string name_prefix;
  // Queues are sealed memfds whose descriptor the client fetches on the fd
  // socket (TakeQueueFd): a daemon with an fd socket. Else named segments.
  bool by_descriptor = false;
  // Ops taken from one queue and not yet delivered to its completion ring.
  size_t max_outstanding = 4096;
  // After taking submissions, the poller keeps looking (yielding the CPU)
  // this long before it sleeps on the futex: a client submitting op after op
  // then needs no FUTEX_WAKE, and the poller no wake-up (tens of us on a
  // virtual CPU). Costs at most this much CPU per burst of ops; 0 = off.
  absl::Duration spin = absl::Microseconds(50);
};

struct OpQueueInfo {
  std::string shm_name;  // a named segment's name, else a description
  bool by_descriptor = false;  // the client fetches the descriptor
  uint64_t size_bytes = 0;
  uint32_t capacity = 0;
};

class OpQueueServer {
 public:
  explicit OpQueueServer(OpQueueServerOptions options = {});
  ~OpQueueServer();  // Shutdown()

  OpQueueServer(const OpQueueServer&) = delete;
  OpQueueServer& operator=(const OpQueueServer&) = delete;

  // Creates and starts serving the queue of `backend`'s session. Rings of
  // `capacity` entries (0 = default; see ipc::NormalizeCapacity).
  // AlreadyExists if the session has one; FailedPrecondition if it is
  // closed; Unavailable after Shutdown.
  absl::StatusOr<OpQueueInfo> Open(std::shared_ptr<OpQueueBackend> backend, uint32_t capacity);

  // The descriptor of the session's queue (by_descriptor), handed out once.
  // NotFound without a queue; FailedPrecondition once taken.
  absl::StatusOr<UniqueFd> TakeQueueFd(const std::string& session_id);

  // Stops serving the session's queue now, telling the client `reason`, and
  // unlinks the segment. No-op without a queue.
  void CloseSession(const std::string& session_id, const absl::Status& reason);

  // Stops every queue (reason: daemon shutting down). Idempotent.
  void Shutdown();

  // Queues being served (finished ones are reaped first).
  size_t queue_count();

 private:
  class Queue;
  // Joins and forgets queues whose poller has ended.
  void Reap();

  const OpQueueServerOptions options_;
  const std::string name_prefix_;

  absl::Mutex mu_;
  std::map<std::string, std::shared_ptr<Queue>> queues_ ABSL_GUARDED_BY(mu_);
  uint64_t next_segment_ ABSL_GUARDED_BY(mu_) = 1;
  bool shut_down_ ABSL_GUARDED_BY(mu_) = false;
};

}  // namespace gradsync

#endif  // GRADSYNC_WORKER_OP_QUEUE_SERVER_H_
