// A cluster of real processes with mutual TLS on the control plane (a
// coordinator, two gradsyncd and a gradsync-ps shard, certificates made for
// the test): jobs form and run, including over the PS shard; a caller
// without a certificate, or with one from another CA, does not get in; each
// role gets only its own calls.
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include <grpcpp/create_channel.h>
#include <grpcpp/security/credentials.h>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "cli/status.h"
#include "common/certs.h"
#include "common/tls.h"
#include "gtest/gtest.h"
#include "proto/coordinator.grpc.pb.h"
#include "proto/status.grpc.pb.h"
#include "tests/cluster_util.h"

namespace gradsync {
namespace {

constexpr char kOtherToken[] = "0ther0ther0ther0-status-tenant";

class TlsCluster : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    LocalClusterOptions o;
    o.daemons = 2;
    o.ps_shards = 1;
    o.tls = true;
    o.extra_tenants = {absl::StrCat("other ", kOtherToken)};
    auto c = LocalCluster::Start(o);
    ASSERT_TRUE(c.ok()) << c.status();
    cluster_ = c->release();
  }
  static void TearDownTestSuite() {
    delete cluster_;
    cluster_ = nullptr;
  }

  static std::unique_ptr<v1::Coordinator::Stub> Coordinator(const TlsConfig& tls) {
    auto credentials = MakeChannelCredentials(tls);
    EXPECT_TRUE(credentials.ok()) << credentials.status();
    return v1::Coordinator::NewStub(
        grpc::CreateChannel(cluster_->coordinator_address(), *credentials));
  }

  static std::unique_ptr<grpc::ClientContext> Ctx() {
    auto ctx = std::make_unique<grpc::ClientContext>();
    ctx->set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(10)));
    // The cluster's tenant (a misbehaving node of the same tenant, at worst).
    ctx->AddMetadata("authorization", "Bearer " + LabTenantToken());
    return ctx;
  }

  static LocalCluster* cluster_;
};

LocalCluster* TlsCluster::cluster_ = nullptr;

// The daemons create, join and heartbeat over mutual TLS, and the shard
// registered over it: a 2-rank job allreduces through the ring and the PS.
TEST_F(TlsCluster, JobsRunWithTheControlPlaneOnMutualTls) {
  auto job = testing::OpenJob(*cluster_, "tls-job", {0, 1}, 30000, 0, /*ps_shards=*/1);
  ASSERT_TRUE(job.ok()) << job.status();
  std::vector<std::string> errors(2);
  testing::OnEveryRank(2, [&](int r) {
    client::Session& s = *(*job)[r].session;
    for (const char* algorithm : {"ring", "ps"}) {
      auto buf = s.AllocateBuffer(512 * 4);
      if (!buf.ok()) return void(errors[r] = buf.status().ToString());
      auto* v = static_cast<int32_t*>((*buf)->data());
      for (int i = 0; i < 512; ++i) v[i] = i * (r + 1);
      client::CollectiveSpec spec;
      spec.buffer = buf->get();
      spec.count = 512;
      spec.dtype = DType::kI32;
      spec.op = ReduceOp::kSum;
      spec.algorithm = algorithm;
      spec.name = absl::StrCat("tls.", algorithm);
      auto res = s.Run(spec);
      if (!res.ok()) return void(errors[r] = absl::StrCat(algorithm, ": ", res.status().ToString()));
      for (int i = 0; i < 512; ++i) {
        if (v[i] != 3 * i) {
          return void(errors[r] = absl::StrCat(algorithm, ": element ", i, " is ", v[i]));
        }
      }
    }
  });
  for (int r = 0; r < 2; ++r) EXPECT_EQ(errors[r], "") << "rank " << r;

  // An operator reads the job, the shard and every daemon's sessions.
  StatusOptions so;
  so.coordinator = cluster_->coordinator_address();
  so.job = "tls-job";
  so.tls = cluster_->certs().operator_;
  auto hanging = RunStatus(so);
  EXPECT_TRUE(hanging.ok()) << hanging.status();
  for (auto& r : *job) EXPECT_TRUE(r.session->Close().ok());
}

