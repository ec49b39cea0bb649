#include "collective/planner.h"

#include "absl/strings/match.h"
#include "gtest/gtest.h"

namespace gradsync {
namespace {

// A link where a round trip is dear and bandwidth plentiful: small ops want
// oneshot, large ones ring.
LinkParams Loopback() {
  LinkParams l;
  l.alpha_us = 30;
  l.beta_us_per_byte = 1e-3 / 2.0;  // 2 GB/s
  l.reduce_us_per_byte = 1e-3 / 10.0;
  return l;
}

PlanTopology Flat(int world) {
  PlanTopology t;
  t.world = world;
  t.streams = 2;
  t.probe_streams = 2;
  return t;
}

TEST(Plan, CodesRoundTripAndUnknownCodesAreNamed) {
  for (Algorithm a : kAllAlgorithms) {
    Plan p;
    p.algorithm = a;
    absl::StatusOr<Plan> back = PlanFromCode(p.Code());
    ASSERT_TRUE(back.ok());
    EXPECT_EQ(*back, p);
    EXPECT_STREQ(back->Name(), AlgorithmName(a));
  }
  absl::StatusOr<Plan> hier = PlanFromCode(kHierarchicalPlanCode);
  ASSERT_TRUE(hier.ok());
  EXPECT_EQ(hier->path, PlanPath::kHierarchical);
  EXPECT_STREQ(hier->Name(), "hier");
  EXPECT_STREQ(PlanCodeName(kParameterServerPlanCode), "ps");
  EXPECT_STREQ(PlanCodeName(kAutoCode), "auto");
  absl::StatusOr<Plan> bad = PlanFromCode(77);
  EXPECT_TRUE(absl::IsDataLoss(bad.status()));
  EXPECT_TRUE(absl::StrContains(bad.status().message(), "unknown plan code 77"));
}

TEST(RequestedPlanCode, NamesAndRefusals) {
  EXPECT_EQ(*RequestedPlanCode("", CollectiveKind::kAllreduce, 8), kAutoCode);
  EXPECT_EQ(*RequestedPlanCode("auto", CollectiveKind::kAllreduce, 8), kAutoCode);
  EXPECT_EQ(*RequestedPlanCode("hier", CollectiveKind::kAllreduce, 8), kHierarchicalPlanCode);
  EXPECT_EQ(*RequestedPlanCode("ring", CollectiveKind::kAllgather, 8),
            static_cast<uint8_t>(Algorithm::kRing));
  absl::Status s = RequestedPlanCode("ps", CollectiveKind::kBroadcast, 8).status();
  EXPECT_EQ(s.message(), "algorithm 'ps' does not implement broadcast (parameter server: allreduce only)");
  s = RequestedPlanCode("pairwise", CollectiveKind::kAllreduce, 8).status();
  EXPECT_EQ(s.message(), "algorithm 'pairwise' does not implement allreduce (ring, rhd, rd, tree, oneshot do)");
  s = RequestedPlanCode("oneshot", CollectiveKind::kAllreduce, 80000).status();
  EXPECT_TRUE(absl::StrContains(s.message(), "carries at most 65536 bytes per rank; this op has 80000"));
  s = RequestedPlanCode("direct", CollectiveKind::kAllreduce, 8).status();
  EXPECT_TRUE(absl::StrContains(s.message(), "unknown algorithm 'direct'")) << s;
}

TEST(Planner, ForcedPlansWinAndOneshotIsFusedOnlyAcrossDaemons) {
  Planner flat(PlannerSettings{}, Flat(4), Loopback());
  Plan p = flat.Propose(CollectiveKind::kAllreduce, 1 << 20,
                        static_cast<uint8_t>(Algorithm::kRecursiveDoubling));
  EXPECT_EQ(p.algorithm, Algorithm::kRecursiveDoubling);
  EXPECT_FALSE(p.fused());
  p = flat.Propose(CollectiveKind::kAllreduce, 8, kAutoCode);
  EXPECT_TRUE(p.fused()) << p.Name();  // 8 bytes on a dear round trip
  p = flat.Propose(CollectiveKind::kAllreduce, 64 << 20, kAutoCode);
  EXPECT_EQ(p.path, PlanPath::kFlat);
  EXPECT_NE(p.algorithm, Algorithm::kOneShot);
  EXPECT_GT(p.streams, 0);  // large enough to carry a stream proposal
  EXPECT_EQ(flat.Propose(CollectiveKind::kAllreduce, 1 << 20, kAutoCode).streams, 0);
}

TEST(Planner, ForcedHierarchicalAndParameterServerPlansAreKept) {
  PlanTopology t = Flat(2);
  t.ps_shards = 2;
  Planner planner(PlannerSettings{}, t, Loopback());
  EXPECT_EQ(planner.Propose(CollectiveKind::kAllreduce, 8, kHierarchicalPlanCode).path,
            PlanPath::kHierarchical);
  EXPECT_EQ(planner.Propose(CollectiveKind::kAllreduce, 8, kParameterServerPlanCode).path,
            PlanPath::kParameterServer);
  EXPECT_EQ(planner.Propose(CollectiveKind::kAllreduce, 8, kParameterServerPlanCode).streams, 0);
}

TEST(Planner, SettingsBoundTheFusedPlan) {
  PlannerSettings s;
  s.oneshot_max_bytes = 0;  // never fuse
  Planner planner(s, Flat(4), Loopback());
  EXPECT_FALSE(planner.Propose(CollectiveKind::kAllreduce, 8, kAutoCode).fused());
}

TEST(Planner, ObservedTransfersRefineTheLinkAndTheAlphaWindow) {
  Planner planner(PlannerSettings{}, Flat(4), Loopback());
  Plan ring;
  ring.algorithm = Algorithm::kRing;
  const double beta0 = planner.link().beta_us_per_byte;
  // A 64 MiB ring allreduce that took 1 s: far slower than 2 GB/s.
  planner.Observe(ring, CollectiveKind::kAllreduce, 64 << 20, 0, 1e6 + 50, 50, true);
  EXPECT_GT(planner.link().beta_us_per_byte, beta0);
  Plan oneshot;
  oneshot.algorithm = Algorithm::kOneShot;
  const double alpha0 = planner.link().alpha_us;
  for (int i = 0; i < PlannerSettings{}.alpha_window; ++i) {
    planner.Observe(oneshot, CollectiveKind::kAllreduce, 8, 0, 1000, 1000, true);
  }
  EXPECT_GT(planner.link().alpha_us, alpha0);  // 1 ms per 8-byte op: a dearer round trip
  Plan hier;
  hier.path = PlanPath::kHierarchical;
  const LinkParams before = planner.link();
  planner.Observe(hier, CollectiveKind::kAllreduce, 64 << 20, 0, 1, 0, true);
  EXPECT_EQ(planner.link().beta_us_per_byte, before.beta_us_per_byte);
}

}  // namespace
}  // namespace gradsync
