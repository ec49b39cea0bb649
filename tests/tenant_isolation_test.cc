// Two tenants on one cluster of real processes (mutual TLS, a tenants file
// with "lab" and "other"): the same job id in both is two jobs that run at
// once on the same daemons without mixing data; a session without a token or
// with an unknown one is refused with the reason; a tenant sees only its own
// jobs, an operator sees all of them as TENANT/JOB.
#include <memory>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include <grpcpp/create_channel.h>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/tls.h"
#include "gtest/gtest.h"
#include "proto/coordinator.grpc.pb.h"
#include "tests/cluster_util.h"

namespace gradsync {
namespace {

constexpr char kOtherToken[] = "0f0f0f0f0f0f0f0f-other-tenant";
constexpr char kGreedyToken[] = "9a9a9a9a9a9a9a9a-greedy-tenant";

class TenantIsolation : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    LocalClusterOptions o;
    o.daemons = 2;
    o.extra_tenants = {absl::StrCat("other ", kOtherToken, " max_forming_jobs=4"),
                       absl::StrCat("greedy ", kGreedyToken, " max_jobs=5")};
    auto c = LocalCluster::Start(o);
    ASSERT_TRUE(c.ok()) << c.status();
    cluster_ = c->release();
  }
  static void TearDownTestSuite() {
    delete cluster_;
    cluster_ = nullptr;
  }
  void SetUp() override { ASSERT_NE(cluster_, nullptr); }

  // One session per daemon for `job` (world 2) with `token` ("" : the
  // environment's, the lab tenant).
  static absl::StatusOr<std::vector<testing::RankHandle>> Open(const std::string& job,
                                                               const std::string& token) {
    std::vector<testing::RankHandle> ranks(2);
    std::vector<absl::Status> st(2);
    testing::OnEveryRank(2, [&](int r) {
      auto c = client::Client::Connect(cluster_->daemon_target(r), absl::Seconds(10));
      if (!c.ok()) return void(st[r] = c.status());
      ranks[r].client = std::move(*c);
      client::SessionOptions so;
      so.job_id = job;
      so.world_size = 2;
      so.rank = r;
      so.timeout = absl::Seconds(20);
      so.tenant_token = token;
      auto s = ranks[r].client->OpenSession(so);
      if (!s.ok()) return void(st[r] = s.status());
      ranks[r].session = std::move(*s);
    });
    for (const absl::Status& s : st) {
      if (!s.ok()) return s;
    }
    return ranks;
  }

  static std::unique_ptr<v1::Coordinator::Stub> Operator() {
    auto credentials = MakeChannelCredentials(cluster_->certs().operator_);
    EXPECT_TRUE(credentials.ok());
    return v1::Coordinator::NewStub(
        grpc::CreateChannel(cluster_->coordinator_address(), *credentials));
  }
  static std::set<std::string> ListJobs(const std::string& token) {
    grpc::ClientContext ctx;
    ctx.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(10)));
    if (!token.empty()) ctx.AddMetadata("authorization", "Bearer " + token);
    v1::ListJobsResponse jobs;
    grpc::Status s = Operator()->ListJobs(&ctx, {}, &jobs);
    EXPECT_TRUE(s.ok()) << s.error_message();
    std::set<std::string> ids;
    for (const auto& j : jobs.jobs()) ids.insert(j.job_id());
    return ids;
  }

  static LocalCluster* cluster_;
};

LocalCluster* TenantIsolation::cluster_ = nullptr;

