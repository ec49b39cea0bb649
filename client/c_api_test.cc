#include "client/c_api.h"

#include <dirent.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cstddef>

#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "client/fake_worker.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace {

using ::gradsync::client::testing::FakeWorker;
using ::testing::HasSubstr;

std::vector<std::string> LeftoverSegments() {
  std::vector<std::string> left;
  const std::string prefix = FakeWorker::ShmPrefix().substr(1);
  DIR* dir = opendir("/dev/shm");
  if (dir == nullptr) return left;
  while (struct dirent* e = readdir(dir)) {
    if (absl::StartsWith(e->d_name, prefix)) left.push_back(e->d_name);
  }
  closedir(dir);
  return left;
}

class CApiTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto fake = FakeWorker::Start(FakeWorker::NewAddress());
    ASSERT_TRUE(fake.ok()) << fake.status();
    fake_ = std::move(*fake);
    ASSERT_EQ(gs_client_connect(fake_->address().c_str(), 5000, &client_), GS_OK)
        << gs_last_error();
    ASSERT_EQ(gs_session_open(client_, "c-job", 1, -1, 3000, &session_), GS_OK) << gs_last_error();
  }

  void TearDown() override {
    EXPECT_EQ(gs_session_close(session_), GS_OK) << gs_last_error();
    gs_client_free(client_);
    fake_.reset();
    EXPECT_THAT(LeftoverSegments(), ::testing::IsEmpty());
  }

  std::unique_ptr<FakeWorker> fake_;
  gs_client* client_ = nullptr;
  gs_session* session_ = nullptr;
};

TEST_F(CApiTest, RoundTripInPlace) {
  EXPECT_EQ(gs_session_rank(session_), 0);
  EXPECT_EQ(gs_session_world_size(session_), 1);

  gs_buffer* buf = nullptr;
  ASSERT_EQ(gs_buffer_alloc(session_, 256 * sizeof(float), &buf), GS_OK) << gs_last_error();
  ASSERT_GE(gs_buffer_size(buf), 256 * sizeof(float));
  float* x = static_cast<float*>(gs_buffer_data(buf));
  for (int i = 0; i < 256; ++i) x[i] = static_cast<float>(i);

  uint64_t op_id = 0;
  ASSERT_EQ(gs_allreduce_async(session_, buf, 0, 256, GS_DTYPE_F32, GS_OP_SUM, "c/grad", 0, &op_id),
            GS_OK)
      << gs_last_error();
  ASSERT_EQ(gs_wait(session_, op_id, 5000), GS_OK) << gs_last_error();
  for (int i = 0; i < 256; ++i) ASSERT_EQ(x[i], 2.0f * i) << i;

  // Blocking form, on the second half only.
  ASSERT_EQ(gs_allreduce(session_, buf, 128 * sizeof(float), 128, GS_DTYPE_F32, GS_OP_AVG, NULL,
                         2000),
            GS_OK)
      << gs_last_error();
  EXPECT_EQ(x[127], 2.0f * 127);
  EXPECT_EQ(x[128], 4.0f * 128);
  EXPECT_EQ(fake_->last_submit_request().reduce_op(), gradsync::v1::REDUCE_OP_AVG);
  EXPECT_EQ(fake_->last_submit_request().timeout_ms(), 2000);

  EXPECT_EQ(gs_buffer_free(session_, buf), GS_OK) << gs_last_error();
  EXPECT_EQ(fake_->live_segments(), 0);
}

TEST_F(CApiTest, WaitTimesOutWhileRunningThenSucceeds) {
  fake_->set_op_delay(absl::Milliseconds(400));
  gs_buffer* buf = nullptr;
  ASSERT_EQ(gs_buffer_alloc(session_, 64, &buf), GS_OK) << gs_last_error();
  uint64_t op_id = 0;
  ASSERT_EQ(gs_allreduce_async(session_, buf, 0, 8, GS_DTYPE_I64, GS_OP_SUM, "c/slow", 0, &op_id),
            GS_OK);
  EXPECT_EQ(gs_wait(session_, op_id, 20), GS_PENDING);
  EXPECT_THAT(gs_last_error(), HasSubstr(absl::StrCat("op ", op_id)));
  EXPECT_EQ(gs_wait(session_, op_id, 0), GS_PENDING);
  EXPECT_EQ(gs_wait(session_, op_id, -1), GS_OK) << gs_last_error();
  EXPECT_EQ(gs_buffer_free(session_, buf), GS_OK);
}

