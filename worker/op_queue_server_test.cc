#include "worker/op_queue_server.h"

#include <sys/stat.h>
#include <unistd.h>

#include <cstring>
#include <deque>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "ipc/op_queue.h"
#include "ipc/shared_memory.h"

namespace gradsync {
namespace {

using ::testing::HasSubstr;

// A session stand-in: ops run in order on one thread; buffer 999 does not
// exist; `Hold()` stops the executor until `Release()`.
class FakeBackend final : public OpQueueBackend {
 public:
  FakeBackend() : executor_([this] { Run(); }) {}
  ~FakeBackend() override { Stop(); }
  // Stops the executor. TearDown calls it first: a listener call in flight
  // may hold the last reference to the queue, and so to this backend, and
  // must not destroy it on the executor's own thread.
  void Stop() {
    {
      absl::MutexLock l(&mu_);
      stopping_ = true;
    }
    if (executor_.joinable()) executor_.join();
  }

  const std::string& session_id() const override { return id_; }

  absl::StatusOr<uint64_t> Submit(const OpDesc& op) override {
    absl::MutexLock l(&mu_);
    if (closed_) return absl::FailedPreconditionError("session is closed");
    if (op.buffer_id == 999) {
      return absl::NotFoundError(absl::StrCat("buffer 999 does not exist in session ", id_));
    }
    const uint64_t id = next_op_++;
    queue_.push_back({id, op.name});
    return id;
  }
  // An op that did not come through the queue (like a Worker.Submit RPC).
  uint64_t SubmitDirectly() {
    absl::MutexLock l(&mu_);
    const uint64_t id = next_op_++;
    queue_.push_back({id, "direct"});
    return id;
  }
  void SetCompletionListener(Listener listener) override {
    absl::MutexLock l(&mu_);
    listener_ = std::move(listener);
  }
  void Touch() override {
    absl::MutexLock l(&mu_);
    ++touches_;
  }
  bool closed() const override {
    absl::MutexLock l(&mu_);
    return closed_;
  }
  absl::Status health() const override {
    absl::MutexLock l(&mu_);
    return closed_ ? absl::CancelledError("session closed") : absl::OkStatus();
  }

  void Hold() {
    absl::MutexLock l(&mu_);
    held_ = true;
  }
  void Release() {
    absl::MutexLock l(&mu_);
    held_ = false;
  }
  void MarkClosed() {
    absl::MutexLock l(&mu_);
    closed_ = true;
  }
  int touches() const {
    absl::MutexLock l(&mu_);
    return touches_;
  }
  // Waits until `n` ops have finished and been handed to the listener.
  bool AwaitFinished(int n, absl::Duration timeout) {
    absl::MutexLock l(&mu_);
    auto done = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return finished_ >= n; };
    return mu_.AwaitWithTimeout(absl::Condition(&done), timeout);
  }
  std::vector<uint64_t> unreported() const {
    absl::MutexLock l(&mu_);
    return unreported_;
  }
  bool has_listener() const {
    absl::MutexLock l(&mu_);
    return static_cast<bool>(listener_);
  }

 private:
  struct Op {
    uint64_t id;
    std::string name;
  };
  void Run() {
    while (true) {
      Op op;
      Listener listener;
      {
        absl::MutexLock l(&mu_);
        auto ready = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
          return stopping_ || (!held_ && !queue_.empty());
        };
        mu_.Await(absl::Condition(&ready));
        if (stopping_) return;
        op = queue_.front();
        queue_.pop_front();
        listener = listener_;
      }
      ipc::OpCompletion c;
      c.algorithm = "fake";
      c.run_time = absl::Microseconds(static_cast<int64_t>(op.id));
      if (op.name == "fail") c.status = absl::AbortedError(absl::StrCat("op ", op.id, " failed at rank 1"));
      const bool reported = listener && listener(op.id, c);
      absl::MutexLock l(&mu_);
      if (!reported) unreported_.push_back(op.id);
      ++finished_;
    }
  }

  const std::string id_ = "s-1";
  mutable absl::Mutex mu_;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  bool held_ ABSL_GUARDED_BY(mu_) = false;
  bool closed_ ABSL_GUARDED_BY(mu_) = false;
  int touches_ ABSL_GUARDED_BY(mu_) = 0;
  int finished_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t next_op_ ABSL_GUARDED_BY(mu_) = 1;
  std::deque<Op> queue_ ABSL_GUARDED_BY(mu_);
  std::vector<uint64_t> unreported_ ABSL_GUARDED_BY(mu_);
  Listener listener_ ABSL_GUARDED_BY(mu_);
  std::thread executor_;
};

