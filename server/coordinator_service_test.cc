// End-to-end tests of the coordinator over real gRPC (in-process server on
// 127.0.0.1:0, generated stubs), plus the gradsync-coordinator binary itself.
#include "server/coordinator_service.h"

#include <signal.h>
#include <spawn.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <future>
#include <string>
#include <thread>
#include <vector>

#include <grpcpp/generic/generic_stub.h>
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>

#include "server/job_registry_testing.h"

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "proto/coordinator.grpc.pb.h"

extern char** environ;

namespace gradsync {
namespace {

using v1::JobEvent;

std::chrono::system_clock::time_point In(absl::Duration d) {
  return absl::ToChronoTime(absl::Now() + d);
}

class CoordinatorServiceTest : public ::testing::Test {
 protected:
  void SetUp() override {
    CoordinatorServerOptions options;
    options.listen_address = "127.0.0.1:0";
    options.registry.liveness_interval = absl::Milliseconds(20);
    auto server = CoordinatorServer::Start(std::move(options));
    ASSERT_TRUE(server.ok()) << server.status();
    server_ = std::move(*server);
    ASSERT_GT(server_->port(), 0);
    EXPECT_EQ(server_->address(), absl::StrCat("127.0.0.1:", server_->port()));
    channel_ = grpc::CreateChannel(server_->address(), grpc::InsecureChannelCredentials());
    stub_ = v1::Coordinator::NewStub(channel_);
  }

  void CreateJob(const std::string& id, int world_size, int64_t heartbeat_timeout_ms = 0) {
    grpc::ClientContext ctx;
    v1::CreateJobRequest req;
    req.set_job_id(id);
    req.set_world_size(world_size);
    req.mutable_options()->set_heartbeat_timeout_ms(heartbeat_timeout_ms);
    v1::CreateJobResponse resp;
    grpc::Status s = stub_->CreateJob(&ctx, req, &resp);
    ASSERT_TRUE(s.ok()) << s.error_message();
    ASSERT_TRUE(resp.created());
  }

  grpc::Status Join(const std::string& job, const std::string& member, int rank, int port,
                    int64_t timeout_ms, v1::JoinJobResponse* resp,
                    grpc::ClientContext* ctx = nullptr) {
    grpc::ClientContext local;
    if (ctx == nullptr) {
      ctx = &local;
      ctx->set_deadline(In(absl::Seconds(10)));
    }
    return stub_->JoinJob(ctx, job_registry_testing::JoinRequest(job, member, rank, port, timeout_ms),
                          resp);
  }

  grpc::Status Heartbeat(const std::string& job, int rank, int64_t epoch,
                         const std::string& member, v1::HeartbeatResponse* resp) {
    grpc::ClientContext ctx;
    return stub_->Heartbeat(&ctx, job_registry_testing::HeartbeatRequest(job, rank, epoch, member),
                            resp);
  }

  grpc::Status Leave(const std::string& job, int rank, int64_t epoch, const std::string& member) {
    grpc::ClientContext ctx;
    v1::LeaveJobResponse resp;
    return stub_->LeaveJob(&ctx, job_registry_testing::LeaveRequest(job, rank, epoch, member), &resp);
  }

  grpc::Status Status(const std::string& job, v1::JobStatus* st) {
    grpc::ClientContext ctx;
    v1::GetJobStatusRequest req;
    req.set_job_id(job);
    return stub_->GetJobStatus(&ctx, req, st);
  }

  // Polls GetJobStatus until `pred` holds (or 5 s pass).
  template <typename Pred>
  bool AwaitStatus(const std::string& job, Pred pred) {
    const absl::Time deadline = absl::Now() + absl::Seconds(5);
    while (absl::Now() < deadline) {
      v1::JobStatus st;
      if (Status(job, &st).ok() && pred(st)) return true;
      absl::SleepFor(absl::Milliseconds(5));
    }
    return false;
  }

