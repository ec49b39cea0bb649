#include "ipc/op_queue.h"

#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cstring>
#include <deque>
#include <memory>
#include <string>
#include <thread>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "ipc/shared_memory.h"

namespace gradsync {
namespace ipc {
namespace {

using ::testing::HasSubstr;

struct Queue {
  std::unique_ptr<SharedMemory> mem;
  std::unique_ptr<DaemonEnd> daemon;
  std::unique_ptr<ClientEnd> client;
};

Queue MakeQueue(uint32_t capacity) {
  Queue q;
  auto mem = SharedMemory::Anonymous(OpQueueBytes(capacity));
  EXPECT_TRUE(mem.ok()) << mem.status();
  q.mem = std::move(*mem);
  auto d = DaemonEnd::Format(q.mem->data(), q.mem->size(), capacity);
  EXPECT_TRUE(d.ok()) << d.status();
  q.daemon = std::make_unique<DaemonEnd>(*d);
  auto c = ClientEnd::Attach(q.mem->data(), q.mem->size());
  EXPECT_TRUE(c.ok()) << c.status();
  q.client = std::make_unique<ClientEnd>(*c);
  return q;
}

SubmissionEntry Entry(uint64_t token, const std::string& name = "grad") {
  OpDesc op;
  op.count = token;
  op.buffer_id = 1;
  op.name = name;
  op.algorithm = "ring";
  SubmissionEntry e;
  EXPECT_TRUE(EncodeSubmission(token, op, &e).ok());
  return e;
}

// The daemon's side of the exchange: takes `n` submissions and answers each
// with a completion carrying its token (every 1000th an error), keeping
// completions that do not fit in a local overflow list like gradsyncd does.
// Returns "" or what went wrong. No gtest here: it also runs in a forked child.
std::string RunDaemon(DaemonEnd& d, uint64_t n, absl::Time deadline) {
  std::deque<CompletionEntry> overflow;
  uint64_t next = 1;
  while (next <= n || !overflow.empty()) {
    if (absl::Now() > deadline) return absl::StrCat("daemon timed out at token ", next);
    Doorbell bell = d.submission_bell();
    const uint32_t snap = bell.Snapshot();
    bool progress = false;
    bool pushed = false;
    while (!overflow.empty()) {
      auto ok = d.PushCompletion(overflow.front());
      if (!ok.ok()) return std::string(ok.status().message());
      if (!*ok) break;
      overflow.pop_front();
      pushed = progress = true;
    }
    SubmissionEntry e;
    while (true) {
      auto got = d.PopSubmission(&e);
      if (!got.ok()) return std::string(got.status().message());
      if (!*got) break;
      progress = true;
      OpDesc op;
      absl::Status decoded = DecodeSubmission(e, &op);
      if (!decoded.ok()) return std::string(decoded.message());
      if (e.token != next) return absl::StrCat("got token ", e.token, ", expected ", next);
      if (op.count != next || op.name != "grad" || op.algorithm != "ring") {
        return absl::StrCat("entry ", next, " garbled");
      }
      ++next;
      OpCompletion c;
      c.token = e.token;
      c.op_id = e.token;
      c.algorithm = "ring";
      c.run_time = absl::Microseconds(static_cast<int64_t>(e.token));
      if (e.token % 1000 == 0) c.status = absl::AbortedError(absl::StrCat("op ", e.token));
      CompletionEntry ce;
      EncodeCompletion(c, &ce);
      if (overflow.empty()) {
        auto ok = d.PushCompletion(ce);
        if (!ok.ok()) return std::string(ok.status().message());
        if (*ok) {
          pushed = true;
          continue;
        }
      }
      overflow.push_back(ce);
    }
    d.SetOverflow(!overflow.empty());
    if (progress) d.NotifySpaceIfWanted();
    if (pushed) d.completion_bell().Ring();
    if (!progress) bell.Wait(snap, absl::Milliseconds(100));
  }
  return "";
}

// The client's side: submits tokens 1..n (waiting for room when the ring is
// full) and checks that completions come back in order, intact.
std::string RunClient(ClientEnd& c, uint64_t n, absl::Time deadline) {
  uint64_t next_submit = 1;
  uint64_t next_complete = 1;
  c.SetSpaceWanted(true);
  while (next_complete <= n) {
    if (absl::Now() > deadline) {
      return absl::StrCat("client timed out: submitted ", next_submit - 1, ", completed ",
                          next_complete - 1);
    }
    Doorbell bell = c.completion_bell();
    const uint32_t snap = bell.Snapshot();
    bool progress = false;
    bool submitted = false;
    while (next_submit <= n) {
      auto ok = c.PushSubmission(Entry(next_submit));
      if (!ok.ok()) return std::string(ok.status().message());
      if (!*ok) break;
      ++next_submit;
      submitted = progress = true;
    }
    if (submitted) c.submission_bell().Ring();
    CompletionEntry ce;
    while (true) {
      auto got = c.PopCompletion(&ce);
      if (!got.ok()) return std::string(got.status().message());
      if (!*got) break;
      progress = true;
      auto done = DecodeCompletion(ce);
      if (!done.ok()) return std::string(done.status().message());
      if (done->token != next_complete) {
        return absl::StrCat("completion ", done->token, ", expected ", next_complete);
      }
      const bool want_error = done->token % 1000 == 0;
      if (want_error != !done->status.ok() || done->algorithm != "ring" ||
          done->run_time != absl::Microseconds(static_cast<int64_t>(done->token)) ||
          (want_error && done->status.message() != absl::StrCat("op ", done->token))) {
        return absl::StrCat("completion ", done->token, " garbled: ", done->status.ToString());
      }
      ++next_complete;
    }
    if (progress && c.overflow()) c.submission_bell().Ring();
    c.BumpHeartbeat();
    if (!progress) bell.Wait(snap, absl::Milliseconds(50));
  }
  return "";
}

TEST(OpQueueLayout, CapacityIsNormalizedAndBounded) {
  EXPECT_EQ(*NormalizeCapacity(0), kDefaultQueueCapacity);
  EXPECT_EQ(*NormalizeCapacity(2), 2u);
  EXPECT_EQ(*NormalizeCapacity(3), 4u);
  EXPECT_EQ(*NormalizeCapacity(4096), 4096u);
  EXPECT_TRUE(absl::IsInvalidArgument(NormalizeCapacity(1).status()));
  EXPECT_TRUE(absl::IsInvalidArgument(NormalizeCapacity(4097).status()));
  EXPECT_EQ(OpQueueBytes(256) % 4096, 0u);
  EXPECT_GE(OpQueueBytes(256),
            sizeof(OpQueueHeader) + 256 * (sizeof(SubmissionEntry) + sizeof(CompletionEntry)));
}

TEST(OpQueue, TwoThreadsExchange100kEntriesInOrder) {
  Queue q = MakeQueue(64);
  constexpr uint64_t kN = 100000;
  const absl::Time deadline = absl::Now() + absl::Seconds(60);
  std::string daemon_error;
  std::thread daemon([&] { daemon_error = RunDaemon(*q.daemon, kN, deadline); });
  const std::string client_error = RunClient(*q.client, kN, deadline);
  daemon.join();
  EXPECT_EQ(daemon_error, "");
  EXPECT_EQ(client_error, "");
}

TEST(OpQueue, TwoProcessesExchange100kEntriesInOrder) {
  Queue q = MakeQueue(32);
  constexpr uint64_t kN = 100000;
  const absl::Time deadline = absl::Now() + absl::Seconds(60);
  int pipefd[2];
  ASSERT_EQ(::pipe(pipefd), 0);
  const pid_t pid = ::fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    // Child: the daemon's side. Only this layer (no gRPC, no gtest).
    ::close(pipefd[0]);
    const std::string err = RunDaemon(*q.daemon, kN, deadline);
    if (!err.empty()) (void)!::write(pipefd[1], err.data(), err.size());
    ::_exit(err.empty() ? 0 : 1);
  }
  ::close(pipefd[1]);
  const std::string client_error = RunClient(*q.client, kN, deadline);
  int status = 0;
  ASSERT_EQ(::waitpid(pid, &status, 0), pid);
  std::string child_error;
  char buf[512];
  ssize_t r;
  while ((r = ::read(pipefd[0], buf, sizeof(buf))) > 0) child_error.append(buf, r);
  ::close(pipefd[0]);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << child_error;
  EXPECT_EQ(child_error, "");
  EXPECT_EQ(client_error, "");
}

TEST(OpQueue, DoorbellWaitTimesOutWhenNobodyRings) {
  Queue q = MakeQueue(4);
  Doorbell bell = q.client->completion_bell();
  const uint32_t snap = bell.Snapshot();
  const absl::Time start = absl::Now();
  bell.Wait(snap, absl::Milliseconds(100));
  const absl::Duration took = absl::Now() - start;
  EXPECT_GE(took, absl::Milliseconds(90));
  EXPECT_LT(took, absl::Milliseconds(600));
}

TEST(OpQueue, DoorbellRungAfterTheSnapshotDoesNotSleep) {
  Queue q = MakeQueue(4);
  Doorbell bell = q.client->completion_bell();
  const uint32_t snap = bell.Snapshot();
  q.daemon->completion_bell().Ring();
  const absl::Time start = absl::Now();
  bell.Wait(snap, absl::Seconds(5));
  EXPECT_LT(absl::Now() - start, absl::Milliseconds(500));
}

TEST(OpQueue, DoorbellWakesASleeperAcrossThreads) {
  Queue q = MakeQueue(4);
  Doorbell bell = q.client->completion_bell();
  const uint32_t snap = bell.Snapshot();
  std::atomic<bool> saw_sleeper{false};
  std::thread ringer([&] {
    // Ring once the waiter is asleep on the bell (it counts itself in
    // `waiters` right before FUTEX_WAIT).
    const absl::Time deadline = absl::Now() + absl::Seconds(20);
    while (q.client->header()->cq_bell.waiters.load() == 0 && absl::Now() < deadline) {
      absl::SleepFor(absl::Milliseconds(1));
    }
    saw_sleeper = q.client->header()->cq_bell.waiters.load() > 0;
    q.daemon->completion_bell().Ring();
  });
  const absl::Time start = absl::Now();
  bell.Wait(snap, absl::Seconds(30));
  const absl::Duration took = absl::Now() - start;
  ringer.join();
  EXPECT_TRUE(saw_sleeper) << "the waiter never slept on the bell";
  EXPECT_LT(took, absl::Seconds(25));  // woken by the ring, not by its timeout
}

TEST(OpQueue, SpinSeesARingWithoutSleepingAndGivesUpAtItsLimit) {
  Queue q = MakeQueue(4);
  Doorbell bell = q.client->completion_bell();
  uint32_t snap = bell.Snapshot();
  absl::Time start = absl::Now();
  EXPECT_FALSE(bell.Spin(snap, absl::Milliseconds(20)));
  EXPECT_GE(absl::Now() - start, absl::Milliseconds(20));
  std::thread ringer([&] {
    absl::SleepFor(absl::Milliseconds(5));
    q.daemon->completion_bell().Ring();
  });
  EXPECT_TRUE(bell.Spin(snap, absl::Seconds(5)));
  ringer.join();
  EXPECT_EQ(q.client->header()->cq_bell.waiters.load(), 0u);  // nobody slept
}

TEST(OpQueue, FullRingRefusesUntilTheConsumerTakesOne) {
  Queue q = MakeQueue(4);
  for (uint64_t t = 1; t <= 4; ++t) EXPECT_TRUE(*q.client->PushSubmission(Entry(t)));
  EXPECT_TRUE(q.client->SubmissionFull());
  EXPECT_FALSE(*q.client->PushSubmission(Entry(5)));
  SubmissionEntry e;
  ASSERT_TRUE(*q.daemon->PopSubmission(&e));
  EXPECT_EQ(e.token, 1u);
  EXPECT_TRUE(*q.client->PushSubmission(Entry(5)));

  CompletionEntry ce;
  EncodeCompletion(OpCompletion{}, &ce);
  for (int i = 0; i < 4; ++i) EXPECT_TRUE(*q.daemon->PushCompletion(ce));
  EXPECT_FALSE(*q.daemon->PushCompletion(ce));
  ASSERT_TRUE(*q.client->PopCompletion(&ce));
  EXPECT_TRUE(*q.daemon->PushCompletion(ce));
}

TEST(OpQueue, CorruptedSubmissionTailIsRefused) {
  Queue q = MakeQueue(8);
  q.daemon->header()->sq_tail.store(1000);  // 1000 entries "pending" in an 8-entry ring
  SubmissionEntry e;
  auto got = q.daemon->PopSubmission(&e);
  ASSERT_FALSE(got.ok());
  EXPECT_TRUE(absl::IsDataLoss(got.status())) << got.status();
  EXPECT_THAT(std::string(got.status().message()), HasSubstr("tail 1000 is impossible"));
  EXPECT_EQ(q.daemon->PendingSubmissions(), 0u);
  // A tail behind the head (the difference wraps) is refused too.
  q.daemon->header()->sq_tail.store(~uint64_t{0});
  EXPECT_TRUE(absl::IsDataLoss(q.daemon->PopSubmission(&e).status()));
}

TEST(OpQueue, CorruptedCompletionHeadIsRefused) {
  Queue q = MakeQueue(8);
  q.daemon->header()->cq_head.store(5);  // the client "consumed" entries never produced
  CompletionEntry ce;
  EncodeCompletion(OpCompletion{}, &ce);
  auto pushed = q.daemon->PushCompletion(ce);
  ASSERT_FALSE(pushed.ok());
  EXPECT_TRUE(absl::IsDataLoss(pushed.status())) << pushed.status();
}

TEST(OpQueue, ClientRefusesImpossibleDaemonIndices) {
  Queue q = MakeQueue(8);
  q.client->header()->cq_tail.store(9);
  CompletionEntry ce;
  EXPECT_TRUE(absl::IsDataLoss(q.client->PopCompletion(&ce).status()));
  q.client->header()->sq_head.store(3);  // consumed more than was produced
  EXPECT_TRUE(absl::IsDataLoss(q.client->PushSubmission(Entry(1)).status()));
}

TEST(OpQueue, OverwrittenHeaderIsDetected) {
  Queue q = MakeQueue(8);
  EXPECT_TRUE(q.daemon->CheckHeader().ok());
  q.daemon->header()->fixed.capacity = 1u << 30;
  absl::Status s = q.daemon->CheckHeader();
  EXPECT_TRUE(absl::IsDataLoss(s)) << s;
  q.daemon->header()->fixed.capacity = 8;
  EXPECT_TRUE(q.daemon->CheckHeader().ok());
  q.daemon->header()->fixed.magic = 0;
  EXPECT_TRUE(absl::IsDataLoss(q.daemon->CheckHeader()));
}

TEST(OpQueue, AttachRefusesWhatIsNotAQueue) {
  auto mem = SharedMemory::Anonymous(OpQueueBytes(8));
  ASSERT_TRUE(mem.ok());
  auto c = ClientEnd::Attach((*mem)->data(), (*mem)->size());  // all zeros
  EXPECT_TRUE(absl::IsFailedPrecondition(c.status())) << c.status();
  ASSERT_TRUE(DaemonEnd::Format((*mem)->data(), (*mem)->size(), 8).ok());
  EXPECT_TRUE(ClientEnd::Attach((*mem)->data(), (*mem)->size()).ok());
  EXPECT_FALSE(ClientEnd::Attach((*mem)->data(), 4096).ok());  // shorter than the rings
  EXPECT_FALSE(DaemonEnd::Format((*mem)->data(), (*mem)->size(), 16).ok());  // does not fit
  EXPECT_FALSE(DaemonEnd::Format((*mem)->data(), (*mem)->size(), 6).ok());   // not a power of 2
}

TEST(OpQueueEntries, RoundTrip) {
  OpDesc op;
  op.kind = CollectiveKind::kBroadcast;
  op.dtype = DType::kBF16;
  op.op = ReduceOp::kMax;
  op.root = 3;
  op.tag = -7;
  op.premul_factor = -0.375;
  op.buffer_id = 9;
  op.offset_bytes = 64;
  op.count = 1000;
  op.timeout = absl::Microseconds(1233001);  // rounded up to whole ms
  op.algorithm = "tree";
  op.name = std::string(kMaxOpNameChars, 'n');
  SubmissionEntry e;
  ASSERT_TRUE(EncodeSubmission(7, op, &e).ok());
  EXPECT_EQ(e.token, 7u);
  EXPECT_EQ(e.timeout_ms, 1234);
  OpDesc back;
  ASSERT_TRUE(DecodeSubmission(e, &back).ok());
  EXPECT_EQ(back.kind, CollectiveKind::kBroadcast);
  EXPECT_EQ(back.dtype, DType::kBF16);
  EXPECT_EQ(back.op, ReduceOp::kMax);
  EXPECT_EQ(back.root, 3);
  EXPECT_EQ(back.tag, -7);
  EXPECT_EQ(back.premul_factor, -0.375);
  EXPECT_EQ(back.buffer_id, 9u);
  EXPECT_EQ(back.offset_bytes, 64u);
  EXPECT_EQ(back.count, 1000u);
  EXPECT_EQ(back.timeout, absl::Milliseconds(1234));
  EXPECT_EQ(back.algorithm, "tree");
  EXPECT_EQ(back.name, op.name);
}

TEST(OpQueueEntries, EncodeRefusesWhatDoesNotFit) {
  OpDesc op;
  SubmissionEntry e;
  op.name = std::string(kMaxOpNameChars + 1, 'x');
  absl::Status s = EncodeSubmission(1, op, &e);
  EXPECT_TRUE(absl::IsInvalidArgument(s));
  EXPECT_THAT(std::string(s.message()), HasSubstr("op name is 257 bytes; the limit is 256"));
  op.name = "g";
  op.algorithm = "a-very-long-algorithm";
  EXPECT_TRUE(absl::IsInvalidArgument(EncodeSubmission(1, op, &e)));
  op.algorithm = "";
  EXPECT_TRUE(absl::IsInvalidArgument(EncodeSubmission(0, op, &e)));
  op.timeout = absl::Milliseconds(-1);
  EXPECT_TRUE(absl::IsInvalidArgument(EncodeSubmission(1, op, &e)));
}

TEST(OpQueueEntries, DecodeRefusesGarbageWithoutReadingPastTheEntry) {
  SubmissionEntry good = Entry(5);
  auto refuse = [](SubmissionEntry e, const std::string& what) {
    OpDesc op;
    absl::Status s = DecodeSubmission(e, &op);
    EXPECT_TRUE(absl::IsInvalidArgument(s)) << what << ": " << s;
    if (!s.ok()) EXPECT_THAT(std::string(s.message()), HasSubstr("token")) << what;
  };
  SubmissionEntry e = good;
  e.name_len = 60000;  // "not terminated": runs past the field
  refuse(e, "name length");
  e = good;
  e.algorithm_len = 200;
  refuse(e, "algorithm length");
  e = good;
  e.token = 0;
  refuse(e, "token");
  // Random bytes never crash it.
  uint32_t x = 12345;
  for (int i = 0; i < 10000; ++i) {
    unsigned char* p = reinterpret_cast<unsigned char*>(&e);
    for (size_t b = 0; b < sizeof(e); ++b) {
      x = x * 1103515245 + 12345;
      p[b] = static_cast<unsigned char>(x >> 16);
    }
    OpDesc op;
    if (DecodeSubmission(e, &op).ok()) {
      EXPECT_LE(op.name.size(), kMaxOpNameChars);
      EXPECT_LE(op.algorithm.size(), kMaxAlgorithmChars);
    }
  }
}

// What the layout does not forbid is kept as it came, for ValidateOp
// (collective/op_validation.h) to refuse with the op's name, as it refuses
// the same op from gRPC.
TEST(OpQueueEntries, DecodeLeavesTheOpsOwnChecksToValidateOp) {
  SubmissionEntry e = Entry(5);
  e.collective = 99;
  e.dtype = 42;
  e.reduce_op = 0;
  e.count = ~uint64_t{0};
  e.timeout_ms = -1;
  OpDesc op;
  ASSERT_TRUE(DecodeSubmission(e, &op).ok());
  EXPECT_EQ(static_cast<int>(op.kind), 99);
  EXPECT_EQ(static_cast<int>(op.dtype), 42);
  EXPECT_EQ(static_cast<int>(op.op), 0);
  EXPECT_EQ(op.count, ~uint64_t{0});
  EXPECT_EQ(op.timeout, absl::Milliseconds(-1));
}

TEST(OpQueueEntries, LongErrorMessagesAreTruncatedAndSaySo) {
  OpCompletion c;
  c.token = 3;
  c.status = absl::AbortedError(std::string(5000, 'e'));
  CompletionEntry e;
  EncodeCompletion(c, &e);
  EXPECT_EQ(e.truncated, 1);
  auto back = DecodeCompletion(e);
  ASSERT_TRUE(back.ok());
  EXPECT_EQ(back->status.code(), absl::StatusCode::kAborted);
  EXPECT_EQ(back->status.message().size(), kMaxErrorMessageBytes);
  EXPECT_TRUE(absl::EndsWith(back->status.message(), " ... [truncated from 5000 bytes]"))
      << back->status.message().substr(900);

  c.status = absl::InvalidArgumentError("short");
  EncodeCompletion(c, &e);
  EXPECT_EQ(e.truncated, 0);
  back = DecodeCompletion(e);
  EXPECT_EQ(back->status, absl::InvalidArgumentError("short"));

  e.message_len = 5000;
  EXPECT_TRUE(absl::IsDataLoss(DecodeCompletion(e).status()));
  e.message_len = 1;
  e.code = 999;
  EXPECT_EQ(DecodeCompletion(e)->status.code(), absl::StatusCode::kUnknown);
}

TEST(OpQueue, CloseIsVisibleToTheClientWithItsReason) {
  Queue q = MakeQueue(4);
  EXPECT_TRUE(q.client->closed_status().ok());
  q.daemon->Close(absl::FailedPreconditionError("session s-1 was closed"));
  EXPECT_EQ(q.client->closed_status(), absl::FailedPreconditionError("session s-1 was closed"));
}

TEST(OpQueue, NamedSegmentIsUnlinkedOnDestruction) {
  const std::string name = absl::StrCat("/gradsync-ipc-test.", ::getpid(), ".", absl::ToUnixNanos(absl::Now()));
  {
    auto mem = SharedMemory::Create(name, 4096);
    ASSERT_TRUE(mem.ok()) << mem.status();
    EXPECT_TRUE(absl::IsAlreadyExists(SharedMemory::Create(name, 4096).status()));
    auto other = SharedMemory::Open(name, 4096);
    ASSERT_TRUE(other.ok()) << other.status();
    static_cast<char*>((*mem)->data())[10] = 42;
    EXPECT_EQ(static_cast<char*>((*other)->data())[10], 42);
    EXPECT_TRUE(absl::IsFailedPrecondition(SharedMemory::Open(name, 8192).status()));
  }
  EXPECT_TRUE(absl::IsNotFound(SharedMemory::Open(name, 4096).status()));
}

}  // namespace
}  // namespace ipc
}  // namespace gradsync