std::string TestPrefix() {
  return absl::StrCat("/gradsync-oqs-test.", ::getpid(), ".", absl::ToUnixNanos(absl::Now()), "-q");
}

bool SegmentExists(const std::string& name) {
  struct stat st;
  return ::stat(("/dev/shm" + name).c_str(), &st) == 0;
}

class OpQueueServerTest : public ::testing::Test {
 protected:
  void Open(uint32_t capacity, OpQueueServerOptions options = {}) {
    options.name_prefix = TestPrefix();
    options.poll_interval = absl::Milliseconds(50);
    server_ = std::make_unique<OpQueueServer>(options);
    backend_ = std::make_shared<FakeBackend>();
    auto info = server_->Open(backend_, capacity);
    ASSERT_TRUE(info.ok()) << info.status();
    info_ = *info;
    auto mem = ipc::SharedMemory::Open(info_.shm_name, info_.size_bytes);
    ASSERT_TRUE(mem.ok()) << mem.status();
    mem_ = std::move(*mem);
    auto end = ipc::ClientEnd::Attach(mem_->data(), mem_->size());
    ASSERT_TRUE(end.ok()) << end.status();
    client_ = std::make_unique<ipc::ClientEnd>(*end);
  }
  void TearDown() override {
    if (backend_ != nullptr) backend_->Stop();
    server_.reset();  // stops the pollers before the backend goes
    backend_.reset();
    if (!info_.shm_name.empty()) {
      EXPECT_FALSE(SegmentExists(info_.shm_name));
    }
  }

  void Submit(uint64_t token, uint64_t buffer_id = 1, const std::string& name = "g") {
    OpDesc op;
    op.buffer_id = buffer_id;
    op.count = 1;
    op.name = name;
    ipc::SubmissionEntry e;
    ASSERT_TRUE(ipc::EncodeSubmission(token, op, &e).ok());
    auto pushed = client_->PushSubmission(e);
    ASSERT_TRUE(pushed.ok() && *pushed) << "ring full or broken";
    client_->submission_bell().Ring();
  }

  // Collects `n` completions (or fewer by the deadline), reading the ring
  // like the client SDK does.
  std::vector<ipc::OpCompletion> Collect(size_t n, absl::Duration within = absl::Seconds(5)) {
    std::vector<ipc::OpCompletion> out;
    const absl::Time deadline = absl::Now() + within;
    while (out.size() < n && absl::Now() < deadline) {
      ipc::Doorbell bell = client_->completion_bell();
      const uint32_t snap = bell.Snapshot();
      bool got_any = false;
      ipc::CompletionEntry e;
      while (true) {
        auto got = client_->PopCompletion(&e);
        EXPECT_TRUE(got.ok()) << got.status();
        if (!got.ok() || !*got) break;
        got_any = true;
        auto c = ipc::DecodeCompletion(e);
        EXPECT_TRUE(c.ok()) << c.status();
        if (c.ok()) out.push_back(*c);
      }
      if (got_any && client_->overflow()) client_->submission_bell().Ring();
      if (!got_any) bell.Wait(snap, absl::Milliseconds(50));
    }
    return out;
  }

  absl::Status WaitClosed(absl::Duration within = absl::Seconds(3)) {
    const absl::Time deadline = absl::Now() + within;
    while (absl::Now() < deadline) {
      absl::Status s = client_->closed_status();
      if (!s.ok()) return s;
      absl::SleepFor(absl::Milliseconds(5));
    }
    return absl::OkStatus();
  }

  std::unique_ptr<OpQueueServer> server_;
  std::shared_ptr<FakeBackend> backend_;
  OpQueueInfo info_;
  std::unique_ptr<ipc::SharedMemory> mem_;
  std::unique_ptr<ipc::ClientEnd> client_;
};

TEST_F(OpQueueServerTest, OpsCompleteThroughTheQueueWithTheirTokens) {
  Open(8);
  EXPECT_EQ(info_.capacity, 8u);
  EXPECT_EQ(info_.size_bytes, ipc::OpQueueBytes(8));
  Submit(10);
  Submit(11, 1, "fail");
  Submit(12);
  auto done = Collect(3);
  ASSERT_EQ(done.size(), 3u);
  EXPECT_EQ(done[0].token, 10u);
  EXPECT_EQ(done[0].op_id, 1u);
  EXPECT_TRUE(done[0].status.ok());
  EXPECT_EQ(done[0].algorithm, "fake");
  EXPECT_EQ(done[1].token, 11u);
  EXPECT_EQ(done[1].status, absl::AbortedError("op 2 failed at rank 1"));
  EXPECT_EQ(done[2].token, 12u);
  EXPECT_TRUE(backend_->unreported().empty());
}

