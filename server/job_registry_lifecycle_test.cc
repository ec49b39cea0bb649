// JobRegistry over a job's life: heartbeats and death, leaving, watching,
// shutdown, the observer's totals, the real-clock liveness thread.
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
#include "server/job_registry_testing.h"

namespace gradsync {
namespace {

using job_registry_testing::CountingObserver;
using job_registry_testing::FakeClock;
using job_registry_testing::JobRegistryTest;
using v1::JobEvent;

TEST_F(JobRegistryTest, MissedHeartbeatsAbortTheEpochAndNameTheRank) {
  Create("j", 2, /*heartbeat_timeout_ms=*/300);
  auto replies = JoinAll("j", {"a", "b"}, {0, 1});
  ASSERT_TRUE(replies[0].ok() && replies[1].ok());

  clock_.Advance(absl::Milliseconds(200));
  ASSERT_TRUE(Beat("j", 0, 1, "a").ok());
  registry_.CheckLiveness();
  EXPECT_EQ(registry_.GetJobStatus("j")->state(), v1::JOB_STATE_RUNNING);

  clock_.Advance(absl::Milliseconds(200));  // b: 400 ms silent, a: 200 ms
  // Before the sweep, the status already tells the truth about b.
  auto before = registry_.GetJobStatus("j");
  ASSERT_TRUE(before.ok());
  EXPECT_TRUE(before->members(0).alive());
  EXPECT_FALSE(before->members(1).alive()) << "a member 400 ms silent (timeout 300 ms) shown alive";
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

// A job whose rendezvous never completes expires once nobody waits in it (its
// id poisoned the coordinator before: "already exists with world size 2;
// requested world size 1"); a member waiting keeps it.
TEST_F(JobRegistryTest, AFormingJobNobodyWaitsInExpiresAndFreesItsId) {
  Create("stuck", 2);
  clock_.Advance(absl::Seconds(9));
  registry_.CheckLiveness();
  ASSERT_TRUE(registry_.GetJobStatus("stuck").ok());  // not yet: 10 s by default
  absl::StatusOr<v1::JoinJobResponse> r = absl::UnknownError("not run");
  std::thread t([&] { r = Join("stuck", "a", 0, 7000, /*timeout_ms=*/500); });
  AwaitJoined("stuck", 1);
  clock_.Advance(absl::Seconds(60));
  registry_.CheckLiveness();
  ASSERT_TRUE(registry_.GetJobStatus("stuck").ok());  // a member waits
  t.join();
  EXPECT_TRUE(absl::IsDeadlineExceeded(r.status())) << r.status();
  clock_.Advance(absl::Seconds(11));
  registry_.CheckLiveness();
  const absl::Status gone = registry_.GetJobStatus("stuck").status();
  EXPECT_TRUE(absl::IsNotFound(gone)) << gone;
  v1::CreateJobRequest again;
  again.set_job_id("stuck");
  again.set_world_size(1);
  auto created = registry_.CreateJob(again);
  ASSERT_TRUE(created.ok()) << created.status();
  EXPECT_TRUE(created->created());
}

// Ranks that disagree on the world size both learn it at once: the waiting
// one used to wait out its whole rendezvous deadline in silence.
TEST_F(JobRegistryTest, RanksThatDisagreeOnTheWorldSizeBothFailAtOnce) {
  Create("sizes", 2);
  absl::StatusOr<v1::JoinJobResponse> r = absl::UnknownError("not run");
  const absl::Time start = absl::Now();
  std::thread t([&] { r = Join("sizes", "a", 0, 7000, /*timeout_ms=*/30000); });
  AwaitJoined("sizes", 1);
  v1::CreateJobRequest other;
  other.set_job_id("sizes");
  other.set_world_size(3);
  const absl::Status refused = registry_.CreateJob(other).status();
  EXPECT_TRUE(absl::IsAlreadyExists(refused)) << refused;
  t.join();
  EXPECT_LT(absl::Now() - start, absl::Seconds(5));
  EXPECT_TRUE(absl::IsFailedPrecondition(r.status())) << r.status();
  EXPECT_EQ(r.status().message(),
            "job 'sizes': another rank asked for world size 3 while this job was created with "
            "world size 2; every rank must pass the same world size");
  // Nobody waits any more: a new attempt with the right size can form.
  auto replies = JoinAll("sizes", {"a", "b"}, {0, 1});
  EXPECT_TRUE(replies[0].ok() && replies[1].ok()) << replies[0].status() << replies[1].status();
}

// One tenant's world-size-1 jobs run as soon as their member joins, so
// max_forming_jobs never stopped them: 10,000 of them left every other
// tenant "10000 jobs exist" for up to an hour. Each namespace now holds at
// most its share of jobs in any state, of forming ranks and of waiting joins.
TEST_F(JobRegistryTest, ANamespaceHoldsOnlyItsShareOfJobsAndFormingRanks) {
  NamespaceLimits limits;
  limits.max_jobs = 3;
  limits.max_forming_ranks = 8192;
  auto create = [&](const std::string& id, int world) {
    v1::CreateJobRequest req;
    req.set_job_id(id);
    req.set_world_size(world);
    return registry_.CreateJob(req, limits).status();
  };
  for (int i = 0; i < 3; ++i) {
    const std::string id = absl::StrCat("greedy/j", i);
    ASSERT_TRUE(create(id, 1).ok()) << i;
    ASSERT_TRUE(Join(id, "m", 0, 7000).ok());  // running at once
  }
  absl::Status refused = create("greedy/j3", 1);
  EXPECT_TRUE(absl::IsResourceExhausted(refused)) << refused;
  EXPECT_EQ(refused.message(),
            "cannot create job 'greedy/j3': tenant 'greedy' already has 3 jobs (its share: 3)");
  EXPECT_TRUE(create("other/j0", 1).ok());  // another tenant is not affected
  ASSERT_TRUE(create("wide/a", 4096).ok());
  ASSERT_TRUE(create("wide/b", 4096).ok());
  refused = create("wide/c", 2);
  EXPECT_TRUE(absl::IsResourceExhausted(refused)) << refused;
  EXPECT_EQ(refused.message(),
            "cannot create job 'wide/c': tenant 'wide''s forming jobs already have 8192 ranks; "
            "with 2 more it would exceed its share of 8192");
  EXPECT_TRUE(create("other/wide", 4096).ok());
}

// 66,000 join retries of one member held every tenant's joins off (and
// 1 GB of the coordinator). One member has at most 4 joins waiting, and a
// namespace at most its share.
TEST_F(JobRegistryTest, JoinsWaitingPerMemberAndPerNamespaceAreBounded) {
  Create("t/pair", 2);
  std::vector<absl::StatusOr<v1::JoinJobResponse>> answers;
  absl::Mutex mu;
  auto start = [&](const std::string& job, const std::string& member, int max_in_namespace) {
    return registry_.StartJoin(
        job_registry_testing::JoinRequest(job, member, -1, 7000, /*timeout_ms=*/5000),
        absl::InfiniteFuture(),
        [&](absl::StatusOr<v1::JoinJobResponse> r) {
          absl::MutexLock l(&mu);
          answers.push_back(std::move(r));
        },
        max_in_namespace);
  };
  for (int i = 0; i < kMaxWaitingJoinsPerMember; ++i) EXPECT_NE(start("t/pair", "a", 0), 0u);
  EXPECT_EQ(start("t/pair", "a", 0), 0u);  // answered at once
  {
    absl::MutexLock l(&mu);
    ASSERT_EQ(answers.size(), 1u);
    EXPECT_TRUE(absl::IsResourceExhausted(answers[0].status())) << answers[0].status();
    EXPECT_EQ(answers[0].status().message(),
              "join of job 't/pair' by member 'a': 4 joins of this member already wait (at most "
              "4)");
  }
  Create("t/other", 3);
  EXPECT_NE(start("t/other", "x", 5), 0u);  // 4 of t's joins wait; its share is 5: x waits
  EXPECT_EQ(start("t/other", "y", 5), 0u);
  {
    absl::MutexLock l(&mu);
    ASSERT_EQ(answers.size(), 2u);
    EXPECT_EQ(answers[1].status().message(),
              "join of job 't/other' by member 'y': tenant 't' already has 5 joins waiting for "
              "rendezvous (its share: 5)");
  }
  registry_.Shutdown();  // answers the 5 waiting joins, on the registry's join thread
  absl::MutexLock l(&mu);
  auto all_answered = [&] { return answers.size() == 7; };
  EXPECT_TRUE(mu.AwaitWithTimeout(absl::Condition(&all_answered), absl::Seconds(10)));
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
  join.set_member_key(job_registry_testing::MemberKey("solo"));
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
  join.set_member_key(job_registry_testing::MemberKey("m"));
  join.set_requested_rank(50);
  join.set_timeout_ms(1);
  auto r = registry.JoinJob(join, {});
  EXPECT_EQ(r.status().message(),
            "job 'big' epoch 1: rendezvous timed out after 1 ms: 99 of 100 ranks missing "
            "(ranks 0-49, 51-99); joined: rank 50 (member 'm')");
}

}  // namespace
// DeleteJob ends a job in any state: a waiting join fails ABORTED naming who
// deleted it, a running member's heartbeat is NOT_FOUND with the same cause,
// the id is free at once, and a new job of that id is not "deleted".
TEST_F(JobRegistryTest, DeleteJobEndsWaitingJoinsAndRunningMembers) {
  Create("forming", 2);
  absl::StatusOr<v1::JoinJobResponse> waiting = absl::UnknownError("not run");
  std::thread joiner([&] { waiting = Join("forming", "a", -1, 5000, 60000); });
  AwaitJoined("forming", 1);
  auto deleted = registry_.DeleteJob("forming", "deleted by operator 'ops': maintenance");
  ASSERT_TRUE(deleted.ok()) << deleted.status();
  EXPECT_EQ(deleted->members(), 1);
  joiner.join();
  EXPECT_EQ(waiting.status().code(), absl::StatusCode::kAborted) << waiting.status();
  EXPECT_NE(waiting.status().message().find("was deleted by operator 'ops': maintenance while "
                                            "member 'a' waited"),
            std::string::npos)
      << waiting.status();

  Create("running", 2);
  auto joined = JoinAll("running", {"a", "b"});
  ASSERT_TRUE(joined[0].ok() && joined[1].ok());
  ASSERT_TRUE(registry_.DeleteJob("running", "deleted by operator 'ops'").ok());
  auto beat = Beat("running", 0, joined[0]->epoch(), "a");
  EXPECT_EQ(beat.status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(beat.status().message(), "job 'running' was deleted by operator 'ops'");
  EXPECT_EQ(registry_.GetJobStatus("running").status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(registry_.DeleteJob("running", "x").status().code(), absl::StatusCode::kNotFound);

  // The id is free; the new job's members are not told about the old one.
  Create("running", 1);
  auto again = Join("running", "c", -1, 5001);
  ASSERT_TRUE(again.ok()) << again.status();
  ASSERT_TRUE(registry_.DeleteJob("running", "deleted by operator 'ops'").ok());
  EXPECT_EQ(registry_.DeleteJob("never", "x").status().message(), "job 'never' does not exist");
}

}  // namespace gradsync
