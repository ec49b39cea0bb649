#include "client/client.h"

#include <dirent.h>
#include <stdlib.h>
#include <sys/stat.h>

#include <atomic>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "client/fake_worker.h"
#include "common/types.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace gradsync {
namespace client {
namespace {

using ::gradsync::client::testing::FakeWorker;
using ::testing::HasSubstr;

// Entries of /dev/shm created by any FakeWorker of this process.
std::vector<std::string> LeftoverSegments() {
  std::vector<std::string> left;
  const std::string prefix = FakeWorker::ShmPrefix().substr(1);  // without the leading '/'
  DIR* dir = opendir("/dev/shm");
  if (dir == nullptr) return left;
  while (struct dirent* e = readdir(dir)) {
    if (absl::StartsWith(e->d_name, prefix)) left.push_back(e->d_name);
  }
  closedir(dir);
  return left;
}

bool SegmentExists(const std::string& shm_name) {
  struct stat st;
  return stat(("/dev/shm" + shm_name).c_str(), &st) == 0;
}

std::string NewAddress() { return FakeWorker::NewAddress(); }

class ClientTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto fake = FakeWorker::Start(NewAddress());
    ASSERT_TRUE(fake.ok()) << fake.status();
    fake_ = std::move(*fake);
    auto client = Client::Connect(fake_->address(), absl::Seconds(5));
    ASSERT_TRUE(client.ok()) << client.status();
    client_ = std::move(*client);
    SessionOptions options;
    options.job_id = "job-1";
    options.world_size = 1;
    options.timeout = absl::Seconds(3);
    options.op_timeout_ms = 5000;
    auto session = client_->OpenSession(options);
    ASSERT_TRUE(session.ok()) << session.status();
    session_ = std::move(*session);
  }

  void TearDown() override {
    session_.reset();
    client_.reset();
    fake_.reset();
    EXPECT_THAT(LeftoverSegments(), ::testing::IsEmpty());
  }

  std::unique_ptr<Buffer> Alloc(size_t bytes) {
    auto buffer = session_->AllocateBuffer(bytes);
    EXPECT_TRUE(buffer.ok()) << buffer.status();
    return buffer.ok() ? std::move(*buffer) : nullptr;
  }

  std::unique_ptr<FakeWorker> fake_;
  std::unique_ptr<Client> client_;
  std::unique_ptr<Session> session_;
};

