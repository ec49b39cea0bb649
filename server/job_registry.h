// JobRegistry: the coordinator's state machine (jobs, rendezvous, membership,
// heartbeats, epochs, events). No gRPC types: requests and replies are the
// gradsync.v1 proto messages used as plain data, errors are absl::Status with
// the same codes the service returns.
//
// A job moves through epochs. Each epoch is
//
//   FORMING --(all world_size ranks joined)--> RUNNING --(death | leave)--> ABORTED
//
// and a JoinJob on an ABORTED job starts the next epoch (epoch + 1, members
// cleared, FORMING). A job whose rendezvous completed is deleted as soon as no
// member of its current epoch is alive and still in the job (JOB_DELETED); a
// FORMING first epoch nobody waits in expires after forming_job_timeout_ms, so
// callers run CreateJob (idempotent) before JoinJob.
//
// Death detection covers RUNNING and ABORTED epochs: a member whose last
// heartbeat (or the rendezvous completion, whichever is later) is older than
// the job's heartbeat_timeout_ms is declared dead. The first death or leave of
// a RUNNING epoch aborts it and sets abort_reason; later deaths in the same
// epoch only add to dead_ranks.
//
// Thread safety: every method may be called from any thread. One mutex guards
// all jobs (this is the control plane, not the data path); no user callback
// and no stream write runs while it is held, except WaitControl::is_cancelled,
// which must be cheap and must not call into the registry.
#ifndef GRADSYNC_SERVER_JOB_REGISTRY_H_
#define GRADSYNC_SERVER_JOB_REGISTRY_H_

#include <cstddef>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <optional>
#include <memory>
#include <string>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "proto/coordinator.pb.h"
#include "server/job_registry_observer.h"

namespace gradsync {

inline constexpr int kMaxWorldSize = 4096;
inline constexpr std::size_t kMaxJobIdLength = 128;
// A tenant's jobs are "TENANT/JOB" in the registry (server/tenants.h).
inline constexpr std::size_t kMaxJobNamespaceLength = 32;
inline constexpr std::size_t kMaxScopedJobIdLength = kMaxJobNamespaceLength + 1 + kMaxJobIdLength;
inline constexpr std::size_t kMaxMemberIdLength = 256;
// JoinJobRequest.member_key: the member's secret.
inline constexpr std::size_t kMinMemberKeyBytes = 16;
inline constexpr std::size_t kMaxMemberKeyBytes = 64;
inline constexpr std::size_t kMaxJobs = 10000;
// Joins waiting for a rendezvous at once, over all jobs.
inline constexpr std::size_t kMaxPendingJoins = 65536;
// Joins of one member waiting at once (its retries).
inline constexpr int kMaxWaitingJoinsPerMember = 4;
// Ranks of forming jobs (the sum of their world sizes), over all jobs: each
// forming rank holds a member slot until the rendezvous completes.
inline constexpr int64_t kMaxFormingRanks = 262144;

// What one namespace (a tenant) may hold of the registry's tables; 0: no
// limit of its own (the registry's global ones still hold). The coordinator
// gives each tenant a fair share (CoordinatorService::Scope), so one tenant
// cannot take a table from the others.
struct NamespaceLimits {
  int max_jobs = 0;            // jobs in any state
  int max_forming_jobs = 0;    // jobs whose first rendezvous has not completed
  int64_t max_forming_ranks = 0;  // the sum of the forming jobs' world sizes
  int max_pending_joins = 0;   // joins waiting for a rendezvous
};
inline constexpr std::size_t kMaxRememberedDeletions = 1024;
// Limits of a job's options (0 keeps meaning "the coordinator's default").
inline constexpr int64_t kMinHeartbeatTimeoutMs = 100;
inline constexpr int64_t kMaxHeartbeatTimeoutMs = 3'600'000;  // 1 h
inline constexpr int64_t kMaxOpTimeoutMs = 86'400'000;        // 24 h
inline constexpr int kMaxJobTcpStreams = 16;
inline constexpr int kMaxJobPsShards = 256;
inline constexpr std::size_t kMaxAlgorithmNameLength = 64;
// A watcher that falls this many events behind is disconnected.
inline constexpr std::size_t kMaxQueuedWatchEvents = 10000;

// OK if every option of a new job is within the limits above (0: the
// default); INVALID_ARGUMENT naming the field, its value and its range.
absl::Status ValidateJobOptions(absl::string_view job_id, const v1::JobOptions& options);

// OK if `job_id` is 1..128 characters of [A-Za-z0-9._-], optionally after a
// tenant's namespace "TENANT/" (1..32 of the same); INVALID_ARGUMENT naming
// the problem otherwise.
absl::Status ValidateJobId(absl::string_view job_id);

// "TENANT/JOB", or JOB for the empty tenant (a coordinator without tenants).
std::string ScopedJobId(absl::string_view tenant, absl::string_view job_id);
// The parts of a scoped id: "" and the id itself for an unscoped one.
absl::string_view JobNamespace(absl::string_view scoped_id);
absl::string_view UnscopedJobId(absl::string_view scoped_id);

// One subscriber's view of a job's events (see JobRegistry::WatchJob). Owned
// by the caller; may outlive the registry. Not thread-safe: one reader.
class JobWatch {
 public:
  struct Queue;  // shared with the registry; defined in job_registry.cc

