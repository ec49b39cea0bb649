// OpIntake with real Sessions. The sessions need a JobExecutor; theirs is
// a placeholder (no node context, never attached to), so they only ever
// reach the intake under test. In the daemon a session's Submit kicks its
// executor, which kicks the intake: the tests kick the intake themselves.
// No sleeps: waits are on conditions with deadlines.
#include "worker/op_intake.h"

#include <memory>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/synchronization/mutex.h"
#include "common/clock.h"
#include "gtest/gtest.h"
#include "worker/job_executor.h"
#include "worker/session.h"
#include "worker/submission_feed.h"

namespace gradsync {
namespace {

constexpr absl::Duration kGuard = absl::Seconds(20);  // only a broken test reaches it

JobPlacement AllHere(int world) {
  JobPlacement p;
  p.world = world;
  p.node_of_rank.assign(world, 0);
  p.ranks_of_node.resize(1);
  for (int r = 0; r < world; ++r) p.ranks_of_node[0].push_back(r);
  p.node_names = {"here:1"};
  return p;
}

struct Job {
  explicit Job(int world) {
    JobExecutorOptions o;
    o.job_id = "intake";
    o.epoch = 1;
    o.placement = AllHere(world);
    placeholder = JobExecutor::Start(std::move(o), nullptr);
    for (int r = 0; r < world; ++r) {
      SessionInfo info;
      info.session_id = "s" + std::to_string(r);
      info.job_id = "intake";
      info.rank = r;
      info.world_size = world;
      info.epoch = 1;
      sessions.push_back(std::make_unique<Session>(info, placeholder));
    }
  }
  // A barrier (no buffer): op `seq` of rank r.
  absl::StatusOr<uint64_t> Submit(int r, absl::Duration timeout = absl::ZeroDuration()) {
    OpDesc a;
    a.kind = CollectiveKind::kBarrier;
    a.name = "b";
    a.timeout = timeout;
    return sessions[r]->Submit(a);
  }
  std::shared_ptr<JobExecutor> placeholder;
  std::vector<std::unique_ptr<Session>> sessions;
};

// A doorbell the test controls: Wait blocks until Wake (the intake's Kick)
// and records the timeout it was given; Pump runs `on_pump`.
class FakeFeed final : public SubmissionFeed {
 public:
  uint32_t Snapshot() override { return 7; }
  void Pump() override {
    std::function<void()> f;
    {
      absl::MutexLock l(&mu_);
      ++pumps_;
      f = on_pump_;
    }
    if (f) f();
  }
  bool Spin(uint32_t, absl::Duration) override { return false; }
  void Wait(uint32_t snapshot, absl::Duration timeout) override {
    absl::MutexLock l(&mu_);
    EXPECT_EQ(snapshot, 7u);
    waiting_ = true;
    ++waits_;
    timeout_ = timeout;
    mu_.AwaitWithTimeout(absl::Condition(&woken_), kGuard);
    waiting_ = false;
  }
  void Wake() override {
    absl::MutexLock l(&mu_);
    woken_ = true;
  }
  absl::Duration spin() const override { return absl::ZeroDuration(); }

  void set_on_pump(std::function<void()> f) {
    absl::MutexLock l(&mu_);
    on_pump_ = std::move(f);
  }
  bool AwaitWaiting() {
    absl::MutexLock l(&mu_);
    return mu_.AwaitWithTimeout(absl::Condition(&waiting_), kGuard);
  }
  bool woken() const {
    absl::MutexLock l(&mu_);
    return woken_;
  }
  int waits() const {
    absl::MutexLock l(&mu_);
    return waits_;
  }
  int pumps() const {
    absl::MutexLock l(&mu_);
    return pumps_;
  }
  absl::Duration timeout() const {
    absl::MutexLock l(&mu_);
    return timeout_;
  }

