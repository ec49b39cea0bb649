#include "client/c_api.h"

#include <dirent.h>

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
  EXPECT_EQ(gs_wait(session_, op_id, 20), GS_DEADLINE_EXCEEDED);
  EXPECT_THAT(gs_last_error(), HasSubstr(absl::StrCat("op ", op_id)));
  EXPECT_EQ(gs_wait(session_, op_id, 0), GS_DEADLINE_EXCEEDED);
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

TEST_F(CApiTest, BuffersOutliveTheirSession) {
  gs_buffer* buf = nullptr;
  ASSERT_EQ(gs_buffer_alloc(session_, 64, &buf), GS_OK);
  EXPECT_EQ(gs_session_close(session_), GS_OK);
  session_ = nullptr;
  EXPECT_EQ(fake_->live_segments(), 0);  // the daemon freed it at close
  static_cast<char*>(gs_buffer_data(buf))[0] = 1;  // still mapped
  EXPECT_EQ(gs_buffer_free(NULL, buf), GS_OK);
}

TEST(CApi, ConnectToMissingDaemonIsUnavailable) {
  const std::string target = FakeWorker::NewAddress() + "-missing";
  gs_client* client = nullptr;
  EXPECT_EQ(gs_client_connect(target.c_str(), 200, &client), GS_UNAVAILABLE);
  EXPECT_EQ(client, nullptr);
  EXPECT_THAT(gs_last_error(), HasSubstr(target));
}

}  // namespace
