// Unit tests of gradsyncd's gRPC edge (worker/worker_service.h,
// worker/status_service.h) in one process: both services over an in-process
// channel (grpc::Server::InProcessChannel) on a real Daemon, which joins jobs
// at a real coordinator (server/coordinator_service.h) on 127.0.0.1 port 0,
// plaintext. The caller's uid comes from a stand-in for the client socket's
// SO_PEERCRED lookup (WorkerService::SetPeerCredentials), so the ownership
// check runs here too. No sleeps: every wait is on a condition with a
// deadline.
#include "worker/worker_service.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <functional>
#include <future>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <gmock/gmock.h>
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "ipc/shared_memory.h"
#include "proto/status.grpc.pb.h"
#include "proto/worker.grpc.pb.h"
#include "server/coordinator_service.h"
#include "worker/daemon.h"
#include "worker/status_service.h"

namespace gradsync {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::StartsWith;

std::chrono::system_clock::time_point In(absl::Duration d) {
  return absl::ToChronoTime(absl::Now() + d);
}

// A named buffer segment (a daemon without an fd socket), mapped here as
// its client maps it.
class MappedSegment {
 public:
  static absl::StatusOr<std::unique_ptr<MappedSegment>> Open(const std::string& name,
                                                             size_t bytes) {
    UniqueFd fd(::shm_open(name.c_str(), O_RDWR, 0));
    if (!fd.valid()) return absl::NotFoundError(absl::StrCat("shm_open ", name));
    absl::StatusOr<void*> p = ipc::MapSharedFile(fd.get(), bytes, name);
    if (!p.ok()) return p.status();
    return std::unique_ptr<MappedSegment>(new MappedSegment(*p, bytes));
  }
  ~MappedSegment() { ::munmap(data_, bytes_); }
  template <typename T>
  T* as() const {
    return static_cast<T*>(data_);
  }

 private:
  MappedSegment(void* data, size_t bytes) : data_(data), bytes_(bytes) {}
  void* const data_;
  const size_t bytes_;
};

class WorkerServiceTest : public ::testing::Test {
 protected:
  void SetUp() override {
    CoordinatorServerOptions co;
    co.listen_address = "127.0.0.1:0";
    co.registry.liveness_interval = absl::Milliseconds(20);
    auto coordinator = CoordinatorServer::Start(std::move(co));
    ASSERT_TRUE(coordinator.ok()) << coordinator.status();
    coordinator_ = std::move(*coordinator);

    DaemonOptions o;
    o.coordinator = coordinator_->address();
    o.data_listen = HostPort{"127.0.0.1", 0};
    o.advertise_host = "127.0.0.1";
    o.node_id = "node-s";
    o.transport = TransportMode::kTcp;
    o.heartbeat_interval = absl::Milliseconds(50);
    o.spin_us = 0;
    o.executor_spin = absl::ZeroDuration();
    o.timeline_dir = ::testing::TempDir();
    auto daemon = Daemon::Start(o);
    ASSERT_TRUE(daemon.ok()) << daemon.status();
    daemon_ = std::move(*daemon);

    service_ = std::make_unique<WorkerService>(daemon_.get());
    service_->SetPeerCredentials([this](const std::string&) -> std::optional<ucred> {
      absl::MutexLock l(&caller_mu_);
      return caller_;
    });
    status_ = std::make_unique<StatusService>(daemon_.get());
    grpc::ServerBuilder builder;
    builder.RegisterService(service_.get());
    builder.RegisterService(status_.get());
    server_ = builder.BuildAndStart();
    ASSERT_NE(server_, nullptr);
    std::shared_ptr<grpc::Channel> channel = server_->InProcessChannel(grpc::ChannelArguments());
    worker_ = v1::Worker::NewStub(channel);
    status_stub_ = v1::DaemonStatus::NewStub(channel);
  }

  void TearDown() override {
    if (server_ != nullptr) server_->Shutdown(In(absl::Seconds(1)));
  }

  // The uid the next calls come from (their client socket's SO_PEERCRED).
  void CallAs(uid_t uid) {
    absl::MutexLock l(&caller_mu_);
    caller_.uid = uid;
  }

