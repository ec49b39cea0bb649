// One client's membership in one job epoch: its rank, its shared-memory
// buffers, and the queue of its ops.
//
// Session is a facade over its parts, one responsibility each:
//   SessionBuffers (session_buffers.h)  buffers and memory quotas;
//   SessionOps     (session_ops.h)      numbering, queue, outcomes, Wait,
//                                       the completion listener and feed;
//   SessionEpoch   (session_epoch.h)    healthy / draining / failed / closed;
//   SessionLease   (session_lease.h)    when the client last used it.
// It adds what needs the job: validating a submission against the job
// (submit_validation.h), waking the executor, the observer, the timeline.
//
// The session validates each op and queues it; the job's executor on this
// daemon (worker/job_executor.h) runs it, together with the same op of the
// job's other ranks on this daemon, and completes it here (Finish). A
// signature mismatch fails only that op; any other failure breaks the epoch:
// the op and everything queued behind it fail with the cause, and later
// submissions are refused until the client opens a new session.
#ifndef GRADSYNC_WORKER_SESSION_H_
#define GRADSYNC_WORKER_SESSION_H_

#include <cstdint>
#include <array>
#include <deque>
#include <functional>
#include <map>
#include <mutex>
#include <optional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "collective/algorithm.h"
#include "collective/collectives.h"
#include "collective/cost_model.h"
#include "collective/planner.h"
#include "collective/op_signature.h"
#include "common/net.h"
#include "common/types.h"
#include "worker/daemon_observer.h"
#include "worker/device_memory.h"
#include "worker/shm_segment.h"
#include "worker/tenant_memory.h"
#include "worker/submission_feed.h"
#include "common/op_desc.h"
#include "worker/timeline.h"
#include "worker/queued_op.h"
#include "worker/session_buffers.h"
#include "worker/session_executor.h"
#include "worker/session_epoch.h"
#include "worker/session_lease.h"
#include "worker/session_ops.h"

namespace gradsync {

struct SessionInfo {
  std::string session_id;
  std::string job_id;
  std::string member_id;
  std::string member_key;  // the member's secret at the coordinator; never logged or shown
  std::string job_key;     // the job's secret (JoinJobResponse); the data-plane handshake proves it
  bool data_tls = false;   // the job's data connections run TLS (JobOptions.data_tls)
  std::string tenant;        // the job's tenant ("" without tenants)
  std::string tenant_token;  // sent with the member's calls to the coordinator; never shown
  // How this daemon keys the job (executors, data plane, PS shards):
  // "TENANT/JOB", or the job id without tenants.
  std::string scoped_job_id() const { return tenant.empty() ? job_id : tenant + "/" + job_id; }
  int rank = 0;
  int world_size = 1;
  int64_t epoch = 0;
  absl::Duration default_op_timeout = absl::Seconds(60);
  // The job's heartbeat timeout at the coordinator: a member whose heartbeats
  // go unanswered this long has been declared dead there.
  absl::Duration heartbeat_timeout = absl::Seconds(3);
  std::string job_algorithm;  // forced for every op of the job; "" = cost model
  std::string job_codec;      // every op's codec unless it names one (codec_request.h); "" = none
  // The epoch's data plane between daemons: "rdma: ...", "tcp: ..." or
  // "local: ..." (JobExecutor::transport and its detail).
  std::string transport;
  LinkParams link;            // measured when the epoch formed, equal on every rank
  std::string timeline_path;  // non-empty: write the job's timeline for this rank here
  std::vector<HostPort> ps_shards;  // the epoch's gradsync-ps shards (algo "ps")
  std::vector<std::string> ps_shard_keys;  // PsShardKey(job_key, shard id) of each; never shown
  std::vector<std::string> ps_shard_rdma;  // each shard's advertised RDMA port (Endpoint.rdma)
  // Random bytes (ipc::kRegistrationTokenBytes) handed only to the session's
  // client; they prove the session on the daemon's fd socket. Never logged
  // or shown in status.
  std::string registration_token;
  // The most buffer memory (allocated and registered, bytes) the session may
  // hold at once; 0: unlimited.
  uint64_t memory_limit_bytes = 0;
  // The uid that opened the session (SO_PEERCRED of its client socket
  // connection); -1: unknown (clients over TCP), anyone may use it.
  int64_t owner_uid = -1;
  // The pid of the client process that opened the session (SO_PEERCRED);
  // its exit closes the session (worker/client_watch.h). 0: unknown.
  int64_t client_pid = 0;
};

// OK when a caller of uid `caller_uid` (-1: unknown) may `what` the session:
// it is the session's owner, or the session has none. PERMISSION_DENIED
// naming the session, its owner and the caller otherwise.
absl::Status CheckOwner(const SessionInfo& info, int64_t caller_uid, absl::string_view what);

// What a session is doing, for `gradsync status` (answers "which rank is
// hanging my job?").
struct SessionStatus {
  SessionInfo info;
  absl::Status health;
  int queued = 0;  // ops waiting behind the current one
  uint64_t last_completed_seq = 0;
  std::string last_completed;  // e.g. "allreduce 'g' f32[10] sum (op 4): OK"
  absl::Time last_completed_at = absl::InfinitePast();
  bool has_current = false;
  uint64_t current_seq = 0;
  std::string current;          // description of the running op
  std::string phase;            // "negotiating" (waiting for ranks) or "running <algo>"
  absl::Time current_since;     // when this rank started the op
  std::vector<int> arrived;     // ranks known to have submitted the current op (incl. self)
  std::vector<int> missing;     // ranks not yet heard from (negotiating phase)
};



class Session {
 public:
  // `executor` runs the ops of this daemon's ranks of the job; the session
  // attaches itself to it (Attach) once it is shared. `tenant_memory`
  // (optional) is charged with the session's buffers under its account:
  // info.tenant, or without one info.owner_uid (MemoryAccount).
  Session(SessionInfo info, std::shared_ptr<SessionExecutor> executor,
          DaemonObserver* observer = nullptr,
          std::shared_ptr<TenantMemory> tenant_memory = nullptr);
  ~Session();  // Close()

