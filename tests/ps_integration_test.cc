// Parameter-server allreduce through real processes: 4 gradsyncd, 2
// gradsync-ps shards registered with the coordinator, jobs with ps_shards.
#include <atomic>
#include <csignal>
#include <cstring>
#include <thread>
#include <vector>

#include <grpcpp/create_channel.h>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "cli/expected.h"
#include "cli/local_cluster.h"
#include "common/certs.h"
#include "common/net_testing.h"
#include "common/tls.h"
#include "collective/reference.h"
#include "gtest/gtest.h"
#include "kernels/cpu_reduce.h"
#include "proto/coordinator.grpc.pb.h"
#include "ps/protocol.h"
#include "tests/cluster_util.h"
#include "transport/wire.h"

namespace gradsync {
namespace {

using testing::OnEveryRank;

absl::StatusOr<std::vector<testing::RankHandle>> OpenPsJob(LocalCluster& cluster,
                                                          const std::string& job, int world,
                                                          int shards) {
  std::vector<testing::RankHandle> ranks(world);
  std::vector<absl::Status> st(world);
  OnEveryRank(world, [&](int r) {
    auto c = client::Client::Connect(cluster.daemon_target(r));
    if (!c.ok()) return void(st[r] = c.status());
    ranks[r].client = std::move(*c);
    client::SessionOptions so;
    so.job_id = job;
    so.world_size = world;
    so.rank = r;
    so.ps_shards = shards;
    so.op_timeout_ms = 20000;
    auto s = ranks[r].client->OpenSession(so);
    if (!s.ok()) return void(st[r] = s.status());
    ranks[r].session = std::move(*s);
  });
  for (int r = 0; r < world; ++r) {
    if (!st[r].ok()) return st[r];
  }
  return ranks;
}

// Every rank of `job` runs `steps` PS allreduces (sum over f32) of `count`
// elements, each checked element by element; returns each rank's first
// error ("" if all were exact).
std::vector<std::string> RunExactPsSteps(std::vector<testing::RankHandle>& job, uint64_t count,
                                         int steps, const std::string& name) {
  const int world = static_cast<int>(job.size());
  std::vector<std::string> errors(world);
  OnEveryRank(world, [&](int r) {
    auto& session = *job[r].session;
    auto b = session.AllocateBuffer(count * 4);
    if (!b.ok()) return void(errors[r] = std::string(b.status().message()));
    for (int step = 0; step < steps; ++step) {
      FillInput(CollectiveKind::kAllreduce, DType::kF32, r, world, count,
                static_cast<char*>((*b)->data()));
      client::CollectiveSpec spec;
      spec.buffer = b->get();
      spec.count = count;
      spec.algorithm = "ps";
      spec.name = name;
      auto res = session.Run(spec);
      if (!res.ok()) {
        return void(errors[r] = absl::StrCat("step ", step, ": ", res.status().message()));
      }
      const uint64_t wrong = CountWrong(CollectiveKind::kAllreduce, DType::kF32, ReduceOp::kSum, 0,
                                        r, world, count, static_cast<char*>((*b)->data()));
      if (wrong) return void(errors[r] = absl::StrCat(wrong, " wrong at step ", step));
    }
  });
  return errors;
}

// Rank-order reduction: acc = x_0; acc = acc OP x_r for r = 1.. (the shard's order).
std::vector<char> RankOrder(const std::vector<std::vector<char>>& in, DType t, ReduceOp op,
                            size_t count) {
  std::vector<char> acc = in[0];
  const ReduceOp combine = op == ReduceOp::kAvg ? ReduceOp::kSum : op;
  for (size_t r = 1; r < in.size(); ++r) ReduceInto(t, combine, acc.data(), in[r].data(), count);
  if (op == ReduceOp::kAvg) DivideBy(t, acc.data(), count, static_cast<int64_t>(in.size()));
  return acc;
}

class PsIntegration : public ::testing::Test {
 protected:
  void SetUp() override {
    LocalClusterOptions o;
    o.daemons = 4;
    o.ps_shards = 2;
    auto c = LocalCluster::Start(o);
    ASSERT_TRUE(c.ok()) << c.status();
    cluster_ = std::move(*c);
  }
  std::unique_ptr<LocalCluster> cluster_;
};

TEST_F(PsIntegration, BitExactRankOrderSumsForAwkwardSizesAndDtypes) {
  auto job = OpenPsJob(*cluster_, "ps-exact", 4, 2);
  ASSERT_TRUE(job.ok()) << job.status();
  uint32_t seed = 1;
  for (auto [t, op] : std::vector<std::pair<DType, ReduceOp>>{
           {DType::kF32, ReduceOp::kSum}, {DType::kBF16, ReduceOp::kAvg}, {DType::kI32, ReduceOp::kMax}}) {
    for (size_t count : {0ul, 1ul, 7ul, 1023ul, 1000003ul}) {
      std::vector<std::vector<char>> in(4);
      for (int r = 0; r < 4; ++r) in[r] = testing::RandomData(t, count, r, seed);
      ++seed;
      const std::vector<char> want = RankOrder(in, t, op, count);
      std::vector<std::string> errors(4);
      OnEveryRank(4, [&](int r) {
        auto& s = *(*job)[r].session;
        auto b = s.AllocateBuffer(std::max<size_t>(1, in[r].size()));
        if (!b.ok()) return void(errors[r] = std::string(b.status().message()));
        if (!in[r].empty()) std::memcpy((*b)->data(), in[r].data(), in[r].size());
        client::CollectiveSpec spec;
        spec.buffer = b->get();
        spec.count = count;
        spec.dtype = t;
        spec.op = op;
        spec.algorithm = "ps";
        spec.name = "ps";
        auto res = s.Run(spec);
        if (!res.ok()) return void(errors[r] = std::string(res.status().message()));
        if (res->algorithm != "ps") errors[r] = "ran " + res->algorithm;
        if (!want.empty() && std::memcmp((*b)->data(), want.data(), want.size()) != 0) {
          errors[r] = "wrong result";
        }
        (void)s.FreeBuffer(std::move(*b));
      });
      for (int r = 0; r < 4; ++r) {
        EXPECT_EQ(errors[r], "") << DTypeName(t) << " " << ReduceOpName(op) << " count " << count
                                 << " rank " << r;
      }
    }
  }
}

TEST_F(PsIntegration, TwoJobsShareTheShardsConcurrently) {
  auto a = OpenPsJob(*cluster_, "ps-a", 2, 2);
  ASSERT_TRUE(a.ok()) << a.status();
  std::vector<testing::RankHandle> b_ranks(2);
  {
    // Job b runs on daemons 2 and 3.
    std::vector<absl::Status> st(2);
    OnEveryRank(2, [&](int r) {
      auto c = client::Client::Connect(cluster_->daemon_target(2 + r));
      ASSERT_TRUE(c.ok());
      b_ranks[r].client = std::move(*c);
      client::SessionOptions so;
      so.job_id = "ps-b";
      so.world_size = 2;
      so.rank = r;
      so.ps_shards = 2;
      auto s = b_ranks[r].client->OpenSession(so);
      ASSERT_TRUE(s.ok()) << s.status();
      b_ranks[r].session = std::move(*s);
    });
  }
  auto run = [](std::vector<testing::RankHandle>& job, DType t, ReduceOp op, std::vector<std::string>* errors) {
    OnEveryRank(2, [&](int r) {
      auto& s = *job[r].session;
      const uint64_t count = 300007;
      auto b = s.AllocateBuffer(count * DTypeSize(t));
      ASSERT_TRUE(b.ok());
      for (int step = 0; step < 5; ++step) {
        FillInput(CollectiveKind::kAllreduce, t, r, 2, count, static_cast<char*>((*b)->data()));
        client::CollectiveSpec spec;
        spec.buffer = b->get();
        spec.count = count;
        spec.dtype = t;
        spec.op = op;
        spec.algorithm = "ps";
        spec.name = "shared";
        auto res = s.Run(spec);
        if (!res.ok()) return void((*errors)[r] = std::string(res.status().message()));
        const uint64_t wrong = CountWrong(CollectiveKind::kAllreduce, t, op, 0, r, 2, count,
                                          static_cast<char*>((*b)->data()));
        if (wrong) return void((*errors)[r] = absl::StrCat(wrong, " wrong at step ", step));
      }
    });
  };
  std::vector<std::string> ea(2), eb(2);
  std::thread ta([&] { run(*a, DType::kF32, ReduceOp::kSum, &ea); });
  std::thread tb([&] { run(b_ranks, DType::kI64, ReduceOp::kMin, &eb); });
  ta.join();
  tb.join();
  for (int r = 0; r < 2; ++r) {
    EXPECT_EQ(ea[r], "") << "job a rank " << r;
    EXPECT_EQ(eb[r], "") << "job b rank " << r;
  }
}

TEST_F(PsIntegration, KilledShardFailsEveryWorkerNamingTheShard) {
  auto job = OpenPsJob(*cluster_, "ps-kill", 4, 2);
  ASSERT_TRUE(job.ok()) << job.status();
  std::vector<absl::Status> st(4);
  std::atomic<int> finished[4] = {};  // ops each rank completed
  std::thread killer([&] {
    // Every rank finished an op through the shards and is in the next one:
    // data is moving when shard 1 dies.
    const absl::Time deadline = absl::Now() + absl::Seconds(60);
    auto moving = [&] {
      for (const auto& f : finished) {
        if (f < 1) return false;
      }
      return true;
    };
    while (!moving() && absl::Now() < deadline) absl::SleepFor(absl::Milliseconds(1));
    EXPECT_TRUE(moving()) << "the ranks did not complete an op within 60 s";
    cluster_->SignalShard(1, SIGKILL);
  });
  OnEveryRank(4, [&](int r) {
    auto& s = *(*job)[r].session;
    const uint64_t count = 4 << 20;
    auto b = s.AllocateBuffer(count * 4);
    ASSERT_TRUE(b.ok());
    for (int i = 0; i < 500; ++i) {
      client::CollectiveSpec spec;
      spec.buffer = b->get();
      spec.count = count;
      spec.algorithm = "ps";
      spec.name = "k";
      auto res = s.Run(spec);
      if (!res.ok()) return void(st[r] = res.status());
      ++finished[r];
    }
  });
  killer.join();
  for (int r = 0; r < 4; ++r) {
    EXPECT_FALSE(st[r].ok()) << "rank " << r;
    EXPECT_NE(st[r].message().find("ps shard"), std::string::npos) << "rank " << r << ": " << st[r];
  }
}

// A PS certificate of another host (a compromised or misconfigured shard)
// tries to take over shard ps0 of a running job of the lab tenant: it
// re-registers ps0 with its own endpoint, again and again, and asks for
// ps0's key. Both are refused, ps0 keeps its endpoint, and the job's sums
// stay exact.
TEST_F(PsIntegration, AnotherShardsCertificateCannotTakeOverAShard) {
  auto job = OpenPsJob(*cluster_, "takeover", 2, 2);
  ASSERT_TRUE(job.ok()) << job.status();
  auto intruder_cert = AddLabCert(cluster_->certs().dir, "ps", "intruder-ps", {});
  ASSERT_TRUE(intruder_cert.ok()) << intruder_cert.status();
  auto stub_of = [&](const TlsConfig& cert) {
    auto credentials = MakeChannelCredentials(cert);
    EXPECT_TRUE(credentials.ok()) << credentials.status();
    return v1::Coordinator::NewStub(
        grpc::CreateChannel(cluster_->coordinator_address(), *credentials));
  };
  auto ctx = [] {
    auto c = std::make_unique<grpc::ClientContext>();
    c->set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(10)));
    return c;
  };
  auto intruder = stub_of(*intruder_cert);
  auto shard = stub_of(cluster_->certs().ps);
  auto op = stub_of(cluster_->certs().operator_);
  v1::JobStatus status;
  {
    v1::GetJobStatusRequest req;
    req.set_job_id("lab/takeover");
    grpc::Status s = op->GetJobStatus(ctx().get(), req, &status);
    ASSERT_TRUE(s.ok()) << s.error_message();
  }
  v1::RegisterShardRequest reg;
  reg.set_shard_id("ps0");
  reg.mutable_endpoint()->set_host("127.0.0.1");
  reg.mutable_endpoint()->set_port(1);
  for (int i = 0; i < 200; ++i) {
    v1::RegisterShardResponse resp;
    grpc::Status s = intruder->RegisterShard(ctx().get(), reg, &resp);
    ASSERT_EQ(s.error_code(), grpc::StatusCode::PERMISSION_DENIED) << i << ": " << s.error_message();
    ASSERT_EQ(s.error_message(),
              "shard 'ps0' is registered by certificate 'lab-ps'; certificate 'intruder-ps' may "
              "not register it (give each shard its own id)");
  }
  v1::GetShardKeyRequest key_req;
  key_req.set_shard_id("ps0");
  key_req.set_job_id("lab/takeover");
  key_req.set_epoch(status.epoch());
  v1::GetShardKeyResponse key;
  grpc::Status s = intruder->GetShardKey(ctx().get(), key_req, &key);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::PERMISSION_DENIED) << s.error_message();
  EXPECT_EQ(s.error_message(), "shard 'ps0' is not registered by certificate 'intruder-ps'");
  EXPECT_TRUE(key.key().empty());
  // The real shard's certificate gets its key; the intruder registers its own id.
  s = shard->GetShardKey(ctx().get(), key_req, &key);
  EXPECT_TRUE(s.ok()) << s.error_message();
  EXPECT_FALSE(key.key().empty());
  reg.set_shard_id("intruder");
  v1::RegisterShardResponse resp;
  EXPECT_TRUE(intruder->RegisterShard(ctx().get(), reg, &resp).ok());
  v1::ListShardsResponse shards;
  ASSERT_TRUE(op->ListShards(ctx().get(), v1::ListShardsRequest(), &shards).ok());
  bool seen = false;
  for (const v1::ShardStatus& st : shards.shards()) {
    if (st.shard_id() != "ps0") continue;
    seen = true;
    EXPECT_NE(st.endpoint().port(), 1);
    EXPECT_EQ(st.identity(), "lab-ps");
  }
  EXPECT_TRUE(seen);
  // The job still reaches the real shards: exact sums.
  const std::vector<std::string> errors = RunExactPsSteps(*job, 100003, 1, "after");
  for (int r = 0; r < 2; ++r) EXPECT_EQ(errors[r], "") << "rank " << r;
}