  grpc::Status Open(const std::string& job, int world_size, int rank,
                    v1::OpenSessionResponse* resp) {
    grpc::ClientContext ctx;
    ctx.set_deadline(In(absl::Seconds(15)));
    v1::OpenSessionRequest req;
    req.set_job_id(job);
    req.set_world_size(world_size);
    req.set_rank(rank);
    req.set_timeout_ms(10000);
    req.set_client_name("worker_service_test");
    return worker_->OpenSession(&ctx, req, resp);
  }

  // Every rank of a job of `n` opens its session here at once.
  std::vector<v1::OpenSessionResponse> OpenJob(const std::string& job, int n) {
    std::vector<std::future<std::pair<grpc::Status, v1::OpenSessionResponse>>> opening;
    for (int r = 0; r < n; ++r) {
      opening.push_back(std::async(std::launch::async, [this, job, n, r] {
        v1::OpenSessionResponse resp;
        grpc::Status s = Open(job, n, r, &resp);
        return std::make_pair(s, resp);
      }));
    }
    std::vector<v1::OpenSessionResponse> out;
    for (int r = 0; r < n; ++r) {
      auto [s, resp] = opening[r].get();
      EXPECT_TRUE(s.ok()) << "rank " << r << ": " << s.error_message();
      if (s.ok()) out.push_back(resp);
    }
    return out;
  }

  grpc::Status Allocate(const std::string& session, uint64_t bytes,
                        v1::AllocateBufferResponse* resp) {
    grpc::ClientContext ctx;
    ctx.set_deadline(In(absl::Seconds(5)));
    v1::AllocateBufferRequest req;
    req.set_session_id(session);
    req.set_size_bytes(bytes);
    return worker_->AllocateBuffer(&ctx, req, resp);
  }

  static v1::SubmitRequest Allreduce(const std::string& session, uint64_t buffer, uint64_t count,
                                     const std::string& name,
                                     v1::DataType dtype = v1::DATA_TYPE_F32) {
    v1::SubmitRequest req;
    req.set_session_id(session);
    req.set_collective(v1::COLLECTIVE_TYPE_ALLREDUCE);
    req.set_name(name);
    req.set_dtype(dtype);
    req.set_count(count);
    req.set_reduce_op(v1::REDUCE_OP_SUM);
    req.set_buffer_id(buffer);
    return req;
  }

  grpc::Status Submit(const v1::SubmitRequest& req, uint64_t* op_id = nullptr) {
    grpc::ClientContext ctx;
    ctx.set_deadline(In(absl::Seconds(5)));
    v1::SubmitResponse resp;
    grpc::Status s = worker_->Submit(&ctx, req, &resp);
    if (op_id != nullptr) *op_id = resp.op_id();
    return s;
  }

  grpc::Status Wait(const std::string& session, uint64_t op_id, v1::WaitResponse* resp,
                    absl::Duration timeout = absl::Seconds(5)) {
    grpc::ClientContext ctx;
    ctx.set_deadline(In(timeout + absl::Seconds(5)));
    v1::WaitRequest req;
    req.set_session_id(session);
    req.set_op_id(op_id);
    req.set_timeout_ms(absl::ToInt64Milliseconds(timeout));
    return worker_->Wait(&ctx, req, resp);
  }

  grpc::Status Close(const std::string& session) {
    grpc::ClientContext ctx;
    ctx.set_deadline(In(absl::Seconds(5)));
    v1::CloseSessionRequest req;
    req.set_session_id(session);
    v1::CloseSessionResponse resp;
    return worker_->CloseSession(&ctx, req, &resp);
  }

  grpc::Status GetStatus(const std::string& job, v1::DaemonStatusResponse* resp) {
    grpc::ClientContext ctx;
    ctx.set_deadline(In(absl::Seconds(5)));
    v1::GetDaemonStatusRequest req;
    req.set_job_id(job);
    return status_stub_->GetStatus(&ctx, req, resp);
  }