 private:
  mutable absl::Mutex mu_;
  bool waiting_ = false, woken_ = false;
  int pumps_ = 0;
  int waits_ = 0;
  absl::Duration timeout_ = absl::InfiniteDuration();
  std::function<void()> on_pump_;
};

TEST(OpIntake, TakesOpKOfEveryLocalRankAndMovesOnTogether) {
  Job job(2);
  OpIntake intake("intake", {0, 1}, 2, absl::ZeroDuration());
  intake.BindToThisThread();
  for (auto& s : job.sessions) intake.Attach(s.get());
  OpIntake::Look look;
  ASSERT_TRUE(intake.BeginLook(&look));
  ASSERT_EQ(look.members.size(), 2u);
  EXPECT_EQ(look.members[1], job.sessions[1].get());
  EXPECT_TRUE(look.broken.ok());
  EXPECT_FALSE(intake.TakeArrivals(look.members));
  EXPECT_FALSE(intake.any_taken());
  EXPECT_EQ(intake.EarliestDeadline(), absl::InfiniteFuture());

  ASSERT_TRUE(job.Submit(0).ok());
  ASSERT_TRUE(job.Submit(0).ok());  // op 2 of rank 0 waits for op 1 to finish
  EXPECT_TRUE(intake.TakeArrivals(look.members));
  EXPECT_TRUE(intake.any_taken());
  EXPECT_FALSE(intake.all_taken());
  EXPECT_EQ(intake.slot(0)->seq, 1u);
  EXPECT_EQ(intake.slot(1), nullptr);
  EXPECT_EQ(intake.ProgressOf(1).arrived, std::vector<int>{0});
  EXPECT_EQ(intake.ProgressOf(1).phase, "negotiating");
  EXPECT_FALSE(intake.TakeArrivals(look.members));  // rank 0's op 2 stays queued

  ASSERT_TRUE(job.Submit(1).ok());
  EXPECT_TRUE(intake.TakeArrivals(look.members));
  ASSERT_TRUE(intake.all_taken());
  for (QueuedOp* op : intake.taken()) EXPECT_EQ(op->seq, 1u);
  intake.SetPhase("running x");
  EXPECT_EQ(intake.ProgressOf(1).phase, "running x");
  EXPECT_EQ(intake.ProgressOf(1).arrived, (std::vector<int>{0, 1}));

  intake.NextOp();
  EXPECT_EQ(intake.next_seq(), 2u);
  EXPECT_FALSE(intake.any_taken());
  EXPECT_TRUE(intake.ProgressOf(1).phase.empty());  // no longer the current op
  EXPECT_EQ(intake.ProgressOf(2).phase, "negotiating");
  EXPECT_TRUE(intake.ProgressOf(2).arrived.empty());
  EXPECT_TRUE(intake.TakeArrivals(look.members));
  EXPECT_EQ(intake.slot(0)->seq, 2u);
  intake.DropTaken();
  intake.EndLook();
}

TEST(OpIntake, ALateRankIsNamedWithWhoWaitsForIt) {
  Job job(3);
  OpIntake intake("intake", {0, 1, 2}, 3, absl::ZeroDuration());
  intake.BindToThisThread();
  for (auto& s : job.sessions) intake.Attach(s.get());
  const absl::Time before = FastNow();
  ASSERT_TRUE(job.Submit(0, absl::Seconds(30)).ok());
  ASSERT_TRUE(job.Submit(1, absl::Seconds(5)).ok());
  OpIntake::Look look;
  ASSERT_TRUE(intake.BeginLook(&look));
  ASSERT_TRUE(intake.TakeArrivals(look.members));
  // The earliest deadline is rank 1's.
  EXPECT_GE(intake.EarliestDeadline(), before + absl::Seconds(5));
  EXPECT_LT(intake.EarliestDeadline(), before + absl::Seconds(30));
  const absl::Status late = intake.LateRankError();
  EXPECT_EQ(late.code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_TRUE(absl::StartsWith(late.message(),
                               "timed out at ranks 0,1 waiting for rank(s) 2 to submit op 1 (barrier"))
      << late;
  intake.DropTaken();
  intake.EndLook();
}

// Runs the executor's side on a thread of its own: one look, then
// WaitForArrivals once.
struct Waiter {
  // `sleep`: what the before-sleep call answers.
  void Start(OpIntake* intake, absl::Time last_active, bool sleep = true) {
    thread = std::thread([this, intake, last_active, sleep] {
      intake->BindToThisThread();
      OpIntake::Look look;
      ASSERT_TRUE(intake->BeginLook(&look));
      intake->TakeArrivals(look.members);
      intake->WaitForArrivals(look.members, last_active, [this, sleep](absl::Time) {
        ++before_sleep;
        return sleep;
      });
      took_after = intake->TakeArrivals(look.members);
      intake->DropTaken();
      intake->EndLook();
    });
  }
  std::thread thread;
  int before_sleep = 0;
  bool took_after = false;
};

TEST(OpIntake, WaitForArrivalsSleepsOnAMissingRanksDoorbellUntilAKick) {
  Job job(2);
  auto feed = std::make_shared<FakeFeed>();
  job.sessions[1]->SetSubmissionFeed(feed);
  OpIntake intake("intake", {0, 1}, 2, absl::ZeroDuration());
  for (auto& s : job.sessions) intake.Attach(s.get());
  ASSERT_TRUE(job.Submit(0, absl::Seconds(30)).ok());  // rank 1 is missing
  Waiter w;
  w.Start(&intake, absl::InfinitePast());  // long idle: no spinning
  ASSERT_TRUE(feed->AwaitWaiting());
  EXPECT_GE(feed->pumps(), 1);  // the missing rank's queue was looked at first
  // Rank 0 waits: the sleep is short (and never past rank 0's deadline).
  EXPECT_GT(feed->timeout(), absl::ZeroDuration());
  EXPECT_LE(feed->timeout(), absl::Milliseconds(1));
  EXPECT_FALSE(feed->woken());
  ASSERT_TRUE(job.Submit(1).ok());
  intake.Kick();  // what the executor does when the session kicks it
  w.thread.join();
  EXPECT_TRUE(feed->woken());
  EXPECT_EQ(w.before_sleep, 1);
  EXPECT_TRUE(w.took_after);
}

// The executor's before-sleep call found something to handle (a peer failed
// its node context): the wait returns without sleeping on the doorbell.
TEST(OpIntake, BeforeSleepCanEndTheWaitWithoutSleeping) {
  Job job(2);
  auto feed = std::make_shared<FakeFeed>();
  job.sessions[1]->SetSubmissionFeed(feed);
  OpIntake intake("intake", {0, 1}, 2, absl::ZeroDuration());
  for (auto& s : job.sessions) intake.Attach(s.get());
  ASSERT_TRUE(job.Submit(0, absl::Seconds(30)).ok());  // rank 1 is missing
  Waiter w;
  w.Start(&intake, absl::InfinitePast(), /*sleep=*/false);
  w.thread.join();
  EXPECT_EQ(w.before_sleep, 1);
  EXPECT_EQ(feed->waits(), 0);
  EXPECT_FALSE(w.took_after);
}

TEST(OpIntake, ASubmissionPumpedFromTheQueueEndsTheWaitWithoutSleeping) {
  Job job(2);
  auto feed = std::make_shared<FakeFeed>();
  job.sessions[1]->SetSubmissionFeed(feed);
  OpIntake intake("intake", {0, 1}, 2, absl::ZeroDuration());
  for (auto& s : job.sessions) intake.Attach(s.get());
  ASSERT_TRUE(job.Submit(0, absl::Seconds(30)).ok());
  // As the shared-memory op queue does: Pump hands the client's submission
  // to the session, whose Submit kicks.
  bool submitted = false;
  feed->set_on_pump([&] {
    if (submitted) return;
    submitted = true;
    EXPECT_TRUE(job.Submit(1).ok());
    intake.Kick();
  });
  Waiter w;
  w.Start(&intake, absl::InfinitePast());
  w.thread.join();
  EXPECT_TRUE(submitted);
  EXPECT_EQ(w.before_sleep, 0);
  EXPECT_TRUE(w.took_after);
}

TEST(OpIntake, DetachBreaksTheEpochAtOnceAndWaitsForTheLookToEnd) {
  Job job(2);
  OpIntake intake("intake", {0, 1}, 2, absl::ZeroDuration());
  for (auto& s : job.sessions) intake.Attach(s.get());
  absl::Mutex mu;
  bool looking = false, end_look = false, ended = false;
  std::thread executor([&] {
    intake.BindToThisThread();
    OpIntake::Look look;
    ASSERT_TRUE(intake.BeginLook(&look));
    absl::MutexLock l(&mu);
    looking = true;
    mu.Await(absl::Condition(&end_look));
    ended = true;
    intake.EndLook();
  });
  {
    absl::MutexLock l(&mu);
    ASSERT_TRUE(mu.AwaitWithTimeout(absl::Condition(&looking), kGuard));
  }
  const absl::Status why = absl::CancelledError("rank 1 closed its session");
  const std::optional<uint64_t> generation = intake.Detach(1, why);
  ASSERT_TRUE(generation.has_value());
  EXPECT_FALSE(intake.Detach(7, why).has_value());  // not a local rank
  std::thread release([&] {
    intake.AwaitRelease(1, *generation);
    absl::MutexLock l(&mu);
    EXPECT_TRUE(ended) << "AwaitRelease returned while the executor still used the members";
  });
  {
    absl::MutexLock l(&mu);
    end_look = true;
  }
  release.join();
  executor.join();
  // The next look: the member is gone and the epoch broken, in one step.
  OpIntake::Look look;
  ASSERT_TRUE(intake.BeginLook(&look));
  EXPECT_EQ(look.members[1], nullptr);
  EXPECT_EQ(look.members[0], job.sessions[0].get());
  EXPECT_EQ(look.broken, why);
  EXPECT_FALSE(look.tell_peers);
  intake.EndLook();
}

TEST(OpIntake, TheFirstBreakWinsAndAbortAsksToTellThePeers) {
  OpIntake intake("intake", {0}, 1, absl::ZeroDuration());
  intake.Break(absl::DeadlineExceededError("first"));
  intake.Break(absl::AbortedError("second"), /*tell_peers=*/true);
  OpIntake::Look look;
  ASSERT_TRUE(intake.BeginLook(&look));
  EXPECT_EQ(look.broken, absl::DeadlineExceededError("first"));
  EXPECT_TRUE(look.tell_peers);
  intake.EndLook();
  intake.Stop();
  EXPECT_FALSE(intake.BeginLook(&look));
}

}  // namespace
}  // namespace gradsync