TEST_F(CApiTest, FailedOpReturnsItsCodeAndMessage) {
  const std::string message = "allreduce 'c/w' aborted: rank 2 left the job";
  fake_->FailNextOp(absl::AbortedError(message));
  gs_buffer* buf = nullptr;
  ASSERT_EQ(gs_buffer_alloc(session_, 64, &buf), GS_OK);
  EXPECT_EQ(gs_allreduce(session_, buf, 0, 16, GS_DTYPE_F32, GS_OP_SUM, "c/w", 0), GS_ABORTED);
  EXPECT_STREQ(gs_last_error(), message.c_str());
  EXPECT_EQ(gs_buffer_free(session_, buf), GS_OK);
}

TEST_F(CApiTest, BadArgumentsFailWithoutRpc) {
  gs_buffer* buf = nullptr;
  ASSERT_EQ(gs_buffer_alloc(session_, 64, &buf), GS_OK);
  const int64_t rpcs = fake_->rpc_count();
  uint64_t op_id = 0;

  EXPECT_EQ(gs_allreduce_async(session_, buf, 0, 1, 42, GS_OP_SUM, "x", 0, &op_id),
            GS_INVALID_ARGUMENT);
  EXPECT_THAT(gs_last_error(), HasSubstr("dtype 42"));
  EXPECT_EQ(gs_allreduce(session_, buf, 0, 1, GS_DTYPE_F32, 0, "x", 0), GS_INVALID_ARGUMENT);
  EXPECT_THAT(gs_last_error(), HasSubstr("op 0"));
  EXPECT_EQ(gs_allreduce_async(session_, buf, 64, 1, GS_DTYPE_F32, GS_OP_SUM, "x", 0, &op_id),
            GS_INVALID_ARGUMENT);
  EXPECT_THAT(gs_last_error(), HasSubstr("offset_bytes 64"));
  EXPECT_EQ(gs_allreduce_async(session_, buf, 0, 17, GS_DTYPE_F32, GS_OP_SUM, "x", 0, &op_id),
            GS_INVALID_ARGUMENT);
  EXPECT_THAT(gs_last_error(), HasSubstr("count 17"));
  EXPECT_EQ(gs_allreduce_async(session_, buf, 0, 1, GS_DTYPE_F32, GS_OP_SUM, "x", -5, &op_id),
            GS_INVALID_ARGUMENT);
  EXPECT_EQ(gs_allreduce_async(session_, NULL, 0, 1, GS_DTYPE_F32, GS_OP_SUM, "x", 0, &op_id),
            GS_INVALID_ARGUMENT);
  EXPECT_THAT(gs_last_error(), HasSubstr("buffer is NULL"));
  EXPECT_EQ(gs_allreduce_async(session_, buf, 0, 1, GS_DTYPE_F32, GS_OP_SUM, "x", 0, NULL),
            GS_INVALID_ARGUMENT);
  EXPECT_EQ(gs_wait(session_, 1, -2), GS_INVALID_ARGUMENT);
  EXPECT_EQ(gs_buffer_alloc(session_, 0, &buf), GS_INVALID_ARGUMENT);
  EXPECT_EQ(op_id, 0u);
  EXPECT_EQ(fake_->rpc_count(), rpcs);
  EXPECT_EQ(gs_buffer_free(session_, buf), GS_OK);
}

