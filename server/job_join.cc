// JobRegistry's rendezvous: a join registers its member at once and, when
// the epoch still forms, waits as an entry in pending_joins_, not as a
// blocked thread. One thread (JoinLoop) answers every pending join when its
// rendezvous completes, fails or times out, when it is cancelled, or when the
// registry shuts down.
#include <algorithm>
#include <utility>
#include <vector>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "common/logging.h"
#include "common/status_macros.h"
#include "server/job_registry.h"
#include "server/job_registry_state.h"

namespace gradsync {
using registry_internal::DescribeMember;
using registry_internal::FormatEndpoint;
using registry_internal::MemberState;
using registry_internal::Rendezvous;

namespace {

// How often a synchronous JoinJob checks its caller's cancellation.
constexpr absl::Duration kCancelPollInterval = absl::Milliseconds(50);

JobRegistryObserver::JoinResult ToJoinResult(const absl::Status& s) {
  if (s.ok()) return JobRegistryObserver::JoinResult::kOk;
  if (absl::IsDeadlineExceeded(s)) return JobRegistryObserver::JoinResult::kTimeout;
  return JobRegistryObserver::JoinResult::kError;
}

// A join for a member that exists is a retry only with the key it joined
// with: member ids are public (status, events), keys are not.
absl::Status CheckRetryKey(const std::string& job_id, int64_t epoch, const MemberState& m,
                           const v1::JoinJobRequest& request) {
  if (registry_internal::KeysEqual(m.key, request.member_key())) return absl::OkStatus();
  return absl::PermissionDeniedError(absl::StrCat(
      "member '", m.member_id, "' of job '", job_id, "' epoch ", epoch,
      " joined with another member key; a retried join must come from the daemon that joined it"));
}

absl::Status ValidateJoin(const v1::JoinJobRequest& request) {
  const std::string& member_id = request.member_id();
  if (member_id.empty() || member_id.size() > kMaxMemberIdLength) {
    return absl::InvalidArgumentError(
        absl::StrCat("join of job '", request.job_id(), "': member_id must be 1..",
                     kMaxMemberIdLength, " characters (got ", member_id.size(), ")"));
  }
  if (request.member_key().size() < kMinMemberKeyBytes ||
      request.member_key().size() > kMaxMemberKeyBytes) {
    return absl::InvalidArgumentError(absl::StrCat(
        "join of job '", request.job_id(), "' by member '", member_id, "': member_key must be ",
        kMinMemberKeyBytes, "..", kMaxMemberKeyBytes, " bytes (got ", request.member_key().size(),
        ")"));
  }
  const std::string& rdma = request.data_endpoint().rdma();
  if (request.data_endpoint().port() < 0 || request.data_endpoint().port() > 65535 ||
      request.data_endpoint().host().size() > 255 || rdma.size() > 128 ||
      std::any_of(rdma.begin(), rdma.end(), [](char c) { return c < 0x20 || c > 0x7e; })) {
    return absl::InvalidArgumentError(absl::StrCat(
        "join of job '", request.job_id(), "' by member '", member_id, "': bad data endpoint '",
        absl::CHexEscape(FormatEndpoint(request.data_endpoint())), "' (rdma '",
        absl::CHexEscape(rdma.substr(0, 140)), "': at most 128 printable characters)"));
  }
  return absl::OkStatus();
}

}  // namespace


void JobRegistry::FinishJoin(const JoinDone& done,
                             absl::StatusOr<std::shared_ptr<const v1::JoinJobResponse>> result,
                             int rank) {
  observer().OnJoinFinished(ToJoinResult(result.status()));
  if (!result.ok()) return done(result.status());
  // The response is immutable and can be large: copy it without the lock.
  v1::JoinJobResponse response = **result;
  response.set_rank(rank);
  done(std::move(response));
}

uint64_t JobRegistry::StartJoin(const v1::JoinJobRequest& request, absl::Time wait_deadline,
                                JoinDone done, int max_pending_in_namespace) {
  const absl::Time start = absl::Now();
  const int64_t timeout_ms =
      request.timeout_ms() > 0 ? request.timeout_ms() : options_.default_join_timeout_ms;
  PendingJoin p;
  p.deadline = std::min(start + absl::Milliseconds(timeout_ms), wait_deadline);
  p.waited_ms = std::max<int64_t>(0, absl::ToInt64Milliseconds(p.deadline - start));
  if (absl::Status s = ValidateJoin(request); !s.ok()) {
    FinishJoin(done, s, -1);
    return 0;
  }
  absl::ReleasableMutexLock lock(&mu_);
  absl::StatusOr<std::shared_ptr<const v1::JoinJobResponse>> now =
      RegisterJoinLocked(request, &p, max_pending_in_namespace);
  if (!now.ok() || *now != nullptr) {
    lock.Release();
    FinishJoin(done, std::move(now), p.rank);
    return 0;
  }
  const uint64_t id = next_join_id_++;
  p.done = std::move(done);
  ++pending_per_namespace_[std::string(JobNamespace(p.job_id))];
  pending_joins_.emplace(id, std::move(p));
  changed_.SignalAll();  // JoinLoop takes the new deadline into account
  return id;
}

void JobRegistry::CancelJoin(uint64_t id) {
  absl::MutexLock lock(&mu_);
  auto it = pending_joins_.find(id);
  if (it == pending_joins_.end()) return;
  it->second.cancelled = true;
  changed_.SignalAll();
}

absl::StatusOr<v1::JoinJobResponse> JobRegistry::JoinJob(const v1::JoinJobRequest& request,
                                                         const WaitControl& wait) {
  absl::Notification finished;
  absl::StatusOr<v1::JoinJobResponse> result;
  const uint64_t id =
      StartJoin(request, wait.deadline, [&](absl::StatusOr<v1::JoinJobResponse> r) {
        result = std::move(r);
        finished.Notify();
      });
  bool cancelled = false;
  while (!finished.WaitForNotificationWithTimeout(kCancelPollInterval)) {
    if (!cancelled && wait.is_cancelled && wait.is_cancelled()) {
      cancelled = true;
      CancelJoin(id);
    }
  }
  return result;
}

absl::StatusOr<std::shared_ptr<const v1::JoinJobResponse>> JobRegistry::RegisterJoinLocked(
    const v1::JoinJobRequest& request, PendingJoin* p, int max_pending_in_namespace) {
  const std::string& member_id = request.member_id();
  if (shutdown_) return absl::UnavailableError("coordinator is shutting down");
  Job* job = FindJobLocked(request.job_id());
  if (job == nullptr) {
    return NotFoundLocked(request.job_id());
  }
  const int requested = request.requested_rank();
  if (requested < -1 || requested >= job->world_size) {
    return absl::InvalidArgumentError(absl::StrCat(
        "requested rank ", requested, " is out of range for job '", job->id, "' (world size ",
        job->world_size, "; -1 takes any free rank)"));
  }

  if (job->state == v1::JOB_STATE_ABORTED) StartNewEpochLocked(*job);

  if (job->state == v1::JOB_STATE_RUNNING) {
    auto it = job->rank_of.find(member_id);
    if (it == job->rank_of.end()) {
      return absl::FailedPreconditionError(absl::StrCat(
          "job '", job->id, "' epoch ", job->epoch, " is already running with all ",
          job->world_size, " ranks; member '", member_id,
          "' can join only after the epoch is aborted"));
    }
    RETURN_IF_ERROR(CheckRetryKey(job->id, job->epoch, *job->members[it->second], request));
    if (requested >= 0 && requested != it->second) {
      return absl::AlreadyExistsError(absl::StrCat("member '", member_id, "' already holds rank ",
                                                   it->second, " of job '", job->id, "' epoch ",
                                                   job->epoch, " (requested rank ", requested,
                                                   ")"));
    }
    p->rank = it->second;  // idempotent retry
    return job->rendezvous->response;
  }

  // FORMING.
  if (pending_joins_.size() >= kMaxPendingJoins) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "join of job '", job->id, "' by member '", member_id, "': ", pending_joins_.size(),
        " joins already wait for rendezvous on this coordinator (at most ", kMaxPendingJoins,
        ")"));
  }
  const absl::string_view ns = JobNamespace(job->id);
  if (auto it = pending_per_namespace_.find(ns);
      max_pending_in_namespace > 0 && it != pending_per_namespace_.end() &&
      it->second >= max_pending_in_namespace) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "join of job '", job->id, "' by member '", member_id, "': tenant '", ns, "' already has ",
        it->second, " joins waiting for rendezvous (its share: ", max_pending_in_namespace, ")"));
  }
  int rank;
  if (auto it = job->rank_of.find(member_id); it != job->rank_of.end()) {
    rank = it->second;
    RETURN_IF_ERROR(CheckRetryKey(job->id, job->epoch, *job->members[rank], request));
    if (requested >= 0 && requested != rank) {
      return absl::AlreadyExistsError(absl::StrCat("member '", member_id, "' already holds rank ",
                                                   rank, " of job '", job->id, "' epoch ",
                                                   job->epoch, " (requested rank ", requested,
                                                   ")"));
    }
    MemberState& m = *job->members[rank];
    if (m.waiting_joins >= kMaxWaitingJoinsPerMember) {
      return absl::ResourceExhaustedError(absl::StrCat(
          "join of job '", job->id, "' by member '", member_id, "': ", m.waiting_joins,
          " joins of this member already wait (at most ", kMaxWaitingJoinsPerMember, ")"));
    }
    m.endpoint = request.data_endpoint();  // a retry may come from a restarted listener
    m.status_endpoint = request.status_endpoint().substr(0, 300);
    ++m.waiting_joins;
    GS_LOG(DEBUG) << "job '" << job->id << "' epoch " << job->epoch << ": member '" << member_id
                  << "' retries its join (rank " << rank << ")";
  } else {
    if (requested >= 0) {
      if (job->members[requested].has_value()) {
        return absl::AlreadyExistsError(absl::StrCat("rank ", requested, " of job '", job->id,
                                                     "' is already taken by member '",
                                                     job->members[requested]->member_id, "'"));
      }
      rank = requested;
    } else {
      rank = 0;
      while (job->members[rank].has_value()) ++rank;  // FORMING: a free rank exists
    }
    MemberState m;
    m.member_id = member_id;
    m.key = request.member_key();
    m.endpoint = request.data_endpoint();
    m.status_endpoint = request.status_endpoint().substr(0, 300);
    m.last_heartbeat = Now();
    m.waiting_joins = 1;
    m.serial = next_member_serial_++;
    job->members[rank] = std::move(m);
    job->rank_of[member_id] = rank;
    observer().OnAliveMembersChanged(+1);
    const std::string message =
        absl::StrCat(DescribeMember(rank, member_id, &request.data_endpoint()), " joined (",
                     job->JoinedCount(), " of ", job->world_size, ")");
    GS_LOG(DEBUG) << "job '" << job->id << "' epoch " << job->epoch << ": " << message;
    EmitLocked(*job, v1::JobEvent::KIND_MEMBER_JOINED, rank, message);
    if (job->JoinedCount() == job->world_size) CompleteRendezvousLocked(*job);
  }
  p->rank = rank;
  if (job->rendezvous->complete) return job->rendezvous->response;  // this join completed it
  p->job_id = job->id;
  p->member_id = member_id;
  p->serial = job->members[rank]->serial;
  p->rv = job->rendezvous;
  return nullptr;  // wait
}

