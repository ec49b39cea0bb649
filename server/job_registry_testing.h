// The fixture of the JobRegistry tests: a registry on a manually advanced
// clock (no liveness thread; tests call CheckLiveness), an observer keeping
// the totals a metrics implementation would, and request helpers.
#ifndef GRADSYNC_SERVER_JOB_REGISTRY_TESTING_H_
#define GRADSYNC_SERVER_JOB_REGISTRY_TESTING_H_

#include <map>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "server/job_registry.h"

namespace gradsync::job_registry_testing {

using v1::JobEvent;

// Manually advanced clock for heartbeat ages and death detection.
class FakeClock {
 public:
  absl::Time Now() {
    absl::MutexLock lock(&mu_);
    return now_;
  }
  void Advance(absl::Duration d) {
    absl::MutexLock lock(&mu_);
    now_ += d;
  }

 private:
  absl::Mutex mu_;
  absl::Time now_ = absl::FromUnixSeconds(1700000000);
};

// Keeps the totals a metrics implementation would keep.
class CountingObserver : public JobRegistryObserver {
 public:
  void OnJobStateChanged(v1::JobState from, v1::JobState to) override {
    absl::MutexLock lock(&mu_);
    --jobs_[from];
    ++jobs_[to];
  }
  void OnAliveMembersChanged(int delta) override {
    absl::MutexLock lock(&mu_);
    alive_ += delta;
  }
  void OnJoinFinished(JoinResult result) override {
    absl::MutexLock lock(&mu_);
    ++joins_[static_cast<int>(result)];
  }
  void OnHeartbeat() override {
    absl::MutexLock lock(&mu_);
    ++heartbeats_;
  }
  void OnMemberDead() override {
    absl::MutexLock lock(&mu_);
    ++dead_;
  }
  void OnEpochAborted(AbortCause cause) override {
    absl::MutexLock lock(&mu_);
    ++aborts_[static_cast<int>(cause)];
  }

  int jobs(v1::JobState state) {
    absl::MutexLock lock(&mu_);
    return jobs_[state];
  }
  int alive() {
    absl::MutexLock lock(&mu_);
    return alive_;
  }
  int joins(JoinResult r) {
    absl::MutexLock lock(&mu_);
    return joins_[static_cast<int>(r)];
  }
  int heartbeats() {
    absl::MutexLock lock(&mu_);
    return heartbeats_;
  }
  int dead() {
    absl::MutexLock lock(&mu_);
    return dead_;
  }
  int aborts(AbortCause c) {
    absl::MutexLock lock(&mu_);
    return aborts_[static_cast<int>(c)];
  }

 private:
  absl::Mutex mu_;
  std::map<v1::JobState, int> jobs_ ABSL_GUARDED_BY(mu_);
  int alive_ ABSL_GUARDED_BY(mu_) = 0;
  int joins_[3] ABSL_GUARDED_BY(mu_) = {};
  int heartbeats_ ABSL_GUARDED_BY(mu_) = 0;
  int dead_ ABSL_GUARDED_BY(mu_) = 0;
  int aborts_[2] ABSL_GUARDED_BY(mu_) = {};
};


// The member key a test gives `member` (16..64 bytes, derived from its id).
inline std::string MemberKey(const std::string& member) {
  return absl::StrCat("test-member-key:", member).substr(0, 64);
}

// Requests as a daemon sends them for `member`, with its key.
inline v1::JoinJobRequest JoinRequest(const std::string& job, const std::string& member, int rank,
                                      int port, int64_t timeout_ms = 5000) {
  v1::JoinJobRequest req;
  req.set_job_id(job);
  req.set_member_id(member);
  req.set_member_key(MemberKey(member));
  req.set_requested_rank(rank);
  req.mutable_data_endpoint()->set_host("127.0.0.1");
  req.mutable_data_endpoint()->set_port(port);
  req.set_timeout_ms(timeout_ms);
  return req;
}

inline v1::HeartbeatRequest HeartbeatRequest(const std::string& job, int rank, int64_t epoch,
                                             const std::string& member) {
  v1::HeartbeatRequest req;
  req.set_job_id(job);
  req.set_rank(rank);
  req.set_epoch(epoch);
  req.set_member_id(member);
  req.set_member_key(MemberKey(member));
  return req;
}

inline v1::LeaveJobRequest LeaveRequest(const std::string& job, int rank, int64_t epoch,
                                        const std::string& member) {
  v1::LeaveJobRequest req;
  req.set_job_id(job);
  req.set_rank(rank);
  req.set_epoch(epoch);
  req.set_member_id(member);
  req.set_member_key(MemberKey(member));
  return req;
}

class JobRegistryTest : public ::testing::Test {
 protected:
  JobRegistryTest() : registry_(MakeOptions(&clock_, &observer_)) {}

