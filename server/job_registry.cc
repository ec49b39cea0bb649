#include "server/job_registry.h"

#include "common/status_macros.h"
#include "server/job_registry_state.h"

#include <sys/random.h>

#include <algorithm>
#include <deque>
#include <optional>
#include <unordered_map>
#include <utility>
#include <vector>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "common/logging.h"

namespace gradsync {
using registry_internal::DescribeMember;
using registry_internal::FormatEndpoint;
using registry_internal::MemberState;
using registry_internal::Rendezvous;
using registry_internal::Seconds;

namespace {

// A job's key: 32 bytes from the kernel's random source.
std::string RandomKey() {
  std::string key(32, '\0');
  size_t got = 0;
  while (got < key.size()) {
    const ssize_t r = ::getrandom(key.data() + got, key.size() - got, 0);
    if (r > 0) got += static_cast<size_t>(r);
  }
  return key;
}


// Rank lists in messages are cut after this many groups / members.
constexpr int kMaxListedRankGroups = 32;
constexpr int kMaxListedMembers = 16;


// Sorted ranks -> "rank 1" / "ranks 1, 3, 5-9".
std::string FormatRanks(const std::vector<int>& ranks) {
  std::vector<std::string> groups;
  int skipped = 0;
  for (size_t i = 0; i < ranks.size();) {
    size_t j = i;
    while (j + 1 < ranks.size() && ranks[j + 1] == ranks[j] + 1) ++j;
    const size_t len = j - i + 1;
    if (static_cast<int>(groups.size()) >= kMaxListedRankGroups) {
      skipped += static_cast<int>(len);
    } else if (len >= 3) {
      groups.push_back(absl::StrCat(ranks[i], "-", ranks[j]));
    } else {
      for (size_t k = i; k <= j; ++k) groups.push_back(absl::StrCat(ranks[k]));
    }
    i = j + 1;
  }
  std::string s = absl::StrCat(ranks.size() == 1 ? "rank " : "ranks ", absl::StrJoin(groups, ", "));
  if (skipped > 0) absl::StrAppend(&s, " and ", skipped, " more");
  return s;
}


// Used when Options::observer is null.
JobRegistryObserver& NoopObserver() {
  static JobRegistryObserver* const noop = new JobRegistryObserver();
  return *noop;
}


}  // namespace

// ---------------------------------------------------------------------------
// JobWatch


JobWatch::JobWatch(std::shared_ptr<Queue> queue) : queue_(std::move(queue)) {}
// The registry holds only a weak_ptr and prunes it on its next event.
JobWatch::~JobWatch() = default;

absl::StatusOr<v1::JobEvent> JobWatch::Next(absl::Duration timeout) {
  const absl::Time deadline = absl::Now() + timeout;
  absl::MutexLock lock(&queue_->mu);
  while (queue_->events.empty() && !queue_->closed) {
    if (queue_->cv.WaitWithDeadline(&queue_->mu, deadline) && queue_->events.empty() &&
        !queue_->closed) {
      return absl::DeadlineExceededError("no event yet");
    }
  }
  if (!queue_->events.empty()) {
    std::shared_ptr<const v1::JobEvent> event = std::move(queue_->events.front());
    queue_->events.pop_front();
    return *event;
  }
  return queue_->end;
}

// ---------------------------------------------------------------------------
// JobRegistry state



JobRegistry::JobRegistry(Options options) : options_(std::move(options)) {
  if (options_.start_liveness_thread) {
    liveness_thread_ = std::thread([this] { LivenessLoop(); });
  }
  join_thread_ = std::thread([this] { JoinLoop(); });
}

JobRegistry::~JobRegistry() {
  Shutdown();
  if (liveness_thread_.joinable()) liveness_thread_.join();
  join_thread_.join();  // it ends once every pending join was answered
}

absl::Time JobRegistry::Now() const { return options_.now ? options_.now() : absl::Now(); }

JobRegistryObserver& JobRegistry::observer() const {
  return options_.observer != nullptr ? *options_.observer : NoopObserver();
}

void JobRegistry::SetStateLocked(Job& job, v1::JobState state) {
  if (job.state == state) return;
  observer().OnJobStateChanged(job.state, state);
  job.state = state;
}

absl::StatusOr<JobRegistry::JobSecret> JobRegistry::JobKey(const std::string& job_id) {
  absl::MutexLock lock(&mu_);
  Job* job = FindJobLocked(job_id);
  if (job == nullptr) return NotFoundLocked(job_id);
  return JobSecret{job->key, job->options.data_tls()};
}

size_t JobRegistry::JobCount() {
  absl::MutexLock lock(&mu_);
  return jobs_.size();
}

JobRegistry::Job* JobRegistry::FindJobLocked(absl::string_view job_id) {
  auto it = jobs_.find(job_id);
  return it == jobs_.end() ? nullptr : it->second.get();
}

void JobRegistry::Shutdown() {
  absl::MutexLock lock(&mu_);
  if (shutdown_) return;
  shutdown_ = true;
  for (auto& [id, job] : jobs_) {
    for (auto& weak : job->watchers) {
      if (auto q = weak.lock()) q->Close(absl::UnavailableError("coordinator is shutting down"));
    }
    job->watchers.clear();
  }
  changed_.SignalAll();
}

// ---------------------------------------------------------------------------
// Events and status

v1::JobStatus JobRegistry::StatusLocked(const Job& job, absl::Time now) const {
  v1::JobStatus status;
  status.set_job_id(job.id);
  status.set_world_size(job.world_size);
  status.set_epoch(job.epoch);
  status.set_state(job.state);
  status.set_abort_reason(job.abort_reason);
  *status.mutable_options() = job.options;
  for (int rank = 0; rank < job.world_size; ++rank) {
    if (!job.members[rank].has_value()) continue;
    const MemberState& m = *job.members[rank];
    v1::Member* out = status.add_members();
    out->set_rank(rank);
    out->set_member_id(m.member_id);
    *out->mutable_data_endpoint() = m.endpoint;
    out->set_status_endpoint(m.status_endpoint);
    const int64_t age_ms = std::max<int64_t>(0, absl::ToInt64Milliseconds(now - m.last_heartbeat));
    // Alive only while its heartbeats are on time: a member past the timeout
    // is dead even before the next liveness sweep says so (forming jobs'
    // members wait in the rendezvous and are not judged).
    const bool judged = job.state == v1::JOB_STATE_RUNNING || job.state == v1::JOB_STATE_ABORTED;
    out->set_alive(m.alive && !m.left &&
                   (!judged || age_ms <= job.options.heartbeat_timeout_ms()));
    out->set_last_heartbeat_age_ms(age_ms);
  }
  return status;
}

void JobRegistry::EmitLocked(Job& job, v1::JobEvent::Kind kind, int rank,
                             const std::string& message) {
  GS_LOG(DEBUG) << "job '" << job.id << "' epoch " << job.epoch << ": "
                << v1::JobEvent::Kind_Name(kind) << " rank " << rank << ": " << message;
  std::vector<std::shared_ptr<JobWatch::Queue>> live;
  for (auto& weak : job.watchers) {
    if (auto q = weak.lock()) live.push_back(std::move(q));
  }
  job.watchers.clear();
  if (live.empty()) return;  // nobody listens: skip building the status
  const absl::Time now = Now();
  auto event = std::make_shared<v1::JobEvent>();
  event->set_kind(kind);
  event->set_job_id(job.id);
  event->set_epoch(job.epoch);
  event->set_rank(rank);
  event->set_message(message);
  *event->mutable_status() = StatusLocked(job, now);
  event->set_unix_time_ms(absl::ToUnixMillis(now));
  std::shared_ptr<const v1::JobEvent> shared = std::move(event);
  for (auto& q : live) {
    q->Push(shared);
    if (kind == v1::JobEvent::KIND_JOB_DELETED) {
      q->Close(absl::OutOfRangeError(absl::StrCat("job '", job.id, "' was deleted")));
    } else {
      job.watchers.push_back(q);
    }
  }
}

// ---------------------------------------------------------------------------
// CreateJob

absl::StatusOr<v1::CreateJobResponse> JobRegistry::CreateJob(const v1::CreateJobRequest& request,
                                                             const NamespaceLimits& limits) {
  if (absl::Status s = ValidateJobId(request.job_id()); !s.ok()) return s;
  if (request.world_size() < 1 || request.world_size() > kMaxWorldSize) {
    return absl::InvalidArgumentError(absl::StrCat("world size ", request.world_size(),
                                                   " of job '", request.job_id(),
                                                   "' is out of range (1..", kMaxWorldSize, ")"));
  }
  v1::JobOptions options = request.options();
  if (options.heartbeat_timeout_ms() < 0 || options.op_timeout_ms() < 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "job '", request.job_id(), "': heartbeat_timeout_ms (", options.heartbeat_timeout_ms(),
        ") and op_timeout_ms (", options.op_timeout_ms(), ") must not be negative (0: default)"));
  }
  if (absl::Status s = ValidateJobOptions(request.job_id(), options); !s.ok()) return s;
  if (options.heartbeat_timeout_ms() == 0) {
    options.set_heartbeat_timeout_ms(options_.default_heartbeat_timeout_ms);
  }
  if (options.op_timeout_ms() == 0) options.set_op_timeout_ms(options_.default_op_timeout_ms);

  absl::MutexLock lock(&mu_);
  if (shutdown_) return absl::UnavailableError("coordinator is shutting down");
  v1::CreateJobResponse response;
  if (Job* job = FindJobLocked(request.job_id())) {
    if (job->world_size != request.world_size()) {
      if (job->state == v1::JOB_STATE_FORMING && job->JoinedCount() > 0) {
        // The ranks already waiting would wait out their deadline for a
        // rendezvous that cannot complete: they fail now, as this caller does.
        job->rendezvous->conflict = absl::FailedPreconditionError(absl::StrCat(
            "job '", job->id, "': another rank asked for world size ", request.world_size(),
            " while this job was created with world size ", job->world_size,
            "; every rank must pass the same world size"));
        changed_.SignalAll();
      }
      return absl::AlreadyExistsError(absl::StrCat(
          "job '", job->id, "' already exists with world size ", job->world_size,
          "; requested world size ", request.world_size()));
    }
    response.set_created(false);
    *response.mutable_options() = job->options;
    return response;
  }
  if (jobs_.size() >= kMaxJobs) {
    return absl::ResourceExhaustedError(
        absl::StrCat("cannot create job '", request.job_id(), "': ", kMaxJobs, " jobs exist"));
  }
  // What the namespace (and everyone) holds now.
  const absl::string_view ns = JobNamespace(request.job_id());
  int jobs = 0, forming = 0;
  int64_t forming_ranks = 0, all_forming_ranks = 0;
  for (const auto& [id, other] : jobs_) {
    const bool is_forming = other->state == v1::JOB_STATE_FORMING;
    if (is_forming) all_forming_ranks += other->world_size;
    if (JobNamespace(id) != ns) continue;
    ++jobs;
    if (is_forming) {
      ++forming;
      forming_ranks += other->world_size;
    }
  }
  auto refuse = [&](absl::string_view why) {
    return absl::ResourceExhaustedError(
        absl::StrCat("cannot create job '", request.job_id(), "': ", why));
  };
  const std::string tenant = absl::StrCat("tenant '", ns, "'");
  if (limits.max_jobs > 0 && jobs >= limits.max_jobs) {
    return refuse(absl::StrCat(tenant, " already has ", jobs, " jobs (its share: ",
                               limits.max_jobs, ")"));
  }
  if (limits.max_forming_jobs > 0 && forming >= limits.max_forming_jobs) {
    return refuse(absl::StrCat(tenant, " already has ", forming,
                               " forming jobs (its limit, max_forming_jobs in the tenants file); "
                               "they expire after the forming-job timeout"));
  }
  if (limits.max_forming_ranks > 0 &&
      forming_ranks + request.world_size() > limits.max_forming_ranks) {
    return refuse(absl::StrCat(tenant, "'s forming jobs already have ", forming_ranks,
                               " ranks; with ", request.world_size(), " more it would exceed its "
                               "share of ", limits.max_forming_ranks));
  }
  if (all_forming_ranks + request.world_size() > kMaxFormingRanks) {
    return refuse(absl::StrCat("forming jobs already have ", all_forming_ranks,
                               " ranks on this coordinator (at most ", kMaxFormingRanks, ")"));
  }
  auto job = std::make_unique<Job>();
  job->id = request.job_id();
  job->key = RandomKey();
  job->world_size = request.world_size();
  job->options = options;
  job->idle_since = Now();
  job->members.resize(job->world_size);
  job->rendezvous = std::make_shared<Rendezvous>(job->epoch);
  GS_LOG(INFO) << "created job '" << job->id << "' (world size " << job->world_size
               << ", heartbeat timeout " << options.heartbeat_timeout_ms() << " ms, op timeout "
               << options.op_timeout_ms() << " ms)";
  observer().OnJobStateChanged(v1::JOB_STATE_UNSPECIFIED, job->state);
  deleted_.erase(job->id);  // a new job of that id: its members are not the deleted one's
  jobs_.emplace(job->id, std::move(job));
  response.set_created(true);
  *response.mutable_options() = options;
  return response;
}

