// A job with data TLS: a PS worker's connections to the shards run TLS 1.3
// after the shard-key handshake, bound to the shard's key. Through a tap
// (tcp_tap_testing.h) on the worker's side: the step is exact and none of its
// bytes are on the wire; the worker refuses a shard that presents a node's
// certificate instead of a shard's, the shard refuses a worker without one of
// the cluster's node certificates, and a worker that does not run TLS for
// such a job gets no service.
#include <signal.h>

#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/certs.h"
#include "gtest/gtest.h"
#include "ps/ps_testing.h"
#include "ps/shard.h"
#include "ps/slicer.h"
#include "ps/worker_client.h"
#include "transport/tcp_tap_testing.h"

namespace gradsync::ps {
namespace {

constexpr char kKey[] = "the-shard-key-of-job-tls-epoch-1";

// OpenSSL writes with write(2): a closed peer must not kill the test.
const bool kNoSigpipe = [] {
  ::signal(SIGPIPE, SIG_IGN);
  return true;
}();

LabCerts Certs(const std::string& name) {
  auto lab = MakeLabCerts(absl::StrCat(std::getenv("TEST_TMPDIR"), "/", name), {});
  EXPECT_TRUE(lab.ok()) << lab.status();
  return *lab;
}

// A shard serving job "tls" epoch 1, with data TLS (presenting `cert`) or without.
std::unique_ptr<PsShard> Shard(const TlsConfig& cert, bool data_tls = true) {
  PsShardOptions o;
  o.listen = {"127.0.0.1", 0};
  o.tls = cert;
  o.job_key = [data_tls](const std::string& job, uint64_t epoch) -> absl::StatusOr<ShardJobKey> {
    if (job == "tls" && epoch == 1) return ShardJobKey{kKey, data_tls};
    return absl::PermissionDeniedError("no such job here");
  };
  auto shard = PsShard::Start(o);
  EXPECT_TRUE(shard.ok()) << shard.status();
  return std::move(*shard);
}

std::unique_ptr<PsWorker> Worker(int port, const TlsConfig& cert, bool encrypt) {
  PsWorkerOptions wo;
  wo.job_id = "tls";
  wo.epoch = 1;
  wo.shards = {HostPort{"127.0.0.1", port}};
  wo.shard_keys = {kKey};
  wo.encrypt = encrypt;
  wo.tls = cert;
  auto w = PsWorker::Create(wo);
  EXPECT_TRUE(w.ok()) << w.status();
  return std::move(*w);
}

// One worker's step of `count` floats of `value` through the shard.
absl::Status Step(PsWorker& w, std::vector<float>& buf) {
  const BalancedSlicer slicer;
  return w.PushPull(1, buf.data(), buf.size(), DType::kF32, ReduceOp::kSum, 1, 0, 64 << 10, slicer,
                    absl::Now() + absl::Seconds(10));
}

TEST(PsDataTls, AStepIsExactAndNoneOfItsBytesAreOnTheWire) {
  const LabCerts lab = Certs("exact");
  auto shard = Shard(lab.ps);
  transport::testing::Tap tap(shard->port());
  auto w = Worker(tap.port(), lab.node, /*encrypt=*/true);
  // A value whose bytes repeat (0x41 0x42 0x43 0x44): plain pushes would put
  // long runs of them on the wire.
  float marker;
  std::memcpy(&marker, "ABCD", 4);
  std::vector<float> buf(1 << 20, marker);
  absl::Status s = Step(*w, buf);
  ASSERT_TRUE(s.ok()) << s;
  for (size_t i = 0; i < buf.size(); ++i) ASSERT_EQ(buf[i], marker) << i;  // one worker: its own data
  const std::string wire = tap.recorded();
  EXPECT_GT(wire.size(), buf.size() * sizeof(float));
  EXPECT_FALSE(absl::StrContains(wire, "ABCDABCDABCDABCD"));
  EXPECT_EQ(shard->stats().connections, 1u);
  EXPECT_EQ(shard->stats().tls_connections, 1u);
}

TEST(PsDataTls, WithoutItThePushesAreOnTheWire) {  // what the tap would see
  auto shard = Shard(TlsConfig{}, /*data_tls=*/false);
  transport::testing::Tap tap(shard->port());
  auto w = Worker(tap.port(), TlsConfig{}, /*encrypt=*/false);
  float marker;
  std::memcpy(&marker, "ABCD", 4);
  std::vector<float> buf(1 << 18, marker);
  ASSERT_TRUE(Step(*w, buf).ok());
  EXPECT_TRUE(absl::StrContains(tap.recorded(), "ABCDABCDABCDABCD"));
}

TEST(PsDataTls, TheWorkerRefusesAShardWithoutAShardCertificate) {
  const LabCerts lab = Certs("not-a-shard");
  auto shard = Shard(lab.node);  // a node's certificate, not a shard's
  auto w = Worker(shard->port(), lab.node, /*encrypt=*/true);
  std::vector<float> buf(1000, 1.0f);
  absl::Status s = Step(*w, buf);
  std::printf("a shard with a node's certificate: %s\n", s.ToString().c_str());
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.code(), absl::StatusCode::kUnauthenticated) << s;
  EXPECT_TRUE(absl::StrContains(s.message(), "not a PS shard's (OU=node)")) << s;
}

TEST(PsDataTls, TheShardRefusesWorkersWithoutANodeCertificateOrWithoutTls) {
  const LabCerts lab = Certs("not-a-node");
  auto shard = Shard(lab.ps);
  {  // the operator's certificate: the shard ends the handshake
    auto w = Worker(shard->port(), lab.operator_, /*encrypt=*/true);
    std::vector<float> buf(1000, 1.0f);
    absl::Status s = Step(*w, buf);
    std::printf("a worker with the operator's certificate: %s\n", s.ToString().c_str());
    EXPECT_FALSE(s.ok());
  }
  {  // no TLS at all: its frames are not a TLS handshake
    auto w = Worker(shard->port(), TlsConfig{}, /*encrypt=*/false);
    std::vector<float> buf(1000, 1.0f);
    absl::Status s = Step(*w, buf);
    std::printf("a worker without TLS: %s\n", s.ToString().c_str());
    EXPECT_FALSE(s.ok());
  }
  EXPECT_EQ(shard->stats().steps_completed, 0u);
}

}  // namespace
}  // namespace gradsync::ps