TEST_F(TlsCluster, CallersWithoutACertificateOfTheCaDoNotGetIn) {
  v1::ListJobsResponse jobs;
  grpc::Status plain = Coordinator(TlsConfig{})->ListJobs(Ctx().get(), {}, &jobs);
  EXPECT_EQ(plain.error_code(), grpc::StatusCode::UNAVAILABLE) << plain.error_message();

  auto foreign = MakeLabCerts(cluster_->work_dir() + "/foreign-ca", {});
  ASSERT_TRUE(foreign.ok()) << foreign.status();
  grpc::Status other_ca = Coordinator(foreign->node)->ListJobs(Ctx().get(), {}, &jobs);
  EXPECT_EQ(other_ca.error_code(), grpc::StatusCode::UNAVAILABLE) << other_ca.error_message();

  // The daemons' status services ask for a certificate too.
  auto job = testing::OpenJob(*cluster_, "tls-status", {0});
  ASSERT_TRUE(job.ok()) << job.status();
  v1::JobStatus status;
  v1::GetJobStatusRequest req;
  req.set_job_id("tls-status");
  ASSERT_TRUE(Coordinator(cluster_->certs().operator_)->GetJobStatus(Ctx().get(), req, &status).ok());
  const std::string endpoint = status.members(0).status_endpoint();
  ASSERT_FALSE(endpoint.empty());
  auto daemon = v1::DaemonStatus::NewStub(
      grpc::CreateChannel(endpoint, grpc::InsecureChannelCredentials()));
  v1::DaemonStatusResponse daemon_status;
  grpc::Status s = daemon->GetStatus(Ctx().get(), {}, &daemon_status);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::UNAVAILABLE) << s.error_message();
  auto ps_credentials = MakeChannelCredentials(cluster_->certs().ps);
  ASSERT_TRUE(ps_credentials.ok());
  s = v1::DaemonStatus::NewStub(grpc::CreateChannel(endpoint, *ps_credentials))
          ->GetStatus(Ctx().get(), {}, &daemon_status);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::PERMISSION_DENIED) << s.error_message();
  EXPECT_TRUE((*job)[0].session->Close().ok());
}

// Roles come from the certificate's OU: an operator reads but cannot create
// or join jobs; a PS shard registers but cannot read jobs.
TEST_F(TlsCluster, EachRoleGetsOnlyItsOwnCalls) {
  auto op = Coordinator(cluster_->certs().operator_);
  v1::ListJobsResponse jobs;
  EXPECT_TRUE(op->ListJobs(Ctx().get(), {}, &jobs).ok());
  v1::ListShardsResponse shards;
  ASSERT_TRUE(op->ListShards(Ctx().get(), {}, &shards).ok());
  EXPECT_EQ(shards.shards_size(), 1);

  v1::CreateJobRequest create;
  create.set_job_id("by-operator");
  create.set_world_size(1);
  v1::CreateJobResponse created;
  grpc::Status s = op->CreateJob(Ctx().get(), create, &created);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::PERMISSION_DENIED);
  EXPECT_EQ(s.error_message(), "CreateJob is not allowed for operator 'lab-operator' (allowed: "
                               "certificates with OU node)");
  v1::JoinJobRequest join;
  join.set_job_id("by-operator");
  v1::JoinJobResponse joined;
  EXPECT_EQ(op->JoinJob(Ctx().get(), join, &joined).error_code(),
            grpc::StatusCode::PERMISSION_DENIED);

  auto ps = Coordinator(cluster_->certs().ps);
  s = ps->ListJobs(Ctx().get(), {}, &jobs);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::PERMISSION_DENIED);
  EXPECT_TRUE(absl::StrContains(s.error_message(), "ps 'lab-ps'")) << s.error_message();
}