  const SessionInfo& info() const { return info_; }

  // `by_descriptor`: a sealed memfd whose descriptor the client fetches
  // (TakeBufferFd) — a daemon with an fd socket; else a named POSIX segment
  // the client opens (its size is not sealed).
  absl::StatusOr<BufferInfo> AllocateBuffer(uint64_t size, bool by_descriptor = false);
  // The descriptor of allocated buffer `id`, handed out once. NotFound for no
  // such buffer, FailedPrecondition once taken or for a named or registered
  // buffer.
  absl::StatusOr<UniqueFd> TakeBufferFd(uint64_t id);
  // Buffers whose descriptor was never fetched hold one each in the daemon;
  // a session may have this many at once.
  static constexpr size_t kMaxUnfetchedBuffers = SessionBuffers::kMaxUnfetchedBuffers;
  // Maps [offset, offset+size) of the client's file `fd` as a buffer of this
  // session (ShmSegment::MapFd says what is checked); same id space and
  // lifetime as allocated buffers.
  absl::StatusOr<BufferInfo> RegisterBuffer(int fd, uint64_t offset, uint64_t size,
                                            const std::string& description);
  // A buffer in the memory of the GPU with `gpu_uuid` (device_memory.h):
  // allocated by the daemon (the client opens BufferInfo::cuda_ipc_handle),
  // or the client's allocation behind `ipc_handle`, [offset, offset+size).
  // FailedPrecondition naming why when this daemon cannot use GPUs.
  absl::StatusOr<BufferInfo> AllocateDeviceBuffer(const std::string& gpu_uuid, uint64_t size);
  absl::StatusOr<BufferInfo> RegisterDeviceBuffer(const std::string& gpu_uuid,
                                                  const std::string& ipc_handle, uint64_t offset,
                                                  uint64_t size, int64_t client_pid);
  absl::Status FreeBuffer(uint64_t id);
  // Bytes of the session's live buffers.
  uint64_t buffer_bytes() const;
  // The largest buffer a session may allocate or register.
  static constexpr uint64_t kMaxBufferBytes = SessionBuffers::kMaxBufferBytes;

