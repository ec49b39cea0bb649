#include "server/tenants.h"

#include <sys/stat.h>
#include <unistd.h>

#include <cstdlib>
#include <fstream>
#include <set>
#include <string>
#include <thread>

#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "proto/coordinator.grpc.pb.h"
#include "server/coordinator_service.h"
#include "server/job_registry_testing.h"

namespace gradsync {
namespace {

constexpr char kTokenA[] = "aaaaaaaaaaaaaaaaaaaaaaaa";
constexpr char kTokenB[] = "bbbbbbbbbbbbbbbbbbbbbbbb";

std::string TempPath(const std::string& name) {
  const char* dir = std::getenv("TEST_TMPDIR");
  return absl::StrCat(dir != nullptr ? dir : "/tmp", "/", name, ".", ::getpid());
}

void Write(const std::string& path, const std::string& text) {
  std::ofstream(path) << text;
}

TEST(ParseTenants, ReadsNamesTokensAndCaps) {
  auto t = ParseTenants(absl::StrCat("# comment\n\nvision ", kTokenA,
                                     "  max_forming_jobs=3 max_jobs=40 # trailing\nnlp\t", kTokenB,
                                     "\n"));
  ASSERT_TRUE(t.ok()) << t.status();
  ASSERT_EQ(t->size(), 2u);
  EXPECT_EQ(t->at(kTokenA).name, "vision");
  EXPECT_EQ(t->at(kTokenA).max_forming_jobs, 3);
  EXPECT_EQ(t->at(kTokenA).max_jobs, 40);
  EXPECT_EQ(t->at(kTokenB).max_jobs, 0);  // its fair share
  EXPECT_EQ(t->at(kTokenB).name, "nlp");
  EXPECT_EQ(t->at(kTokenB).max_forming_jobs, kDefaultMaxFormingJobsPerTenant);
}

TEST(ParseTenants, NamesTheLineAndTheProblem) {
  struct Case {
    std::string text;
    std::string error;
  } cases[] = {
      {"lonely\n", "line 1: expected 'NAME TOKEN [max_forming_jobs=N] [max_jobs=N]'"},
      {absl::StrCat("ok ", kTokenA, "\nbad/name ", kTokenB), "line 2: tenant name 'bad/name'"},
      {"short 0123456789", "the token of tenant 'short' has 10 characters; 16..256"},
      {absl::StrCat("a ", kTokenA, "\na ", kTokenB), "tenant 'a' appears twice"},
      {absl::StrCat("a ", kTokenA, "\nb ", kTokenA), "already another tenant's"},
      {absl::StrCat("a ", kTokenA, " colour=blue"), "unknown option 'colour=blue'"},
      {absl::StrCat("a ", kTokenA, " max_forming_jobs=0"), "unknown option 'max_forming_jobs=0'"},
      {absl::StrCat("a ", kTokenA, " max_jobs=10001"), "unknown option 'max_jobs=10001'"},
      {absl::StrCat("ps ", kTokenA), "'ps' is reserved"},
  };
  for (const Case& c : cases) {
    auto t = ParseTenants(c.text);
    ASSERT_FALSE(t.ok()) << c.text;
    EXPECT_EQ(t.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_TRUE(absl::StrContains(t.status().message(), c.error)) << t.status();
  }
}

TEST(TenantTable, AuthenticatesBearerTokens) {
  TenantTable table({{kTokenA, Tenant{"vision", 4}}});
  auto none = table.Authenticate(std::nullopt);
  ASSERT_TRUE(none.ok());
  EXPECT_FALSE(none->has_value());
  auto ok = table.Authenticate(absl::StrCat("Bearer ", kTokenA));
  ASSERT_TRUE(ok.ok() && ok->has_value());
  EXPECT_EQ((*ok)->name, "vision");
  EXPECT_EQ(table.Authenticate(kTokenA).status().message(),
            "the authorization metadata must be 'Bearer TOKEN' (a tenant token)");
  auto unknown = table.Authenticate(absl::StrCat("Bearer ", kTokenB));
  EXPECT_EQ(unknown.status().code(), absl::StatusCode::kUnauthenticated);
  EXPECT_EQ(unknown.status().message(),
            "unknown tenant token (not in the coordinator's tenants file)");
  EXPECT_EQ(table.ByName("vision")->max_forming_jobs, 4);
  EXPECT_FALSE(table.ByName("nlp").has_value());
}

// Tokens are added and revoked by editing the file; a broken edit keeps the
// last good table.
TEST(TenantTable, RereadsTheFileWhenItChanges) {
  const std::string path = TempPath("tenants");
  Write(path, absl::StrCat("vision ", kTokenA, "\n"));
  auto table = TenantTable::Load(path);
  ASSERT_TRUE(table.ok()) << table.status();
  EXPECT_TRUE((*table)->Lookup(kTokenA).has_value());
  EXPECT_FALSE((*table)->Lookup(kTokenB).has_value());

  Write(path, absl::StrCat("nlp ", kTokenB, "\n"));  // A revoked, B added
  const absl::Time deadline = absl::Now() + absl::Seconds(10);
  while ((*table)->Lookup(kTokenA).has_value() && absl::Now() < deadline) {
    absl::SleepFor(absl::Milliseconds(50));
  }
  EXPECT_FALSE((*table)->Lookup(kTokenA).has_value());
  EXPECT_EQ((*table)->Lookup(kTokenB)->name, "nlp");

  Write(path, "broken line with a short token\n");
  absl::SleepFor(absl::Milliseconds(1200));
  EXPECT_EQ((*table)->Lookup(kTokenB)->name, "nlp");
  ::unlink(path.c_str());

  auto missing = TenantTable::Load(path);
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kNotFound);
  EXPECT_TRUE(absl::StrContains(missing.status().message(), path)) << missing.status();
}

// The coordinator's service scopes every job by the caller's tenant (plaintext
// here: the token is checked in the handler; with TLS the same table is
// consulted by TenantAuthProcessor, see tests/tenant_isolation_test.cc).
class TenantScopes : public ::testing::Test {
 protected:
  void SetUp() override {
    CoordinatorServerOptions o;
    o.tenants = std::make_shared<TenantTable>(
        std::map<std::string, Tenant>{{kTokenA, Tenant{"vision", 2}}, {kTokenB, Tenant{"nlp", 8}}});
    auto server = CoordinatorServer::Start(std::move(o));
    ASSERT_TRUE(server.ok()) << server.status();
    server_ = std::move(*server);
    stub_ = v1::Coordinator::NewStub(
        grpc::CreateChannel(server_->address(), grpc::InsecureChannelCredentials()));
  }
  static std::unique_ptr<grpc::ClientContext> Ctx(const std::string& token) {
    auto ctx = std::make_unique<grpc::ClientContext>();
    ctx->set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(5)));
    if (!token.empty()) ctx->AddMetadata("authorization", "Bearer " + token);
    return ctx;
  }
  grpc::Status Create(const std::string& token, const std::string& job, int world = 1) {
    v1::CreateJobRequest req;
    req.set_job_id(job);
    req.set_world_size(world);
    v1::CreateJobResponse resp;
    return stub_->CreateJob(Ctx(token).get(), req, &resp);
  }
  std::unique_ptr<CoordinatorServer> server_;
  std::unique_ptr<v1::Coordinator::Stub> stub_;
};