  explicit JobWatch(std::shared_ptr<Queue> queue);
  ~JobWatch();
  JobWatch(const JobWatch&) = delete;
  JobWatch& operator=(const JobWatch&) = delete;

  // Waits up to `timeout` for the next event. Returns
  //   the event (the first one is always KIND_SNAPSHOT);
  //   DEADLINE_EXCEEDED: nothing arrived within `timeout` (call again);
  //   OUT_OF_RANGE: the stream ended normally after the KIND_JOB_DELETED event;
  //   UNAVAILABLE: the registry shut down;
  //   RESOURCE_EXHAUSTED: the reader fell kMaxQueuedWatchEvents behind.
  absl::StatusOr<v1::JobEvent> Next(absl::Duration timeout);

 private:
  std::shared_ptr<Queue> queue_;
};

class JobRegistry {
 public:
  struct Options {
    // Used for jobs created with options.heartbeat_timeout_ms == 0.
    int64_t default_heartbeat_timeout_ms = 3000;
    // Used for jobs created with options.op_timeout_ms == 0.
    int64_t default_op_timeout_ms = 60000;
    // Rendezvous wait when a JoinJob request has timeout_ms <= 0.
    int64_t default_join_timeout_ms = 5 * 60 * 1000;
    // How often the background thread runs death detection.
    absl::Duration liveness_interval = absl::Milliseconds(100);
    // A job whose first rendezvous never completed and that no member has
    // been waiting in for this long is deleted: its id is free again.
    absl::Duration forming_job_timeout = absl::Seconds(10);
    // false: no background thread; tests call CheckLiveness() themselves.
    bool start_liveness_thread = true;
    // Clock for heartbeat ages, death detection and event times; absl::Now
    // when empty. Rendezvous deadlines always use the real clock.
    std::function<absl::Time()> now;
    // Told about state changes (metrics); not owned, must outlive the
    // registry. nullptr: nobody is told.
    JobRegistryObserver* observer = nullptr;
  };

  // How long a blocking call may wait, and how it learns that its caller went
  // away (e.g. a cancelled RPC). Polled every ~50 ms while waiting.
  struct WaitControl {
    absl::Time deadline = absl::InfiniteFuture();
    std::function<bool()> is_cancelled;  // may be empty
  };

  explicit JobRegistry(Options options);
  ~JobRegistry();  // Shutdown(), then stops the background thread
  JobRegistry(const JobRegistry&) = delete;
  JobRegistry& operator=(const JobRegistry&) = delete;

  // Creates a job (created = true), or finds one with the same id and world
  // size (created = false; options are the existing job's). Zero options take
  // the registry defaults; the reply carries the effective options.
  // INVALID_ARGUMENT: bad id, world size outside 1..4096, negative options.
  // ALREADY_EXISTS: same id, other world size (the message names both).
  // RESOURCE_EXHAUSTED: kMaxJobs jobs exist, kMaxFormingRanks ranks form,
  // or the id's namespace is at one of `limits` (naming which). UNAVAILABLE:
  // shutting down.
  absl::StatusOr<v1::CreateJobResponse> CreateJob(const v1::CreateJobRequest& request,
                                                  const NamespaceLimits& limits = {});