// This build has no CUDA (the default build's stub): device buffers are
// refused before any RPC, naming why; host buffers report no device.
TEST_F(CApiTest, DeviceBuffersWithoutCudaSayWhy) {
  const uint64_t rpcs = fake_->rpc_count();
  gs_buffer* buf = nullptr;
  EXPECT_EQ(gs_buffer_alloc_device(session_, 1024, 0, &buf), GS_FAILED_PRECONDITION);
  EXPECT_THAT(gs_last_error(), HasSubstr("AllocateDeviceBuffer: device buffers need CUDA in this process"));
  EXPECT_THAT(gs_last_error(), HasSubstr("built without CUDA"));
  char host[64];
  EXPECT_EQ(gs_buffer_register_device(session_, host, sizeof(host), &buf), GS_FAILED_PRECONDITION);
  EXPECT_THAT(gs_last_error(), HasSubstr("RegisterDeviceBuffer"));
  EXPECT_EQ(gs_buffer_register_device(NULL, host, sizeof(host), &buf), GS_INVALID_ARGUMENT);
  EXPECT_EQ(buf, nullptr);
  EXPECT_EQ(fake_->rpc_count(), rpcs);
  ASSERT_EQ(gs_buffer_alloc(session_, 64, &buf), GS_OK);
  EXPECT_EQ(gs_buffer_cuda_device(buf), -1);
  EXPECT_EQ(gs_buffer_cuda_device(NULL), -1);
  EXPECT_EQ(gs_buffer_free(session_, buf), GS_OK);
}

TEST_F(CApiTest, BuffersOutliveTheirSession) {
  gs_buffer* buf = nullptr;
  ASSERT_EQ(gs_buffer_alloc(session_, 64, &buf), GS_OK);
  EXPECT_EQ(gs_session_close(session_), GS_OK);
  session_ = nullptr;
  EXPECT_EQ(fake_->live_segments(), 0);  // the daemon freed it at close
  static_cast<char*>(gs_buffer_data(buf))[0] = 1;  // still mapped
  EXPECT_EQ(gs_buffer_free(NULL, buf), GS_OK);
}

// The fake worker announces no fd socket (as a daemon reached over TCP):
// registering memory is refused with the reason, before anything is sent.
TEST_F(CApiTest, RegisterFdNeedsTheDaemonsFdSocket) {
  const int fd = memfd_create("c_api_test", MFD_ALLOW_SEALING | MFD_CLOEXEC);
  ASSERT_GE(fd, 0);
  ASSERT_EQ(ftruncate(fd, 4096), 0);
  gs_buffer* buf = nullptr;
  EXPECT_EQ(gs_buffer_register_fd(session_, fd, 0, 4096, &buf), GS_FAILED_PRECONDITION);
  EXPECT_THAT(gs_last_error(), HasSubstr("has no fd socket"));
  EXPECT_EQ(buf, nullptr);
  EXPECT_EQ(gs_buffer_register_fd(session_, fd, 0, 4096, NULL), GS_INVALID_ARGUMENT);
  EXPECT_EQ(gs_buffer_register_fd(session_, fd, 0, 0, &buf), GS_INVALID_ARGUMENT);
  EXPECT_THAT(gs_last_error(), HasSubstr("bytes must be > 0"));
  close(fd);
}

TEST(CApi, ConnectToMissingDaemonIsUnavailable) {
  const std::string target = FakeWorker::NewAddress() + "-missing";
  gs_client* client = nullptr;
  EXPECT_EQ(gs_client_connect(target.c_str(), 200, &client), GS_UNAVAILABLE);
  EXPECT_EQ(client, nullptr);
  EXPECT_THAT(gs_last_error(), HasSubstr(target));
}