// A member's key is bound to the certificate that joined it: another node
// presenting the same member id and key (a stolen key) is refused.
TEST_F(TlsCluster, AMemberKeyWorksOnlyFromTheNodeThatJoined) {
  auto other = AddLabCert(cluster_->certs().dir, "node", "node-b", {});
  ASSERT_TRUE(other.ok()) << other.status();
  auto a = Coordinator(cluster_->certs().node);
  auto b = Coordinator(*other);
  v1::CreateJobRequest create;
  create.set_job_id("bound");
  create.set_world_size(1);
  v1::CreateJobResponse created;
  ASSERT_TRUE(a->CreateJob(Ctx().get(), create, &created).ok());
  v1::JoinJobRequest join;
  join.set_job_id("bound");
  join.set_member_id("m");
  join.set_member_key("0123456789abcdef");
  join.set_requested_rank(0);
  join.set_timeout_ms(5000);
  v1::JoinJobResponse joined;
  grpc::Status s = a->JoinJob(Ctx().get(), join, &joined);
  ASSERT_TRUE(s.ok()) << s.error_message();

  v1::HeartbeatRequest beat;
  beat.set_job_id("bound");
  beat.set_rank(0);
  beat.set_epoch(joined.epoch());
  beat.set_member_id("m");
  beat.set_member_key("0123456789abcdef");
  v1::HeartbeatResponse beaten;
  s = b->Heartbeat(Ctx().get(), beat, &beaten);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::PERMISSION_DENIED) << s.error_message();
  EXPECT_TRUE(a->Heartbeat(Ctx().get(), beat, &beaten).ok());
  s = b->JoinJob(Ctx().get(), join, &joined);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::PERMISSION_DENIED) << s.error_message();

  v1::LeaveJobRequest leave;
  leave.set_job_id("bound");
  leave.set_rank(0);
  leave.set_epoch(joined.epoch());
  leave.set_member_id("m");
  leave.set_member_key("0123456789abcdef");
  v1::LeaveJobResponse left;
  s = b->LeaveJob(Ctx().get(), leave, &left);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::PERMISSION_DENIED) << s.error_message();
  EXPECT_TRUE(a->LeaveJob(Ctx().get(), leave, &left).ok());
}

// A revoked node certificate (`gradsync certs --revoke`, the CA's CRL in
// --tls_crl_dir) is refused from the next handshake on, while the cluster's
// own nodes and another node certificate of the same CA go on working.
TEST_F(TlsCluster, ARevokedCertificateIsRefusedAtTheNextHandshake) {
  auto doomed = AddLabCert(cluster_->certs().dir, "node", "node-revoked", {});
  ASSERT_TRUE(doomed.ok()) << doomed.status();
  auto kept = AddLabCert(cluster_->certs().dir, "node", "node-kept", {});
  ASSERT_TRUE(kept.ok()) << kept.status();
  // A fresh connection per call (no shared subchannel), so each call handshakes.
  int n = 0;
  auto list = [&](const TlsConfig& tls) {
    auto credentials = MakeChannelCredentials(tls);
    EXPECT_TRUE(credentials.ok()) << credentials.status();
    grpc::ChannelArguments args;
    args.SetInt("gradsync.test_connection", ++n);
    auto stub = v1::Coordinator::NewStub(
        grpc::CreateCustomChannel(cluster_->coordinator_address(), *credentials, args));
    v1::ListJobsResponse jobs;
    return stub->ListJobs(Ctx().get(), {}, &jobs);
  };
  ASSERT_TRUE(list(*doomed).ok());
  auto crl = RevokeLabCert(cluster_->certs().dir, doomed->cert);
  ASSERT_TRUE(crl.ok()) << crl.status();
  const grpc::Status refused = list(*doomed);
  EXPECT_EQ(refused.error_code(), grpc::StatusCode::UNAVAILABLE) << refused.error_message();
  EXPECT_TRUE(list(*kept).ok());
  // A second revocation keeps the first (the CRL is cumulative).
  ASSERT_TRUE(RevokeLabCert(cluster_->certs().dir, kept->cert).ok());
  EXPECT_EQ(list(*kept).error_code(), grpc::StatusCode::UNAVAILABLE);
  EXPECT_EQ(list(*doomed).error_code(), grpc::StatusCode::UNAVAILABLE);
  EXPECT_TRUE(list(cluster_->certs().operator_).ok());
  // The daemons (each its own lab-node-I certificate) still run jobs.
  auto job = testing::OpenJob(*cluster_, "after-revocation", {0, 1});
  ASSERT_TRUE(job.ok()) << job.status();
  for (auto& r : *job) EXPECT_TRUE(r.session->Close().ok());
}

}  // namespace
// Only an operator may delete a job; a running job's ranks then fail their
// next op naming who deleted it and why, and the id can form a new job.
TEST_F(TlsCluster, AnOperatorDeletesAJobAndItsRanksLearnWhy) {
  auto job = testing::OpenJob(*cluster_, "doomed", {0, 1});
  ASSERT_TRUE(job.ok()) << job.status();
  v1::DeleteJobRequest del;
  del.set_job_id("doomed");
  del.set_reason("maintenance");
  v1::DeleteJobResponse deleted;
  grpc::Status s = Coordinator(cluster_->certs().node)->DeleteJob(Ctx().get(), del, &deleted);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::PERMISSION_DENIED) << s.error_message();
  s = Coordinator(cluster_->certs().operator_)->DeleteJob(Ctx().get(), del, &deleted);
  ASSERT_TRUE(s.ok()) << s.error_message();
  EXPECT_EQ(deleted.members(), 2);

  // The ranks learn at their daemon's next heartbeat (500 ms).
  const absl::Time deadline = absl::Now() + absl::Seconds(10);
  std::vector<absl::Status> last(2);
  testing::OnEveryRank(2, [&](int r) {
    client::Session& session = *(*job)[r].session;
    auto buf = session.AllocateBuffer(4096);
    if (!buf.ok()) return void(last[r] = buf.status());
    while (absl::Now() < deadline) {
      client::CollectiveSpec spec;
      spec.buffer = buf->get();
      spec.count = 1024;
      spec.name = "after-delete";
      spec.timeout = absl::Seconds(2);
      auto res = session.Run(spec);
      last[r] = res.ok() ? absl::OkStatus() : res.status();
      if (!res.ok()) return;
      absl::SleepFor(absl::Milliseconds(50));
    }
  });
  for (int r = 0; r < 2; ++r) {
    EXPECT_FALSE(last[r].ok()) << "rank " << r;
    EXPECT_TRUE(absl::StrContains(last[r].message(),
                                  "was deleted by operator 'lab-operator': maintenance"))
        << "rank " << r << ": " << last[r];
  }
  for (auto& r : *job) (void)r.session->Close();
  v1::DeleteJobRequest unknown;
  unknown.set_job_id("doomed");
  s = Coordinator(cluster_->certs().operator_)->DeleteJob(Ctx().get(), unknown, &deleted);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::NOT_FOUND) << s.error_message();
  auto again = testing::OpenJob(*cluster_, "doomed", {0, 1});
  ASSERT_TRUE(again.ok()) << again.status();
  for (auto& r : *again) EXPECT_TRUE(r.session->Close().ok());
}

