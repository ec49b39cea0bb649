#include "worker/session_ops.h"

#include <sys/syscall.h>

#include <atomic>
#include <memory>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/clock.h"
#include "common/thread_testing.h"
#include "gtest/gtest.h"

namespace gradsync {
namespace {

std::shared_ptr<QueuedOp> MakeOp(const std::string& name, uint64_t count) {
  auto op = std::make_shared<QueuedOp>();
  op->sig.kind = CollectiveKind::kAllreduce;
  op->sig.dtype = DType::kF32;
  op->sig.op = ReduceOp::kSum;
  op->sig.count = count;
  op->sig.name = name;
  return op;
}

class SessionOpsTest : public ::testing::Test {
 protected:
  SessionEpoch epoch_{"j", 3};
  SessionOps ops_{"s1", &epoch_};

  uint64_t Push(const std::string& name, uint64_t count = 10) {
    absl::StatusOr<uint64_t> seq = ops_.Push(MakeOp(name, count), absl::Seconds(60));
    EXPECT_TRUE(seq.ok()) << seq.status();
    return seq.ok() ? *seq : 0;
  }
  // Finishes `op` at `end`; returns whether it was the first Finish.
  bool Finish(QueuedOp& op, const absl::Status& s, absl::Time end, bool* newly_failed = nullptr) {
    bool ignored = false;
    return ops_.Finish(op, s, "ring", end, newly_failed != nullptr ? newly_failed : &ignored);
  }
};

TEST_F(SessionOpsTest, NumbersOpsInSubmissionOrderAndHandsThemOutOldestFirst) {
  const absl::Time before = FastNow();
  auto op = MakeOp("a", 10);
  absl::StatusOr<uint64_t> first = ops_.Push(op, absl::Seconds(5));
  ASSERT_TRUE(first.ok()) << first.status();
  EXPECT_EQ(*first, 1u);
  EXPECT_EQ(op->seq, 1u);
  EXPECT_EQ(op->sig.seq, 1u);
  EXPECT_GE(op->submitted, before);
  EXPECT_EQ(op->deadline, op->submitted + absl::Seconds(5));
  EXPECT_EQ(Push("b"), 2u);
  EXPECT_EQ(Push("c"), 3u);

  std::vector<std::string> taken;
  while (std::shared_ptr<QueuedOp> next = ops_.TakeNext()) {
    EXPECT_EQ(next->sig.seq, next->seq);
    EXPECT_GE(next->started, next->submitted);
    taken.push_back(absl::StrCat(next->seq, next->sig.name));
  }
  EXPECT_EQ(taken, (std::vector<std::string>{"1a", "2b", "3c"}));
  EXPECT_EQ(ops_.TakeNext(), nullptr);
}

TEST_F(SessionOpsTest, WaitReturnsNotDoneAtItsDeadline) {
  const uint64_t seq = Push("a");
  absl::StatusOr<OpOutcome> out = ops_.Wait(seq, FastNow());
  ASSERT_TRUE(out.ok()) << out.status();
  EXPECT_FALSE(out->done);
  EXPECT_TRUE(ops_.has_pending());
  // Not reported: still there to wait for.
  out = ops_.Wait(seq, absl::InfinitePast());
  ASSERT_TRUE(out.ok()) << out.status();
  EXPECT_FALSE(out->done);
}

TEST_F(SessionOpsTest, FinishRecordsTheOutcomeOnceAndWaitReportsItOnce) {
  const uint64_t seq = Push("a");
  std::shared_ptr<QueuedOp> op = ops_.TakeNext();
  ASSERT_NE(op, nullptr);
  const absl::Time end = op->started + absl::Milliseconds(7);
  EXPECT_TRUE(Finish(*op, absl::OkStatus(), end));
  EXPECT_FALSE(Finish(*op, absl::InternalError("late"), end + absl::Seconds(1)));
  EXPECT_FALSE(ops_.has_pending());  // finished, not yet reported

  absl::StatusOr<OpOutcome> out = ops_.Wait(seq, FastNow() + absl::Seconds(60));
  ASSERT_TRUE(out.ok()) << out.status();
  EXPECT_TRUE(out->done);
  EXPECT_TRUE(out->status.ok()) << out->status;  // the first Finish's
  EXPECT_EQ(out->algorithm, "ring");
  EXPECT_EQ(out->queued_time, op->started - op->submitted);
  EXPECT_EQ(out->run_time, absl::Milliseconds(7));

  out = ops_.Wait(seq, FastNow() + absl::Seconds(60));
  EXPECT_EQ(out.status(),
            absl::NotFoundError(
                "op 1 is not pending in session s1 (already reported, or never submitted)"));
  EXPECT_EQ(ops_.Wait(99, FastNow()).status().code(), absl::StatusCode::kNotFound);
}

TEST_F(SessionOpsTest, AWaiterAsleepWakesWhenTheOpFinishes) {
  const uint64_t seq = Push("a");
  std::shared_ptr<QueuedOp> op = ops_.TakeNext();
  std::atomic<pid_t> waiter_tid{0};
  absl::StatusOr<OpOutcome> out;
  std::thread waiter([&] {
    waiter_tid = testing::ThisThreadId();
    out = ops_.Wait(seq, FastNow() + absl::Seconds(60));
  });
  while (waiter_tid.load() == 0) std::this_thread::yield();
  ASSERT_TRUE(testing::WaitUntilAsleepInSyscall(waiter_tid.load(), {SYS_futex}));
  EXPECT_TRUE(Finish(*op, absl::DeadlineExceededError("rank 2 never submitted"), FastNow()));
  waiter.join();
  ASSERT_TRUE(out.ok()) << out.status();
  EXPECT_TRUE(out->done);
  EXPECT_EQ(out->status, absl::DeadlineExceededError("rank 2 never submitted"));
}

TEST_F(SessionOpsTest, AListenerThatDeliversTheOutcomeMakesTheOpForgotten) {
  std::vector<std::pair<uint64_t, OpOutcome>> heard;
  ops_.SetCompletionListener([&heard](uint64_t op_id, const OpOutcome& outcome) {
    heard.emplace_back(op_id, outcome);
    return op_id == 1;  // delivers op 1 only
  });
  Push("a");
  Push("b");
  std::shared_ptr<QueuedOp> a = ops_.TakeNext(), b = ops_.TakeNext();
  EXPECT_TRUE(Finish(*a, absl::OkStatus(), FastNow()));
  EXPECT_TRUE(Finish(*b, absl::InvalidArgumentError("op 2 does not match"), FastNow()));
  ASSERT_EQ(heard.size(), 2u);
  EXPECT_EQ(heard[0].first, 1u);
  EXPECT_TRUE(heard[0].second.done);
  EXPECT_TRUE(heard[0].second.status.ok());
  EXPECT_EQ(heard[0].second.algorithm, "ring");
  EXPECT_EQ(heard[1].first, 2u);
  EXPECT_EQ(heard[1].second.status, absl::InvalidArgumentError("op 2 does not match"));

  EXPECT_EQ(ops_.Wait(1, FastNow()).status().code(), absl::StatusCode::kNotFound);
  absl::StatusOr<OpOutcome> b_out = ops_.Wait(2, FastNow());  // not delivered: Wait reports it
  ASSERT_TRUE(b_out.ok()) << b_out.status();
  EXPECT_EQ(b_out->status, absl::InvalidArgumentError("op 2 does not match"));

  ops_.SetCompletionListener(nullptr);
  const uint64_t c = Push("c");
  EXPECT_TRUE(Finish(*ops_.TakeNext(), absl::OkStatus(), FastNow()));
  EXPECT_EQ(heard.size(), 2u);
  EXPECT_TRUE(ops_.Wait(c, FastNow()).ok());
}

TEST_F(SessionOpsTest, AFailureOtherThanAMismatchBreaksTheEpochBeforeTheOpIsDone) {
  // A mismatch (InvalidArgument) fails only its op.
  Push("a");
  bool newly_failed = true;
  EXPECT_TRUE(Finish(*ops_.TakeNext(), absl::InvalidArgumentError("mismatch"), FastNow(),
                     &newly_failed));
  EXPECT_FALSE(newly_failed);
  EXPECT_TRUE(epoch_.health().ok());

  // The listener runs after the op is done: by then the epoch must be broken.
  absl::Status refusal_seen;
  ops_.SetCompletionListener([&](uint64_t, const OpOutcome&) {
    refusal_seen = epoch_.Refusal();
    return false;
  });
  Push("b");
  Push("c");
  std::shared_ptr<QueuedOp> b = ops_.TakeNext(), c = ops_.TakeNext();
  EXPECT_TRUE(Finish(*b, absl::UnavailableError("rank 1 lost"), FastNow(), &newly_failed));
  EXPECT_TRUE(newly_failed);
  EXPECT_EQ(refusal_seen.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_TRUE(Finish(*c, absl::UnavailableError("again"), FastNow(), &newly_failed));
  EXPECT_FALSE(newly_failed);  // already broken
  EXPECT_EQ(epoch_.health(), absl::UnavailableError("rank 1 lost"));

  EXPECT_EQ(ops_.Push(MakeOp("d", 1), absl::Seconds(1)).status(),
            absl::FailedPreconditionError(
                "job 'j' epoch 3 is no longer usable (open a new session): rank 1 lost"));
}

TEST_F(SessionOpsTest, StatusShowsTheCurrentAndTheLastFinishedOp) {
  OpsStatus st = ops_.Status();
  EXPECT_EQ(st.queued, 0);
  EXPECT_FALSE(st.has_current);
  EXPECT_EQ(st.last_completed_seq, 0u);
  EXPECT_EQ(st.last_completed, "");

  Push("g");
  Push("h", 4);
  std::shared_ptr<QueuedOp> g = ops_.TakeNext();
  st = ops_.Status();
  EXPECT_EQ(st.queued, 1);
  EXPECT_TRUE(st.has_current);
  EXPECT_EQ(st.current_seq, 1u);
  EXPECT_EQ(st.current, "allreduce 'g' f32[10] sum (op 1)");
  EXPECT_EQ(st.current_since, g->started);

  const absl::Time end = FastNow();
  Finish(*g, absl::OkStatus(), end);
  st = ops_.Status();
  EXPECT_FALSE(st.has_current);
  EXPECT_EQ(st.last_completed_seq, 1u);
  EXPECT_EQ(st.last_completed, "allreduce 'g' f32[10] sum (op 1): OK");
  EXPECT_EQ(st.last_completed_at, end);

  Finish(*ops_.TakeNext(), absl::DeadlineExceededError("late"), FastNow());
  EXPECT_EQ(ops_.Status().last_completed, "allreduce 'h' f32[4] sum (op 2): DEADLINE_EXCEEDED");
}

TEST_F(SessionOpsTest, AtMostMaxUnreportedOpsAreHeld) {
  for (size_t i = 0; i < SessionOps::kMaxUnreportedOps; ++i) {
    ASSERT_TRUE(ops_.Push(MakeOp("x", 1), absl::Seconds(60)).ok());
  }
  EXPECT_EQ(ops_.Push(MakeOp("x", 1), absl::Seconds(60)).status(),
            absl::ResourceExhaustedError(
                "4096 ops are queued or unreported; Wait for some before submitting more"));
  // Finished ops still count until they are reported.
  std::shared_ptr<QueuedOp> first = ops_.TakeNext();
  Finish(*first, absl::OkStatus(), FastNow());
  EXPECT_FALSE(ops_.Push(MakeOp("x", 1), absl::Seconds(60)).ok());
  ASSERT_TRUE(ops_.Wait(first->seq, FastNow()).ok());
  EXPECT_TRUE(ops_.Push(MakeOp("x", 1), absl::Seconds(60)).ok());
}

TEST_F(SessionOpsTest, ClosingFailsTheOpsTheExecutorNeverTook) {
  Push("a");
  Push("b");
  Push("c");
  std::shared_ptr<QueuedOp> running = ops_.TakeNext();
  epoch_.Close();
  EXPECT_EQ(ops_.Push(MakeOp("d", 1), absl::Seconds(1)).status(),
            absl::FailedPreconditionError("session is closed"));
  std::deque<std::shared_ptr<QueuedOp>> queued = ops_.TakeQueued();
  ASSERT_EQ(queued.size(), 2u);
  EXPECT_EQ(queued[0]->seq, 2u);
  EXPECT_EQ(queued[1]->seq, 3u);
  EXPECT_EQ(ops_.TakeNext(), nullptr);
  const absl::Status why = absl::CancelledError("rank 0 closed its session");
  ops_.FailUntaken(queued, why);
  for (uint64_t seq : {2u, 3u}) {
    absl::StatusOr<OpOutcome> out = ops_.Wait(seq, FastNow());
    ASSERT_TRUE(out.ok()) << out.status();
    EXPECT_TRUE(out->done);
    EXPECT_EQ(out->status, why);
    EXPECT_EQ(out->run_time, absl::ZeroDuration());
  }
  EXPECT_TRUE(ops_.has_pending());  // the running one
  Finish(*running, why, FastNow());
  EXPECT_FALSE(ops_.has_pending());
}

class FakeFeed : public SubmissionFeed {
 public:
  uint32_t Snapshot() override { return 0; }
  void Pump() override {}
  bool Spin(uint32_t, absl::Duration) override { return false; }
  void Wait(uint32_t, absl::Duration) override {}
  void Wake() override {}
  absl::Duration spin() const override { return absl::ZeroDuration(); }
};

TEST_F(SessionOpsTest, TheFeedIsTheLastOneSet) {
  EXPECT_EQ(ops_.feed(), nullptr);
  auto feed = std::make_shared<FakeFeed>();
  ops_.SetFeed(feed);
  EXPECT_EQ(ops_.feed(), feed);
  ops_.SetFeed(nullptr);
  EXPECT_EQ(ops_.feed(), nullptr);
}

}  // namespace
}  // namespace gradsync