std::optional<absl::StatusOr<std::shared_ptr<const v1::JoinJobResponse>>>
JobRegistry::JoinOutcomeLocked(PendingJoin& p, absl::Time now) {
  if (p.rv->complete) return p.rv->response;
  if (shutdown_) return absl::UnavailableError("coordinator is shutting down");
  Job* job = FindJobLocked(p.job_id);
  if (job == nullptr) {
    if (auto it = deleted_.find(p.job_id); it != deleted_.end()) {
      return absl::AbortedError(absl::StrCat("job '", p.job_id, "' epoch ", p.rv->epoch, " was ",
                                             it->second, " while member '", p.member_id,
                                             "' waited for the rendezvous"));
    }
  }
  if (job == nullptr || job->rendezvous != p.rv) {  // defensive: cannot happen while FORMING
    return absl::AbortedError(absl::StrCat("job '", p.job_id, "' epoch ", p.rv->epoch,
                                           " ended while member '", p.member_id,
                                           "' waited for the rendezvous"));
  }
  if (!job->members[p.rank].has_value() || job->members[p.rank]->serial != p.serial) {
    return absl::AbortedError(absl::StrCat("member '", p.member_id, "' was removed from job '",
                                           p.job_id, "' epoch ", p.rv->epoch,
                                           " while it waited for the rendezvous"));
  }
  const bool conflict = !p.rv->conflict.ok();
  const bool timed_out = !conflict && now >= p.deadline;
  const bool cancelled = !conflict && !timed_out && p.cancelled;
  if (!conflict && !timed_out && !cancelled) return std::nullopt;
  absl::Status status =
      conflict    ? p.rv->conflict
      : timed_out ? absl::DeadlineExceededError(DescribeTimeoutLocked(*job, p.waited_ms))
                  : absl::CancelledError(absl::StrCat("join of job '", p.job_id, "' by member '",
                                                      p.member_id, "' was cancelled"));
  if (--job->members[p.rank]->waiting_joins <= 0) {
    RemoveFormingMemberLocked(
        *job, p.rank,
        conflict    ? std::string("left: the ranks disagree on the world size")
        : timed_out ? absl::StrCat("gave up after waiting ", p.waited_ms, " ms for the rendezvous")
                    : std::string("cancelled its join"));
  }
  GS_LOG(INFO) << status.message();
  return status;
}

