#include "server/job_registry.h"

#include <atomic>
#include <map>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"

namespace gradsync {
namespace {

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

  static v1::JoinJobRequest JoinRequest(const std::string& job, const std::string& member,
                                        int rank, int port, int64_t timeout_ms = 5000) {
    v1::JoinJobRequest req;
    req.set_job_id(job);
    req.set_member_id(member);
    req.set_requested_rank(rank);
    req.mutable_data_endpoint()->set_host("127.0.0.1");
    req.mutable_data_endpoint()->set_port(port);
    req.set_timeout_ms(timeout_ms);
    return req;
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
    v1::HeartbeatRequest req;
    req.set_job_id(job);
    req.set_rank(rank);
    req.set_epoch(epoch);
    req.set_member_id(member);
    return registry_.Heartbeat(req);
  }

  absl::Status Leave(const std::string& job, int rank, int64_t epoch, const std::string& member) {
    v1::LeaveJobRequest req;
    req.set_job_id(job);
    req.set_rank(rank);
    req.set_epoch(epoch);
    req.set_member_id(member);
    return registry_.LeaveJob(req);
  }

  FakeClock clock_;
  CountingObserver observer_;
  JobRegistry registry_;
};

TEST_F(JobRegistryTest, CreateJobIsIdempotentForSameWorldSize) {
  v1::CreateJobRequest req;
  req.set_job_id("train-1.a_b");
  req.set_world_size(4);
  auto first = registry_.CreateJob(req);
  ASSERT_TRUE(first.ok()) << first.status();
  EXPECT_TRUE(first->created());
  EXPECT_EQ(first->options().heartbeat_timeout_ms(), 3000);
  EXPECT_EQ(first->options().op_timeout_ms(), 60000);

  req.mutable_options()->set_heartbeat_timeout_ms(999);  // ignored: job exists
  auto second = registry_.CreateJob(req);
  ASSERT_TRUE(second.ok()) << second.status();
  EXPECT_FALSE(second->created());
  EXPECT_EQ(second->options().heartbeat_timeout_ms(), 3000);

  req.set_world_size(8);
  auto third = registry_.CreateJob(req);
  EXPECT_EQ(third.status().code(), absl::StatusCode::kAlreadyExists);
  EXPECT_EQ(third.status().message(),
            "job 'train-1.a_b' already exists with world size 4; requested world size 8");
}

TEST_F(JobRegistryTest, CreateJobRejectsBadIdsAndWorldSizes) {
  auto create = [&](const std::string& id, int ws) {
    v1::CreateJobRequest req;
    req.set_job_id(id);
    req.set_world_size(ws);
    return registry_.CreateJob(req).status();
  };
  EXPECT_EQ(create("", 2).message(), "job id must not be empty");
  EXPECT_EQ(create("a b", 2).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(create("a b", 2).message().find("contains ' '"), absl::string_view::npos);
  EXPECT_EQ(create("a/b", 2).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(create(std::string(129, 'x'), 2).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(create(std::string(128, 'x'), 2).ok());
  EXPECT_EQ(create("j", 0).message(), "world size 0 of job 'j' is out of range (1..4096)");
  EXPECT_EQ(create("j", 4097).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(create("j", 4096).ok());
  v1::CreateJobRequest neg;
  neg.set_job_id("n");
  neg.set_world_size(1);
  neg.mutable_options()->set_op_timeout_ms(-1);
  EXPECT_EQ(registry_.CreateJob(neg).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST_F(JobRegistryTest, FourJoinersRendezvousWithDistinctRanksAndEndpoints) {
  Create("j", 4);
  auto replies = JoinAll("j", {"a", "b", "c", "d"});
  std::vector<bool> seen(4, false);
  for (size_t i = 0; i < replies.size(); ++i) {
    ASSERT_TRUE(replies[i].ok()) << replies[i].status();
    const v1::JoinJobResponse& r = *replies[i];
    EXPECT_EQ(r.world_size(), 4);
    EXPECT_EQ(r.epoch(), 1);
    EXPECT_EQ(r.options().heartbeat_timeout_ms(), 3000);
    ASSERT_GE(r.rank(), 0);
    ASSERT_LT(r.rank(), 4);
    EXPECT_FALSE(seen[r.rank()]) << "rank " << r.rank() << " assigned twice";
    seen[r.rank()] = true;
    ASSERT_EQ(r.members_size(), 4);
    for (int k = 0; k < 4; ++k) {
      EXPECT_EQ(r.members(k).rank(), k);
      EXPECT_TRUE(r.members(k).alive());
    }
    // This member's own entry carries its endpoint.
    EXPECT_EQ(r.members(r.rank()).member_id(), std::string(1, static_cast<char>('a' + i)));
    EXPECT_EQ(r.members(r.rank()).data_endpoint().host(), "127.0.0.1");
    EXPECT_EQ(r.members(r.rank()).data_endpoint().port(), 5000 + static_cast<int>(i));
  }
  auto st = registry_.GetJobStatus("j");
  ASSERT_TRUE(st.ok());
  EXPECT_EQ(st->state(), v1::JOB_STATE_RUNNING);
}

TEST_F(JobRegistryTest, RequestedRanksAreHonouredAndConflictsNamed) {
  Create("j", 3);
  std::thread t([&] {
    auto r = Join("j", "x", 2, 6000);
    ASSERT_TRUE(r.ok()) << r.status();
    EXPECT_EQ(r->rank(), 2);
  });
  AwaitJoined("j", 1);
  auto taken = Join("j", "y", 2, 6001);
  EXPECT_EQ(taken.status().code(), absl::StatusCode::kAlreadyExists);
  EXPECT_EQ(taken.status().message(), "rank 2 of job 'j' is already taken by member 'x'");
  auto out_of_range = Join("j", "y", 3, 6001);
  EXPECT_EQ(out_of_range.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(out_of_range.status().message(),
            "requested rank 3 is out of range for job 'j' (world size 3; -1 takes any free rank)");
  EXPECT_EQ(Join("j", "y", -2, 6001).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(Join("nope", "y", -1, 6001).status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(Join("j", "", -1, 6001).status().code(), absl::StatusCode::kInvalidArgument);

  auto rest = JoinAll("j", {"y", "z"});  // lowest free ranks: 0, 1
  t.join();
  ASSERT_TRUE(rest[0].ok() && rest[1].ok());
  EXPECT_EQ(rest[0]->rank() + rest[1]->rank(), 1);
}

TEST_F(JobRegistryTest, TimeoutNamesMissingAndJoinedRanksAndFreesTheRank) {
  Create("j", 4);
  absl::StatusOr<v1::JoinJobResponse> a_reply = absl::UnknownError("not run");
  std::thread a([&] { a_reply = Join("j", "a", 0, 5000, /*timeout_ms=*/10000); });
  AwaitJoined("j", 1);

  const absl::Time start = absl::Now();
  auto c = Join("j", "c", 2, 5002, /*timeout_ms=*/200);
  const absl::Duration took = absl::Now() - start;
  EXPECT_EQ(c.status().code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_EQ(c.status().message(),
            "job 'j' epoch 1: rendezvous timed out after 200 ms: 2 of 4 ranks missing "
            "(ranks 1, 3); joined: rank 0 (member 'a' at 127.0.0.1:5000), "
            "rank 2 (member 'c' at 127.0.0.1:5002)");
  EXPECT_GE(took, absl::Milliseconds(200));
  EXPECT_LT(took, absl::Milliseconds(1500));

  // c was removed so it (or anyone) can take rank 2 again.
  auto st = registry_.GetJobStatus("j");
  ASSERT_TRUE(st.ok());
  ASSERT_EQ(st->members_size(), 1);
  EXPECT_EQ(st->members(0).member_id(), "a");

  auto rest = JoinAll("j", {"b", "c", "d"}, {1, 2, 3});
  a.join();
  for (auto& r : rest) EXPECT_TRUE(r.ok()) << r.status();
  ASSERT_TRUE(a_reply.ok()) << a_reply.status();
  EXPECT_EQ(a_reply->rank(), 0);
  EXPECT_EQ(a_reply->members(2).member_id(), "c");
}

TEST_F(JobRegistryTest, RetriedJoinGetsSameRankWhileFormingAndAfterRunning) {
  Create("j", 2);
  absl::StatusOr<v1::JoinJobResponse> first = absl::UnknownError("not run");
  absl::StatusOr<v1::JoinJobResponse> retry = absl::UnknownError("not run");
  std::thread t1([&] { first = Join("j", "a", -1, 5000); });
  AwaitJoined("j", 1);
  std::thread t2([&] { retry = Join("j", "a", -1, 5000); });  // same member, still forming
  absl::SleepFor(absl::Milliseconds(20));
  auto b = Join("j", "b", -1, 5001);
  t1.join();
  t2.join();
  ASSERT_TRUE(first.ok() && retry.ok() && b.ok());
  EXPECT_EQ(first->rank(), 0);
  EXPECT_EQ(retry->rank(), 0);
  EXPECT_EQ(b->rank(), 1);

  // A retry after the rendezvous (its reply was lost) returns at once.
  auto again = Join("j", "a", -1, 5000, /*timeout_ms=*/50);
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ(again->rank(), 0);
  EXPECT_EQ(again->epoch(), 1);
  EXPECT_EQ(again->members_size(), 2);
  EXPECT_EQ(Join("j", "a", 1, 5000).status().code(), absl::StatusCode::kAlreadyExists);

  auto newcomer = Join("j", "z", -1, 5009);
  EXPECT_EQ(newcomer.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(newcomer.status().message(),
            "job 'j' epoch 1 is already running with all 2 ranks; member 'z' can join only "
            "after the epoch is aborted");
}

TEST_F(JobRegistryTest, TimedOutRetryDoesNotEvictAStillWaitingCall) {
  Create("j", 2);
  absl::StatusOr<v1::JoinJobResponse> patient = absl::UnknownError("not run");
  std::thread t([&] { patient = Join("j", "a", -1, 5000, 10000); });
  AwaitJoined("j", 1);
  EXPECT_EQ(Join("j", "a", -1, 5000, 50).status().code(), absl::StatusCode::kDeadlineExceeded);
  AwaitJoined("j", 1);  // still a member: the first call is waiting
  ASSERT_TRUE(Join("j", "b", -1, 5001).ok());
  t.join();
  ASSERT_TRUE(patient.ok()) << patient.status();
}

TEST_F(JobRegistryTest, CancelledJoinReturnsCancelledAndLeaves) {
  Create("j", 2);
  std::atomic<bool> cancel{false};
  JobRegistry::WaitControl wait;
  wait.is_cancelled = [&] { return cancel.load(); };
  absl::StatusOr<v1::JoinJobResponse> r = absl::UnknownError("not run");
  std::thread t([&] { r = registry_.JoinJob(JoinRequest("j", "a", -1, 5000), wait); });
  AwaitJoined("j", 1);
  cancel = true;
  t.join();
  EXPECT_EQ(r.status().code(), absl::StatusCode::kCancelled);
  AwaitJoined("j", 0);
}

TEST_F(JobRegistryTest, MissedHeartbeatsAbortTheEpochAndNameTheRank) {
  Create("j", 2, /*heartbeat_timeout_ms=*/300);
  auto replies = JoinAll("j", {"a", "b"}, {0, 1});
  ASSERT_TRUE(replies[0].ok() && replies[1].ok());

  clock_.Advance(absl::Milliseconds(200));
  ASSERT_TRUE(Beat("j", 0, 1, "a").ok());
  registry_.CheckLiveness();
  EXPECT_EQ(registry_.GetJobStatus("j")->state(), v1::JOB_STATE_RUNNING);

  clock_.Advance(absl::Milliseconds(200));  // b: 400 ms silent, a: 200 ms
  registry_.CheckLiveness();
  auto st = registry_.GetJobStatus("j");
  ASSERT_TRUE(st.ok());
  EXPECT_EQ(st->state(), v1::JOB_STATE_ABORTED);
  EXPECT_EQ(st->abort_reason(), "rank 1 (member 'b') missed heartbeats for 0.4 s (timeout 0.3 s)");
  EXPECT_TRUE(st->members(0).alive());
  EXPECT_FALSE(st->members(1).alive());
  EXPECT_EQ(st->members(1).last_heartbeat_age_ms(), 400);

  auto hb = Beat("j", 0, 1, "a");
  ASSERT_TRUE(hb.ok());
  EXPECT_EQ(hb->state(), v1::JOB_STATE_ABORTED);
  EXPECT_EQ(hb->epoch(), 1);
  EXPECT_EQ(hb->abort_reason(), st->abort_reason());
  ASSERT_EQ(hb->dead_ranks_size(), 1);
  EXPECT_EQ(hb->dead_ranks(0), 1);

  // A later death in the same epoch only adds to dead_ranks; with nobody
  // left alive the job is deleted.
  clock_.Advance(absl::Milliseconds(350));
  auto watch = registry_.WatchJob("j");
  ASSERT_TRUE(watch.ok());
  registry_.CheckLiveness();
  std::vector<JobEvent::Kind> kinds;
  while (true) {
    auto ev = (*watch)->Next(absl::Milliseconds(100));
    if (!ev.ok()) {
      EXPECT_EQ(ev.status().code(), absl::StatusCode::kOutOfRange);
      break;
    }
    kinds.push_back(ev->kind());
    if (ev->kind() == JobEvent::KIND_MEMBER_DEAD) {
      EXPECT_EQ(ev->rank(), 0);
      EXPECT_EQ(ev->status().abort_reason(), st->abort_reason());  // unchanged
    }
  }
  EXPECT_EQ(kinds, (std::vector<JobEvent::Kind>{JobEvent::KIND_SNAPSHOT,
                                                JobEvent::KIND_MEMBER_DEAD,
                                                JobEvent::KIND_JOB_DELETED}));
  EXPECT_EQ(registry_.GetJobStatus("j").status().code(), absl::StatusCode::kNotFound);
}

TEST_F(JobRegistryTest, LeaveAbortsRunningJobAndRejoinStartsEpochTwo) {
  Create("j", 2);
  ASSERT_TRUE(JoinAll("j", {"a", "b"}, {0, 1})[1].ok());
  ASSERT_TRUE(Leave("j", 1, 1, "b").ok());
  auto st = registry_.GetJobStatus("j");
  EXPECT_EQ(st->state(), v1::JOB_STATE_ABORTED);
  EXPECT_EQ(st->abort_reason(), "rank 1 (member 'b') left the job");
  EXPECT_TRUE(Leave("j", 1, 1, "b").ok());      // idempotent
  EXPECT_TRUE(Leave("nope", 0, 1, "b").ok());   // unknown job
  EXPECT_TRUE(Leave("j", 0, 7, "a").ok());      // stale epoch: no effect
  EXPECT_EQ(registry_.GetJobStatus("j")->members_size(), 2);

  // Rejoining an aborted job starts epoch 2 with cleared members.
  auto replies = JoinAll("j", {"b", "a"}, {1, 0});
  ASSERT_TRUE(replies[0].ok() && replies[1].ok()) << replies[0].status();
  EXPECT_EQ(replies[0]->epoch(), 2);
  EXPECT_EQ(replies[0]->rank(), 1);
  st = registry_.GetJobStatus("j");
  EXPECT_EQ(st->epoch(), 2);
  EXPECT_EQ(st->state(), v1::JOB_STATE_RUNNING);
  EXPECT_EQ(st->abort_reason(), "");

  // A member of epoch 1 learns from its heartbeat that it is gone.
  auto stale = Beat("j", 0, 1, "a");
  ASSERT_TRUE(stale.ok());
  EXPECT_EQ(stale->epoch(), 2);
  EXPECT_EQ(stale->state(), v1::JOB_STATE_RUNNING);

  // Both leave: the job is deleted.
  ASSERT_TRUE(Leave("j", 0, 2, "a").ok());
  EXPECT_TRUE(registry_.GetJobStatus("j").ok());
  ASSERT_TRUE(Leave("j", 1, 2, "b").ok());
  EXPECT_EQ(registry_.GetJobStatus("j").status().code(), absl::StatusCode::kNotFound);
}

TEST_F(JobRegistryTest, LeaveWhileFormingOnlyRemovesTheMember) {
  Create("j", 3);
  absl::StatusOr<v1::JoinJobResponse> r = absl::UnknownError("not run");
  std::thread t([&] { r = Join("j", "a", 1, 5000); });
  AwaitJoined("j", 1);
  ASSERT_TRUE(Leave("j", 1, 1, "a").ok());
  t.join();
  EXPECT_EQ(r.status().code(), absl::StatusCode::kAborted);
  auto st = registry_.GetJobStatus("j");
  EXPECT_EQ(st->state(), v1::JOB_STATE_FORMING);
  EXPECT_EQ(st->members_size(), 0);
}

TEST_F(JobRegistryTest, WatchSeesEveryEventInOrder) {
  Create("j", 2, /*heartbeat_timeout_ms=*/300);
  auto watch = registry_.WatchJob("j");
  ASSERT_TRUE(watch.ok());
  ASSERT_TRUE(JoinAll("j", {"a", "b"}, {0, 1})[0].ok());
  clock_.Advance(absl::Milliseconds(250));
  ASSERT_TRUE(Beat("j", 0, 1, "a").ok());
  clock_.Advance(absl::Milliseconds(250));
  registry_.CheckLiveness();
  ASSERT_TRUE(Leave("j", 0, 1, "a").ok());

  std::vector<JobEvent> events;
  while (true) {
    auto ev = (*watch)->Next(absl::Milliseconds(100));
    if (!ev.ok()) {
      EXPECT_EQ(ev.status().code(), absl::StatusCode::kOutOfRange) << ev.status();
      break;
    }
    events.push_back(*ev);
  }
  std::vector<JobEvent::Kind> kinds;
  for (const auto& e : events) kinds.push_back(e.kind());
  EXPECT_EQ(kinds, (std::vector<JobEvent::Kind>{
                       JobEvent::KIND_SNAPSHOT, JobEvent::KIND_MEMBER_JOINED,
                       JobEvent::KIND_MEMBER_JOINED, JobEvent::KIND_JOB_RUNNING,
                       JobEvent::KIND_MEMBER_DEAD, JobEvent::KIND_EPOCH_ABORTED,
                       JobEvent::KIND_MEMBER_LEFT, JobEvent::KIND_JOB_DELETED}));
  ASSERT_EQ(events.size(), 8u);
  EXPECT_EQ(events[0].status().state(), v1::JOB_STATE_FORMING);
  EXPECT_EQ(events[0].rank(), -1);
  EXPECT_EQ(events[2].status().members_size(), 2);
  EXPECT_EQ(events[3].status().state(), v1::JOB_STATE_RUNNING);
  EXPECT_EQ(events[4].rank(), 1);
  EXPECT_EQ(events[4].message(), "rank 1 (member 'b') missed heartbeats for 0.5 s (timeout 0.3 s)");
  EXPECT_EQ(events[5].status().state(), v1::JOB_STATE_ABORTED);
  EXPECT_EQ(events[6].rank(), 0);
  EXPECT_EQ(events[6].message(), "rank 0 (member 'a') left the job");
  for (const auto& e : events) {
    EXPECT_EQ(e.job_id(), "j");
    EXPECT_EQ(e.epoch(), 1);
  }
  EXPECT_EQ(registry_.WatchJob("nope").status().code(), absl::StatusCode::kNotFound);
}

TEST_F(JobRegistryTest, ShutdownWakesJoinersAndEndsWatches) {
  Create("j", 2);
  auto watch = registry_.WatchJob("j");
  ASSERT_TRUE(watch.ok());
  absl::StatusOr<v1::JoinJobResponse> r = absl::UnknownError("not run");
  std::thread t([&] { r = Join("j", "a", -1, 5000, 60000); });
  AwaitJoined("j", 1);
  const absl::Time start = absl::Now();
  registry_.Shutdown();
  t.join();
  EXPECT_LT(absl::Now() - start, absl::Milliseconds(500));
  EXPECT_EQ(r.status().code(), absl::StatusCode::kUnavailable);
  absl::StatusCode end = absl::StatusCode::kOk;
  for (int i = 0; i < 10 && end == absl::StatusCode::kOk; ++i) {
    end = (*watch)->Next(absl::Milliseconds(100)).status().code();
  }
  EXPECT_EQ(end, absl::StatusCode::kUnavailable);
}

TEST_F(JobRegistryTest, ObserverSeesTheLifecycle) {
  using R = JobRegistryObserver::JoinResult;
  using C = JobRegistryObserver::AbortCause;
  Create("j", 2, /*heartbeat_timeout_ms=*/1000);
  EXPECT_EQ(observer_.jobs(v1::JOB_STATE_FORMING), 1);
  auto replies = JoinAll("j", {"a", "b"});
  ASSERT_TRUE(replies[0].ok() && replies[1].ok());
  EXPECT_EQ(observer_.jobs(v1::JOB_STATE_FORMING), 0);
  EXPECT_EQ(observer_.jobs(v1::JOB_STATE_RUNNING), 1);
  EXPECT_EQ(observer_.alive(), 2);
  EXPECT_EQ(observer_.joins(R::kOk), 2);
  ASSERT_TRUE(Join("j", "a", -1, 5000).ok());  // idempotent retry
  EXPECT_EQ(observer_.joins(R::kOk), 3);
  EXPECT_EQ(observer_.alive(), 2);

  // "b" keeps beating, "a" goes silent and is declared dead.
  const int64_t epoch = replies[1]->epoch();
  clock_.Advance(absl::Milliseconds(600));
  ASSERT_TRUE(Beat("j", replies[1]->rank(), epoch, "b").ok());
  clock_.Advance(absl::Milliseconds(600));
  registry_.CheckLiveness();
  EXPECT_EQ(observer_.heartbeats(), 1);
  EXPECT_EQ(observer_.dead(), 1);
  EXPECT_EQ(observer_.aborts(C::kMemberDead), 1);
  EXPECT_EQ(observer_.jobs(v1::JOB_STATE_RUNNING), 0);
  EXPECT_EQ(observer_.jobs(v1::JOB_STATE_ABORTED), 1);
  EXPECT_EQ(observer_.alive(), 1);

  // A rejoin starts epoch 2 (the survivor no longer counts), then a leave
  // aborts it.
  std::thread first([&] { EXPECT_TRUE(Join("j", "c", -1, 6000).ok()); });
  AwaitJoined("j", 1);
  EXPECT_EQ(observer_.jobs(v1::JOB_STATE_FORMING), 1);
  EXPECT_EQ(observer_.jobs(v1::JOB_STATE_ABORTED), 0);
  EXPECT_EQ(observer_.alive(), 1);
  auto d = Join("j", "d", -1, 6001);
  first.join();
  ASSERT_TRUE(d.ok());
  EXPECT_EQ(observer_.alive(), 2);
  ASSERT_TRUE(Leave("j", d->rank(), d->epoch(), "d").ok());
  EXPECT_EQ(observer_.aborts(C::kMemberLeft), 1);
  EXPECT_EQ(observer_.alive(), 1);
  EXPECT_EQ(observer_.jobs(v1::JOB_STATE_ABORTED), 1);
  ASSERT_TRUE(Leave("j", 1 - d->rank(), d->epoch(), "c").ok());
  EXPECT_EQ(observer_.alive(), 0);
  EXPECT_EQ(observer_.jobs(v1::JOB_STATE_ABORTED), 0);  // deleted
  EXPECT_EQ(registry_.JobCount(), 0u);

  // Timeouts and errors.
  Create("k", 2);
  EXPECT_EQ(Join("k", "x", -1, 5000, /*timeout_ms=*/50).status().code(),
            absl::StatusCode::kDeadlineExceeded);
  EXPECT_EQ(observer_.joins(R::kTimeout), 1);
  EXPECT_EQ(observer_.alive(), 0);  // the timed-out member was removed
  EXPECT_EQ(Join("nope", "x", -1, 5000).status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(Join("k", "", -1, 5000).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(observer_.joins(R::kError), 2);
  EXPECT_EQ(observer_.jobs(v1::JOB_STATE_FORMING), 1);
}

TEST(JobRegistryThreadTest, BackgroundThreadDetectsDeathWithRealClock) {
  JobRegistry::Options o;
  o.default_heartbeat_timeout_ms = 200;
  o.liveness_interval = absl::Milliseconds(20);
  JobRegistry registry(o);
  v1::CreateJobRequest create;
  create.set_job_id("j");
  create.set_world_size(1);
  ASSERT_TRUE(registry.CreateJob(create).ok());
  v1::JoinJobRequest join;
  join.set_job_id("j");
  join.set_member_id("solo");
  join.set_requested_rank(-1);
  auto r = registry.JoinJob(join, {});
  ASSERT_TRUE(r.ok()) << r.status();
  const absl::Time deadline = absl::Now() + absl::Seconds(3);
  absl::StatusCode code = absl::StatusCode::kOk;
  while (absl::Now() < deadline && code == absl::StatusCode::kOk) {
    code = registry.GetJobStatus("j").status().code();  // deleted once its only member dies
    absl::SleepFor(absl::Milliseconds(10));
  }
  EXPECT_EQ(code, absl::StatusCode::kNotFound);
}

TEST(FormatTest, LongRankListsAreCompressed) {
  JobRegistry registry(JobRegistry::Options{});
  v1::CreateJobRequest create;
  create.set_job_id("big");
  create.set_world_size(100);
  ASSERT_TRUE(registry.CreateJob(create).ok());
  v1::JoinJobRequest join;
  join.set_job_id("big");
  join.set_member_id("m");
  join.set_requested_rank(50);
  join.set_timeout_ms(1);
  auto r = registry.JoinJob(join, {});
  EXPECT_EQ(r.status().message(),
            "job 'big' epoch 1: rendezvous timed out after 1 ms: 99 of 100 ranks missing "
            "(ranks 0-49, 51-99); joined: rank 50 (member 'm')");
}

}  // namespace
}  // namespace gradsync