// The spec-based calls: any collective through one struct, the result's
// plan and times, and the C-only checks named (no RPC for them).
TEST_F(CApiTest, SubmitRunAndPollWithASpec) {
  gs_buffer* buf = nullptr;
  ASSERT_EQ(gs_buffer_alloc(session_, 8 * sizeof(float), &buf), GS_OK) << gs_last_error();
  auto* f = static_cast<float*>(gs_buffer_data(buf));
  for (int i = 0; i < 8; ++i) f[i] = static_cast<float>(i);
  gs_collective_spec spec;
  gs_collective_spec_init(&spec);
  EXPECT_EQ(spec.struct_size, sizeof(gs_collective_spec));
  EXPECT_EQ(spec.kind, GS_ALLREDUCE);
  spec.buffer = buf;
  spec.count = 8;
  spec.name = "spec";
  gs_result result;
  ASSERT_EQ(gs_run(session_, &spec, &result), GS_OK) << gs_last_error();
  EXPECT_STREQ(result.algorithm, "fake-local");
  EXPECT_GE(result.queued_us, 0);
  EXPECT_EQ(f[7], 14.0f);  // the fake doubles
  uint64_t op = 0;
  ASSERT_EQ(gs_submit(session_, &spec, &op), GS_OK) << gs_last_error();
  int rc = GS_PENDING;
  for (int i = 0; i < 500 && rc == GS_PENDING; ++i) {
    rc = gs_poll(session_, op, &result);
    if (rc == GS_PENDING) absl::SleepFor(absl::Milliseconds(10));
  }
  EXPECT_EQ(rc, GS_OK) << gs_last_error();
  EXPECT_EQ(f[7], 28.0f);

  const int rpcs = fake_->rpc_count();
  gs_collective_spec bad = spec;
  bad.kind = 12;
  EXPECT_EQ(gs_submit(session_, &bad, &op), GS_INVALID_ARGUMENT);
  EXPECT_THAT(gs_last_error(), HasSubstr("collective 12 is not a valid value (1..11: allreduce"));
  bad = spec;
  bad.buffer = nullptr;
  EXPECT_EQ(gs_submit(session_, &bad, &op), GS_INVALID_ARGUMENT);
  EXPECT_THAT(gs_last_error(), HasSubstr("spec->buffer is NULL"));
  bad = spec;
  bad.dtype = 42;
  EXPECT_EQ(gs_run(session_, &bad, &result), GS_INVALID_ARGUMENT);
  EXPECT_THAT(gs_last_error(), HasSubstr("dtype 42 is not a valid value (1..9: f32 f64"));
  bad.dtype = 257;  // not narrowed to 1 (f32) on the way in
  EXPECT_EQ(gs_submit(session_, &bad, &op), GS_INVALID_ARGUMENT);
  EXPECT_THAT(gs_last_error(), HasSubstr("allreduce 'spec' on rank 0: dtype 257 is not a valid"));
  bad = spec;
  bad.timeout_ms = -5;
  EXPECT_EQ(gs_submit(session_, &bad, &op), GS_INVALID_ARGUMENT);
  EXPECT_THAT(gs_last_error(), HasSubstr("timeout must be finite and >= 0"));
  bad = spec;
  bad.struct_size = 0;
  EXPECT_EQ(gs_run(session_, &bad, &result), GS_INVALID_ARGUMENT);
  EXPECT_THAT(gs_last_error(), HasSubstr("call gs_collective_spec_init first"));
  EXPECT_EQ(fake_->rpc_count(), rpcs);
  // This fake has no op queue: no event fd, with the reason.
  int fd = -1;
  EXPECT_EQ(gs_session_event_fd(session_, &fd), GS_UNIMPLEMENTED);
  EXPECT_THAT(gs_last_error(), HasSubstr("needs the shared-memory op queue"));
  EXPECT_EQ(gs_buffer_free(session_, buf), GS_OK);
}

