// The job registry after the rendezvous: heartbeats, leaving, liveness and
// the read-only queries (the state: server/job_registry_state.h).
#include <algorithm>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/logging.h"
#include "server/job_registry.h"
#include "server/job_registry_state.h"

namespace gradsync {
using registry_internal::DescribeMember;
using registry_internal::MemberState;
using registry_internal::Seconds;

// ---------------------------------------------------------------------------
// Heartbeat, LeaveJob, death detection

absl::StatusOr<v1::HeartbeatResponse> JobRegistry::Heartbeat(const v1::HeartbeatRequest& request) {
  observer().OnHeartbeat();
  absl::MutexLock lock(&mu_);
  if (shutdown_) return absl::UnavailableError("coordinator is shutting down");
  Job* job = FindJobLocked(request.job_id());
  if (job == nullptr) {
    return NotFoundLocked(request.job_id());
  }
  if (request.epoch() == job->epoch) {
    bool wrong_key = false;
    MemberState* m =
        job->FindMemberWithKey(request.member_id(), request.rank(), request.member_key(), &wrong_key);
    if (wrong_key) {
      return absl::PermissionDeniedError(absl::StrCat(
          "heartbeat for rank ", request.rank(), " of job '", job->id, "' epoch ", job->epoch,
          " does not carry that member's key"));
    }
    if (m != nullptr && m->alive && !m->left) m->last_heartbeat = Now();
  }
  v1::HeartbeatResponse response;
  response.set_state(job->state);
  response.set_epoch(job->epoch);
  response.set_abort_reason(job->abort_reason);
  for (int r : job->dead_ranks) response.add_dead_ranks(r);
  return response;
}

void JobRegistry::AbortLocked(Job& job, int rank, const std::string& reason,
                              JobRegistryObserver::AbortCause cause) {
  SetStateLocked(job, v1::JOB_STATE_ABORTED);
  observer().OnEpochAborted(cause);
  job.abort_reason = reason;
  GS_LOG(WARNING) << "job '" << job.id << "' epoch " << job.epoch << " aborted: " << reason;
  EmitLocked(job, v1::JobEvent::KIND_EPOCH_ABORTED, rank, reason);
}

bool JobRegistry::MaybeDeleteLocked(Job& job) {
  if (job.state == v1::JOB_STATE_FORMING) return false;
  for (const auto& m : job.members) {
    if (m.has_value() && m->alive && !m->left) return false;
  }
  const std::string message =
      absl::StrCat("job '", job.id, "' deleted: no member of epoch ", job.epoch, " is left");
  GS_LOG(INFO) << message;
  EmitLocked(job, v1::JobEvent::KIND_JOB_DELETED, -1, message);
  observer().OnJobStateChanged(job.state, v1::JOB_STATE_UNSPECIFIED);
  observer().OnJobRemoved(job.id);
  jobs_.erase(jobs_.find(job.id));
  return true;
}

absl::Status JobRegistry::NotFoundLocked(absl::string_view job_id) const {
  if (auto it = deleted_.find(job_id); it != deleted_.end()) {
    return absl::NotFoundError(absl::StrCat("job '", job_id, "' was ", it->second));
  }
  return absl::NotFoundError(absl::StrCat("job '", job_id, "' does not exist"));
}

absl::StatusOr<v1::DeleteJobResponse> JobRegistry::DeleteJob(absl::string_view job_id,
                                                             const std::string& why) {
  absl::MutexLock lock(&mu_);
  if (shutdown_) return absl::UnavailableError("coordinator is shutting down");
  Job* job = FindJobLocked(job_id);
  if (job == nullptr) return NotFoundLocked(job_id);
  v1::DeleteJobResponse response;
  response.set_epoch(job->epoch);
  int alive = 0;
  for (const auto& m : job->members) {
    if (!m.has_value()) continue;
    response.set_members(response.members() + 1);
    if (m->alive && !m->left) ++alive;
  }
  if (alive > 0) observer().OnAliveMembersChanged(-alive);
  const std::string id = job->id;
  const std::string message = absl::StrCat("job '", id, "' epoch ", job->epoch, " was ", why);
  GS_LOG(WARNING) << message;
  EmitLocked(*job, v1::JobEvent::KIND_JOB_DELETED, -1, message);
  observer().OnJobStateChanged(job->state, v1::JOB_STATE_UNSPECIFIED);
  observer().OnJobRemoved(id);
  jobs_.erase(jobs_.find(id));
  if (deleted_.insert_or_assign(id, why).second) deleted_order_.push_back(id);
  while (deleted_order_.size() > kMaxRememberedDeletions) {
    deleted_.erase(deleted_order_.front());
    deleted_order_.pop_front();
  }
  changed_.SignalAll();  // waiting joins end (JoinLoop)
  return response;
}

absl::Status JobRegistry::LeaveJob(const v1::LeaveJobRequest& request) {
  absl::MutexLock lock(&mu_);
  if (shutdown_) return absl::UnavailableError("coordinator is shutting down");
  Job* job = FindJobLocked(request.job_id());
  if (job == nullptr || request.epoch() != job->epoch) return absl::OkStatus();
  bool wrong_key = false;
  MemberState* m =
      job->FindMemberWithKey(request.member_id(), request.rank(), request.member_key(), &wrong_key);
  if (wrong_key) {
    return absl::PermissionDeniedError(absl::StrCat("leave of rank ", request.rank(), " of job '",
                                                    job->id, "' epoch ", job->epoch,
                                                    " does not carry that member's key"));
  }
  if (m == nullptr || m->left || !m->alive) return absl::OkStatus();
  const int rank = job->RankOf(m);
  if (job->state == v1::JOB_STATE_FORMING) {
    RemoveFormingMemberLocked(*job, rank, "left before the rendezvous completed");
    return absl::OkStatus();
  }
  m->left = true;
  observer().OnAliveMembersChanged(-1);
  const std::string message = absl::StrCat(DescribeMember(rank, m->member_id, nullptr), " left the job");
  GS_LOG(INFO) << "job '" << job->id << "' epoch " << job->epoch << ": " << message;
  EmitLocked(*job, v1::JobEvent::KIND_MEMBER_LEFT, rank, message);
  if (job->state == v1::JOB_STATE_RUNNING) {
    AbortLocked(*job, rank, message, JobRegistryObserver::AbortCause::kMemberLeft);
  }
  MaybeDeleteLocked(*job);
  return absl::OkStatus();
}

void JobRegistry::CheckLiveness() {
  absl::MutexLock lock(&mu_);
  if (shutdown_) return;
  CheckLivenessLocked(Now());
}

void JobRegistry::CheckLivenessLocked(absl::Time now) {
  for (auto it = jobs_.begin(); it != jobs_.end();) {
    Job& job = *(it++)->second;  // advance first: `job` may be deleted below
    if (job.state == v1::JOB_STATE_FORMING) {
      // A first rendezvous nobody waits in any more: free the id (a later
      // CreateJob may use it with another world size).
      if (job.epoch == 1 && job.JoinedCount() == 0 &&
          now - job.idle_since > options_.forming_job_timeout) {
        const std::string message = absl::StrCat(
            "job '", job.id, "' deleted: its rendezvous never completed and no member has "
            "waited in it for ", absl::FormatDuration(now - job.idle_since));
        GS_LOG(INFO) << message;
        EmitLocked(job, v1::JobEvent::KIND_JOB_DELETED, -1, message);
        observer().OnJobStateChanged(job.state, v1::JOB_STATE_UNSPECIFIED);
        observer().OnJobRemoved(job.id);
        jobs_.erase(jobs_.find(job.id));
      }
      continue;
    }
    const int64_t timeout_ms = job.options.heartbeat_timeout_ms();
    bool someone_died = false;
    for (int rank = 0; rank < job.world_size; ++rank) {
      if (!job.members[rank].has_value()) continue;
      MemberState& m = *job.members[rank];
      if (!m.alive || m.left) continue;
      const int64_t age_ms = absl::ToInt64Milliseconds(now - m.last_heartbeat);
      if (age_ms <= timeout_ms) continue;
      m.alive = false;
      someone_died = true;
      observer().OnAliveMembersChanged(-1);
      observer().OnMemberDead();
      job.dead_ranks.push_back(rank);
      const std::string reason =
          absl::StrCat(DescribeMember(rank, m.member_id, nullptr), " missed heartbeats for ",
                       Seconds(age_ms), " (timeout ", Seconds(timeout_ms), ")");
      GS_LOG(WARNING) << "job '" << job.id << "' epoch " << job.epoch << ": " << reason;
      EmitLocked(job, v1::JobEvent::KIND_MEMBER_DEAD, rank, reason);
      if (job.state == v1::JOB_STATE_RUNNING) {
        AbortLocked(job, rank, reason, JobRegistryObserver::AbortCause::kMemberDead);
        observer().OnEpochFailed(job.id, job.epoch);
      }
    }
    if (someone_died) MaybeDeleteLocked(job);
  }
}

void JobRegistry::LivenessLoop() {
  absl::MutexLock lock(&mu_);
  while (!shutdown_) {
    changed_.WaitWithTimeout(&mu_, options_.liveness_interval);
    if (shutdown_) break;
    CheckLivenessLocked(Now());
  }
}

// ---------------------------------------------------------------------------
// Status and watches

absl::StatusOr<v1::JobStatus> JobRegistry::GetJobStatus(absl::string_view job_id) {
  if (job_id.empty()) return absl::InvalidArgumentError("job id must not be empty");
  absl::MutexLock lock(&mu_);
  Job* job = FindJobLocked(job_id);
  if (job == nullptr) return NotFoundLocked(job_id);
  return StatusLocked(*job, Now());
}

v1::ListJobsResponse JobRegistry::ListJobs() {
  absl::MutexLock lock(&mu_);
  v1::ListJobsResponse response;
  const absl::Time now = Now();
  for (const auto& [id, job] : jobs_) *response.add_jobs() = StatusLocked(*job, now);
  return response;
}

absl::StatusOr<std::unique_ptr<JobWatch>> JobRegistry::WatchJob(absl::string_view job_id) {
  if (job_id.empty()) return absl::InvalidArgumentError("job id must not be empty");
  absl::MutexLock lock(&mu_);
  if (shutdown_) return absl::UnavailableError("coordinator is shutting down");
  Job* job = FindJobLocked(job_id);
  if (job == nullptr) return NotFoundLocked(job_id);
  auto queue = std::make_shared<JobWatch::Queue>();
  const absl::Time now = Now();
  auto snapshot = std::make_shared<v1::JobEvent>();
  snapshot->set_kind(v1::JobEvent::KIND_SNAPSHOT);
  snapshot->set_job_id(job->id);
  snapshot->set_epoch(job->epoch);
  snapshot->set_rank(-1);
  snapshot->set_message(job->abort_reason);
  *snapshot->mutable_status() = StatusLocked(*job, now);
  snapshot->set_unix_time_ms(absl::ToUnixMillis(now));
  queue->Push(std::move(snapshot));
  job->watchers.push_back(queue);
  return std::make_unique<JobWatch>(std::move(queue));
}

}  // namespace gradsync