  static JobRegistry::Options MakeOptions(FakeClock* clock, JobRegistryObserver* observer) {
    JobRegistry::Options o;
    o.start_liveness_thread = false;  // tests call CheckLiveness() themselves
    o.now = [clock] { return clock->Now(); };
    o.observer = observer;
    return o;
  }

  // After every test: the observer's running totals agree with a recount of
  // the registry's state (jobs by state, alive members).
  void TearDown() override {
    std::map<v1::JobState, int> jobs;
    int alive = 0;
    const v1::ListJobsResponse all = registry_.ListJobs();
    for (const v1::JobStatus& job : all.jobs()) {
      ++jobs[job.state()];
      for (const v1::Member& m : job.members()) alive += m.alive() ? 1 : 0;
    }
    for (v1::JobState state :
         {v1::JOB_STATE_FORMING, v1::JOB_STATE_RUNNING, v1::JOB_STATE_ABORTED}) {
      EXPECT_EQ(observer_.jobs(state), jobs[state]) << v1::JobState_Name(state);
    }
    EXPECT_EQ(alive, observer_.alive());
    EXPECT_EQ(registry_.JobCount(), static_cast<size_t>(all.jobs_size()));
  }

  void Create(const std::string& id, int world_size, int64_t heartbeat_timeout_ms = 0) {
    v1::CreateJobRequest req;
    req.set_job_id(id);
    req.set_world_size(world_size);
    req.mutable_options()->set_heartbeat_timeout_ms(heartbeat_timeout_ms);
    ASSERT_TRUE(registry_.CreateJob(req).ok());
  }

  absl::StatusOr<v1::JoinJobResponse> Join(const std::string& job, const std::string& member,
                                           int rank, int port, int64_t timeout_ms = 5000) {
    return registry_.JoinJob(JoinRequest(job, member, rank, port, timeout_ms), {});
  }

  // Joins all `members` concurrently (requested rank -1 unless given) and
  // returns their replies in the same order.
  std::vector<absl::StatusOr<v1::JoinJobResponse>> JoinAll(const std::string& job,
                                                           const std::vector<std::string>& members,
                                                           std::vector<int> ranks = {}) {
    std::vector<absl::StatusOr<v1::JoinJobResponse>> out(members.size(),
                                                         absl::UnknownError("not run"));
    std::vector<std::thread> threads;
    for (size_t i = 0; i < members.size(); ++i) {
      const int rank = ranks.empty() ? -1 : ranks[i];
      threads.emplace_back([&, i, rank] {
        out[i] = Join(job, members[i], rank, 5000 + static_cast<int>(i));
      });
    }
    for (auto& t : threads) t.join();
    return out;
  }

  // Waits (real time) until `n` members joined the job's current epoch.
  void AwaitJoined(const std::string& job, int n) {
    const absl::Time deadline = absl::Now() + absl::Seconds(5);
    while (absl::Now() < deadline) {
      auto st = registry_.GetJobStatus(job);
      if (st.ok() && st->members_size() == n) return;
      absl::SleepFor(absl::Milliseconds(2));
    }
    FAIL() << "job " << job << " never reached " << n << " members";
  }

  absl::StatusOr<v1::HeartbeatResponse> Beat(const std::string& job, int rank, int64_t epoch,
                                             const std::string& member) {
    return registry_.Heartbeat(HeartbeatRequest(job, rank, epoch, member));
  }

  absl::Status Leave(const std::string& job, int rank, int64_t epoch, const std::string& member) {
    return registry_.LeaveJob(LeaveRequest(job, rank, epoch, member));
  }

  FakeClock clock_;
  CountingObserver observer_;
  JobRegistry registry_;
};

}  // namespace gradsync::job_registry_testing

#endif  // GRADSYNC_SERVER_JOB_REGISTRY_TESTING_H_
