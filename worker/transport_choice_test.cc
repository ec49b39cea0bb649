#include "worker/transport_choice.h"

#include "gtest/gtest.h"

namespace gradsync {
namespace {

std::vector<TransportAdvert> Adverts(const std::vector<std::string>& rdma,
                                     const std::vector<bool>& required = {}) {
  std::vector<TransportAdvert> out;
  for (size_t i = 0; i < rdma.size(); ++i) {
    out.push_back({rdma[i], i < required.size() && required[i],
                   "daemon " + std::to_string(i) + " (" + std::string(1, 'a' + i) + ":1)"});
  }
  return out;
}

TEST(TransportChoice, RdmaWhenEveryDaemonAdvertisesTheSamePort) {
  auto c = ChooseTransport(TransportMode::kAuto, Adverts({"ib", "ib", "ib"}), false, "j");
  ASSERT_TRUE(c.ok());
  EXPECT_TRUE(c->rdma);
  EXPECT_EQ(c->why_not_rdma, "");
}

TEST(TransportChoice, AutoFallsBackToTcpNamingTheDaemonWithout) {
  auto c = ChooseTransport(TransportMode::kAuto, Adverts({"ib", "ib", ""}), false, "j");
  ASSERT_TRUE(c.ok());
  EXPECT_FALSE(c->rdma);
  EXPECT_EQ(c->why_not_rdma, "daemon 2 (c:1) has no RDMA port");
  c = ChooseTransport(TransportMode::kAuto, Adverts({"ib", "roce", "ib"}), false, "j");
  ASSERT_TRUE(c.ok());
  EXPECT_FALSE(c->rdma);
  EXPECT_EQ(c->why_not_rdma, "daemon 1 (b:1) has RDMA 'roce', daemon 0 (a:1) 'ib'");
}

TEST(TransportChoice, NobodyWithRdmaIsPlainTcpWithoutAReason) {
  auto c = ChooseTransport(TransportMode::kAuto, Adverts({"", "", ""}), false, "j");
  ASSERT_TRUE(c.ok());
  EXPECT_FALSE(c->rdma);
  EXPECT_EQ(c->why_not_rdma, "");
}

TEST(TransportChoice, TcpModeNeverUsesRdma) {
  auto c = ChooseTransport(TransportMode::kTcp, Adverts({"ib", "ib"}), false, "j");
  ASSERT_TRUE(c.ok());
  EXPECT_FALSE(c->rdma);
  EXPECT_EQ(c->why_not_rdma, "");
}

TEST(TransportChoice, DataTlsJobsRunOverTcp) {
  auto c = ChooseTransport(TransportMode::kAuto, Adverts({"ib", "ib"}), true, "j");
  ASSERT_TRUE(c.ok());
  EXPECT_FALSE(c->rdma);
  EXPECT_EQ(c->why_not_rdma, "the job encrypts its data plane (data_tls), which RDMA cannot");
}

TEST(TransportChoice, ADaemonThatRequiresRdmaFailsTheEpochOnEveryDaemonAlike) {
  const auto adverts = Adverts({"ib", ""}, {true, false});
  const std::string want =
      "job 'train' cannot run over RDMA: daemon 1 (b:1) has no RDMA port; daemon 0 (a:1) runs "
      "--transport=rdma (--transport=auto falls back to TCP)";
  for (TransportMode mode : {TransportMode::kRdma, TransportMode::kAuto, TransportMode::kTcp}) {
    auto c = ChooseTransport(mode, adverts, false, "train");
    ASSERT_FALSE(c.ok());
    EXPECT_EQ(c.status().code(), absl::StatusCode::kFailedPrecondition);
    EXPECT_EQ(c.status().message(), want);
  }
  auto tls = ChooseTransport(TransportMode::kRdma, Adverts({"ib", "ib"}, {true, true}), true, "j");
  EXPECT_EQ(tls.status().code(), absl::StatusCode::kFailedPrecondition);
}

TEST(TransportChoice, ParsesModes) {
  EXPECT_EQ(*ParseTransportMode("auto"), TransportMode::kAuto);
  EXPECT_EQ(*ParseTransportMode("rdma"), TransportMode::kRdma);
  EXPECT_EQ(ParseTransportMode("verbs").status().message(),
            "--transport 'verbs': expected auto, tcp or rdma");
}

}  // namespace
}  // namespace gradsync