TEST(ClientConnect, MissingDaemonIsUnavailableNamingTargetWithinTimeout) {
  const std::string target = NewAddress() + "-nobody-listens";
  const absl::Time start = absl::Now();
  auto client = Client::Connect(target, absl::Milliseconds(300));
  const absl::Duration took = absl::Now() - start;
  ASSERT_FALSE(client.ok());
  EXPECT_EQ(client.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(std::string(client.status().message()), HasSubstr(target));
  EXPECT_LT(took, absl::Seconds(3));
}

TEST(ClientConnect, RejectsEmptyTargetAndBadTimeout) {
  EXPECT_EQ(Client::Connect("").status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(Client::Connect("unix-abstract:x", absl::ZeroDuration()).status().code(),
            absl::StatusCode::kInvalidArgument);
}

// A unix socket path longer than the kernel's limit is named at once, not
// after the timeout behind gRPC's own log lines.
TEST(ClientConnect, AUnixPathLongerThanTheKernelAllowsIsNamedAtOnce) {
  const std::string path = "/tmp/" + std::string(120, 'p') + ".sock";
  const absl::Time start = absl::Now();
  for (const std::string& target : {"unix:" + path, "unix://" + path}) {
    auto client = Client::Connect(target, absl::Seconds(5));
    ASSERT_FALSE(client.ok());
    EXPECT_EQ(client.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_EQ(client.status().message(),
              absl::StrCat("Connect: the unix socket path '", path, "' is ", path.size(),
                           " bytes; the kernel allows at most 107 (start gradsyncd with a "
                           "shorter --listen, e.g. under /run)"));
  }
  EXPECT_LT(absl::Now() - start, absl::Seconds(1));
}

TEST(ClientConnect, WaitsForADaemonThatStartsLate) {
  const std::string address = NewAddress();
  std::unique_ptr<FakeWorker> fake;
  std::atomic<bool> connecting{false};
  absl::Time connect_start;
  std::thread starter([&] {
    // Lateness is the behaviour under test: the daemon starts 300 ms after
    // Connect began (past gRPC's first 100 ms reconnect backoff, so Connect
    // has found nobody at least once).
    while (!connecting.load()) absl::SleepFor(absl::Milliseconds(1));
    absl::SleepFor(absl::Milliseconds(300));
    auto started = FakeWorker::Start(address);
    ASSERT_TRUE(started.ok()) << started.status();
    fake = std::move(*started);
  });
  connect_start = absl::Now();
  connecting = true;
  auto client = Client::Connect(address, absl::Seconds(20));
  const absl::Duration took = absl::Now() - connect_start;
  starter.join();
  EXPECT_TRUE(client.ok()) << client.status();
  EXPECT_GE(took, absl::Milliseconds(300)) << "connected before the daemon started";
}

TEST_F(ClientTest, OpenSessionReportsRankAndForwardsOptions) {
  EXPECT_EQ(session_->rank(), 0);
  EXPECT_EQ(session_->world_size(), 1);
  EXPECT_EQ(session_->epoch(), 1);
  EXPECT_FALSE(session_->id().empty());
  const auto req = fake_->last_open_request();
  EXPECT_EQ(req.job_id(), "job-1");
  EXPECT_EQ(req.rank(), -1);
  EXPECT_EQ(req.timeout_ms(), 3000);
  EXPECT_EQ(req.options().op_timeout_ms(), 5000);
}

TEST_F(ClientTest, OpenSessionRejectsBadOptionsWithoutRpc) {
  const int64_t rpcs = fake_->rpc_count();
  SessionOptions options;
  options.job_id = "job-1";
  options.world_size = 2;
  options.rank = 2;
  auto session = client_->OpenSession(options);
  EXPECT_EQ(session.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(session.status().message()), HasSubstr("rank 2"));
  options.rank = 0;
  options.job_id.clear();
  EXPECT_EQ(client_->OpenSession(options).status().code(), absl::StatusCode::kInvalidArgument);
  options.job_id = "job-1";
  options.world_size = 0;
  EXPECT_EQ(client_->OpenSession(options).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(fake_->rpc_count(), rpcs);
}

TEST_F(ClientTest, AllreduceResultIsTheDaemonsInPlaceWrite) {
  constexpr size_t kCount = 1 << 20;  // 4 MiB of f32
  std::unique_ptr<Buffer> buf = Alloc(kCount * sizeof(float));
  ASSERT_NE(buf, nullptr);
  ASSERT_GE(buf->size(), kCount * sizeof(float));
  float* x = buf->as<float>();
  for (size_t i = 0; i < kCount; ++i) x[i] = static_cast<float>(i % 1000);

  auto result = session_->Allreduce(*buf, 0, kCount, DType::kF32, ReduceOp::kSum, "grad/all");
  ASSERT_TRUE(result.ok()) << result.status();
  EXPECT_EQ(result->algorithm, "fake-local");
  EXPECT_GE(result->run_time, absl::ZeroDuration());
  for (size_t i = 0; i < kCount; ++i) ASSERT_EQ(x[i], 2.0f * (i % 1000)) << i;
  // Only the descriptor went through gRPC, never the 4 MiB.
  EXPECT_LT(fake_->last_submit_request().ByteSizeLong(), 128u);
  EXPECT_EQ(fake_->last_submit_request().dtype(), v1::DATA_TYPE_F32);
  EXPECT_EQ(fake_->last_submit_request().reduce_op(), v1::REDUCE_OP_SUM);
}

TEST_F(ClientTest, AllreduceTouchesOnlyItsRange) {
  std::unique_ptr<Buffer> buf = Alloc(64 * sizeof(int32_t));
  ASSERT_NE(buf, nullptr);
  int32_t* x = buf->as<int32_t>();
  for (int i = 0; i < 64; ++i) x[i] = i;
  auto result = session_->Allreduce(*buf, 16 * sizeof(int32_t), 8, DType::kI32, ReduceOp::kMax,
                                    "grad/slice", absl::Seconds(2));
  ASSERT_TRUE(result.ok()) << result.status();
  for (int i = 0; i < 64; ++i) EXPECT_EQ(x[i], (i >= 16 && i < 24) ? 2 * i : i) << i;
  const auto req = fake_->last_submit_request();
  EXPECT_EQ(req.offset_bytes(), 64u);
  EXPECT_EQ(req.count(), 8u);
  EXPECT_EQ(req.dtype(), v1::DATA_TYPE_I32);
  EXPECT_EQ(req.reduce_op(), v1::REDUCE_OP_MAX);
  EXPECT_EQ(req.timeout_ms(), 2000);
}

TEST_F(ClientTest, ShortWaitIsDeadlineExceededWhileOpRunsThenOk) {
  fake_->set_op_delay(absl::Milliseconds(600));
  std::unique_ptr<Buffer> buf = Alloc(16 * sizeof(float));
  ASSERT_NE(buf, nullptr);
  for (int i = 0; i < 16; ++i) buf->as<float>()[i] = 1.5f;

  auto op = session_->AllreduceAsync(*buf, 0, 16, DType::kF32, ReduceOp::kSum, "grad/slow");
  ASSERT_TRUE(op.ok()) << op.status();
  EXPECT_EQ(op->sequence, 1u);

  const absl::Time start = absl::Now();
  auto early = session_->Wait(*op, absl::Milliseconds(50));
  EXPECT_LT(absl::Now() - start, absl::Milliseconds(500));
  ASSERT_EQ(early.status().code(), absl::StatusCode::kDeadlineExceeded) << early.status();
  EXPECT_TRUE(IsStillRunning(early.status())) << early.status();
  EXPECT_FALSE(IsStillRunning(absl::DeadlineExceededError(early.status().message())));
  EXPECT_THAT(std::string(early.status().message()), HasSubstr("grad/slow"));
  EXPECT_THAT(std::string(early.status().message()), HasSubstr(absl::StrCat("op ", op->op_id)));
  auto polled = session_->Poll(*op);
  ASSERT_TRUE(polled.ok()) << polled.status();
  EXPECT_FALSE(*polled);
  EXPECT_EQ(buf->as<float>()[0], 1.5f);  // not written yet

  auto done = session_->Wait(*op, absl::Seconds(5));
  ASSERT_TRUE(done.ok()) << done.status();
  EXPECT_GE(done->run_time, absl::Milliseconds(500));
  EXPECT_EQ(buf->as<float>()[15], 3.0f);
  polled = session_->Poll(*op);
  ASSERT_TRUE(polled.ok()) << polled.status();
  EXPECT_TRUE(*polled);
}

TEST_F(ClientTest, InfiniteWaitReturnsWhenTheOpEnds) {
  fake_->set_op_delay(absl::Milliseconds(100));
  std::unique_ptr<Buffer> buf = Alloc(sizeof(double));
  ASSERT_NE(buf, nullptr);
  *buf->as<double>() = 21;
  auto op = session_->AllreduceAsync(*buf, 0, 1, DType::kF64, ReduceOp::kAvg, "");
  ASSERT_TRUE(op.ok()) << op.status();
  auto done = session_->Wait(*op, absl::InfiniteDuration());
  ASSERT_TRUE(done.ok()) << done.status();
  EXPECT_EQ(*buf->as<double>(), 42);
}

TEST_F(ClientTest, FailedOpErrorComesThroughVerbatim) {
  const std::string message = "allreduce 'grad/w' (seq 1) aborted: rank 2 missed heartbeats for 5s";
  fake_->FailNextOp(absl::AbortedError(message));
  std::unique_ptr<Buffer> buf = Alloc(64);
  ASSERT_NE(buf, nullptr);
  auto result = session_->Allreduce(*buf, 0, 16, DType::kF32, ReduceOp::kSum, "grad/w");
  EXPECT_EQ(result.status().code(), absl::StatusCode::kAborted);
  EXPECT_EQ(result.status().message(), message);

  // Poll reports the same error; the next op runs normally.
  fake_->FailNextOp(absl::AbortedError(message));
  auto op = session_->AllreduceAsync(*buf, 0, 16, DType::kF32, ReduceOp::kSum, "grad/w");
  ASSERT_TRUE(op.ok()) << op.status();
  ASSERT_FALSE(session_->Wait(*op, absl::Seconds(5)).ok());
  auto polled = session_->Poll(*op);
  EXPECT_EQ(polled.status().code(), absl::StatusCode::kAborted);
  EXPECT_EQ(polled.status().message(), message);
  EXPECT_TRUE(session_->Allreduce(*buf, 0, 16, DType::kF32, ReduceOp::kSum, "grad/w").ok());
}

TEST_F(ClientTest, BadArgumentsFailLocallyWithoutRpcAndNameTheValues) {
  std::unique_ptr<Buffer> buf = Alloc(4096);
  ASSERT_NE(buf, nullptr);
  ASSERT_EQ(buf->size(), 4096u);
  const int64_t rpcs = fake_->rpc_count();
  auto expect_invalid = [&](const absl::StatusOr<OpHandle>& r, std::vector<std::string> parts) {
    ASSERT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument) << r.status();
    for (const std::string& p : parts) {
      EXPECT_THAT(std::string(r.status().message()), HasSubstr(p));
    }
  };
  // Offset past the end.
  expect_invalid(session_->AllreduceAsync(*buf, 4096, 1, DType::kF32, ReduceOp::kSum, "g"),
                 {"offset_bytes 4096", "4096 bytes", "'g'"});
  // Count too large; the words are ValidateOp's (collective/op_validation_test.cc).
  expect_invalid(session_->AllreduceAsync(*buf, 0, 1025, DType::kF32, ReduceOp::kSum, "g"),
                 {absl::StrCat("allreduce 'g' on rank ", session_->rank(),
                               ": count 1025 x 4-byte f32 (4100 bytes) at offset_bytes 0 does not "
                               "fit in buffer ", buf->id(),
                               " (4096 bytes; at most 1024 elements fit)")});
  expect_invalid(session_->AllreduceAsync(*buf, 8, 1023, DType::kF32, ReduceOp::kSum, "g"),
                 {"count 1023", "offset_bytes 8", "at most 1022"});
  // A count whose byte size overflows size_t.
  expect_invalid(
      session_->AllreduceAsync(*buf, 0, SIZE_MAX / 2, DType::kF64, ReduceOp::kSum, "g"),
      {absl::StrCat("count ", SIZE_MAX / 2), "is more than 1099511627776 bytes"});
  // Misaligned offset, bad enums, negative timeout.
  expect_invalid(session_->AllreduceAsync(*buf, 2, 1, DType::kF32, ReduceOp::kSum, "g"),
                 {"offset_bytes 2", "element size 4"});
  expect_invalid(session_->AllreduceAsync(*buf, 0, 1, static_cast<DType>(42), ReduceOp::kSum, "g"),
                 {"dtype 42 is not a valid value"});
  expect_invalid(session_->AllreduceAsync(*buf, 0, 1, DType::kF32, static_cast<ReduceOp>(9), "g"),
                 {"reduce op 9 is not a valid value"});
  expect_invalid(session_->AllreduceAsync(*buf, 0, 1, DType::kF32, ReduceOp::kSum, "g",
                                          absl::Milliseconds(-1)),
                 {"timeout"});
  EXPECT_EQ(session_->Allreduce(*buf, 0, 1025, DType::kF32, ReduceOp::kSum, "g").status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(session_->AllocateBuffer(0).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(session_->FreeBuffer(nullptr).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(fake_->rpc_count(), rpcs);
}

TEST_F(ClientTest, BufferOfAnotherSessionIsRejected) {
  SessionOptions options;
  options.job_id = "job-2";
  auto other = client_->OpenSession(options);
  ASSERT_TRUE(other.ok()) << other.status();
  auto foreign = (*other)->AllocateBuffer(64);
  ASSERT_TRUE(foreign.ok()) << foreign.status();
  const int64_t rpcs = fake_->rpc_count();
  auto op = session_->AllreduceAsync(**foreign, 0, 1, DType::kF32, ReduceOp::kSum, "g");
  EXPECT_EQ(op.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(op.status().message()), HasSubstr((*other)->id()));
  EXPECT_EQ(session_->FreeBuffer(std::move(*foreign)).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(fake_->rpc_count(), rpcs);
}

TEST_F(ClientTest, FreeBufferUnlinksTheSegment) {
  std::unique_ptr<Buffer> buf = Alloc(128);
  ASSERT_NE(buf, nullptr);
  const std::string name = buf->shm_name();
  EXPECT_TRUE(SegmentExists(name)) << name;
  EXPECT_EQ(fake_->live_segments(), 1);
  ASSERT_TRUE(session_->FreeBuffer(std::move(buf)).ok());
  EXPECT_FALSE(SegmentExists(name)) << name;
  EXPECT_EQ(fake_->live_segments(), 0);
}

TEST_F(ClientTest, CloseIsIdempotentAndFreesTheSessionsBuffers) {
  std::unique_ptr<Buffer> a = Alloc(128);
  std::unique_ptr<Buffer> b = Alloc(256);
  ASSERT_NE(a, nullptr);
  ASSERT_NE(b, nullptr);
  EXPECT_EQ(fake_->live_segments(), 2);
  EXPECT_TRUE(session_->Close().ok());
  EXPECT_TRUE(session_->Close().ok());
  EXPECT_EQ(fake_->live_segments(), 0);
  EXPECT_EQ(session_->AllocateBuffer(64).status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(session_->AllreduceAsync(*a, 0, 1, DType::kF32, ReduceOp::kSum, "g").status().code(),
            absl::StatusCode::kFailedPrecondition);
  // The mapping itself is still valid memory after close.
  a->as<char>()[0] = 1;
  EXPECT_TRUE(session_->FreeBuffer(std::move(a)).ok());
  b.reset();  // dropping a Buffer only unmaps
}

TEST_F(ClientTest, DestroyingTheSessionClosesIt) {
  ASSERT_NE(Alloc(4096), nullptr);
  EXPECT_EQ(fake_->live_segments(), 1);
  session_.reset();
  EXPECT_EQ(fake_->live_segments(), 0);
}

TEST_F(ClientTest, SessionOutlivesItsClient) {
  client_.reset();
  std::unique_ptr<Buffer> buf = Alloc(4);
  ASSERT_NE(buf, nullptr);
  *buf->as<int32_t>() = 7;
  ASSERT_TRUE(session_->Allreduce(*buf, 0, 1, DType::kI32, ReduceOp::kSum, "g").ok());
  EXPECT_EQ(*buf->as<int32_t>(), 14);
}

TEST_F(ClientTest, ConcurrentSubmittersGetDistinctSequences) {
  constexpr int kThreads = 4;
  constexpr int kOpsPerThread = 10;
  std::vector<std::unique_ptr<Buffer>> bufs;
  for (int t = 0; t < kThreads; ++t) {
    bufs.push_back(Alloc(sizeof(int64_t)));
    ASSERT_NE(bufs.back(), nullptr);
    *bufs.back()->as<int64_t>() = 1;
  }
  std::vector<std::vector<uint64_t>> seqs(kThreads);
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < kOpsPerThread; ++i) {
        auto op = session_->AllreduceAsync(*bufs[t], 0, 1, DType::kI64, ReduceOp::kSum,
                                           absl::StrCat("t", t, "/", i));
        ASSERT_TRUE(op.ok()) << op.status();
        seqs[t].push_back(op->sequence);
        ASSERT_TRUE(session_->Wait(*op, absl::Seconds(5)).ok());
      }
    });
  }
  for (auto& th : threads) th.join();
  std::set<uint64_t> all;
  for (const auto& s : seqs) all.insert(s.begin(), s.end());
  EXPECT_EQ(all.size(), static_cast<size_t>(kThreads * kOpsPerThread));
  EXPECT_EQ(*all.begin(), 1u);
  EXPECT_EQ(*all.rbegin(), static_cast<uint64_t>(kThreads * kOpsPerThread));
  for (const auto& b : bufs) EXPECT_EQ(*b->as<int64_t>(), int64_t{1} << kOpsPerThread);
}

TEST_F(ClientTest, FallsBackToSubmitAndWaitRpcsWhenTheDaemonHasNoOpQueue) {
  // SetUp's session asked for an op queue, got UNIMPLEMENTED, and uses RPCs.
  EXPECT_EQ(fake_->open_op_queue_calls(), 1);
  std::unique_ptr<Buffer> buf = Alloc(4);
  ASSERT_NE(buf, nullptr);
  *buf->as<int32_t>() = 21;
  const int64_t before = fake_->rpc_count();
  auto op = session_->AllreduceAsync(*buf, 0, 1, DType::kI32, ReduceOp::kSum, "g");
  ASSERT_TRUE(op.ok()) << op.status();
  EXPECT_EQ(op->sequence, 1u);  // the daemon's sequence: only the RPC path knows it at once
  EXPECT_EQ(fake_->rpc_count(), before + 1);  // Worker.Submit
  ASSERT_TRUE(session_->Wait(*op, absl::Seconds(5)).ok());
  EXPECT_GE(fake_->rpc_count(), before + 2);  // and Worker.Wait
  EXPECT_EQ(*buf->as<int32_t>(), 42);
}

TEST_F(ClientTest, GrpcOpChannelCanBeForcedFromTheEnvironment) {
  ASSERT_EQ(setenv("GRADSYNC_OP_CHANNEL", "grpc", 1), 0);
  SessionOptions options;
  options.job_id = "job-forced";
  auto session = client_->OpenSession(options);
  unsetenv("GRADSYNC_OP_CHANNEL");
  ASSERT_TRUE(session.ok()) << session.status();
  EXPECT_EQ(fake_->open_op_queue_calls(), 1);  // only SetUp's session asked
  auto buf = (*session)->AllocateBuffer(8);
  ASSERT_TRUE(buf.ok());
  *(*buf)->as<int64_t>() = 5;
  ASSERT_TRUE((*session)->Allreduce(**buf, 0, 1, DType::kI64, ReduceOp::kSum, "g").ok());
  EXPECT_EQ(*(*buf)->as<int64_t>(), 10);
}

TEST_F(ClientTest, DaemonGoingAwayIsAnErrorNotAHang) {
  std::unique_ptr<Buffer> buf = Alloc(4);
  ASSERT_NE(buf, nullptr);
  fake_->set_op_delay(absl::Seconds(30));
  auto op = session_->AllreduceAsync(*buf, 0, 1, DType::kF32, ReduceOp::kSum, "g");
  ASSERT_TRUE(op.ok()) << op.status();
  // The daemon goes away while the client is blocked in a Wait RPC: the
  // fake has been asked (every RPC bumps rpc_count as it arrives).
  const int64_t rpcs = fake_->rpc_count();
  std::atomic<bool> saw_wait{false};
  std::thread killer([&] {
    const absl::Time deadline = absl::Now() + absl::Seconds(20);
    while (fake_->rpc_count() == rpcs && absl::Now() < deadline) absl::SleepFor(absl::Milliseconds(1));
    saw_wait = fake_->rpc_count() > rpcs;
    fake_.reset();
  });
  const absl::Time start = absl::Now();
  auto result = session_->Wait(*op, absl::Seconds(20));
  killer.join();
  EXPECT_TRUE(saw_wait) << "the client never called Wait";
  EXPECT_FALSE(result.ok());
  EXPECT_LT(absl::Now() - start, absl::Seconds(5));
  buf.reset();
  EXPECT_FALSE(session_->Close().ok());  // the daemon is gone
  EXPECT_TRUE(session_->Close().ok());   // but Close stays idempotent
}

}  // namespace
}  // namespace client
}  // namespace gradsync