// Someone with no certificate and no key sprays Hellos announcing 3 workers
// at both shards while a tenant's 2-worker PS job forms and runs: the shards
// made the job's state from the first Hello, with the wrong size, and both
// workers failed ("has 3 workers here, rank 0 connected with 2"). Now
// nothing is made before the key proof, and every step is exact.
TEST_F(PsIntegration, HellosSprayedWithoutTheKeyDoNotShapeAFormingJob) {
  std::atomic<bool> stop{false};
  std::atomic<int> sprayed{0};
  std::thread sprayer([&] {
    const std::string id = *ps::PsJobId("lab/sprayed");
    for (int i = 0; i < 5000 && !stop; ++i) {
      const int shard = i % 2;
      // From another host than the workers' (an outsider): the listener's
      // per-host handshake slots are not what this test is about.
      UniqueFd fd = testing::ConnectFrom("127.0.0.2", cluster_->ps_data_port(shard));
      if (!fd.valid()) continue;
      const absl::Time deadline = absl::Now() + absl::Seconds(2);
      transport::Hello h{transport::kHelloMagic, transport::kWireVersion,
                         static_cast<uint16_t>(id.size()), 1, 0, shard, 3, 0};
      const std::string nonce = transport::RandomNonce();
      (void)WriteFull(fd.get(), &h, sizeof(h), deadline);
      (void)WriteFull(fd.get(), id.data(), id.size(), deadline);
      (void)WriteFull(fd.get(), nonce.data(), nonce.size(), deadline);
      ++sprayed;  // and closes without a proof
    }
  });
  for (const absl::Time until = absl::Now() + absl::Seconds(20);
       sprayed < 50 && absl::Now() < until;) {
    absl::SleepFor(absl::Milliseconds(1));
  }
  auto job = OpenPsJob(*cluster_, "sprayed", 2, 2);
  ASSERT_TRUE(job.ok()) << job.status();
  const std::vector<std::string> errors = RunExactPsSteps(*job, 50001, 5, "sprayed");
  stop = true;
  sprayer.join();
  for (int r = 0; r < 2; ++r) EXPECT_EQ(errors[r], "") << "rank " << r;
  EXPECT_GE(sprayed.load(), 50);
}

TEST_F(PsIntegration, ForcingPsWithoutShardsIsRefused) {
  auto job = testing::OpenJob(*cluster_, "no-ps", {0, 1});
  ASSERT_TRUE(job.ok()) << job.status();
  auto& s = *(*job)[0].session;
  auto b = s.AllocateBuffer(64);
  ASSERT_TRUE(b.ok());
  client::CollectiveSpec spec;
  spec.buffer = b->get();
  spec.count = 4;
  spec.algorithm = "ps";
  spec.name = "x";
  auto res = s.Run(spec);
  EXPECT_TRUE(absl::IsInvalidArgument(res.status())) << res.status();
  EXPECT_NE(res.status().message().find("needs parameter-server shards"), std::string::npos)
      << res.status();
}

}  // namespace
}  // namespace gradsync
