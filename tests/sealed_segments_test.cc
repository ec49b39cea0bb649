// Daemon-made shared memory against a real gradsyncd: buffers and op queues
// are memfds sealed against any size change, handed to the session's client
// once on the fd socket, so a client cannot make the daemon fault (it
// truncated its op queue or a buffer to 0 and gradsyncd died of SIGBUS).
// The test speaks the Worker gRPC API and the fd socket itself, as a hostile
// client would.
#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cstring>
#include <memory>
#include <string>

#include <grpcpp/create_channel.h>
#include <grpcpp/security/credentials.h>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/metrics_testing.h"
#include "common/net.h"
#include "gtest/gtest.h"
#include "ipc/fd_registration.h"
#include "ipc/shared_memory.h"
#include "proto/worker.grpc.pb.h"
#include "tests/cluster_util.h"

namespace gradsync {
namespace {

using SealedSegments = testing::SharedClusterTest<1>;

// A world-1 session opened over raw gRPC, with what the daemon hands its
// client: the fd socket and the registration token.
struct RawSession {
  std::unique_ptr<v1::Worker::Stub> stub;
  v1::OpenSessionResponse open;
};

RawSession Open(LocalCluster& cluster, const std::string& job) {
  RawSession s;
  s.stub = v1::Worker::NewStub(
      grpc::CreateChannel(cluster.daemon_target(0), grpc::InsecureChannelCredentials()));
  v1::OpenSessionRequest req;
  req.set_job_id(job);
  req.set_world_size(1);
  req.set_rank(0);
  req.set_timeout_ms(30000);
  req.set_tenant_token(LabTenantToken());
  grpc::ClientContext ctx;
  ctx.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(40)));
  grpc::Status st = s.stub->OpenSession(&ctx, req, &s.open);
  EXPECT_TRUE(st.ok()) << st.error_message();
  return s;
}

v1::AllocateBufferResponse Allocate(RawSession& s, uint64_t bytes, grpc::Status* status) {
  v1::AllocateBufferRequest req;
  req.set_session_id(s.open.session_id());
  req.set_size_bytes(bytes);
  grpc::ClientContext ctx;
  ctx.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(10)));
  v1::AllocateBufferResponse resp;
  *status = s.stub->AllocateBuffer(&ctx, req, &resp);
  return resp;
}

absl::StatusOr<ipc::FetchedSegment> Fetch(const RawSession& s, ipc::SegmentKind kind, uint64_t id,
                                          std::string token = "") {
  ipc::FetchRequest req;
  req.session_id = s.open.session_id();
  req.token = token.empty() ? s.open.registration_token() : token;
  req.kind = kind;
  req.id = id;
  return ipc::FetchSegment(s.open.fd_socket(), req, absl::Now() + absl::Seconds(10));
}

void Close(RawSession& s) {
  v1::CloseSessionRequest req;
  req.set_session_id(s.open.session_id());
  grpc::ClientContext ctx;
  ctx.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(10)));
  v1::CloseSessionResponse resp;
  EXPECT_TRUE(s.stub->CloseSession(&ctx, req, &resp).ok());
}

// Seals as the daemon set them, and what a client can no longer do.
void ExpectCannotResize(int fd, uint64_t size, const std::string& what) {
  EXPECT_EQ(::fcntl(fd, F_GET_SEALS), ipc::kSegmentSeals) << what;
  EXPECT_EQ(::ftruncate(fd, 0), -1) << what << " could shrink";
  EXPECT_EQ(errno, EPERM) << what;
  EXPECT_EQ(::ftruncate(fd, static_cast<off_t>(2 * size)), -1) << what << " could grow";
  EXPECT_EQ(::fcntl(fd, F_ADD_SEALS, F_SEAL_WRITE), -1) << what << " took another seal";
}