void JobRegistry::JoinLoop() {
  struct Answer {
    JoinDone done;
    absl::StatusOr<std::shared_ptr<const v1::JoinJobResponse>> result;
    int rank;
  };
  absl::MutexLock lock(&mu_);
  while (true) {
    std::vector<Answer> answers;
    const absl::Time now = absl::Now();
    absl::Time next = absl::InfiniteFuture();
    for (auto it = pending_joins_.begin(); it != pending_joins_.end();) {
      auto outcome = JoinOutcomeLocked(it->second, now);
      if (!outcome.has_value()) {
        next = std::min(next, it->second.deadline);
        ++it;
        continue;
      }
      answers.push_back({std::move(it->second.done), *std::move(outcome), it->second.rank});
      if (auto ns = pending_per_namespace_.find(JobNamespace(it->second.job_id));
          ns != pending_per_namespace_.end() && --ns->second <= 0) {
        pending_per_namespace_.erase(ns);
      }
      it = pending_joins_.erase(it);
    }
    if (!answers.empty()) {
      // Answer without the lock (a gRPC reactor finishes its call); then look
      // again: what the answers changed may have ended other joins.
      mu_.Unlock();
      for (Answer& a : answers) FinishJoin(a.done, std::move(a.result), a.rank);
      answers.clear();
      mu_.Lock();
      continue;
    }
    if (shutdown_ && pending_joins_.empty()) return;
    changed_.WaitWithDeadline(&mu_, next);
  }
}

}  // namespace gradsync
