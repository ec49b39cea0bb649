// Worker connections to a PS shard prove the job's shard key (shard first,
// then worker) before the shard takes them: a forged Hello with a wrong key,
// or for a job epoch the shard has no key for, is refused and counted, and
// never replaces a worker's live connection.
#include <atomic>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/time/clock.h"
#include "common/net.h"
#include "gtest/gtest.h"
#include "ps/protocol.h"
#include "ps/ps_testing.h"
#include "ps/shard.h"
#include "ps/slicer.h"
#include "ps/worker_client.h"
#include "transport/wire.h"

namespace gradsync::ps {
namespace {
using testing::Addresses;
using testing::ConnectToShard;
using testing::StartShards;

constexpr char kKey[] = "the-shard-key-of-job-auth-epoch1";

PsShardOptions WithKeys() {
  PsShardOptions o;
  o.job_key = [](const std::string& job, uint64_t epoch) -> absl::StatusOr<ShardJobKey> {
    if (job == "auth" && epoch == 1) return ShardJobKey{kKey};
    return absl::PermissionDeniedError("shard 's0' does not serve job '" + job + "'");
  };
  return o;
}

// The one worker of job "auth" epoch 1, holding the shard key.
absl::StatusOr<std::unique_ptr<PsWorker>> AuthWorker(
    const std::vector<std::unique_ptr<PsShard>>& shards) {
  PsWorkerOptions wo;
  wo.job_id = "auth";
  wo.epoch = 1;
  wo.shards = Addresses(shards);
  wo.shard_keys = {kKey};
  return PsWorker::Create(wo);
}

absl::Status Step(PsWorker& w, std::vector<float>& buf, uint64_t step) {
  const BalancedSlicer slicer;
  return w.PushPull(step, buf.data(), buf.size(), DType::kF32, ReduceOp::kSum, 1, 0, 1024, slicer,
                    absl::Now() + absl::Seconds(10));
}

// Hello + job id + nonce, then the shard's ack, nonce and proof, then
// `proof` (the forger's guess) instead of a real one. Returns the fd.
UniqueFd Forge(int port, const std::string& job, const std::string& proof) {
  auto fd = TcpConnect(HostPort{"127.0.0.1", port}, absl::Now() + absl::Seconds(5));
  EXPECT_TRUE(fd.ok()) << fd.status();
  const std::string ps_job = *PsJobId(job);
  transport::Hello h{transport::kHelloMagic, transport::kWireVersion,
                     static_cast<uint16_t>(ps_job.size()), 1, 0, 0, 1, 0};
  const absl::Time deadline = absl::Now() + absl::Seconds(5);
  const std::string nonce = transport::RandomNonce();
  EXPECT_TRUE(WriteFull(fd->get(), &h, sizeof(h), deadline).ok());
  EXPECT_TRUE(WriteFull(fd->get(), ps_job.data(), ps_job.size(), deadline).ok());
  EXPECT_TRUE(WriteFull(fd->get(), nonce.data(), nonce.size(), deadline).ok());
  transport::HelloAck ack{};
  EXPECT_TRUE(ReadFull(fd->get(), &ack, sizeof(ack), deadline).ok());
  EXPECT_EQ(ack.code, 0);
  std::string skip(transport::kNonceBytes + transport::kProofBytes, '\0');
  EXPECT_TRUE(ReadFull(fd->get(), skip.data(), skip.size(), deadline).ok());
  EXPECT_TRUE(WriteFull(fd->get(), proof.data(), proof.size(), deadline).ok());
  return std::move(*fd);
}

TEST(PsShardAuth, AWorkerWithTheKeyIsServedAForgerIsRefusedAndReplacesNothing) {
  auto shards = StartShards(1, WithKeys());
  auto w = AuthWorker(shards);
  ASSERT_TRUE(w.ok()) << w.status();
  std::vector<float> buf(4000, 1.5f);
  ASSERT_TRUE(Step(**w, buf, 1).ok());
  EXPECT_EQ(buf[0], 1.5f);  // one worker: the sum is its own data

  // Before the handshake proved the key, a forged Hello for the same job,
  // epoch and rank replaced the worker's connection and failed its job.
  UniqueFd forged = Forge(shards[0]->port(), "auth", std::string(transport::kProofBytes, 'x'));
  char byte;
  auto closed = ReadFull(forged.get(), &byte, 1, absl::Now() + absl::Seconds(5));
  EXPECT_FALSE(closed.ok());  // the shard closed it
  EXPECT_EQ(shards[0]->stats().auth_failures, 1u);
  EXPECT_EQ(shards[0]->stats().connections, 1u);

  std::fill(buf.begin(), buf.end(), 2.5f);
  absl::Status s = Step(**w, buf, 2);
  EXPECT_TRUE(s.ok()) << s;  // the worker's connection is still the one in use
  EXPECT_EQ(buf[0], 2.5f);
}

TEST(PsShardAuth, AnUnknownJobLooksLikeAWrongKeyAndNothingIsMadeBeforeTheProof) {
  auto shards = StartShards(1, WithKeys());
  const HostPort addr{"127.0.0.1", shards[0]->port()};
  // A job epoch the shard has no key for: the shard proves a random key, so
  // the answer is the same as for a wrong key, and says nothing about the job.
  auto fd = ConnectToShard(addr, *PsJobId("other"), 1, 0, 1, 0, absl::Now() + absl::Seconds(5),
                           0, kKey);
  ASSERT_FALSE(fd.ok());
  EXPECT_EQ(fd.status().code(), absl::StatusCode::kUnauthenticated) << fd.status();
  EXPECT_EQ(fd.status().message(), "the shard did not prove the job's key");
  // A worker holding another key, announcing 3 workers for the real job: the
  // same answer, and the job's state is not made from its Hello.
  fd = ConnectToShard(addr, *PsJobId("auth"), 1, 0, 3, 0, absl::Now() + absl::Seconds(5), 0,
                      "not-the-key");
  ASSERT_FALSE(fd.ok());
  EXPECT_EQ(fd.status().code(), absl::StatusCode::kUnauthenticated) << fd.status();
  EXPECT_EQ(fd.status().message(), "the shard did not prove the job's key");
  EXPECT_EQ(shards[0]->stats().jobs, 0u);
  // The shard counts each once it read the connector's (missing) proof.
  for (const absl::Time until = absl::Now() + absl::Seconds(10);
       shards[0]->stats().auth_failures < 2 && absl::Now() < until;) {
    absl::SleepFor(absl::Milliseconds(1));
  }
  EXPECT_EQ(shards[0]->stats().auth_failures, 2u);
  // The real single worker gets in and is served.
  auto w = AuthWorker(shards);
  ASSERT_TRUE(w.ok()) << w.status();
  std::vector<float> buf(1000, 0.5f);
  absl::Status s = Step(**w, buf, 1);
  EXPECT_TRUE(s.ok()) << s;
  EXPECT_EQ(buf[999], 0.5f);
  // A proven worker whose Hello does not fit the job is told why.
  fd = ConnectToShard(addr, *PsJobId("auth"), 1, 0, 2, 0, absl::Now() + absl::Seconds(5), 0, kKey);
  ASSERT_FALSE(fd.ok());
  EXPECT_EQ(fd.status().code(), absl::StatusCode::kFailedPrecondition) << fd.status();
  EXPECT_EQ(fd.status().message(),
            "refused: ps shard 0: job 'auth' epoch 1 has 1 workers here, rank 0 connected with 2");
}

// Hellos with a wrong world size sprayed at the shard by someone without the
// key while the job's worker connects and steps: the job forms from its
// proven worker alone, and every step is exact.
TEST(PsShardAuth, SprayedHellosWithoutTheKeyDoNotShapeTheJob) {
  auto shards = StartShards(1, WithKeys());
  const HostPort addr{"127.0.0.1", shards[0]->port()};
  std::atomic<bool> stop{false};
  std::atomic<int> sprayed{0};
  std::thread sprayer([&] {
    for (int i = 0; i < 2000 && !stop; ++i) {
      auto fd = ConnectToShard(addr, *PsJobId("auth"), 1, 0, 3, 0,
                               absl::Now() + absl::Seconds(5), 0, "guess");
      EXPECT_FALSE(fd.ok());
      ++sprayed;
    }
  });
  auto w = AuthWorker(shards);
  ASSERT_TRUE(w.ok()) << w.status();
  // Wait until the spray is under way.
  for (const absl::Time until = absl::Now() + absl::Seconds(20); sprayed < 20 && absl::Now() < until;) {
    absl::SleepFor(absl::Milliseconds(1));
  }
  for (uint64_t step = 1; step <= 20; ++step) {
    std::vector<float> buf(3000, static_cast<float>(step));
    absl::Status s = Step(**w, buf, step);
    ASSERT_TRUE(s.ok()) << "step " << step << ": " << s;
    ASSERT_EQ(buf[2999], static_cast<float>(step));
  }
  stop = true;
  sprayer.join();
  EXPECT_GE(shards[0]->stats().auth_failures, 20u);
  EXPECT_EQ(shards[0]->stats().jobs, 1u);
}

}  // namespace
}  // namespace gradsync::ps