  // Declared in the order they start: destroyed in reverse (the server
  // first, the coordinator, which the daemon leaves its jobs at, last).
  std::unique_ptr<CoordinatorServer> coordinator_;
  std::unique_ptr<Daemon> daemon_;
  std::unique_ptr<WorkerService> service_;
  std::unique_ptr<StatusService> status_;
  std::unique_ptr<grpc::Server> server_;
  std::unique_ptr<v1::Worker::Stub> worker_;
  std::unique_ptr<v1::DaemonStatus::Stub> status_stub_;
  absl::Mutex caller_mu_;
  ucred caller_ ABSL_GUARDED_BY(caller_mu_){/*pid=*/0, /*uid=*/::geteuid(), /*gid=*/::getegid()};
};

TEST_F(WorkerServiceTest, OpenAllocateSubmitWaitRoundTripIsExact) {
  // Two ranks on this daemon: the sum is real, reduced by its executor.
  std::vector<v1::OpenSessionResponse> s = OpenJob("rt", 2);
  ASSERT_EQ(s.size(), 2u);
  for (int r = 0; r < 2; ++r) {
    EXPECT_THAT(s[r].session_id(), StartsWith("node-s-"));
    EXPECT_EQ(s[r].rank(), r);
    EXPECT_EQ(s[r].world_size(), 2);
    EXPECT_EQ(s[r].epoch(), s[0].epoch());
    EXPECT_EQ(s[r].coordinator(), coordinator_->address());
    EXPECT_EQ(s[r].op_timeout_ms(), 60000);
    EXPECT_THAT(s[r].transport(), StartsWith("local"));
    EXPECT_TRUE(s[r].fd_socket().empty());  // no fd socket: named segments
  }
  EXPECT_EQ(daemon_->session_count(), 2u);

  constexpr uint64_t kCount = 1000;
  std::vector<std::unique_ptr<MappedSegment>> bufs;
  std::vector<uint64_t> buffer_ids;
  for (int r = 0; r < 2; ++r) {
    v1::AllocateBufferResponse b;
    grpc::Status st = Allocate(s[r].session_id(), kCount * sizeof(float), &b);
    ASSERT_TRUE(st.ok()) << st.error_message();
    EXPECT_EQ(b.size_bytes(), kCount * sizeof(float));
    EXPECT_FALSE(b.by_descriptor());
    ASSERT_FALSE(b.shm_name().empty());
    auto m = MappedSegment::Open(b.shm_name(), kCount * sizeof(float));
    ASSERT_TRUE(m.ok()) << m.status();
    bufs.push_back(*std::move(m));
    buffer_ids.push_back(b.buffer_id());
  }
  std::vector<float> want(kCount);
  for (uint64_t k = 0; k < kCount; ++k) {
    const float x0 = 0.75f * static_cast<float>(k) - 300.0f;
    const float x1 = 2.0f - 0.0625f * static_cast<float>(k % 64);
    bufs[0]->as<float>()[k] = x0;
    bufs[1]->as<float>()[k] = x1;
    want[k] = x0 + x1;
  }
  std::vector<uint64_t> ops(2);
  for (int r = 0; r < 2; ++r) {
    grpc::Status st = Submit(Allreduce(s[r].session_id(), buffer_ids[r], kCount, "g"), &ops[r]);
    ASSERT_TRUE(st.ok()) << st.error_message();
    EXPECT_EQ(ops[r], 1u);
  }
  for (int r = 0; r < 2; ++r) {
    v1::WaitResponse w;
    grpc::Status st = Wait(s[r].session_id(), ops[r], &w);
    ASSERT_TRUE(st.ok()) << "rank " << r << ": " << st.error_message();
    EXPECT_TRUE(w.done()) << "rank " << r;
    EXPECT_FALSE(w.algorithm().empty());
    EXPECT_EQ(std::memcmp(bufs[r]->as<float>(), want.data(), kCount * sizeof(float)), 0)
        << "rank " << r;
  }
  // Reported once: the op is forgotten after.
  v1::WaitResponse again;
  grpc::Status st = Wait(s[0].session_id(), ops[0], &again);
  EXPECT_EQ(st.error_code(), grpc::StatusCode::NOT_FOUND);

  for (int r = 0; r < 2; ++r) {
    grpc::Status closed = Close(s[r].session_id());
    EXPECT_TRUE(closed.ok()) << closed.error_message();
  }
  EXPECT_EQ(daemon_->session_count(), 0u);
  v1::AllocateBufferResponse b;
  grpc::Status gone = Allocate(s[0].session_id(), 64, &b);
  EXPECT_EQ(gone.error_code(), grpc::StatusCode::NOT_FOUND);
  EXPECT_EQ(gone.error_message(), absl::StrCat("no session '", s[0].session_id(), "' on this daemon"));
}

TEST_F(WorkerServiceTest, OpenSessionRefusalsKeepTheirCodeAndMessage) {
  v1::OpenSessionResponse resp;
  grpc::Status zero = Open("bad", 0, 0, &resp);
  EXPECT_EQ(zero.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_EQ(zero.error_message(), "world_size 0 out of range [1, 4096]");
  grpc::Status rank = Open("bad", 3, 3, &resp);
  EXPECT_EQ(rank.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_EQ(rank.error_message(), "rank 3 out of range for world size 3 (-1 = any)");
  EXPECT_EQ(daemon_->session_count(), 0u);
}

TEST_F(WorkerServiceTest, SubmitRefusesABadOpNamingTheOp) {
  std::vector<v1::OpenSessionResponse> s = OpenJob("bad-ops", 1);
  ASSERT_EQ(s.size(), 1u);
  const std::string& id = s[0].session_id();
  v1::AllocateBufferResponse b;
  grpc::Status st = Allocate(id, 4096, &b);
  ASSERT_TRUE(st.ok()) << st.error_message();

  // No such buffer.
  st = Submit(Allreduce(id, b.buffer_id() + 41, 16, "lost"));
  EXPECT_EQ(st.error_code(), grpc::StatusCode::NOT_FOUND);
  EXPECT_EQ(st.error_message(),
            absl::StrCat("buffer ", b.buffer_id() + 41, " does not exist in session ", id));

  // An invalid dtype, refused where the request becomes an OpDesc
  // (OpDescFromRequest), before the session queues it: the op and the rank.
  st = Submit(Allreduce(id, b.buffer_id(), 16, "odd", static_cast<v1::DataType>(99)));
  EXPECT_EQ(st.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(st.error_message(),
              StartsWith("allreduce 'odd' on rank 0: dtype 99 is not a valid value ("));

  // premul_sum without this rank's factor (proto3 would read it as 0).
  v1::SubmitRequest premul = Allreduce(id, b.buffer_id(), 16, "pre");
  premul.set_reduce_op(v1::REDUCE_OP_PREMUL_SUM);
  st = Submit(premul);
  EXPECT_EQ(st.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_EQ(st.error_message(), "allreduce 'pre' on rank 0: reduce op premul_sum needs "
                                "premul_factor (this rank's multiplier)");

  // ValidateOp against the session: the op and the rank.
  st = Submit(Allreduce(id, b.buffer_id(), 1025, "too-big"));
  EXPECT_EQ(st.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_EQ(st.error_message(),
            absl::StrCat("allreduce 'too-big' on rank 0: count 1025 x 4-byte f32 (4100 bytes) at "
                         "offset_bytes 0 does not fit in buffer ",
                         b.buffer_id(), " (4096 bytes; at most 1024 elements fit)"));
  v1::SubmitRequest offset = Allreduce(id, b.buffer_id(), 4, "skewed");
  offset.set_offset_bytes(2);
  st = Submit(offset);
  EXPECT_EQ(st.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_EQ(st.error_message(),
            "allreduce 'skewed' on rank 0: offset_bytes 2 is not a multiple of the f32 element "
            "size 4");
  v1::SubmitRequest root = Allreduce(id, b.buffer_id(), 4, "rootless");
  root.set_collective(v1::COLLECTIVE_TYPE_BROADCAST);
  root.set_root(1);
  st = Submit(root);
  EXPECT_EQ(st.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_EQ(st.error_message(),
            "broadcast 'rootless' on rank 0: root 1 out of range for world size 1 (expected 0..0)");

  // Nothing was queued: the next good op is op 1.
  uint64_t op = 0;
  st = Submit(Allreduce(id, b.buffer_id(), 1024, "good"), &op);
  ASSERT_TRUE(st.ok()) << st.error_message();
  EXPECT_EQ(op, 1u);
  v1::WaitResponse w;
  st = Wait(id, op, &w);
  EXPECT_TRUE(st.ok()) << st.error_message();
  EXPECT_TRUE(w.done());
}

TEST_F(WorkerServiceTest, WaitOnAnUnknownOpIsNotFound) {
  std::vector<v1::OpenSessionResponse> s = OpenJob("unknown-op", 1);
  ASSERT_EQ(s.size(), 1u);
  v1::WaitResponse w;
  grpc::Status st = Wait(s[0].session_id(), 42, &w);
  EXPECT_EQ(st.error_code(), grpc::StatusCode::NOT_FOUND);
  EXPECT_EQ(st.error_message(), absl::StrCat("op 42 is not pending in session ", s[0].session_id(),
                                             " (already reported, or never submitted)"));
  st = Wait("no-such-session", 1, &w);
  EXPECT_EQ(st.error_code(), grpc::StatusCode::NOT_FOUND);
  EXPECT_EQ(st.error_message(), "no session 'no-such-session' on this daemon");
}

TEST_F(WorkerServiceTest, AnotherUidsCallsOnTheSessionAreDenied) {
  const uid_t owner = ::geteuid();
  const uid_t other = owner + 1;
  std::vector<v1::OpenSessionResponse> s = OpenJob("owned", 1);
  ASSERT_EQ(s.size(), 1u);
  const std::string& id = s[0].session_id();
  v1::AllocateBufferResponse b;
  grpc::Status st = Allocate(id, 64, &b);
  ASSERT_TRUE(st.ok()) << st.error_message();
  uint64_t op = 0;
  ASSERT_TRUE(Submit(Allreduce(id, b.buffer_id(), 16, "mine"), &op).ok());

  CallAs(other);
  auto denied = [&](const std::string& call) {
    return absl::StrCat("session ", id, " belongs to uid ", owner, "; uid ", other,
                        " may not call ", call, " on it");
  };
  st = Allocate(id, 64, &b);
  EXPECT_EQ(st.error_code(), grpc::StatusCode::PERMISSION_DENIED);
  EXPECT_EQ(st.error_message(), denied("AllocateBuffer"));
  st = Submit(Allreduce(id, b.buffer_id(), 16, "theirs"));
  EXPECT_EQ(st.error_code(), grpc::StatusCode::PERMISSION_DENIED);
  EXPECT_EQ(st.error_message(), denied("Submit"));
  v1::WaitResponse w;
  st = Wait(id, op, &w);
  EXPECT_EQ(st.error_code(), grpc::StatusCode::PERMISSION_DENIED);
  EXPECT_EQ(st.error_message(), denied("Wait"));
  st = Close(id);
  EXPECT_EQ(st.error_code(), grpc::StatusCode::PERMISSION_DENIED);
  EXPECT_EQ(st.error_message(), denied("CloseSession"));
  EXPECT_EQ(daemon_->session_count(), 1u);

  // Its owner still has it, op and all.
  CallAs(owner);
  st = Wait(id, op, &w);
  EXPECT_TRUE(st.ok()) << st.error_message();
  EXPECT_TRUE(w.done());
  EXPECT_TRUE(Close(id).ok());
  EXPECT_EQ(daemon_->session_count(), 0u);
}

TEST_F(WorkerServiceTest, CloseSessionFailsTheOtherRanksPendingOpNamingTheRank) {
  std::vector<v1::OpenSessionResponse> s = OpenJob("left", 2);
  ASSERT_EQ(s.size(), 2u);
  v1::AllocateBufferResponse b;
  ASSERT_TRUE(Allocate(s[0].session_id(), 64, &b).ok());
  uint64_t op = 0;
  ASSERT_TRUE(Submit(Allreduce(s[0].session_id(), b.buffer_id(), 16, "alone"), &op).ok());
  // Rank 1 closes without submitting; rank 0's Wait returns with the cause
  // well before the op's timeout (60 s).
  grpc::Status closed = Close(s[1].session_id());
  ASSERT_TRUE(closed.ok()) << closed.error_message();
  v1::WaitResponse w;
  grpc::Status st = Wait(s[0].session_id(), op, &w);
  EXPECT_EQ(st.error_code(), grpc::StatusCode::CANCELLED) << st.error_message();
  EXPECT_THAT(st.error_message(), HasSubstr("rank 1 closed its session"));
  // The epoch is over for rank 0 too.
  st = Submit(Allreduce(s[0].session_id(), b.buffer_id(), 16, "after"));
  EXPECT_EQ(st.error_code(), grpc::StatusCode::FAILED_PRECONDITION) << st.error_message();
  EXPECT_THAT(st.error_message(), HasSubstr("open a new session"));
}

TEST_F(WorkerServiceTest, StatusServiceListsTheSessionsWithTheirCurrentAndLastOp) {
  std::vector<v1::OpenSessionResponse> s = OpenJob("watched", 2);
  ASSERT_EQ(s.size(), 2u);
  std::vector<uint64_t> buffers;
  for (int r = 0; r < 2; ++r) {
    v1::AllocateBufferResponse b;
    grpc::Status st = Allocate(s[r].session_id(), 64, &b);
    ASSERT_TRUE(st.ok()) << st.error_message();
    buffers.push_back(b.buffer_id());
  }
  // Op 1 on both ranks; op 2 on rank 0 only, which waits for rank 1.
  std::vector<uint64_t> first(2);
  for (int r = 0; r < 2; ++r) {
    ASSERT_TRUE(Submit(Allreduce(s[r].session_id(), buffers[r], 4, "first"), &first[r]).ok());
  }
  for (int r = 0; r < 2; ++r) {
    v1::WaitResponse w;
    grpc::Status st = Wait(s[r].session_id(), first[r], &w);
    ASSERT_TRUE(st.ok()) << st.error_message();
    ASSERT_TRUE(w.done()) << "rank " << r;
  }
  uint64_t second = 0;
  ASSERT_TRUE(Submit(Allreduce(s[0].session_id(), buffers[0], 4, "second"), &second).ok());
  EXPECT_EQ(second, 2u);

  v1::DaemonStatusResponse resp;
  const absl::Time deadline = absl::Now() + absl::Seconds(5);
  for (;;) {
    resp.Clear();
    grpc::Status st = GetStatus("", &resp);
    ASSERT_TRUE(st.ok()) << st.error_message();
    ASSERT_EQ(resp.sessions_size(), 2);
    const bool taken = std::any_of(resp.sessions().begin(), resp.sessions().end(),
                                   [](const v1::SessionState& x) { return x.has_current(); });
    if (taken) break;
    ASSERT_LT(absl::Now(), deadline) << "op 2 was never taken: " << resp.DebugString();
    absl::SleepFor(absl::Milliseconds(1));
  }
  EXPECT_EQ(resp.node_id(), "node-s");
  EXPECT_EQ(resp.data_port(), daemon_->data_port());
  EXPECT_FALSE(resp.version().empty());
  for (const v1::SessionState& x : resp.sessions()) {
    SCOPED_TRACE(x.DebugString());
    EXPECT_EQ(x.job_id(), "watched");
    EXPECT_EQ(x.world_size(), 2);
    EXPECT_EQ(x.epoch(), s[0].epoch());
    EXPECT_EQ(x.session_id(), s[x.rank()].session_id());
    EXPECT_EQ(x.error(), "");
    EXPECT_THAT(x.transport(), StartsWith("local"));
    EXPECT_EQ(x.last_completed_seq(), 1u);
    EXPECT_EQ(x.last_completed(), "allreduce 'first' f32[4] sum (op 1): OK");
    EXPECT_GE(x.last_completed_age_ms(), 0);
    EXPECT_EQ(x.queued_ops(), 0);
    if (x.rank() == 0) {
      EXPECT_TRUE(x.has_current());
      EXPECT_EQ(x.current_seq(), 2u);
      EXPECT_THAT(x.current_op(), HasSubstr("allreduce 'second' f32[4] sum"));
      EXPECT_EQ(x.phase(), "negotiating");
      EXPECT_THAT(x.arrived_ranks(), ElementsAre(0));
      EXPECT_THAT(x.missing_ranks(), ElementsAre(1));
    } else {
      EXPECT_FALSE(x.has_current());
    }
  }
  // A job filter.
  resp.Clear();
  ASSERT_TRUE(GetStatus("another-job", &resp).ok());
  EXPECT_EQ(resp.sessions_size(), 0);
  resp.Clear();
  ASSERT_TRUE(GetStatus("watched", &resp).ok());
  EXPECT_EQ(resp.sessions_size(), 2);

  // Rank 1 catches up: op 2 completes on both.
  uint64_t op = 0;
  ASSERT_TRUE(Submit(Allreduce(s[1].session_id(), buffers[1], 4, "second"), &op).ok());
  for (int r = 0; r < 2; ++r) {
    v1::WaitResponse w;
    grpc::Status st = Wait(s[r].session_id(), r == 0 ? second : op, &w);
    EXPECT_TRUE(st.ok()) << "rank " << r << ": " << st.error_message();
    EXPECT_TRUE(w.done()) << "rank " << r;
  }
  resp.Clear();
  ASSERT_TRUE(GetStatus("watched", &resp).ok());
  for (const v1::SessionState& x : resp.sessions()) {
    EXPECT_FALSE(x.has_current()) << x.DebugString();
    EXPECT_EQ(x.last_completed(), "allreduce 'second' f32[4] sum (op 2): OK") << x.DebugString();
  }
}

}  // namespace
}  // namespace gradsync