// ---------------------------------------------------------------------------
// JoinJob

void JobRegistry::StartNewEpochLocked(Job& job) {
  GS_LOG(INFO) << "job '" << job.id << "': epoch " << job.epoch << " was aborted ("
               << job.abort_reason << "); forming epoch " << job.epoch + 1;
  int alive = 0;
  for (const auto& m : job.members) {
    if (m.has_value() && m->alive && !m->left) ++alive;
  }
  if (alive > 0) observer().OnAliveMembersChanged(-alive);
  ++job.epoch;
  SetStateLocked(job, v1::JOB_STATE_FORMING);
  job.members.assign(job.world_size, std::nullopt);
  job.rank_of.clear();
  job.abort_reason.clear();
  job.dead_ranks.clear();
  job.rendezvous = std::make_shared<Rendezvous>(job.epoch);
}

void JobRegistry::CompleteRendezvousLocked(Job& job) {
  const absl::Time now = Now();
  auto response = std::make_shared<v1::JoinJobResponse>();
  response->set_world_size(job.world_size);
  response->set_epoch(job.epoch);
  response->set_job_key(job.key);
  *response->mutable_options() = job.options;
  for (int rank = 0; rank < job.world_size; ++rank) {
    MemberState& m = *job.members[rank];
    m.last_heartbeat = now;  // the liveness clock starts at the rendezvous
    m.alive = true;
    m.waiting_joins = 0;
    v1::Member* out = response->add_members();
    out->set_rank(rank);
    out->set_member_id(m.member_id);
    *out->mutable_data_endpoint() = m.endpoint;
    out->set_status_endpoint(m.status_endpoint);
    out->set_alive(true);
  }
  SetStateLocked(job, v1::JOB_STATE_RUNNING);
  job.rendezvous->response = std::move(response);
  job.rendezvous->complete = true;
  GS_LOG(INFO) << "job '" << job.id << "' epoch " << job.epoch << ": all " << job.world_size
               << " ranks joined; running";
  EmitLocked(job, v1::JobEvent::KIND_JOB_RUNNING, -1,
             absl::StrCat("all ", job.world_size, " ranks joined epoch ", job.epoch));
  changed_.SignalAll();
}