// A daemon's status port shows an operator every session, but a node
// certificate (any other daemon) only the sessions of the tenant whose token
// its call carries: none without one, none with another tenant's.
TEST_F(TlsCluster, TheStatusPortShowsANodeOnlyItsTenantsSessions) {
  auto job = testing::OpenJob(*cluster_, "status-scope", {0});
  ASSERT_TRUE(job.ok()) << job.status();
  v1::JobStatus status;
  v1::GetJobStatusRequest req;
  req.set_job_id("status-scope");
  ASSERT_TRUE(Coordinator(cluster_->certs().operator_)->GetJobStatus(Ctx().get(), req, &status).ok());
  const std::string endpoint = status.members(0).status_endpoint();
  ASSERT_FALSE(endpoint.empty());
  // The job ids of the sessions `tls` (with `token`, "" for none) sees.
  auto seen = [&](const TlsConfig& tls, const std::string& token) {
    auto credentials = MakeChannelCredentials(tls);
    EXPECT_TRUE(credentials.ok()) << credentials.status();
    auto stub = v1::DaemonStatus::NewStub(grpc::CreateChannel(endpoint, *credentials));
    grpc::ClientContext ctx;
    ctx.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(10)));
    if (!token.empty()) ctx.AddMetadata("authorization", "Bearer " + token);
    v1::DaemonStatusResponse resp;
    const grpc::Status s = stub->GetStatus(&ctx, {}, &resp);
    std::vector<std::string> jobs;
    if (!s.ok()) return std::vector<std::string>{"error: " + s.error_message()};
    for (const auto& session : resp.sessions()) {
      jobs.push_back(session.job_id());
      EXPECT_FALSE(session.member_id().empty());
    }
    return jobs;
  };
  const std::vector<std::string> lab_job = {"lab/status-scope"};
  EXPECT_EQ(seen(cluster_->certs().operator_, ""), lab_job);
  EXPECT_EQ(seen(cluster_->certs().node, ""), std::vector<std::string>{});
  EXPECT_EQ(seen(cluster_->certs().node, kOtherToken), std::vector<std::string>{});
  EXPECT_EQ(seen(cluster_->certs().node, LabTenantToken()), lab_job);
  EXPECT_TRUE((*job)[0].session->Close().ok());
}

}  // namespace gradsync
