// The shared-memory OpChannel against a scripted daemon end in the same
// process (ipc/op_queue.h only; the real daemon is in tests/).
#include "client/shm_op_channel.h"

#include <sys/syscall.h>
#include <unistd.h>

#include <atomic>
#include <deque>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "common/thread_testing.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "ipc/op_queue.h"
#include "ipc/shared_memory.h"

namespace gradsync {
namespace client {
namespace internal {
namespace {

using ::testing::HasSubstr;

// Plays gradsyncd: bumps its heartbeat, takes submissions and answers them.
// Ops named "hold" wait for Complete(); "fail:<msg>" fail with Aborted <msg>;
// everything else succeeds at once.
class ScriptedDaemon {
 public:
  explicit ScriptedDaemon(uint32_t capacity) {
    name_ = absl::StrCat("/gradsync-channel-test.", ::getpid(), ".", absl::ToUnixNanos(absl::Now()));
    auto mem = ipc::SharedMemory::Create(name_, ipc::OpQueueBytes(capacity));
    EXPECT_TRUE(mem.ok()) << mem.status();
    mem_ = std::move(*mem);
    auto end = ipc::DaemonEnd::Format(mem_->data(), mem_->size(), capacity);
    EXPECT_TRUE(end.ok()) << end.status();
    end_ = std::make_unique<ipc::DaemonEnd>(*end);
    thread_ = std::thread([this] { Run(); });
  }
  ~ScriptedDaemon() {
    {
      absl::MutexLock l(&mu_);
      stop_ = true;
    }
    thread_.join();
  }

  std::unique_ptr<OpChannel> Channel(ShmOpChannelOptions options = {}) {
    auto mem = ipc::SharedMemory::Open(name_, mem_->size());
    EXPECT_TRUE(mem.ok()) << mem.status();
    auto channel = NewShmOpChannel(std::move(*mem), "unix:/test.sock", "s-1", options);
    EXPECT_TRUE(channel.ok()) << channel.status();
    return channel.ok() ? std::move(*channel) : nullptr;
  }

  void Complete(uint64_t token, absl::Status status = absl::OkStatus()) {
    absl::MutexLock l(&mu_);
    PostLocked(token, std::move(status));
  }
  void Die() {  // heartbeat stops, nothing is answered any more
    absl::MutexLock l(&mu_);
    dead_ = true;
  }
  void PauseTaking(bool paused) {
    absl::MutexLock l(&mu_);
    paused_ = paused;
  }
  void Close(const absl::Status& reason) {
    absl::MutexLock l(&mu_);
    end_->Close(reason);
  }
  // A decoded submission and its token.
  struct Received : OpDesc {
    uint64_t token = 0;
  };
  std::vector<Received> received() const {
    absl::MutexLock l(&mu_);
    return received_;
  }
  uint64_t client_heartbeat() const { return end_->client_heartbeat(); }
  // A client submitter is waiting for room in the full submission ring.
  bool space_wanted() const { return end_->header()->sq_space_wanted.load() != 0; }
  // Client threads asleep on the completion bell.
  uint32_t completion_sleepers() const { return end_->header()->cq_bell.waiters.load(); }

 private:
  void PostLocked(uint64_t token, absl::Status status) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    ipc::OpCompletion c;
    c.token = token;
    c.op_id = token + 100;
    c.status = std::move(status);
    c.algorithm = "ring";
    c.queued_time = absl::Microseconds(5);
    c.run_time = absl::Microseconds(7);
    ipc::CompletionEntry e;
    ipc::EncodeCompletion(c, &e);
    overflow_.push_back(e);
    FlushLocked();
  }
  void FlushLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    bool pushed = false;
    while (!overflow_.empty() && *end_->PushCompletion(overflow_.front())) {
      overflow_.pop_front();
      pushed = true;
    }
    end_->SetOverflow(!overflow_.empty());
    if (pushed) end_->completion_bell().Ring();
  }
  void Run() {
    absl::Time next_beat = absl::Now();
    while (true) {
      {
        absl::MutexLock l(&mu_);
        if (stop_) return;
        if (!dead_) {
          if (absl::Now() >= next_beat) {
            end_->BumpHeartbeat();
            next_beat = absl::Now() + absl::Milliseconds(20);
          }
          FlushLocked();
          ipc::SubmissionEntry e;
          bool took = false;
          while (!paused_ && *end_->PopSubmission(&e)) {
            took = true;
            Received op;
            op.token = e.token;
            absl::Status decoded = ipc::DecodeSubmission(e, &op);
            EXPECT_TRUE(decoded.ok()) << decoded;
            received_.push_back(op);
            if (op.name == "hold") continue;
            if (absl::StartsWith(op.name, "fail:")) {
              PostLocked(op.token, absl::AbortedError(op.name.substr(5)));
            } else {
              PostLocked(op.token, absl::OkStatus());
            }
          }
          if (took) end_->NotifySpaceIfWanted();
        }
      }
      ipc::Doorbell bell = end_->submission_bell();
      bell.Wait(bell.Snapshot(), absl::Milliseconds(5));
    }
  }