// Before tenants, a second tenant's sessions with the same job id took the
// free ranks of the first tenant's forming job (and its data). Now each
// tenant's "shared" is its own job: both form at once on the same two daemons
// and each allreduce sums only its own tenant's data.
TEST_F(TenantIsolation, TheSameJobIdInTwoTenantsIsTwoJobs) {
  absl::StatusOr<std::vector<testing::RankHandle>> lab, other;
  std::thread t([&] { lab = Open("shared", ""); });
  other = Open("shared", kOtherToken);
  t.join();
  ASSERT_TRUE(lab.ok()) << lab.status();
  ASSERT_TRUE(other.ok()) << other.status();
  constexpr int kCount = 100000;  // several chunks, so the data plane is busy for a while
  std::vector<std::string> errors(4);
  testing::OnEveryRank(4, [&](int i) {
    const bool is_lab = i < 2;
    const int r = i % 2;
    client::Session& s = *(is_lab ? *lab : *other)[r].session;
    const int32_t base = is_lab ? 1 : 1000;
    auto buf = s.AllocateBuffer(kCount * 4);
    if (!buf.ok()) return void(errors[i] = buf.status().ToString());
    auto* v = static_cast<int32_t*>((*buf)->data());
    for (int round = 0; round < 5; ++round) {
      for (int k = 0; k < kCount; ++k) v[k] = base * (r + 1) + k;
      client::CollectiveSpec spec;
      spec.buffer = buf->get();
      spec.count = kCount;
      spec.dtype = DType::kI32;
      spec.op = ReduceOp::kSum;
      spec.algorithm = "ring";
      spec.name = absl::StrCat("grad.", round);
      auto res = s.Run(spec);
      if (!res.ok()) return void(errors[i] = res.status().ToString());
      for (int k = 0; k < kCount; ++k) {
        if (v[k] != 3 * base + 2 * k) {
          return void(errors[i] = absl::StrCat("round ", round, " element ", k, " is ", v[k],
                                               ", expected ", 3 * base + 2 * k));
        }
      }
    }
  });
  for (int i = 0; i < 4; ++i) EXPECT_EQ(errors[i], "") << (i < 2 ? "lab" : "other") << " rank " << i % 2;

  // Each tenant sees its own "shared"; the operator sees both, with tenants.
  EXPECT_EQ(ListJobs(LabTenantToken()).count("shared"), 1u);
  EXPECT_EQ(ListJobs(kOtherToken).count("shared"), 1u);
  const std::set<std::string> all = ListJobs("");
  EXPECT_EQ(all.count("lab/shared"), 1u);
  EXPECT_EQ(all.count("other/shared"), 1u);
  for (auto* ranks : {&*lab, &*other}) {
    for (auto& r : *ranks) EXPECT_TRUE(r.session->Close().ok());
  }
}

TEST_F(TenantIsolation, ATenantSeesOnlyItsOwnJobs) {
  auto lab = Open("lab-only", "");
  ASSERT_TRUE(lab.ok()) << lab.status();
  EXPECT_EQ(ListJobs(LabTenantToken()).count("lab-only"), 1u);
  const std::set<std::string> other = ListJobs(kOtherToken);
  for (const std::string& id : other) EXPECT_FALSE(absl::StrContains(id, "lab-only")) << id;
  grpc::ClientContext ctx;
  ctx.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(10)));
  ctx.AddMetadata("authorization", absl::StrCat("Bearer ", kOtherToken));
  v1::GetJobStatusRequest req;
  req.set_job_id("lab-only");
  v1::JobStatus status;
  grpc::Status s = Operator()->GetJobStatus(&ctx, req, &status);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::NOT_FOUND) << s.error_message();
  for (auto& r : *lab) EXPECT_TRUE(r.session->Close().ok());
}

TEST_F(TenantIsolation, ASessionWithoutAValidTokenIsRefusedWithTheReason) {
  auto wrong = Open("no-entry", "this-is-not-a-known-token");
  ASSERT_FALSE(wrong.ok());
  EXPECT_EQ(wrong.status().code(), absl::StatusCode::kUnauthenticated) << wrong.status();
  EXPECT_TRUE(absl::StrContains(wrong.status().message(), "unknown tenant token"))
      << wrong.status();

  testing::ScopedEnv no_token("GRADSYNC_TENANT_TOKEN", "");
  auto none = Open("no-entry", "");
  ASSERT_FALSE(none.ok());
  EXPECT_EQ(none.status().code(), absl::StatusCode::kUnauthenticated) << none.status();
  EXPECT_TRUE(absl::StrContains(none.status().message(), "needs a tenant token")) << none.status();
  EXPECT_EQ(ListJobs("").count("lab/no-entry"), 0u);
}