// gather and scatter reach the daemon as their own collectives with their
// root; a root that is not a rank is refused before any RPC.
TEST_F(CApiTest, GatherAndScatterCarryTheirKindAndRoot) {
  gs_buffer* buf = nullptr;
  ASSERT_EQ(gs_buffer_alloc(session_, 8 * sizeof(int32_t), &buf), GS_OK) << gs_last_error();
  auto* x = static_cast<int32_t*>(gs_buffer_data(buf));
  for (int i = 0; i < 8; ++i) x[i] = 3 * i;
  const struct {
    int kind;
    gradsync::v1::CollectiveType wire;
  } cases[] = {{GS_GATHER, gradsync::v1::COLLECTIVE_TYPE_GATHER},
               {GS_SCATTER, gradsync::v1::COLLECTIVE_TYPE_SCATTER}};
  for (const auto& c : cases) {
    gs_collective_spec spec;
    gs_collective_spec_init(&spec);
    spec.kind = c.kind;
    spec.buffer = buf;
    spec.count = 8;  // world size 1: one block
    spec.dtype = GS_DTYPE_I32;
    spec.root = 0;
    spec.name = c.kind == GS_GATHER ? "g" : "s";
    gs_result result;
    ASSERT_EQ(gs_run(session_, &spec, &result), GS_OK) << gs_last_error();
    EXPECT_EQ(fake_->last_submit_request().collective(), c.wire);
    EXPECT_EQ(fake_->last_submit_request().root(), 0);
    EXPECT_EQ(fake_->last_submit_request().count(), 8u);
    for (int i = 0; i < 8; ++i) EXPECT_EQ(x[i], 3 * i) << i;  // one rank: nothing moves
    const int64_t rpcs = fake_->rpc_count();
    spec.root = 1;
    uint64_t op = 0;
    EXPECT_EQ(gs_submit(session_, &spec, &op), GS_INVALID_ARGUMENT);
    EXPECT_THAT(gs_last_error(), HasSubstr(absl::StrCat(c.kind == GS_GATHER ? "gather" : "scatter",
                                                        " '", spec.name,
                                                        "' on rank 0: root 1 out of range for "
                                                        "world size 1")));
    EXPECT_EQ(fake_->rpc_count(), rpcs);
  }
  EXPECT_EQ(gs_buffer_free(session_, buf), GS_OK) << gs_last_error();
}

// premul_sum carries this rank's factor to the daemon; an older caller's
// shorter spec leaves it at 1; an integer dtype is refused before any RPC.
TEST_F(CApiTest, PremulSumCarriesTheRanksFactor) {
  gs_buffer* buf = nullptr;
  ASSERT_EQ(gs_buffer_alloc(session_, 8 * sizeof(float), &buf), GS_OK) << gs_last_error();
  gs_collective_spec spec;
  gs_collective_spec_init(&spec);
  EXPECT_EQ(spec.premul_factor, 1.0);
  spec.buffer = buf;
  spec.count = 8;
  spec.op = GS_OP_PREMUL_SUM;
  spec.premul_factor = 0.125;
  spec.name = "pre";
  gs_result result;
  ASSERT_EQ(gs_run(session_, &spec, &result), GS_OK) << gs_last_error();
  EXPECT_EQ(fake_->last_submit_request().reduce_op(), gradsync::v1::REDUCE_OP_PREMUL_SUM);
  EXPECT_TRUE(fake_->last_submit_request().has_premul_factor());
  EXPECT_EQ(fake_->last_submit_request().premul_factor(), 0.125);
  gs_collective_spec old = spec;
  old.struct_size = offsetof(gs_collective_spec, premul_factor);
  ASSERT_EQ(gs_run(session_, &old, &result), GS_OK) << gs_last_error();
  EXPECT_EQ(fake_->last_submit_request().premul_factor(), 1.0);
  const int64_t rpcs = fake_->rpc_count();
  spec.dtype = GS_DTYPE_I32;
  uint64_t op = 0;
  EXPECT_EQ(gs_submit(session_, &spec, &op), GS_INVALID_ARGUMENT);
  EXPECT_THAT(gs_last_error(), HasSubstr("allreduce 'pre' on rank 0: reduce op premul_sum needs "
                                         "a float dtype (f32, f64, f16, bf16, f8e4m3, f8e5m2), "
                                         "got i32"));
  EXPECT_EQ(fake_->rpc_count(), rpcs);
  EXPECT_EQ(gs_buffer_free(session_, buf), GS_OK) << gs_last_error();
}