  std::string name_;
  std::unique_ptr<ipc::SharedMemory> mem_;
  mutable absl::Mutex mu_;
  std::unique_ptr<ipc::DaemonEnd> end_;
  std::deque<ipc::CompletionEntry> overflow_ ABSL_GUARDED_BY(mu_);
  std::vector<Received> received_ ABSL_GUARDED_BY(mu_);
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  bool dead_ ABSL_GUARDED_BY(mu_) = false;
  bool paused_ ABSL_GUARDED_BY(mu_) = false;
  std::thread thread_;
};

OpDesc Op(absl::string_view name, int64_t timeout_ms = 0) {
  OpDesc a;
  a.kind = CollectiveKind::kAllreduce;
  a.buffer_id = 3;
  a.offset_bytes = 8;
  a.count = 2;
  a.dtype = DType::kF64;
  a.op = ReduceOp::kMax;
  a.algorithm = "rhd";
  a.name = std::string(name);
  a.timeout = absl::Milliseconds(timeout_ms);
  return a;
}

absl::Time In(absl::Duration d) { return absl::Now() + d; }

// Polls `pred` every millisecond until it holds or 20 s pass; returns pred().
template <typename Pred>
bool Eventually(Pred pred) {
  const absl::Time deadline = In(absl::Seconds(20));
  while (!pred() && absl::Now() < deadline) absl::SleepFor(absl::Milliseconds(1));
  return pred();
}

TEST(ShmOpChannel, SubmitReturnsTokensAndWaitReturnsTheOutcome) {
  ScriptedDaemon daemon(8);
  auto ch = daemon.Channel();
  auto a = ch->Submit(Op("grad/a", 1500));
  auto b = ch->Submit(Op("grad/b"));
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_EQ(a->op_id, 1u);
  EXPECT_EQ(b->op_id, 2u);
  EXPECT_EQ(a->sequence, 0u);  // not known at submission
  auto out = ch->Wait(a->op_id, In(absl::Seconds(5)));
  ASSERT_TRUE(out.ok()) << out.status();
  EXPECT_TRUE(out->done);
  EXPECT_EQ(out->algorithm, "ring");
  EXPECT_EQ(out->queued_time, absl::Microseconds(5));
  EXPECT_EQ(out->run_time, absl::Microseconds(7));
  EXPECT_TRUE(ch->Wait(b->op_id, In(absl::Seconds(5)))->done);

  auto got = daemon.received();
  ASSERT_EQ(got.size(), 2u);
  EXPECT_EQ(got[0].name, "grad/a");
  EXPECT_EQ(got[0].buffer_id, 3u);
  EXPECT_EQ(got[0].offset_bytes, 8u);
  EXPECT_EQ(got[0].count, 2u);
  EXPECT_EQ(got[0].dtype, DType::kF64);
  EXPECT_EQ(got[0].op, ReduceOp::kMax);
  EXPECT_EQ(got[0].algorithm, "rhd");
  EXPECT_EQ(got[0].timeout, absl::Milliseconds(1500));
  // Reported once, then forgotten.
  EXPECT_TRUE(absl::IsNotFound(ch->Wait(a->op_id, In(absl::Seconds(1))).status()));
  EXPECT_TRUE(absl::IsNotFound(ch->Wait(99, In(absl::Seconds(1))).status()));
}

TEST(ShmOpChannel, ErrorsComeBackWithTheirCodeAndMessage) {
  ScriptedDaemon daemon(8);
  auto ch = daemon.Channel();
  auto op = ch->Submit(Op("fail:op 3 does not match across ranks: rank 1 submitted ..."));
  ASSERT_TRUE(op.ok());
  auto out = ch->Wait(op->op_id, In(absl::Seconds(5)));
  EXPECT_EQ(out.status(), absl::AbortedError("op 3 does not match across ranks: rank 1 submitted ..."));

  auto held = ch->Submit(Op("hold"));
  ASSERT_TRUE(held.ok());
  daemon.Complete(held->op_id, absl::InvalidArgumentError(std::string(3000, 'm')));
  out = ch->Wait(held->op_id, In(absl::Seconds(5)));
  EXPECT_TRUE(absl::IsInvalidArgument(out.status()));
  EXPECT_TRUE(absl::EndsWith(out.status().message(), "[truncated from 3000 bytes]"));
}

TEST(ShmOpChannel, NamesThatDoNotFitAreRefusedLocally) {
  ScriptedDaemon daemon(8);
  auto ch = daemon.Channel();
  const std::string long_name(300, 'n');
  EXPECT_TRUE(absl::IsInvalidArgument(ch->Submit(Op(long_name)).status()));
  OpDesc a = Op("g");
  a.algorithm = "a-sixteen-chars!";
  EXPECT_TRUE(absl::IsInvalidArgument(ch->Submit(a).status()));
  // Refused submissions use no token.
  EXPECT_EQ(ch->Submit(Op("g"))->op_id, 1u);
}

TEST(ShmOpChannel, ShortWaitsReportStillRunningAndPollDoesNotBlock) {
  ScriptedDaemon daemon(8);
  auto ch = daemon.Channel();
  auto op = ch->Submit(Op("hold"));
  ASSERT_TRUE(op.ok());
  absl::Time start = absl::Now();
  auto out = ch->Wait(op->op_id, absl::InfinitePast());
  ASSERT_TRUE(out.ok());
  EXPECT_FALSE(out->done);
  EXPECT_LT(absl::Now() - start, absl::Milliseconds(50));
  start = absl::Now();
  out = ch->Wait(op->op_id, In(absl::Milliseconds(120)));
  ASSERT_TRUE(out.ok());
  EXPECT_FALSE(out->done);
  EXPECT_GE(absl::Now() - start, absl::Milliseconds(110));
  daemon.Complete(op->op_id);
  EXPECT_TRUE(ch->Wait(op->op_id, In(absl::Seconds(5)))->done);
}

TEST(ShmOpChannel, ThreadsWaitOnDifferentOpsAndEarlyCompletionsAreKept) {
  ScriptedDaemon daemon(4);
  auto ch = daemon.Channel();
  constexpr int kOps = 12;  // more than the ring holds
  std::vector<uint64_t> ids;
  for (int i = 0; i < kOps; ++i) {
    auto op = ch->Submit(Op("hold"));
    ASSERT_TRUE(op.ok()) << op.status();
    ids.push_back(op->op_id);
  }
  std::vector<absl::Status> results(kOps);
  std::vector<std::atomic<pid_t>> tids(kOps);
  std::vector<std::atomic<bool>> returned(kOps);
  std::vector<std::thread> waiters;
  for (int i = 1; i < kOps; i += 2) {  // only odd ops have waiters for now
    waiters.emplace_back([&, i] {
      tids[i] = testing::ThisThreadId();
      auto out = ch->Wait(ids[i], In(absl::Seconds(10)));
      results[i] = out.ok() ? (out->done ? absl::OkStatus() : absl::DeadlineExceededError("")) : out.status();
      returned[i] = true;
    });
  }
  // Every waiter is asleep in its Wait (on the doorbell, or on the channel
  // for the thread that sleeps on it) before anything completes.
  for (int i = 1; i < kOps; i += 2) {
    ASSERT_TRUE(Eventually([&] { return tids[i] != 0; }));
    ASSERT_TRUE(testing::WaitUntilAsleepInSyscall(tids[i], {SYS_futex})) << "waiter of op " << i;
  }
  // Complete in reverse order, some with errors; each waiter returns before
  // the next op completes, while the others keep waiting.
  for (int i = kOps - 1; i >= 0; --i) {
    daemon.Complete(ids[i], i % 3 == 0 ? absl::AbortedError(absl::StrCat("op ", i)) : absl::OkStatus());
    if (i % 2 == 1) {
      ASSERT_TRUE(Eventually([&] { return returned[i].load(); })) << "op " << i;
    }
  }
  for (auto& t : waiters) t.join();
  for (int i = 1; i < kOps; i += 2) {
    EXPECT_EQ(results[i], i % 3 == 0 ? absl::AbortedError(absl::StrCat("op ", i)) : absl::OkStatus()) << i;
  }
  for (int i = 0; i < kOps; i += 2) {  // kept until waited for
    auto out = ch->Wait(ids[i], absl::InfinitePast());
    if (i % 3 == 0) {
      EXPECT_EQ(out.status(), absl::AbortedError(absl::StrCat("op ", i)));
    } else {
      ASSERT_TRUE(out.ok()) << out.status();
      EXPECT_TRUE(out->done);
    }
  }
}

TEST(ShmOpChannel, FullRingWaitsForRoomBoundedByTheOpTimeout) {
  ScriptedDaemon daemon(2);
  auto ch = daemon.Channel();
  daemon.PauseTaking(true);
  ASSERT_TRUE(ch->Submit(Op("a")).ok());
  ASSERT_TRUE(ch->Submit(Op("b")).ok());
  const absl::Time start = absl::Now();
  auto third = ch->Submit(Op("c", /*timeout_ms=*/200));
  EXPECT_TRUE(absl::IsDeadlineExceeded(third.status())) << third.status();
  EXPECT_THAT(std::string(third.status().message()), HasSubstr("stayed full (2 entries)"));
  EXPECT_GE(absl::Now() - start, absl::Milliseconds(190));
  EXPECT_LT(absl::Now() - start, absl::Seconds(2));
  // Room appears while a submitter waits: it goes through.
  EXPECT_FALSE(daemon.space_wanted());  // the timed-out submitter took its request back
  std::atomic<bool> saw_waiting{false};
  std::thread unpause([&] {
    saw_waiting = Eventually([&] { return daemon.space_wanted(); });
    daemon.PauseTaking(false);
  });
  auto fourth = ch->Submit(Op("d", /*timeout_ms=*/30000));
  unpause.join();
  EXPECT_TRUE(saw_waiting) << "the fourth submission never waited for room";
  ASSERT_TRUE(fourth.ok()) << fourth.status();
  EXPECT_EQ(fourth->op_id, 3u);  // the timed-out one used no token
  EXPECT_TRUE(ch->Wait(fourth->op_id, In(absl::Seconds(5)))->done);
}

TEST(ShmOpChannel, DeadDaemonIsUnavailableOnceItsHeartbeatStops) {
  ScriptedDaemon daemon(8);
  ShmOpChannelOptions o;
  o.heartbeat_timeout = absl::Milliseconds(300);
  auto ch = daemon.Channel(o);
  auto op = ch->Submit(Op("hold"));
  ASSERT_TRUE(op.ok());
  ASSERT_TRUE(Eventually([&] { return daemon.received().size() == 1; })) << "the daemon never took the op";
  daemon.Die();
  const absl::Time start = absl::Now();
  auto out = ch->Wait(op->op_id, absl::InfiniteFuture());
  const absl::Duration took = absl::Now() - start;
  EXPECT_TRUE(absl::IsUnavailable(out.status())) << out.status();
  EXPECT_EQ(out.status().message(),
            "gradsyncd at unix:/test.sock stopped answering (no heartbeat for 0.3 s)");
  EXPECT_LT(took, absl::Seconds(1));
  // Sticky, and new submissions fail the same way.
  EXPECT_TRUE(absl::IsUnavailable(ch->Submit(Op("x")).status()));
}

TEST(ShmOpChannel, ClosedQueueFailsWaitersWithTheDaemonsReason) {
  ScriptedDaemon daemon(8);
  auto ch = daemon.Channel();
  auto done = ch->Submit(Op("ok"));
  auto held = ch->Submit(Op("hold"));
  ASSERT_TRUE(done.ok() && held.ok());
  // The daemon took both, so "ok"'s completion is in the ring before the close.
  ASSERT_TRUE(Eventually([&] { return daemon.received().size() == 2; })) << "the daemon never took both";
  std::atomic<bool> saw_sleeper{false};
  std::thread closer([&] {
    // Close while the waiter sleeps on the completion bell.
    saw_sleeper = Eventually([&] { return daemon.completion_sleepers() > 0; });
    daemon.Close(absl::FailedPreconditionError("session s-1 is closed: session closed"));
  });
  auto out = ch->Wait(held->op_id, In(absl::Seconds(30)));
  closer.join();
  EXPECT_TRUE(saw_sleeper) << "Wait never slept on the completion bell";
  EXPECT_EQ(out.status(), absl::FailedPreconditionError("session s-1 is closed: session closed"));
  // A completion that arrived before the close is still reported.
  auto first = ch->Wait(done->op_id, absl::InfinitePast());
  ASSERT_TRUE(first.ok()) << first.status();
  EXPECT_TRUE(first->done);
}

TEST(ShmOpChannel, WaitingKeepsTheClientHeartbeatMoving) {
  ScriptedDaemon daemon(8);
  auto ch = daemon.Channel();
  auto op = ch->Submit(Op("hold"));
  ASSERT_TRUE(op.ok());
  const uint64_t before = daemon.client_heartbeat();
  ASSERT_TRUE(ch->Wait(op->op_id, In(absl::Milliseconds(300))).ok());
  EXPECT_GE(daemon.client_heartbeat(), before + 4);  // a beat per <= 50 ms slice
}

}  // namespace
}  // namespace internal
}  // namespace client
}  // namespace gradsync