  // Validates and queues (a collective) or hands to the executor's
  // point-to-point engine (send, recv); returns the op id.
  absl::StatusOr<uint64_t> Submit(const OpDesc& op);
  // Waits up to `timeout` for the op. done=false if still running. Once a
  // finished op has been reported it is forgotten (NotFound afterwards).
  absl::StatusOr<OpOutcome> Wait(uint64_t op_id, absl::Duration timeout);

  // ---- For the job's executor (worker/job_executor.h).
  // Takes the op at the front of the queue (null if none) and marks it
  // started ("negotiating").
  std::shared_ptr<QueuedOp> TakeNext();
  std::shared_ptr<SubmissionFeed> feed() const;
  // Records the op's outcome (status, the plan it ran) and tells the client,
  // once: false if it was already finished. `newly_failed`: this failure
  // broke the session's epoch.
  bool Finish(QueuedOp& op, const absl::Status& s, absl::string_view plan, absl::Time end,
              bool* newly_failed);
  // A point-to-point op's outcome (worker/point_to_point.h): its own failure
  // (a timeout, a size mismatch) does not break the epoch. `source`: the
  // rank the message came from (recv) or went to (send).
  bool FinishPointToPoint(QueuedOp& op, const absl::Status& s, int source, absl::Time end);
  int rank() const { return info_.rank; }
  // What the observer hears of a finished op.
  OpRecord Record(const QueuedOp& op, absl::Duration arrival_wait) const;
  Timeline* timeline() const { return timeline_.get(); }

  // Called on the executor thread, without locks held, each time an op
  // finishes. If it returns true the outcome was delivered elsewhere (e.g. a
  // shared-memory completion queue) and the op is forgotten (Wait then says
  // NotFound). At most one listener; set it before submitting ops.
  using CompletionListener = SessionOps::CompletionListener;
  void SetCompletionListener(CompletionListener listener);

  // While idle, the executor polls `feed` for submissions itself (the
  // shared-memory op queue) instead of sleeping until Submit wakes it: no
  // thread hand-off between the client's submission and its op running.
  // nullptr withdraws it.
  void SetSubmissionFeed(std::shared_ptr<SubmissionFeed> feed);

  // Refuses new submissions with `reason` (Unavailable); queued and running
  // ops go on (graceful drain).
  void StopAccepting(const std::string& reason);

  // The epoch ended gracefully (a member left): later ops fail with `reason`
  // (FailedPrecondition), but the running op is not interrupted; if it still
  // needs the member that left, the closed connection fails it at once.
  void EndEpoch(const absl::Status& reason);

  // Fails the epoch from outside (coordinator said so, daemon stopping).
  void AbortEpoch(const absl::Status& reason);
  // Leaves the executor (which fails a running op and breaks the epoch),
  // fails the queued ops, frees the buffers. Idempotent. `why` is what the
  // job's other ranks are told (the default: "rank R closed its session").
  void Close();
  void Close(const absl::Status& why);

  SessionStatus Status() const;

  // OK while the epoch is usable.
  absl::Status health() const;
  // OK while the session takes new ops; else why not, as Submit refuses:
  // Unavailable while draining, FailedPrecondition once closed or the
  // epoch failed ("... is no longer usable (open a new session): ...").
  absl::Status Refusal() const;
  // True once Close() has begun (client, lease or daemon shutdown).
  bool closed() const;
  bool has_pending_ops() const;
  absl::Time last_used() const;
  void Touch();

 private:
  // Submit's work: validates against the job and queues.
  absl::StatusOr<uint64_t> Enqueue(const OpDesc& op);

  const SessionInfo info_;
  const std::shared_ptr<SessionExecutor> executor_;
  DaemonObserver* const observer_;
  std::unique_ptr<Timeline> timeline_;  // null unless the job's timeline is on
  SessionLease lease_;
  SessionEpoch epoch_;
  // Shared with the ops, whose kept state (QueuedOp::quota) it is charged for.
  std::shared_ptr<SessionBuffers> buffers_;
  SessionOps ops_;  // refers to epoch_
  std::once_flag close_once_;
};

}  // namespace gradsync

#endif  // GRADSYNC_WORKER_SESSION_H_