  // Rendezvous; blocks until every rank of the current epoch joined, then
  // returns this member's rank, the epoch and all members indexed by rank.
  // The wait ends at min(now + timeout_ms, wait.deadline). A retry with the
  // same member_id gets the same rank (also after the rendezvous completed).
  // requested_rank -1 takes the lowest free rank.
  //   NOT_FOUND: no such job.
  //   INVALID_ARGUMENT: empty/oversized member_id, a member_key outside
  //     kMinMemberKeyBytes..kMaxMemberKeyBytes, rank out of range, bad port.
  //   PERMISSION_DENIED: a join for a member that exists with another key
  //     (a retry must come from the daemon that joined it).
  //   ALREADY_EXISTS: the requested rank is held by another member, or this
  //     member already holds a different rank.
  //   FAILED_PRECONDITION: the epoch is RUNNING and this is a new member.
  //   DEADLINE_EXCEEDED: timed out; the message names the missing and joined
  //     ranks. The member is removed from the forming epoch (unless another
  //     JoinJob call of the same member is still waiting) so it can retry.
  //   CANCELLED: wait.is_cancelled() became true (member removed likewise).
  //   ABORTED: the member was removed (LeaveJob) while waiting.
  //   UNAVAILABLE: the registry shut down.
  absl::StatusOr<v1::JoinJobResponse> JoinJob(const v1::JoinJobRequest& request,
                                              const WaitControl& wait);

  // JoinJob without a thread per waiting joiner: `done` gets what JoinJob
  // would return, exactly once and without the registry lock held — on the
  // calling thread when the answer is known at once (0 is returned), else
  // later on the registry's join thread (the join's id is returned, for
  // CancelJoin). `wait_deadline` bounds the wait as WaitControl::deadline
  // does. RESOURCE_EXHAUSTED when kMaxPendingJoins joins already wait, when
  // kMaxWaitingJoinsPerMember of this member do, or `max_pending_in_namespace`
  // (> 0) of the job's namespace do.
  using JoinDone = std::function<void(absl::StatusOr<v1::JoinJobResponse>)>;
  uint64_t StartJoin(const v1::JoinJobRequest& request, absl::Time wait_deadline, JoinDone done,
                     int max_pending_in_namespace = 0);
  // A pending join's caller went away: it ends CANCELLED (as JoinJob does
  // when wait.is_cancelled() turns true). No-op for an answered join.
  void CancelJoin(uint64_t id);

  // Records a heartbeat if request.epoch is the job's current epoch and the
  // member (by member_id, or by rank when member_id is empty) is alive. Always
  // returns the job's state, epoch, abort_reason and dead_ranks.
  // NOT_FOUND: no such job. PERMISSION_DENIED: the member's key differs
  // (nothing recorded).
  absl::StatusOr<v1::HeartbeatResponse> Heartbeat(const v1::HeartbeatRequest& request);

  // Graceful exit of a member (by member_id, or by rank when it is empty).
  // FORMING: the member is removed. RUNNING: the epoch is aborted ("rank r
  // (member 'x') left the job"). Idempotent: unknown job, stale epoch or
  // unknown member are OK. PERMISSION_DENIED: the member's key differs
  // (nothing changes).
  absl::Status LeaveJob(const v1::LeaveJobRequest& request);

  // Ends the job now, whatever its state: waiting joins fail ABORTED with
  // `why` (e.g. "deleted by operator 'x': reason"), watches end, and later
  // calls about it (a running member's heartbeat) are NOT_FOUND naming `why`
  // until the id is used again. NOT_FOUND: no such job.
  absl::StatusOr<v1::DeleteJobResponse> DeleteJob(absl::string_view job_id, const std::string& why);

  // NOT_FOUND: no such job. INVALID_ARGUMENT: empty id.
  absl::StatusOr<v1::JobStatus> GetJobStatus(absl::string_view job_id);
  // All jobs, ordered by id.
  v1::ListJobsResponse ListJobs();

  // Subscribes to the job's events; the first one is a KIND_SNAPSHOT. Every
  // later event carries the job status after it. NOT_FOUND: no such job.
  absl::StatusOr<std::unique_ptr<JobWatch>> WatchJob(absl::string_view job_id);