// An op's codec reaches the daemon; a codec that cannot apply, or is not a
// codec, is refused before any RPC; an older caller's shorter spec sends
// none (the job's); the session's codec becomes the job option.
TEST_F(CApiTest, CodecsReachTheDaemonOrAreRefusedFirst) {
  gs_buffer* buf = nullptr;
  ASSERT_EQ(gs_buffer_alloc(session_, 8192 * sizeof(float), &buf), GS_OK) << gs_last_error();
  gs_collective_spec spec;
  gs_collective_spec_init(&spec);
  EXPECT_EQ(spec.codec, nullptr);
  spec.buffer = buf;
  spec.count = 8192;
  spec.codec = "int8";
  spec.name = "c";
  gs_result result;
  ASSERT_EQ(gs_run(session_, &spec, &result), GS_OK) << gs_last_error();
  EXPECT_EQ(fake_->last_submit_request().codec(), "int8");
  gs_collective_spec old = spec;
  old.struct_size = offsetof(gs_collective_spec, codec);
  ASSERT_EQ(gs_run(session_, &old, &result), GS_OK) << gs_last_error();
  EXPECT_EQ(fake_->last_submit_request().codec(), "");
  const int64_t rpcs = fake_->rpc_count();
  uint64_t op = 0;
  spec.count = 100;
  EXPECT_EQ(gs_submit(session_, &spec, &op), GS_INVALID_ARGUMENT);
  EXPECT_THAT(gs_last_error(), HasSubstr("allreduce 'c' on rank 0: codec 'int8' does not apply: "
                                         "100 elements per rank are fewer than one codec block"));
  spec.codec = "gzip";
  EXPECT_EQ(gs_submit(session_, &spec, &op), GS_INVALID_ARGUMENT);
  EXPECT_THAT(gs_last_error(), HasSubstr("unknown codec 'gzip'"));
  EXPECT_EQ(fake_->rpc_count(), rpcs);
  EXPECT_EQ(gs_buffer_free(session_, buf), GS_OK) << gs_last_error();

  gs_session_options o;
  gs_session_options_init(&o);
  o.job_id = "c-codec-job";
  o.codec = "auto:bf16,int8";
  gs_session* s = nullptr;
  ASSERT_EQ(gs_session_open_with(client_, &o, &s), GS_OK) << gs_last_error();
  EXPECT_EQ(fake_->last_open_request().options().codec(), "auto:bf16,int8");
  EXPECT_EQ(gs_session_close(s), GS_OK);
}

TEST_F(CApiTest, SessionOptionsAreCheckedAndUsed) {
  gs_session_options o;
  gs_session_options_init(&o);
  EXPECT_EQ(o.rank, -1);
  EXPECT_EQ(o.world_size, 1);
  gs_session* s = nullptr;
  EXPECT_EQ(gs_session_open_with(client_, &o, &s), GS_INVALID_ARGUMENT);
  EXPECT_THAT(gs_last_error(), HasSubstr("options->job_id is NULL"));
  o.job_id = "c-job-2";
  o.timeout_ms = 0;
  EXPECT_EQ(gs_session_open_with(client_, &o, &s), GS_INVALID_ARGUMENT);
  EXPECT_THAT(gs_last_error(), HasSubstr("timeout_ms must be > 0"));
  o.timeout_ms = 3000;
  o.world_size = 0;
  EXPECT_EQ(gs_session_open_with(client_, &o, &s), GS_INVALID_ARGUMENT);
  EXPECT_THAT(gs_last_error(), HasSubstr("world_size must be >= 1"));
  o.world_size = 1;
  o.op_timeout_ms = 4000;
  ASSERT_EQ(gs_session_open_with(client_, &o, &s), GS_OK) << gs_last_error();
  EXPECT_EQ(gs_session_rank(s), 0);
  EXPECT_EQ(gs_session_close(s), GS_OK);
}

}  // namespace