TEST_F(TenantScopes, JobsNeedATokenAndLiveInTheTenantsNamespace) {
  grpc::Status s = Create("", "train");
  EXPECT_EQ(s.error_code(), grpc::StatusCode::UNAUTHENTICATED);
  EXPECT_TRUE(absl::StrContains(s.error_message(), "CreateJob of job 'train': this coordinator "
                                                   "has tenants (--tenants_file), so the call "
                                                   "needs a tenant token"))
      << s.error_message();
  s = Create("cccccccccccccccccccccccc", "train");
  EXPECT_EQ(s.error_code(), grpc::StatusCode::UNAUTHENTICATED);
  EXPECT_TRUE(absl::StrContains(s.error_message(), "unknown tenant token")) << s.error_message();
  // A tenant cannot address another's namespace.
  s = Create(kTokenA, "nlp/train");
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_TRUE(absl::StrContains(s.error_message(), "must not contain '/'")) << s.error_message();

  // The same id in two tenants is two jobs, even with other world sizes.
  ASSERT_TRUE(Create(kTokenA, "train", 2).ok());
  ASSERT_TRUE(Create(kTokenB, "train", 3).ok());
  v1::GetJobStatusRequest get;
  get.set_job_id("train");
  v1::JobStatus status;
  ASSERT_TRUE(stub_->GetJobStatus(Ctx(kTokenA).get(), get, &status).ok());
  EXPECT_EQ(status.job_id(), "train");
  EXPECT_EQ(status.world_size(), 2);
  ASSERT_TRUE(stub_->GetJobStatus(Ctx(kTokenB).get(), get, &status).ok());
  EXPECT_EQ(status.world_size(), 3);

  // Each tenant lists its own jobs; a caller without a token (an operator
  // here, plaintext) sees all of them with their tenants.
  ASSERT_TRUE(Create(kTokenB, "eval").ok());
  v1::ListJobsResponse list;
  ASSERT_TRUE(stub_->ListJobs(Ctx(kTokenA).get(), {}, &list).ok());
  ASSERT_EQ(list.jobs_size(), 1);
  EXPECT_EQ(list.jobs(0).job_id(), "train");
  list.Clear();
  ASSERT_TRUE(stub_->ListJobs(Ctx("").get(), {}, &list).ok());
  std::set<std::string> ids;
  for (const auto& j : list.jobs()) ids.insert(j.job_id());
  EXPECT_EQ(ids, (std::set<std::string>{"nlp/eval", "nlp/train", "vision/train"}));

  // Vision cannot read, join or leave nlp's "eval".
  get.set_job_id("eval");
  s = stub_->GetJobStatus(Ctx(kTokenA).get(), get, &status);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::NOT_FOUND) << s.error_message();
  v1::JoinJobRequest join = job_registry_testing::JoinRequest("eval", "intruder", 0, 7071, 200);
  v1::JoinJobResponse joined;
  s = stub_->JoinJob(Ctx(kTokenA).get(), join, &joined);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::NOT_FOUND) << s.error_message();
  v1::LeaveJobRequest leave = job_registry_testing::LeaveRequest("eval", 0, 1, "intruder");
  v1::LeaveJobResponse left;
  (void)stub_->LeaveJob(Ctx(kTokenA).get(), leave, &left);  // a leave of no job is a no-op
  ASSERT_TRUE(stub_->GetJobStatus(Ctx(kTokenB).get(), get, &status).ok());
  EXPECT_EQ(status.state(), v1::JOB_STATE_FORMING);  // nlp's job did not notice

  // A join tells the daemon the tenant, so it keys the job as vision/train.
  ASSERT_TRUE(Create(kTokenA, "solo").ok());
  join = job_registry_testing::JoinRequest("solo", "m0", 0, 7071, 2000);
  s = stub_->JoinJob(Ctx(kTokenA).get(), join, &joined);
  ASSERT_TRUE(s.ok()) << s.error_message();
  EXPECT_EQ(joined.tenant(), "vision");
}

TEST_F(TenantScopes, FormingJobsAreCappedPerTenant) {
  ASSERT_TRUE(Create(kTokenA, "f1", 2).ok());
  ASSERT_TRUE(Create(kTokenA, "f2", 2).ok());
  grpc::Status s = Create(kTokenA, "f3", 2);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
  EXPECT_TRUE(absl::StrContains(s.error_message(), "tenant 'vision' already has 2 forming jobs"))
      << s.error_message();
  EXPECT_TRUE(Create(kTokenA, "f1", 2).ok());  // an existing job is still found
  EXPECT_TRUE(Create(kTokenB, "f3", 2).ok());  // another tenant is not affected
}

}  // namespace
}  // namespace gradsync