  // The number of jobs. Takes the registry mutex, so it doubles as a cheap
  // "is the registry responsive" probe (the systemd watchdog uses it).
  // The job's secret (handed to its members at JoinJob) and whether its
  // data connections run TLS, for the PS shards assigned to it. NOT_FOUND.
  struct JobSecret {
    std::string key;
    bool data_tls = false;
  };
  absl::StatusOr<JobSecret> JobKey(const std::string& job_id);
  size_t JobCount();

  // One pass of death detection (the background thread calls this).
  void CheckLiveness();

  // Wakes every blocked JoinJob (UNAVAILABLE) and ends every watch
  // (UNAVAILABLE); later calls fail with UNAVAILABLE. Idempotent.
  void Shutdown();

 private:
  struct Job;

  absl::Time Now() const;
  struct PendingJoin;  // server/job_registry_state.h
  // Registers the member (or its retry) and sets p->rank. Returns the epoch's
  // shared response when the join is answered at once, nullptr when it must
  // wait (p then describes the wait), or the error.
  absl::StatusOr<std::shared_ptr<const v1::JoinJobResponse>> RegisterJoinLocked(
      const v1::JoinJobRequest& request, PendingJoin* p, int max_pending_in_namespace)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // How a pending join ends now, or nullopt while it still waits.
  std::optional<absl::StatusOr<std::shared_ptr<const v1::JoinJobResponse>>> JoinOutcomeLocked(
      PendingJoin& p, absl::Time now) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void FinishJoin(const JoinDone& done,
                  absl::StatusOr<std::shared_ptr<const v1::JoinJobResponse>> result, int rank);
  void JoinLoop();  // answers pending joins (join_thread_)
  void LivenessLoop();
  void CheckLivenessLocked(absl::Time now) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  Job* FindJobLocked(absl::string_view job_id) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void StartNewEpochLocked(Job& job) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void CompleteRendezvousLocked(Job& job) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void RemoveFormingMemberLocked(Job& job, int rank, const std::string& why)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void AbortLocked(Job& job, int rank, const std::string& reason,
                   JobRegistryObserver::AbortCause cause) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Sets job.state and tells the observer.
  void SetStateLocked(Job& job, v1::JobState state) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  JobRegistryObserver& observer() const;
  // Deletes the job if its rendezvous completed and no member is alive and
  // still in it. Returns true if it was deleted (`job` is then dangling).
  bool MaybeDeleteLocked(Job& job) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void EmitLocked(Job& job, v1::JobEvent::Kind kind, int rank, const std::string& message)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  v1::JobStatus StatusLocked(const Job& job, absl::Time now) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  std::string DescribeTimeoutLocked(const Job& job, int64_t waited_ms) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const Options options_;

  mutable absl::Mutex mu_;
  // Signalled when a rendezvous completes, a forming member is removed, or on
  // shutdown. Waiters also wake on their own deadline and to poll cancellation.
  absl::CondVar changed_;
  std::map<std::string, std::unique_ptr<Job>, std::less<>> jobs_ ABSL_GUARDED_BY(mu_);
  bool shutdown_ ABSL_GUARDED_BY(mu_) = false;
  uint64_t next_member_serial_ ABSL_GUARDED_BY(mu_) = 1;
  std::map<uint64_t, PendingJoin> pending_joins_ ABSL_GUARDED_BY(mu_);
  // pending_joins_ per job namespace ("" for jobs without one).
  std::map<std::string, int, std::less<>> pending_per_namespace_ ABSL_GUARDED_BY(mu_);
  // Why recently deleted jobs ended (DeleteJob), for the NOT_FOUND their
  // members get; the oldest are forgotten beyond kMaxRememberedDeletions.
  std::map<std::string, std::string, std::less<>> deleted_ ABSL_GUARDED_BY(mu_);
  std::deque<std::string> deleted_order_ ABSL_GUARDED_BY(mu_);
  // NOT_FOUND for `job_id`, with why it was deleted when known.
  absl::Status NotFoundLocked(absl::string_view job_id) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  uint64_t next_join_id_ ABSL_GUARDED_BY(mu_) = 1;

  std::thread liveness_thread_;
  std::thread join_thread_;
};

}  // namespace gradsync

#endif  // GRADSYNC_SERVER_JOB_REGISTRY_H_