void JobRegistry::RemoveFormingMemberLocked(Job& job, int rank, const std::string& why) {
  MemberState& m = *job.members[rank];
  const std::string message = absl::StrCat(DescribeMember(rank, m.member_id, nullptr), " ", why);
  GS_LOG(INFO) << "job '" << job.id << "' epoch " << job.epoch << ": " << message;
  job.rank_of.erase(m.member_id);
  job.members[rank].reset();
  observer().OnAliveMembersChanged(-1);
  EmitLocked(job, v1::JobEvent::KIND_MEMBER_LEFT, rank, message);
  if (job.JoinedCount() == 0) {
    job.idle_since = Now();
    job.rendezvous->conflict = absl::OkStatus();  // nobody waits for it any more
  }
  changed_.SignalAll();  // wakes this member's other JoinJob calls, if any
}

std::string JobRegistry::DescribeTimeoutLocked(const Job& job, int64_t waited_ms) const {
  std::vector<int> missing;
  std::vector<std::string> joined;
  int joined_total = 0;
  for (int rank = 0; rank < job.world_size; ++rank) {
    if (!job.members[rank].has_value()) {
      missing.push_back(rank);
      continue;
    }
    if (++joined_total <= kMaxListedMembers) {
      const MemberState& m = *job.members[rank];
      joined.push_back(DescribeMember(rank, m.member_id, &m.endpoint));
    }
  }
  std::string s = absl::StrCat("job '", job.id, "' epoch ", job.epoch,
                               ": rendezvous timed out after ", waited_ms, " ms: ",
                               missing.size(), " of ", job.world_size, " ranks missing (",
                               FormatRanks(missing), "); joined: ", absl::StrJoin(joined, ", "));
  if (joined_total > kMaxListedMembers) {
    absl::StrAppend(&s, " and ", joined_total - kMaxListedMembers, " more");
  }
  return s;
}

}  // namespace gradsync
