// Attacks on a gradsyncd data port by someone without a certificate or a job
// key, against real processes (a coordinator and two gradsyncd on loopback):
// a forger who parks silent connections with a forming job's Hello before
// the real peer, and silent connections from several source addresses that
// fill every handshake slot. The job forms all the same, in seconds.
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/net.h"
#include "common/net_testing.h"
#include "gtest/gtest.h"
#include "tests/cluster_util.h"
#include "transport/wire.h"

namespace gradsync {
namespace {

using DataPortAttack = testing::SharedClusterTest<2>;

using testing::ConnectFrom;

// The job "lab/<job>" epoch 1, rank 0 -> rank 1 of 2, `stream`: guessable.
void SendForgedHello(int fd, const std::string& job, uint32_t stream) {
  const std::string id = "lab/" + job;
  const absl::Time deadline = absl::Now() + absl::Seconds(5);
  transport::Hello h{transport::kHelloMagic, transport::kWireVersion,
                     static_cast<uint16_t>(id.size()), 1, 0, 1, 2, stream};
  ASSERT_TRUE(WriteFull(fd, &h, sizeof(h), deadline).ok());
  ASSERT_TRUE(WriteFull(fd, id.data(), id.size(), deadline).ok());
}

// Before: rank 1's daemon claimed the forger's connection and waited on it
// for the whole connect deadline; both ranks failed after 30 s.
TEST_F(DataPortAttack, SilentForgersParkedBeforeTheRealPeerCostSeconds) {
  std::vector<UniqueFd> forged;
  for (uint32_t stream = 0; stream < 2; ++stream) {  // gradsyncd's --tcp_streams=2
    forged.push_back(ConnectFrom("127.0.0.2", cluster_->daemon_data_port(1)));
    SendForgedHello(forged.back().get(), "stall", stream);
  }
  const absl::Time start = absl::Now();
  auto job = testing::OpenJob(*cluster_, "stall", {0, 1});
  const absl::Duration took = absl::Now() - start;
  ASSERT_TRUE(job.ok()) << job.status();
  // One 3 s handshake step per forged stream at most, far below the 30 s.
  EXPECT_LT(took, absl::Seconds(15)) << took;
  testing::ExpectAllreduceExact(*job, 10000, "ring");
  const std::string log = testing::ReadTextFile(cluster_->daemon_log(1));
  EXPECT_NE(log.find("closed a connection claiming to be rank 0 (no_proof)"), std::string::npos)
      << "the forged connections were never claimed, so this test shows nothing";
  for (auto& r : *job) EXPECT_TRUE(r.session->Close().ok());
}

// Before: 64 silent connections from each of 4 addresses took the 256
// handshake slots, and every job forming on the daemon failed.
TEST_F(DataPortAttack, SilentConnectionsFromFourHostsDoNotStopJobsForming) {
  std::vector<UniqueFd> silent;
  for (int d = 0; d < 2; ++d) {
    for (const char* host : {"127.0.0.2", "127.0.0.3", "127.0.0.4", "127.0.0.5"}) {
      for (int i = 0; i < 64; ++i) silent.push_back(ConnectFrom(host, cluster_->daemon_data_port(d)));
    }
  }
  auto job = testing::OpenJob(*cluster_, "crowded", {0, 1});
  ASSERT_TRUE(job.ok()) << job.status();
  testing::ExpectAllreduceExact(*job, 10000, "ring");
  for (auto& r : *job) EXPECT_TRUE(r.session->Close().ok());
}

}  // namespace
}  // namespace gradsync