// The attack: a client fetches its buffer and op queue, tries to shrink,
// grow and write-seal them, then uses them; every resize is refused by the
// kernel, the daemon runs the op on the buffer and answers, and each
// descriptor is handed out once, only with the session's token.
TEST_F(SealedSegments, AClientCannotResizeWhatTheDaemonMaps) {
  RawSession s = Open(*cluster_, "sealed-resize");
  ASSERT_FALSE(s.open.fd_socket().empty());
  const uint64_t count = 4096;
  grpc::Status st;
  v1::AllocateBufferResponse buf = Allocate(s, count * 4, &st);
  ASSERT_TRUE(st.ok()) << st.error_message();
  EXPECT_TRUE(buf.by_descriptor());
  EXPECT_EQ(buf.shm_name(), "");  // nothing in /dev/shm for another process to open

  auto forged = Fetch(s, ipc::SegmentKind::kBuffer, buf.buffer_id(),
                      std::string(ipc::kRegistrationTokenBytes, 'x'));
  EXPECT_EQ(forged.status().code(), absl::StatusCode::kPermissionDenied) << forged.status();
  auto fetched = Fetch(s, ipc::SegmentKind::kBuffer, buf.buffer_id());
  ASSERT_TRUE(fetched.ok()) << fetched.status();
  EXPECT_EQ(fetched->size, count * 4);
  ExpectCannotResize(fetched->fd.get(), count * 4, "a buffer");
  auto again = Fetch(s, ipc::SegmentKind::kBuffer, buf.buffer_id());
  EXPECT_EQ(again.status().code(), absl::StatusCode::kFailedPrecondition) << again.status();
  EXPECT_TRUE(absl::StrContains(again.status().message(), "already fetched")) << again.status();
  auto missing = Fetch(s, ipc::SegmentKind::kBuffer, 999);
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kNotFound) << missing.status();

  {
    v1::OpenOpQueueRequest req;
    req.set_session_id(s.open.session_id());
    grpc::ClientContext ctx;
    ctx.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(10)));
    v1::OpenOpQueueResponse q;
    ASSERT_TRUE(s.stub->OpenOpQueue(&ctx, req, &q).ok());
    EXPECT_TRUE(q.by_descriptor());
    auto queue = Fetch(s, ipc::SegmentKind::kOpQueue, 0);
    ASSERT_TRUE(queue.ok()) << queue.status();
    EXPECT_GE(queue->size, q.size_bytes());
    ExpectCannotResize(queue->fd.get(), q.size_bytes(), "the op queue");
    EXPECT_EQ(Fetch(s, ipc::SegmentKind::kOpQueue, 0).status().code(),
              absl::StatusCode::kFailedPrecondition);
  }

  // The daemon still serves: an allreduce over the mapped buffer completes
  // and leaves this world-1 job's data as they were, bit for bit.
  void* p = ::mmap(nullptr, count * 4, PROT_READ | PROT_WRITE, MAP_SHARED, fetched->fd.get(), 0);
  ASSERT_NE(p, MAP_FAILED);
  auto* v = static_cast<int32_t*>(p);
  for (uint64_t i = 0; i < count; ++i) v[i] = static_cast<int32_t>(i * 7 - 3);
  v1::SubmitRequest sub;
  sub.set_session_id(s.open.session_id());
  sub.set_collective(v1::COLLECTIVE_TYPE_ALLREDUCE);
  sub.set_name("sealed.allreduce");
  sub.set_dtype(v1::DATA_TYPE_I32);
  sub.set_count(count);
  sub.set_reduce_op(v1::REDUCE_OP_SUM);
  sub.set_buffer_id(buf.buffer_id());
  v1::SubmitResponse submitted;
  {
    grpc::ClientContext ctx;
    ctx.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(10)));
    grpc::Status s2 = s.stub->Submit(&ctx, sub, &submitted);
    ASSERT_TRUE(s2.ok()) << s2.error_message();
  }
  v1::WaitRequest wait;
  wait.set_session_id(s.open.session_id());
  wait.set_op_id(submitted.op_id());
  wait.set_timeout_ms(20000);
  v1::WaitResponse done;
  {
    grpc::ClientContext ctx;
    ctx.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(30)));
    grpc::Status s2 = s.stub->Wait(&ctx, wait, &done);
    ASSERT_TRUE(s2.ok()) << s2.error_message();
  }
  EXPECT_TRUE(done.done());
  for (uint64_t i = 0; i < count; ++i) {
    ASSERT_EQ(v[i], static_cast<int32_t>(i * 7 - 3)) << "element " << i;
  }
  ::munmap(p, count * 4);
  Close(s);

  auto page = HttpGet("127.0.0.1", cluster_->daemon_metrics_port(0), "/metrics");
  ASSERT_TRUE(page.ok()) << page.status();
  const std::string series = "gradsync_daemon_fd_fetches_total";
  auto denied = FindSample(*page, series + "{result=\"permission_denied\"}");
  ASSERT_TRUE(denied.ok()) << denied.status();
  EXPECT_EQ(*denied, 1);
  auto twice = FindSample(*page, series + "{result=\"failed_precondition\"}");
  ASSERT_TRUE(twice.ok()) << twice.status();
  EXPECT_EQ(*twice, 2);
  auto ok = FindSample(*page, series + "{result=\"ok\"}");
  ASSERT_TRUE(ok.ok()) << ok.status();
  EXPECT_GE(*ok, 2);
}