TEST_F(OpQueueServerTest, RefusedSubmissionIsAnsweredAtOnceWithTheSessionsError) {
  Open(8);
  Submit(1, 999);
  Submit(2);
  auto done = Collect(2);
  ASSERT_EQ(done.size(), 2u);
  EXPECT_EQ(done[0].token, 1u);
  EXPECT_EQ(done[0].op_id, 0u);
  EXPECT_EQ(done[0].status, absl::NotFoundError("buffer 999 does not exist in session s-1"));
  EXPECT_EQ(done[1].token, 2u);
  EXPECT_TRUE(done[1].status.ok());
}

TEST_F(OpQueueServerTest, GarbageEntriesAreRefusedAndTheQueueKeepsServing) {
  Open(8);
  backend_->Hold();
  ipc::SubmissionEntry e;
  std::memset(&e, 0xff, sizeof(e));  // every length and enum out of range
  e.token = 5;
  ASSERT_TRUE(*client_->PushSubmission(e));
  client_->submission_bell().Ring();
  Submit(6);
  Submit(6);  // a token used before
  auto done = Collect(2);
  backend_->Release();
  auto rest = Collect(1);
  done.insert(done.end(), rest.begin(), rest.end());
  ASSERT_EQ(done.size(), 3u);
  EXPECT_EQ(done[0].token, 5u);
  EXPECT_TRUE(absl::IsInvalidArgument(done[0].status)) << done[0].status;
  EXPECT_THAT(std::string(done[0].status.message()), HasSubstr("op name length 65535"));
  // The refusal of the duplicate comes at once, before the first 6 runs.
  EXPECT_EQ(done[1].token, 6u);
  EXPECT_THAT(std::string(done[1].status.message()),
              HasSubstr("token 6 is not above the previous token 6"));
  EXPECT_EQ(done[2].token, 6u);
  EXPECT_TRUE(done[2].status.ok()) << done[2].status;
  EXPECT_TRUE(client_->closed_status().ok());
}

TEST_F(OpQueueServerTest, ImpossibleIndexClosesTheQueueAndUnlinksIt) {
  Open(8);
  client_->header()->sq_tail.store(12345);
  client_->submission_bell().Ring();
  absl::Status closed = WaitClosed();
  EXPECT_TRUE(absl::IsDataLoss(closed)) << closed;
  EXPECT_THAT(std::string(closed.message()), HasSubstr("impossible"));
  for (int i = 0; i < 100 && server_->queue_count() > 0; ++i) absl::SleepFor(absl::Milliseconds(10));
  EXPECT_EQ(server_->queue_count(), 0u);
  EXPECT_FALSE(SegmentExists(info_.shm_name));
  EXPECT_FALSE(backend_->has_listener());
}

TEST_F(OpQueueServerTest, OverwrittenHeaderClosesTheQueue) {
  Open(8);
  client_->header()->fixed.magic = 0xdeadbeef;
  absl::Status closed = WaitClosed();
  EXPECT_TRUE(absl::IsDataLoss(closed)) << closed;
  EXPECT_THAT(std::string(closed.message()), HasSubstr("header was overwritten"));
}

TEST_F(OpQueueServerTest, CompletionsBeyondTheRingWaitInOverflowAndAreNeverDropped) {
  Open(4);
  backend_->Hold();
  auto taken = [&](uint64_t n) {  // waits until the daemon took n submissions
    for (int i = 0; i < 1000 && client_->header()->sq_head.load() < n; ++i) {
      absl::SleepFor(absl::Milliseconds(5));
    }
    return client_->header()->sq_head.load() == n;
  };
  for (uint64_t t = 1; t <= 4; ++t) Submit(t);
  ASSERT_TRUE(taken(4));
  for (uint64_t t = 5; t <= 8; ++t) Submit(t);
  ASSERT_TRUE(taken(8));
  backend_->Release();
  // All 8 finish while the client reads nothing: 4 fit, 4 overflow.
  ASSERT_TRUE(backend_->AwaitFinished(8, absl::Seconds(10)));
  EXPECT_TRUE(client_->overflow());
  auto done = Collect(8);
  ASSERT_EQ(done.size(), 8u);
  for (uint64_t t = 1; t <= 8; ++t) EXPECT_EQ(done[t - 1].token, t);
  EXPECT_FALSE(client_->overflow());
}