// A tenant that creates world-size-1 jobs (running at once, so never
// "forming") until the table is full, and retries one member's join many
// times at once, used to deny every other tenant new jobs and joins. Each
// tenant now holds only its share: the greedy one is refused, naming its
// share, and the lab tenant's job forms and runs.
TEST_F(TenantIsolation, OneTenantCannotFillTheCoordinatorsTables) {
  auto credentials = MakeChannelCredentials(cluster_->certs().node);
  ASSERT_TRUE(credentials.ok());
  auto node = v1::Coordinator::NewStub(
      grpc::CreateChannel(cluster_->coordinator_address(), *credentials));
  auto ctx = [] {
    auto c = std::make_unique<grpc::ClientContext>();
    c->set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(10)));
    c->AddMetadata("authorization", absl::StrCat("Bearer ", kGreedyToken));
    return c;
  };
  auto create = [&](const std::string& job, int world) {
    v1::CreateJobRequest req;
    req.set_job_id(job);
    req.set_world_size(world);
    v1::CreateJobResponse resp;
    return node->CreateJob(ctx().get(), req, &resp);
  };
  auto join = [&](const std::string& job, const std::string& member, int64_t timeout_ms) {
    v1::JoinJobRequest req;
    req.set_job_id(job);
    req.set_member_id(member);
    req.set_member_key("greedy-member-key-0123456789");
    req.set_requested_rank(-1);
    req.mutable_data_endpoint()->set_host("127.0.0.1");
    req.mutable_data_endpoint()->set_port(9);
    req.set_timeout_ms(timeout_ms);
    v1::JoinJobResponse resp;
    return node->JoinJob(ctx().get(), req, &resp);
  };
  for (int i = 0; i < 4; ++i) {  // plus the forming job below: its 5 (max_jobs=5)
    const std::string job = absl::StrCat("solo-", i);
    grpc::Status s = create(job, 1);
    ASSERT_TRUE(s.ok()) << job << ": " << s.error_message();
    s = join(job, "m", 5000);
    ASSERT_TRUE(s.ok()) << job << ": " << s.error_message();  // running at once
  }
  ASSERT_TRUE(create("pair", 2).ok());
  grpc::Status refused = create("one-too-many", 1);
  EXPECT_EQ(refused.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED) << refused.error_message();
  EXPECT_EQ(refused.error_message(),
            "cannot create job 'greedy/one-too-many': tenant 'greedy' already has 5 jobs (its "
            "share: 5)");
  // One member's join retried 5 times at once: 4 wait, one is refused at once.
  std::vector<grpc::Status> joins(5);
  std::vector<std::thread> threads;
  for (int i = 0; i < 5; ++i) {
    threads.emplace_back([&, i] { joins[i] = join("pair", "retrier", 3000); });
  }
  for (auto& t : threads) t.join();
  int refused_joins = 0, timed_out = 0;
  for (const grpc::Status& j : joins) {
    if (j.error_code() == grpc::StatusCode::RESOURCE_EXHAUSTED) {
      ++refused_joins;
      EXPECT_EQ(j.error_message(),
                "join of job 'greedy/pair' by member 'retrier': 4 joins of this member already "
                "wait (at most 4)");
    }
    timed_out += j.error_code() == grpc::StatusCode::DEADLINE_EXCEEDED ? 1 : 0;
  }
  EXPECT_EQ(refused_joins, 1);
  EXPECT_EQ(timed_out, 4);
  // The lab tenant is not affected.
  auto lab = Open("after-greedy", "");
  ASSERT_TRUE(lab.ok()) << lab.status();
  testing::ExpectAllreduceExact(*lab, 1000, "ring");
}

}  // namespace
}  // namespace gradsync