// Every unfetched buffer holds a descriptor in the daemon: a session may
// have 16 waiting; the 17th allocation is refused naming the limit, and
// freeing one makes room.
TEST_F(SealedSegments, UnfetchedBuffersAreBounded) {
  RawSession s = Open(*cluster_, "sealed-unfetched");
  grpc::Status st;
  uint64_t first = 0;
  for (int i = 0; i < 16; ++i) {
    v1::AllocateBufferResponse b = Allocate(s, 4096, &st);
    ASSERT_TRUE(st.ok()) << i << ": " << st.error_message();
    if (i == 0) first = b.buffer_id();
  }
  Allocate(s, 4096, &st);
  EXPECT_EQ(st.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
  EXPECT_TRUE(absl::StrContains(st.error_message(), "at most 16 may wait")) << st.error_message();
  {
    v1::FreeBufferRequest req;
    req.set_session_id(s.open.session_id());
    req.set_buffer_id(first);
    grpc::ClientContext ctx;
    ctx.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(10)));
    v1::FreeBufferResponse resp;
    ASSERT_TRUE(s.stub->FreeBuffer(&ctx, req, &resp).ok());
  }
  v1::AllocateBufferResponse b = Allocate(s, 4096, &st);
  ASSERT_TRUE(st.ok()) << st.error_message();
  EXPECT_TRUE(Fetch(s, ipc::SegmentKind::kBuffer, b.buffer_id()).ok());
  Allocate(s, 4096, &st);  // the fetch made room too
  EXPECT_TRUE(st.ok()) << st.error_message();
  Close(s);
}

// Through the SDK the same is invisible: buffers come by descriptor, and
// ranks allreduce in them as before.
TEST_F(SealedSegments, SdkBuffersComeByDescriptor) {
  auto job = testing::OpenJob(*cluster_, "sealed-sdk", {0, 0});
  ASSERT_TRUE(job.ok()) << job.status();
  std::vector<std::string> errors(2);
  testing::OnEveryRank(2, [&](int r) {
    client::Session& s = *(*job)[r].session;
    auto buf = s.AllocateBuffer(1024 * 4);
    if (!buf.ok()) return void(errors[r] = buf.status().ToString());
    if (!absl::StartsWith((*buf)->shm_name(), "sealed memfd")) {
      return void(errors[r] = absl::StrCat("buffer segment '", (*buf)->shm_name(), "'"));
    }
    auto* v = static_cast<int32_t*>((*buf)->data());
    for (int i = 0; i < 1024; ++i) v[i] = i * (r + 1);
    client::CollectiveSpec spec;
    spec.buffer = buf->get();
    spec.count = 1024;
    spec.dtype = DType::kI32;
    spec.op = ReduceOp::kSum;
    spec.name = "sealed.sdk";
    auto res = s.Run(spec);
    if (!res.ok()) return void(errors[r] = res.status().ToString());
    for (int i = 0; i < 1024; ++i) {
      if (v[i] != i * 3) return void(errors[r] = absl::StrCat("element ", i, " is ", v[i]));
    }
  });
  for (int r = 0; r < 2; ++r) EXPECT_EQ(errors[r], "") << "rank " << r;
  for (auto& r : *job) EXPECT_TRUE(r.session->Close().ok());
}

// A daemon without an fd socket (--fd_socket=) cannot hand out descriptors:
// its segments are named POSIX shared memory, as the docs say (unsealed).
TEST(SealedSegmentsWithoutFdSocket, BuffersAreNamedSegments) {
  auto cluster = testing::StartCluster(1, {"--fd_socket="});
  ASSERT_NE(cluster, nullptr);
  auto job = testing::OpenJob(*cluster, "sealed-none", testing::FirstN(1));
  ASSERT_TRUE(job.ok()) << job.status();
  auto buf = (*job)[0].session->AllocateBuffer(4096);
  ASSERT_TRUE(buf.ok()) << buf.status();
  EXPECT_TRUE(absl::StartsWith((*buf)->shm_name(), "/gradsync.")) << (*buf)->shm_name();
  EXPECT_TRUE((*job)[0].session->FreeBuffer(std::move(*buf)).ok());
  EXPECT_TRUE((*job)[0].session->Close().ok());
}

}  // namespace
}  // namespace gradsync