TEST_F(OpQueueServerTest, OutstandingOpsAreBoundedByLeavingEntriesInTheRing) {
  OpQueueServerOptions o;
  o.max_outstanding = 3;
  Open(16, o);
  backend_->Hold();
  for (uint64_t t = 1; t <= 10; ++t) Submit(t);
  const absl::Time deadline = absl::Now() + absl::Seconds(10);
  while (client_->header()->sq_head.load() < 3 && absl::Now() < deadline) {
    absl::SleepFor(absl::Milliseconds(5));
  }
  ASSERT_EQ(client_->header()->sq_head.load(), 3u);
  // The poller bumps the heartbeat, then looks at the ring, every tick: two
  // more beats and it has looked at all 10 entries since, and left 7.
  const uint64_t beat = client_->daemon_heartbeat();
  while (client_->daemon_heartbeat() < beat + 2 && absl::Now() < deadline) {
    absl::SleepFor(absl::Milliseconds(5));
  }
  ASSERT_GE(client_->daemon_heartbeat(), beat + 2);
  EXPECT_EQ(client_->header()->sq_head.load(), 3u);
  backend_->Release();
  auto done = Collect(10);
  ASSERT_EQ(done.size(), 10u);
  for (uint64_t t = 1; t <= 10; ++t) EXPECT_EQ(done[t - 1].token, t);
}

TEST_F(OpQueueServerTest, ClosedSessionClosesItsQueue) {
  Open(8);
  backend_->MarkClosed();
  absl::Status closed = WaitClosed();
  EXPECT_TRUE(absl::IsFailedPrecondition(closed)) << closed;
  EXPECT_EQ(closed.message(), "session s-1 is closed: session closed");
  for (int i = 0; i < 100 && SegmentExists(info_.shm_name); ++i) absl::SleepFor(absl::Milliseconds(10));
  EXPECT_FALSE(SegmentExists(info_.shm_name));
}

TEST_F(OpQueueServerTest, CloseSessionStopsTheQueueAtOnceWithTheReason) {
  Open(8);
  const absl::Time start = absl::Now();
  server_->CloseSession("s-1", absl::FailedPreconditionError("session s-1 was closed by its client"));
  EXPECT_LT(absl::Now() - start, absl::Milliseconds(500));
  EXPECT_EQ(client_->closed_status(),
            absl::FailedPreconditionError("session s-1 was closed by its client"));
  EXPECT_FALSE(SegmentExists(info_.shm_name));
  EXPECT_EQ(server_->queue_count(), 0u);
}

TEST_F(OpQueueServerTest, HeartbeatsFlowBothWays) {
  Open(8);
  const uint64_t hb0 = client_->daemon_heartbeat();
  const absl::Time deadline = absl::Now() + absl::Seconds(10);
  while (client_->daemon_heartbeat() < hb0 + 3 && absl::Now() < deadline) {  // poll interval 50 ms here
    absl::SleepFor(absl::Milliseconds(5));
  }
  EXPECT_GE(client_->daemon_heartbeat(), hb0 + 3);
  const int touches = backend_->touches();
  client_->BumpHeartbeat();
  for (int i = 0; i < 100 && backend_->touches() == touches; ++i) absl::SleepFor(absl::Milliseconds(10));
  EXPECT_GT(backend_->touches(), touches);
}

TEST_F(OpQueueServerTest, OpsSubmittedElsewhereAreLeftToTheirOwner) {
  Open(8);
  const uint64_t id = backend_->SubmitDirectly();
  Submit(1);
  auto done = Collect(1);
  ASSERT_EQ(done.size(), 1u);
  EXPECT_EQ(done[0].token, 1u);
  EXPECT_EQ(backend_->unreported(), std::vector<uint64_t>{id});
}

TEST_F(OpQueueServerTest, OneQueuePerSessionAndNoneAfterShutdown) {
  Open(8);
  EXPECT_TRUE(absl::IsAlreadyExists(server_->Open(backend_, 8).status()));
  EXPECT_TRUE(absl::IsInvalidArgument(server_->Open(std::make_shared<FakeBackend>(), 5000).status()));
  server_->Shutdown();
  absl::Status closed = client_->closed_status();
  EXPECT_TRUE(absl::IsUnavailable(closed)) << closed;
  EXPECT_FALSE(SegmentExists(info_.shm_name));
  EXPECT_TRUE(absl::IsUnavailable(server_->Open(std::make_shared<FakeBackend>(), 8).status()));
}

}  // namespace
}  // namespace gradsync