  std::unique_ptr<CoordinatorServer> server_;
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<v1::Coordinator::Stub> stub_;
};

TEST_F(CoordinatorServiceTest, FourJoinersInThreadsRendezvous) {
  CreateJob("j", 4);
  std::vector<v1::JoinJobResponse> replies(4);
  std::vector<grpc::Status> statuses(4);
  std::vector<std::thread> threads;
  for (int i = 0; i < 4; ++i) {
    threads.emplace_back([&, i] {
      statuses[i] = Join("j", absl::StrCat("m", i), -1, 7000 + i, 5000, &replies[i]);
    });
  }
  for (auto& t : threads) t.join();
  std::vector<bool> seen(4, false);
  for (int i = 0; i < 4; ++i) {
    ASSERT_TRUE(statuses[i].ok()) << statuses[i].error_message();
    const auto& r = replies[i];
    EXPECT_EQ(r.epoch(), 1);
    EXPECT_EQ(r.world_size(), 4);
    ASSERT_TRUE(r.rank() >= 0 && r.rank() < 4);
    EXPECT_FALSE(seen[r.rank()]);
    seen[r.rank()] = true;
    ASSERT_EQ(r.members_size(), 4);
    EXPECT_EQ(r.members(r.rank()).member_id(), absl::StrCat("m", i));
    EXPECT_EQ(r.members(r.rank()).data_endpoint().port(), 7000 + i);
    for (int k = 0; k < 4; ++k) EXPECT_EQ(r.members(k).rank(), k);
  }
  // Everyone got the same member table.
  for (int i = 1; i < 4; ++i) {
    for (int k = 0; k < 4; ++k) {
      EXPECT_EQ(replies[i].members(k).member_id(), replies[0].members(k).member_id());
      EXPECT_EQ(replies[i].members(k).data_endpoint().port(),
                replies[0].members(k).data_endpoint().port());
    }
  }
  v1::JobStatus st;
  ASSERT_TRUE(Status("j", &st).ok());
  EXPECT_EQ(st.state(), v1::JOB_STATE_RUNNING);

  // Idempotent retry after the rendezvous.
  v1::JoinJobResponse again;
  ASSERT_TRUE(Join("j", "m2", -1, 7002, 100, &again).ok());
  EXPECT_EQ(again.rank(), replies[2].rank());
  // A newcomer is refused while the epoch runs.
  grpc::Status late = Join("j", "m9", -1, 7009, 100, &again);
  EXPECT_EQ(late.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  EXPECT_TRUE(absl::StrContains(late.error_message(), "job 'j' epoch 1"));
  EXPECT_TRUE(absl::StrContains(late.error_message(), "all 4 ranks"));
}

TEST_F(CoordinatorServiceTest, TimeoutMessageRankConflictAndCancellation) {
  CreateJob("j", 4);
  grpc::ClientContext a_ctx;
  a_ctx.set_deadline(In(absl::Seconds(10)));
  grpc::Status a_status;
  v1::JoinJobResponse a_resp;
  std::thread a([&] { a_status = Join("j", "a", 0, 5000, 10000, &a_resp, &a_ctx); });
  ASSERT_TRUE(AwaitStatus("j", [](const v1::JobStatus& s) { return s.members_size() == 1; }));

  v1::JoinJobResponse resp;
  grpc::Status conflict = Join("j", "x", 0, 5009, 1000, &resp);
  EXPECT_EQ(conflict.error_code(), grpc::StatusCode::ALREADY_EXISTS);
  EXPECT_EQ(conflict.error_message(), "rank 0 of job 'j' is already taken by member 'a'");
  EXPECT_EQ(Join("j", "x", 4, 5009, 1000, &resp).error_code(),
            grpc::StatusCode::INVALID_ARGUMENT);

  grpc::Status c = Join("j", "c", 2, 5002, 300, &resp);
  EXPECT_EQ(c.error_code(), grpc::StatusCode::DEADLINE_EXCEEDED);
  EXPECT_EQ(c.error_message(),
            "job 'j' epoch 1: rendezvous timed out after 300 ms: 2 of 4 ranks missing "
            "(ranks 1, 3); joined: rank 0 (member 'a' at 127.0.0.1:5000), "
            "rank 2 (member 'c' at 127.0.0.1:5002)");
  v1::JobStatus st;
  ASSERT_TRUE(Status("j", &st).ok());
  EXPECT_EQ(st.members_size(), 1);  // c was removed and may retry

  // Cancelling a's call removes it from the forming epoch.
  a_ctx.TryCancel();
  a.join();
  EXPECT_EQ(a_status.error_code(), grpc::StatusCode::CANCELLED);
  EXPECT_TRUE(AwaitStatus("j", [](const v1::JobStatus& s) { return s.members_size() == 0; }));
}

TEST_F(CoordinatorServiceTest, RpcDeadlineShorterThanTimeoutEndsTheWait) {
  CreateJob("j", 2);
  grpc::ClientContext ctx;
  ctx.set_deadline(In(absl::Milliseconds(300)));
  v1::JoinJobResponse resp;
  const absl::Time start = absl::Now();
  grpc::Status s = Join("j", "a", -1, 5000, 60000, &resp, &ctx);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::DEADLINE_EXCEEDED);
  EXPECT_LT(absl::Now() - start, absl::Seconds(2));
  EXPECT_TRUE(AwaitStatus("j", [](const v1::JobStatus& st) { return st.members_size() == 0; }));
}

TEST_F(CoordinatorServiceTest, UnknownJobsAreNotFoundAndLeaveIsIdempotent) {
  v1::JoinJobResponse join;
  EXPECT_EQ(Join("nope", "a", -1, 1, 100, &join).error_code(), grpc::StatusCode::NOT_FOUND);
  v1::HeartbeatResponse hb;
  EXPECT_EQ(Heartbeat("nope", 0, 1, "a", &hb).error_code(), grpc::StatusCode::NOT_FOUND);
  v1::JobStatus st;
  EXPECT_EQ(Status("nope", &st).error_code(), grpc::StatusCode::NOT_FOUND);
  EXPECT_TRUE(Leave("nope", 0, 1, "a").ok());
  grpc::ClientContext ctx;
  v1::WatchJobRequest wreq;
  wreq.set_job_id("nope");
  auto reader = stub_->WatchJob(&ctx, wreq);
  JobEvent ev;
  EXPECT_FALSE(reader->Read(&ev));
  EXPECT_EQ(reader->Finish().error_code(), grpc::StatusCode::NOT_FOUND);

  CreateJob("b", 1);
  CreateJob("a", 2);
  grpc::ClientContext lctx;
  v1::ListJobsResponse list;
  ASSERT_TRUE(stub_->ListJobs(&lctx, v1::ListJobsRequest(), &list).ok());
  ASSERT_EQ(list.jobs_size(), 2);
  EXPECT_EQ(list.jobs(0).job_id(), "a");
  EXPECT_EQ(list.jobs(1).job_id(), "b");
  EXPECT_EQ(list.jobs(0).options().heartbeat_timeout_ms(), 3000);

  grpc::ClientContext cctx;
  v1::CreateJobRequest creq;
  creq.set_job_id("a");
  creq.set_world_size(3);
  v1::CreateJobResponse cresp;
  grpc::Status dup = stub_->CreateJob(&cctx, creq, &cresp);
  EXPECT_EQ(dup.error_code(), grpc::StatusCode::ALREADY_EXISTS);
  EXPECT_EQ(dup.error_message(), "job 'a' already exists with world size 2; requested world size 3");
}

// Watch + heartbeat death: rank 1 goes silent, rank 0 keeps beating.
TEST_F(CoordinatorServiceTest, MissedHeartbeatsAbortAndWatchSeesEventsInOrder) {
  CreateJob("j", 2, /*heartbeat_timeout_ms=*/300);

  grpc::ClientContext wctx;
  v1::WatchJobRequest wreq;
  wreq.set_job_id("j");
  std::unique_ptr<grpc::ClientReader<JobEvent>> reader = stub_->WatchJob(&wctx, wreq);
  std::vector<JobEvent> events;
  std::promise<grpc::Status> watch_done;
  std::promise<void> got_snapshot;
  std::thread watcher([&] {
    JobEvent ev;
    while (reader->Read(&ev)) {
      events.push_back(ev);
      if (events.size() == 1) got_snapshot.set_value();
    }
    if (events.empty()) got_snapshot.set_value();
    watch_done.set_value(reader->Finish());
  });
  // The stream starts with a snapshot; joins before it would be folded into it.
  ASSERT_EQ(got_snapshot.get_future().wait_for(std::chrono::seconds(5)), std::future_status::ready);

  std::atomic<bool> stop{false};
  v1::HeartbeatResponse last_hb;
  std::thread a([&] {
    v1::JoinJobResponse r;
    ASSERT_TRUE(Join("j", "a", 0, 5000, 5000, &r).ok());
    while (!stop) {
      v1::HeartbeatResponse hb;
      if (Heartbeat("j", 0, r.epoch(), "a", &hb).ok()) last_hb = hb;
      if (hb.state() == v1::JOB_STATE_ABORTED) break;
      absl::SleepFor(absl::Milliseconds(50));
    }
  });
  v1::JoinJobResponse b;
  ASSERT_TRUE(Join("j", "b", 1, 5001, 5000, &b).ok());  // then silence
  const absl::Time joined = absl::Now();
  a.join();  // returns once a's heartbeat reply says ABORTED
  const absl::Duration to_abort = absl::Now() - joined;
  EXPECT_GE(to_abort, absl::Milliseconds(300));
  EXPECT_LT(to_abort, absl::Seconds(2));

  EXPECT_EQ(last_hb.state(), v1::JOB_STATE_ABORTED);
  EXPECT_EQ(last_hb.epoch(), 1);
  ASSERT_EQ(last_hb.dead_ranks_size(), 1);
  EXPECT_EQ(last_hb.dead_ranks(0), 1);
  EXPECT_TRUE(absl::StartsWith(last_hb.abort_reason(), "rank 1 (member 'b') missed heartbeats for "))
      << last_hb.abort_reason();
  EXPECT_TRUE(absl::EndsWith(last_hb.abort_reason(), "(timeout 0.3 s)")) << last_hb.abort_reason();

  v1::JobStatus st;
  ASSERT_TRUE(Status("j", &st).ok());
  EXPECT_EQ(st.state(), v1::JOB_STATE_ABORTED);
  EXPECT_EQ(st.abort_reason(), last_hb.abort_reason());
  ASSERT_EQ(st.members_size(), 2);
  EXPECT_TRUE(st.members(0).alive());
  EXPECT_FALSE(st.members(1).alive());
  EXPECT_GE(st.members(1).last_heartbeat_age_ms(), 300);

  // a leaves: nobody is left, the job is deleted and the stream ends.
  ASSERT_TRUE(Leave("j", 0, 1, "a").ok());
  auto fut = watch_done.get_future();
  ASSERT_EQ(fut.wait_for(std::chrono::seconds(3)), std::future_status::ready);
  EXPECT_TRUE(fut.get().ok());
  watcher.join();

  std::vector<JobEvent::Kind> kinds;
  for (const auto& e : events) kinds.push_back(e.kind());
  EXPECT_EQ(kinds, (std::vector<JobEvent::Kind>{
                       JobEvent::KIND_SNAPSHOT, JobEvent::KIND_MEMBER_JOINED,
                       JobEvent::KIND_MEMBER_JOINED, JobEvent::KIND_JOB_RUNNING,
                       JobEvent::KIND_MEMBER_DEAD, JobEvent::KIND_EPOCH_ABORTED,
                       JobEvent::KIND_MEMBER_LEFT, JobEvent::KIND_JOB_DELETED}));
  if (events.size() == 8) {
    EXPECT_EQ(events[4].rank(), 1);
    EXPECT_EQ(events[5].status().state(), v1::JOB_STATE_ABORTED);
    EXPECT_EQ(events[5].message(), last_hb.abort_reason());
  }
  EXPECT_EQ(Status("j", &st).error_code(), grpc::StatusCode::NOT_FOUND);
}

TEST_F(CoordinatorServiceTest, LeaveAbortsAndRejoinStartsEpochTwo) {
  CreateJob("j", 2);
  v1::JoinJobResponse a1, b1;
  std::thread t([&] { ASSERT_TRUE(Join("j", "a", -1, 5000, 5000, &a1).ok()); });
  ASSERT_TRUE(Join("j", "b", -1, 5001, 5000, &b1).ok());
  t.join();
  ASSERT_TRUE(Leave("j", b1.rank(), 1, "b").ok());

  v1::HeartbeatResponse hb;
  ASSERT_TRUE(Heartbeat("j", a1.rank(), 1, "a", &hb).ok());
  EXPECT_EQ(hb.state(), v1::JOB_STATE_ABORTED);
  EXPECT_EQ(hb.abort_reason(), absl::StrCat("rank ", b1.rank(), " (member 'b') left the job"));
  EXPECT_EQ(hb.dead_ranks_size(), 0);

  v1::JoinJobResponse a2, b2;
  std::thread t2([&] { ASSERT_TRUE(Join("j", "a", -1, 6000, 5000, &a2).ok()); });
  ASSERT_TRUE(Join("j", "b", -1, 6001, 5000, &b2).ok());
  t2.join();
  EXPECT_EQ(a2.epoch(), 2);
  EXPECT_EQ(b2.epoch(), 2);
  EXPECT_EQ(a2.members(a2.rank()).data_endpoint().port(), 6000);
  ASSERT_TRUE(Heartbeat("j", a2.rank(), 2, "a", &hb).ok());
  EXPECT_EQ(hb.state(), v1::JOB_STATE_RUNNING);
  EXPECT_EQ(hb.epoch(), 2);
}

TEST_F(CoordinatorServiceTest, HealthServiceAnswersServing) {
  // grpc.health.v1 stubs are not in Debian's packages: use a generic call.
  // HealthCheckRequest{service: ""} is empty; HealthCheckResponse{status:
  // SERVING} is field 1 varint 1 = bytes 08 01.
  grpc::GenericStub generic(channel_);
  for (const std::string service : {"", "gradsync.v1.Coordinator"}) {
    std::string request_bytes;
    if (!service.empty()) {
      request_bytes = std::string("\x0a", 1) + static_cast<char>(service.size()) + service;
    }
    grpc::Slice slice(request_bytes);
    grpc::ByteBuffer request(&slice, 1);
    grpc::ByteBuffer response;
    grpc::ClientContext ctx;
    ctx.set_deadline(In(absl::Seconds(5)));
    std::promise<grpc::Status> done;
    generic.UnaryCall(&ctx, "/grpc.health.v1.Health/Check", grpc::StubOptions(), &request,
                      &response, [&](grpc::Status s) { done.set_value(s); });
    grpc::Status s = done.get_future().get();
    ASSERT_TRUE(s.ok()) << service << ": " << s.error_message();
    std::vector<grpc::Slice> slices;
    ASSERT_TRUE(response.Dump(&slices).ok());
    std::string bytes;
    for (const auto& sl : slices) bytes.append(reinterpret_cast<const char*>(sl.begin()), sl.size());
    EXPECT_EQ(bytes, std::string("\x08\x01", 2)) << "service '" << service << "'";
  }
}

TEST_F(CoordinatorServiceTest, ShutdownUnblocksJoinAndWatchQuickly) {
  CreateJob("j", 2);
  grpc::Status join_status;
  std::thread joiner([&] {
    v1::JoinJobResponse r;
    join_status = Join("j", "a", -1, 5000, 60000, &r);
  });
  grpc::ClientContext wctx;
  v1::WatchJobRequest wreq;
  wreq.set_job_id("j");
  auto reader = stub_->WatchJob(&wctx, wreq);
  JobEvent ev;
  ASSERT_TRUE(reader->Read(&ev));
  EXPECT_EQ(ev.kind(), JobEvent::KIND_SNAPSHOT);
  ASSERT_TRUE(AwaitStatus("j", [](const v1::JobStatus& s) { return s.members_size() == 1; }));

  const absl::Time start = absl::Now();
  server_->Shutdown(absl::Seconds(2));
  EXPECT_LT(absl::Now() - start, absl::Seconds(1));
  joiner.join();
  EXPECT_EQ(join_status.error_code(), grpc::StatusCode::UNAVAILABLE);
  while (reader->Read(&ev)) {
  }
  EXPECT_FALSE(reader->Finish().ok());
}

TEST_F(CoordinatorServiceTest, SecondServerOnTheSamePortFailsToStart) {
  CoordinatorServerOptions options;
  options.listen_address = server_->address();
  auto second = CoordinatorServer::Start(std::move(options));
  EXPECT_EQ(second.status().code(), absl::StatusCode::kUnavailable);
}

// ---------------------------------------------------------------------------
// The real binary.

std::string BinaryPath() {
  const char* srcdir = std::getenv("TEST_SRCDIR");
  const char* workspace = std::getenv("TEST_WORKSPACE");
  if (srcdir == nullptr) return "server/gradsync-coordinator";
  return absl::StrCat(srcdir, "/", workspace ? workspace : "gradsync",
                      "/server/gradsync-coordinator");
}

pid_t Spawn(const std::vector<std::string>& args) {
  std::vector<char*> argv;
  for (const auto& a : args) argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);
  pid_t pid = -1;
  if (posix_spawn(&pid, argv[0], nullptr, nullptr, argv.data(), environ) != 0) return -1;
  return pid;
}

// Waits up to `timeout` for `pid`; returns its wait status or -1 on timeout.
int WaitFor(pid_t pid, absl::Duration timeout) {
  const absl::Time deadline = absl::Now() + timeout;
  while (absl::Now() < deadline) {
    int status = 0;
    if (waitpid(pid, &status, WNOHANG) == pid) return status;
    absl::SleepFor(absl::Milliseconds(10));
  }
  return -1;
}

TEST(CoordinatorBinaryTest, ServesOnPortFileAndExitsZeroOnSigterm) {
  const char* tmp = std::getenv("TEST_TMPDIR");
  const std::string port_file = absl::StrCat(tmp ? tmp : "/tmp", "/coordinator.", getpid(), ".port");
  unlink(port_file.c_str());
  const pid_t pid = Spawn({BinaryPath(), "--insecure", "--listen=127.0.0.1:0", "--metrics_listen=",
                           absl::StrCat("--port_file=", port_file), "--heartbeat_timeout_ms=1500"});
  ASSERT_GT(pid, 0) << "cannot start " << BinaryPath();

  int port = 0;
  const absl::Time deadline = absl::Now() + absl::Seconds(10);
  while (port == 0 && absl::Now() < deadline) {
    std::ifstream in(port_file);
    std::string line;
    if (in && std::getline(in, line) && !line.empty()) port = std::stoi(line);
    if (port == 0) absl::SleepFor(absl::Milliseconds(20));
  }
  if (port == 0) {
    kill(pid, SIGKILL);
    waitpid(pid, nullptr, 0);
    FAIL() << "no port file after 10 s";
  }

  auto channel =
      grpc::CreateChannel(absl::StrCat("127.0.0.1:", port), grpc::InsecureChannelCredentials());
  auto stub = v1::Coordinator::NewStub(channel);
  grpc::ClientContext ctx;
  ctx.set_deadline(In(absl::Seconds(5)));
  v1::CreateJobRequest req;
  req.set_job_id("bin-job");
  req.set_world_size(2);
  v1::CreateJobResponse resp;
  grpc::Status s = stub->CreateJob(&ctx, req, &resp);
  EXPECT_TRUE(s.ok()) << s.error_message();
  EXPECT_TRUE(resp.created());
  EXPECT_EQ(resp.options().heartbeat_timeout_ms(), 1500);  // from the flag

  // A rendezvous still blocked at SIGTERM fails with UNAVAILABLE at once.
  std::promise<grpc::Status> join_done;
  std::thread joiner([&] {
    grpc::ClientContext jctx;
    jctx.set_deadline(In(absl::Seconds(10)));
    v1::JoinJobRequest jreq;
    jreq.set_job_id("bin-job");
    jreq.set_member_id("lonely");
    jreq.set_member_key(job_registry_testing::MemberKey("lonely"));
    jreq.set_requested_rank(-1);
    jreq.set_timeout_ms(10000);
    v1::JoinJobResponse jresp;
    join_done.set_value(stub->JoinJob(&jctx, jreq, &jresp));
  });
  const absl::Time wait_until = absl::Now() + absl::Seconds(5);
  bool joined = false;
  while (!joined && absl::Now() < wait_until) {
    grpc::ClientContext sctx;
    v1::GetJobStatusRequest sreq;
    sreq.set_job_id("bin-job");
    v1::JobStatus st;
    joined = stub->GetJobStatus(&sctx, sreq, &st).ok() && st.members_size() == 1;
    if (!joined) absl::SleepFor(absl::Milliseconds(10));
  }
  EXPECT_TRUE(joined);

  const absl::Time sent = absl::Now();
  ASSERT_EQ(kill(pid, SIGTERM), 0);
  auto join_future = join_done.get_future();
  ASSERT_EQ(join_future.wait_for(std::chrono::seconds(1)), std::future_status::ready)
      << "the blocked JoinJob was not released by SIGTERM";
  EXPECT_EQ(join_future.get().error_code(), grpc::StatusCode::UNAVAILABLE);
  joiner.join();
  // Note: gRPC's graceful shutdown also waits, up to the 2 s grace, for idle
  // client connections (like ours: a non-polling client never acks GOAWAY,
  // even after its channel is destroyed), so the exit comes at about 2 s.
  const int status = WaitFor(pid, absl::Seconds(3) - (absl::Now() - sent));
  if (status == -1) {
    kill(pid, SIGKILL);
    waitpid(pid, nullptr, 0);
    FAIL() << "gradsync-coordinator did not exit within 3 s of SIGTERM";
  }
  ASSERT_TRUE(WIFEXITED(status)) << "status " << status;
  EXPECT_EQ(WEXITSTATUS(status), 0);
  std::fprintf(stderr, "exited %s after SIGTERM\n",
               absl::FormatDuration(absl::Now() - sent).c_str());
  struct stat port_stat;
  EXPECT_EQ(stat(port_file.c_str(), &port_stat), 0);  // renamed into place, no temp left over
  EXPECT_NE(stat(absl::StrCat(port_file, ".tmp.", pid).c_str(), &port_stat), 0);
}

TEST(CoordinatorBinaryTest, UnknownFlagExitsOne) {
  const pid_t pid = Spawn({BinaryPath(), "--no_such_flag=1"});
  ASSERT_GT(pid, 0);
  const int status = WaitFor(pid, absl::Seconds(5));
  ASSERT_NE(status, -1);
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 1);
}

}  // namespace
}  // namespace gradsync
