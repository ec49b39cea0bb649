// Forged coordinator requests against a running job of real processes (a
// coordinator and two gradsyncd on loopback, mutual TLS), sent with a valid
// node certificate (a compromised or misbehaving node) and built from what
// GetJobStatus shows: the job id, each rank's member id and the epoch. Without the
// members' keys, a LeaveJob (it aborted every rank before), a join retry
// with the victim's member id and another endpoint (it took over the rank's
// endpoint before) and heartbeats are refused, and the job goes on.
#include <memory>
#include <string>
#include <vector>

#include <grpcpp/create_channel.h>
#include <grpcpp/security/credentials.h>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/tls.h"
#include "gtest/gtest.h"
#include "proto/coordinator.grpc.pb.h"
#include "tests/cluster_util.h"

namespace gradsync {
namespace {

using ControlPlaneForgery = testing::SharedClusterTest<2>;

std::unique_ptr<grpc::ClientContext> Ctx() {
  auto ctx = std::make_unique<grpc::ClientContext>();
  ctx->set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(10)));
  // The cluster's tenant (a misbehaving node of the same tenant, at worst).
  ctx->AddMetadata("authorization", "Bearer " + LabTenantToken());
  return ctx;
}

// Every rank allreduces i32 data; the sum must be exact.
void ExpectAllreduceWorks(std::vector<testing::RankHandle>& job, const std::string& name) {
  std::vector<std::string> errors(job.size());
  testing::OnEveryRank(static_cast<int>(job.size()), [&](int r) {
    client::Session& s = *job[r].session;
    auto buf = s.AllocateBuffer(256 * 4);
    if (!buf.ok()) return void(errors[r] = buf.status().ToString());
    auto* v = static_cast<int32_t*>((*buf)->data());
    for (int i = 0; i < 256; ++i) v[i] = i + 1000 * r;
    auto res = s.Allreduce(**buf, 0, 256, DType::kI32, ReduceOp::kSum, name);
    if (!res.ok()) return void(errors[r] = res.status().ToString());
    for (int i = 0; i < 256; ++i) {
      if (v[i] != 2 * i + 1000) return void(errors[r] = absl::StrCat("element ", i, " is ", v[i]));
    }
  });
  for (size_t r = 0; r < job.size(); ++r) EXPECT_EQ(errors[r], "") << name << " rank " << r;
}

TEST_F(ControlPlaneForgery, RequestsWithoutTheMembersKeysChangeNothing) {
  auto job = testing::OpenJob(*cluster_, "forgery", {0, 1});
  ASSERT_TRUE(job.ok()) << job.status();
  ExpectAllreduceWorks(*job, "before");

  auto credentials = MakeChannelCredentials(cluster_->certs().node);
  ASSERT_TRUE(credentials.ok()) << credentials.status();
  auto stub = v1::Coordinator::NewStub(
      grpc::CreateChannel(cluster_->coordinator_address(), *credentials));
  v1::JobStatus status;
  {
    v1::GetJobStatusRequest req;
    req.set_job_id("forgery");
    ASSERT_TRUE(stub->GetJobStatus(Ctx().get(), req, &status).ok());
  }
  ASSERT_EQ(status.members_size(), 2);
  const v1::Member& victim = status.members(1);

  v1::LeaveJobRequest leave;
  leave.set_job_id("forgery");
  leave.set_rank(1);
  leave.set_epoch(status.epoch());
  v1::LeaveJobResponse left;
  grpc::Status s = stub->LeaveJob(Ctx().get(), leave, &left);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::PERMISSION_DENIED) << s.error_message();
  leave.set_member_id(victim.member_id());
  leave.set_member_key("guessed-key-0123456789");
  s = stub->LeaveJob(Ctx().get(), leave, &left);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::PERMISSION_DENIED) << s.error_message();

  v1::JoinJobRequest join;
  join.set_job_id("forgery");
  join.set_member_id(victim.member_id());
  join.set_member_key("attacker-key-0123456789");
  join.set_requested_rank(1);
  join.mutable_data_endpoint()->set_host("127.0.0.1");
  join.mutable_data_endpoint()->set_port(1);
  join.set_timeout_ms(1000);
  v1::JoinJobResponse joined;
  s = stub->JoinJob(Ctx().get(), join, &joined);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::PERMISSION_DENIED) << s.error_message();

  v1::HeartbeatRequest beat;
  beat.set_job_id("forgery");
  beat.set_rank(1);
  beat.set_epoch(status.epoch());
  beat.set_member_id(victim.member_id());
  v1::HeartbeatResponse beaten;
  s = stub->Heartbeat(Ctx().get(), beat, &beaten);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::PERMISSION_DENIED) << s.error_message();

  v1::JobStatus after;
  {
    v1::GetJobStatusRequest req;
    req.set_job_id("forgery");
    ASSERT_TRUE(stub->GetJobStatus(Ctx().get(), req, &after).ok());
  }
  EXPECT_EQ(after.state(), v1::JOB_STATE_RUNNING);
  EXPECT_EQ(after.epoch(), status.epoch());
  EXPECT_EQ(after.members(1).data_endpoint().port(), victim.data_endpoint().port());
  ExpectAllreduceWorks(*job, "after");
  for (auto& r : *job) EXPECT_TRUE(r.session->Close().ok());
}

}  // namespace
}  // namespace gradsync
