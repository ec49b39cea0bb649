#include "collective/planner.h"

#include "absl/strings/match.h"
#include "collective/codec_request.h"
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

PlanRequest Op(CollectiveKind kind, size_t bytes, uint8_t forced = kAutoCode) {
  PlanRequest op;
  op.kind = kind;
  op.bytes = bytes;
  op.forced = forced;
  return op;
}

// `world` daemons hosting `ranks` ranks (more ranks than daemons: some share).
PlanTopology Shared(int world, int ranks) {
  PlanTopology t = Flat(world);
  t.ranks = ranks;
  return t;
}

uint8_t Code(Algorithm a) { return static_cast<uint8_t>(a); }

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
  Plan p =
      flat.Propose(Op(CollectiveKind::kAllreduce, 1 << 20, Code(Algorithm::kRecursiveDoubling)));
  EXPECT_EQ(p.algorithm, Algorithm::kRecursiveDoubling);
  EXPECT_FALSE(p.fused);
  p = flat.Propose(Op(CollectiveKind::kAllreduce, 8, kAutoCode));
  EXPECT_TRUE(p.fused) << p.Name();  // 8 bytes on a dear round trip
  p = flat.Propose(Op(CollectiveKind::kAllreduce, 64 << 20, kAutoCode));
  EXPECT_EQ(p.path, PlanPath::kFlat);
  EXPECT_NE(p.algorithm, Algorithm::kOneShot);
  EXPECT_GT(p.streams, 0);  // large enough to carry a stream proposal
  EXPECT_EQ(flat.Propose(Op(CollectiveKind::kAllreduce, 1 << 20, kAutoCode)).streams, 0);
}

TEST(Planner, ForcedHierarchicalAndParameterServerPlansAreKept) {
  PlanTopology t = Flat(2);
  t.ps_shards = 2;
  Planner planner(PlannerSettings{}, t, Loopback());
  EXPECT_EQ(planner.Propose(Op(CollectiveKind::kAllreduce, 8, kHierarchicalPlanCode)).path,
            PlanPath::kHierarchical);
  EXPECT_EQ(planner.Propose(Op(CollectiveKind::kAllreduce, 8, kParameterServerPlanCode)).path,
            PlanPath::kParameterServer);
  EXPECT_EQ(planner.Propose(Op(CollectiveKind::kAllreduce, 8, kParameterServerPlanCode)).streams,
            0);
}

TEST(Planner, SettingsBoundTheFusedPlan) {
  PlannerSettings s;
  s.oneshot_max_bytes = 0;  // never fuse
  Planner planner(s, Flat(4), Loopback());
  EXPECT_FALSE(planner.Propose(Op(CollectiveKind::kAllreduce, 8, kAutoCode)).fused);
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

TEST(Planner, NodeStageAlgorithmFollowsThePlanOrTheCostModelWithRingFallback) {
  Planner planner(PlannerSettings{}, Shared(2, 3), Loopback());
  const PlanRequest big = Op(CollectiveKind::kAllreduce, 64 << 20);
  const Plan mine = planner.Propose(big);
  EXPECT_TRUE(mine.local_stage);
  // A flat plan's algorithm runs the stage among the daemons.
  absl::StatusOr<Plan> p = planner.Agree(big, mine, Code(Algorithm::kRecursiveDoubling), 0);
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_EQ(p->node_algorithm, Algorithm::kRecursiveDoubling);
  // A hierarchical plan: the cost model's choice on the agreed link, no oneshot.
  p = planner.Agree(big, mine, kHierarchicalPlanCode, 0);
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_EQ(p->node_algorithm, ChooseAlgorithm(CollectiveKind::kAllreduce, 64 << 20, 2, Loopback(),
                                               /*allow_oneshot=*/false));
  // reduce_scatter's stage is an allreduce of every block.
  const PlanRequest rs = Op(CollectiveKind::kReduceScatter, 64 << 20);
  p = planner.Agree(rs, planner.Propose(rs), kHierarchicalPlanCode, 0);
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_EQ(p->node_algorithm, ChooseAlgorithm(CollectiveKind::kAllreduce, 64 << 20, 2, Loopback(),
                                               /*allow_oneshot=*/false));
  // Ring where the plan's algorithm does not implement the stage, or is oneshot.
  p = planner.Agree(big, mine, Code(Algorithm::kPairwise), 0);
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_EQ(p->node_algorithm, Algorithm::kRing);
  const PlanRequest bcast = Op(CollectiveKind::kBroadcast, 1 << 10);
  p = planner.Agree(bcast, planner.Propose(bcast), Code(Algorithm::kOneShot), 0);
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_FALSE(p->fused);
  EXPECT_EQ(p->node_algorithm, Algorithm::kRing);
}

// gather and scatter have one algorithm, the linear exchange ("pairwise"):
// the cost model picks it flat, and it names the stage among the daemons.
TEST(Planner, GatherAndScatterRunTheLinearExchange) {
  for (CollectiveKind kind : {CollectiveKind::kGather, CollectiveKind::kScatter}) {
    for (size_t bytes : {size_t{8}, size_t{64} << 20}) {
      Planner flat(PlannerSettings{}, Flat(4), Loopback());
      Plan p = flat.Propose(Op(kind, bytes));
      EXPECT_EQ(p.path, PlanPath::kFlat);
      EXPECT_EQ(p.algorithm, Algorithm::kPairwise) << CollectiveName(kind) << " " << bytes;
      EXPECT_FALSE(p.fused);
      EXPECT_EQ(p.streams, 0);
      Planner shared(PlannerSettings{}, Shared(2, 3), Loopback());
      absl::StatusOr<Plan> agreed =
          shared.Agree(Op(kind, bytes), shared.Propose(Op(kind, bytes)), Code(Algorithm::kPairwise), 0);
      ASSERT_TRUE(agreed.ok()) << agreed.status();
      EXPECT_EQ(agreed->node_algorithm, Algorithm::kPairwise);
      EXPECT_STREQ(agreed->shown_name, "hier");
    }
    for (Algorithm a : kAllAlgorithms) {
      EXPECT_EQ(Implements(a, kind), a == Algorithm::kPairwise) << AlgorithmName(a);
    }
  }
}

TEST(Planner, FusedOnlyForAnAllreduceOrBarrierWhoseLocalSignaturesAgree) {
  Planner planner(PlannerSettings{}, Shared(2, 4), Loopback());
  PlanRequest small = Op(CollectiveKind::kAllreduce, 8);
  EXPECT_TRUE(planner.Propose(small).fused);  // the daemon's partial result rides along
  small.local_mismatch = true;
  const Plan mine = planner.Propose(small);
  EXPECT_FALSE(mine.fused);
  // Still proposed: the exchange reports the mismatch.
  EXPECT_EQ(mine.algorithm, Algorithm::kOneShot);
  EXPECT_FALSE(planner.Propose(Op(CollectiveKind::kAllreduce, 64 << 20)).fused);
  // Agree keeps the decision every daemon made before the exchange.
  small.local_mismatch = false;
  const Plan fused = planner.Propose(small);
  absl::StatusOr<Plan> p = planner.Agree(small, fused, Code(Algorithm::kOneShot), 0);
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_TRUE(p->fused);
}

TEST(Planner, TheNameShownIsHierWhereRanksShareDaemons) {
  const PlanRequest big = Op(CollectiveKind::kAllreduce, 64 << 20);
  PlanTopology shared = Shared(2, 3);
  shared.ps_shards = 2;
  Planner hier(PlannerSettings{}, shared, Loopback());
  absl::StatusOr<Plan> p = hier.Agree(big, hier.Propose(big), Code(Algorithm::kRing), 0);
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_STREQ(p->shown_name, "hier");
  EXPECT_STREQ(p->Name(), "ring");  // what the signature carried
  p = hier.Agree(big, hier.Propose(big), kParameterServerPlanCode, 0);
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_STREQ(p->shown_name, "ps");
  Planner flat(PlannerSettings{}, Flat(2), Loopback());
  p = flat.Agree(big, flat.Propose(big), Code(Algorithm::kRecursiveHalvingDoubling), 0);
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_STREQ(p->shown_name, "rhd");
  // Every rank on this daemon: several ranks show "hier"; a job of one rank
  // runs nothing and shows what it asked for.
  PlanTopology here;
  here.ranks = 3;
  here.every_rank_here = true;
  Plan local = Planner(PlannerSettings{}, here, Loopback()).Propose(big);
  EXPECT_TRUE(local.in_memory);
  EXPECT_STREQ(local.shown_name, "hier");
  here.ranks = 1;
  Planner one(PlannerSettings{}, here, Loopback());
  EXPECT_STREQ(one.Propose(big).shown_name, "ring");
  EXPECT_STREQ(one.Propose(Op(CollectiveKind::kAllreduce, 8, kParameterServerPlanCode)).shown_name,
               "ps");
  EXPECT_TRUE(one.Propose(big).in_memory);
}

TEST(Planner, DeviceBuffersRunInPlaceUnlessFusedOrOnTheParameterServer) {
  PlanTopology t = Flat(2);
  t.ps_shards = 2;
  Planner planner(PlannerSettings{}, t, Loopback());
  PlanRequest big = Op(CollectiveKind::kAllreduce, 64 << 20);
  EXPECT_FALSE(planner.Propose(big).on_device);  // no device path: host twins
  big.device_path = true;
  const Plan mine = planner.Propose(big);
  EXPECT_TRUE(mine.on_device);
  absl::StatusOr<Plan> p = planner.Agree(big, mine, Code(Algorithm::kRing), 0);
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_TRUE(p->on_device);
  p = planner.Agree(big, mine, kParameterServerPlanCode, 0);
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_FALSE(p->on_device);  // the PS path moves host memory
  PlanRequest small = Op(CollectiveKind::kAllreduce, 8);
  small.device_path = true;
  const Plan fused = planner.Propose(small);
  ASSERT_TRUE(fused.fused);
  EXPECT_FALSE(fused.on_device);  // the exchange carries host memory
  PlanTopology here;
  here.ranks = 2;
  here.every_rank_here = true;
  EXPECT_TRUE(Planner(PlannerSettings{}, here, Loopback()).Propose(small).on_device);
  EXPECT_TRUE(planner.WantsDevicePath(true));
  EXPECT_FALSE(planner.WantsDevicePath(false));  // host buffers among them
}

TEST(Planner, HostTwinsWhenDeviceOpsInPlaceAreOff) {
  PlannerSettings s;
  s.device_ops_in_place = false;  // gradsyncd --device_ops=host_twin
  Planner planner(s, Flat(2), Loopback());
  EXPECT_FALSE(planner.WantsDevicePath(true));
  PlanRequest big = Op(CollectiveKind::kAllreduce, 64 << 20);
  big.device_path = true;
  EXPECT_FALSE(planner.Propose(big).on_device);
}

TEST(Planner, SlicingAndPartitionSizesComeFromTheSettings) {
  PlannerSettings s;
  s.min_slice_bytes = 4096;
  s.ps_partition_bytes = 65536;
  PlanTopology shared = Shared(2, 3);
  shared.ps_shards = 1;
  Planner planner(s, shared, Loopback());
  const PlanRequest big = Op(CollectiveKind::kAllreduce, 64 << 20);
  const Plan mine = planner.Propose(big);
  absl::StatusOr<Plan> p = planner.Agree(big, mine, kHierarchicalPlanCode, 0);
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_EQ(p->slice_min_bytes, 4096u);
  EXPECT_EQ(p->ps_partition_bytes, 0u);
  p = planner.Agree(big, mine, kParameterServerPlanCode, 0);
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_EQ(p->ps_partition_bytes, 65536u);
  EXPECT_EQ(p->slice_min_bytes, 0u);  // the PS path's local reduce runs on one thread
  // One rank per daemon: nothing in memory to slice.
  Planner flat(s, Flat(2), Loopback());
  EXPECT_EQ(flat.Propose(big).slice_min_bytes, 0u);
  PlanTopology here;
  here.ranks = 4;
  here.every_rank_here = true;
  EXPECT_EQ(Planner(s, here, Loopback()).Propose(big).slice_min_bytes, 4096u);
  EXPECT_EQ(PlannerSettings{}.min_slice_bytes, size_t{1} << 20);
  EXPECT_EQ(PlannerSettings{}.ps_partition_bytes, uint64_t{1} << 20);
}

// An f32 allreduce of `bytes` with codec request `codecs` (codec_request.h).
PlanRequest CodecOp(size_t bytes, const char* codecs, DType dtype = DType::kF32) {
  PlanRequest op = Op(CollectiveKind::kAllreduce, bytes);
  op.dtype = dtype;
  op.count = bytes / DTypeSize(dtype);
  op.codecs = ParseCodecRequest(codecs, /*job=*/false)->Code();
  return op;
}

// 1 Gbit/s: 8e-3 us per byte.
LinkParams Gigabit() {
  LinkParams l = Loopback();
  l.beta_us_per_byte = 8e-3;
  return l;
}

TEST(Planner, WithoutARequestTheCodecIsNone) {
  Planner planner(PlannerSettings{}, Shared(2, 3), Gigabit());
  for (size_t bytes : {size_t{8}, size_t{1} << 20, size_t{64} << 20}) {
    const PlanRequest op = Op(CollectiveKind::kAllreduce, bytes);
    const Plan mine = planner.Propose(op);
    EXPECT_EQ(mine.codec, CodecId::kNone);
    absl::StatusOr<Plan> p = planner.Agree(op, mine, mine.Code(), mine.streams);
    ASSERT_TRUE(p.ok()) << p.status();
    EXPECT_EQ(p->codec, CodecId::kNone);
  }
}

TEST(Planner, ANamedCodecRunsOnTheRingWhereItApplies) {
  Planner flat(PlannerSettings{}, Flat(4), Loopback());
  // Small enough for oneshot, large enough for a codec block: the ring.
  Plan p = flat.Propose(CodecOp(32 << 10, "int8"));
  EXPECT_EQ(p.codec, CodecId::kInt8);
  EXPECT_EQ(p.algorithm, Algorithm::kRing);
  EXPECT_FALSE(p.fused);
  // Where it cannot apply it runs dense and says why.
  p = flat.Propose(CodecOp(1 << 20, "bf16", DType::kI32));
  EXPECT_EQ(p.codec, CodecId::kNone);
  EXPECT_STREQ(p.codec_note, "codecs encode f32 values");
  p = flat.Propose(CodecOp(1 << 10, "bf16"));
  EXPECT_EQ(p.codec, CodecId::kNone);
  EXPECT_STREQ(p.codec_note, "fewer elements than one codec block");
  // A device buffer runs its codec in place on the GPU (the CUDA kernels).
  PlanRequest device = CodecOp(1 << 20, "bf16");
  device.device_path = true;
  p = flat.Propose(device);
  EXPECT_EQ(p.codec, CodecId::kBf16);
  EXPECT_TRUE(p.on_device);
  absl::StatusOr<Plan> agreed = flat.Agree(device, p, p.Code(), p.streams, p.CodecCode());
  ASSERT_TRUE(agreed.ok()) << agreed.status();
  EXPECT_EQ(agreed->codec, CodecId::kBf16);
  EXPECT_TRUE(agreed->on_device);
  // Ranks sharing daemons: the ring among the daemons carries it.
  Planner shared(PlannerSettings{}, Shared(2, 4), Loopback());
  p = shared.Propose(CodecOp(1 << 20, "fp16"));
  EXPECT_EQ(p.codec, CodecId::kFp16);
  EXPECT_EQ(p.node_algorithm, Algorithm::kRing);
  // Every rank on this daemon: nothing crosses a link.
  PlanTopology here = Shared(1, 4);
  here.every_rank_here = true;
  EXPECT_EQ(Planner(PlannerSettings{}, here, Gigabit()).Propose(CodecOp(1 << 20, "int8")).codec,
            CodecId::kNone);
}

TEST(Planner, AutoTakesACodecWhereTheLinkIsSlowerThanTheCodec) {
  PlanRequest op = CodecOp(64 << 20, "auto:bf16,int8");
  op.keyed = true;
  // 1 Gbit/s: the smaller encoding wins, on a named op (its loss is fed back).
  EXPECT_EQ(Planner(PlannerSettings{}, Flat(4), Gigabit()).Propose(op).codec, CodecId::kInt8);
  PlanRequest plain = CodecOp(64 << 20, "auto");
  plain.keyed = true;
  EXPECT_EQ(Planner(PlannerSettings{}, Flat(4), Gigabit()).Propose(plain).codec, CodecId::kInt8);
  // Unnamed: no feedback, so no 8-bit codec; a 16-bit one (which of the two
  // depends on their measured speed on this machine, e.g. under a sanitizer).
  plain.keyed = false;
  const CodecId sixteen = Planner(PlannerSettings{}, Flat(4), Gigabit()).Propose(plain).codec;
  EXPECT_TRUE(sixteen == CodecId::kBf16 || sixteen == CodecId::kFp16) << CodecName(sixteen);
  PlanRequest only8 = CodecOp(64 << 20, "auto:int8,fp8");
  const Plan unfed = Planner(PlannerSettings{}, Flat(4), Gigabit()).Propose(only8);
  EXPECT_EQ(unfed.codec, CodecId::kNone);
  EXPECT_TRUE(absl::StrContains(unfed.codec_note, "8-bit codecs run only where the daemon feeds their loss back"))
      << unfed.codec_note;
  // A named op on a device buffer keeps no residual (error feedback is host
  // memory): 16-bit only.
  PlanRequest on_gpu = plain;
  on_gpu.keyed = true;
  on_gpu.device_path = true;
  const Plan gpu = Planner(PlannerSettings{}, Flat(4), Gigabit()).Propose(on_gpu);
  EXPECT_TRUE(gpu.codec == CodecId::kBf16 || gpu.codec == CodecId::kFp16) << CodecName(gpu.codec);
  EXPECT_TRUE(gpu.on_device);
  // A link far faster than any codec: dense, saying why.
  LinkParams fast = Loopback();
  fast.beta_us_per_byte = 1e-6;
  fast.reduce_us_per_byte = 1e-6;
  const Plan dense = Planner(PlannerSettings{}, Flat(4), fast).Propose(op);
  EXPECT_EQ(dense.codec, CodecId::kNone);
  EXPECT_STREQ(dense.codec_note, "auto: no codec is modelled faster than dense on this link");
  // The model: the codec's time is the ring's over its encoded bytes plus
  // its measured CPU cost, below the dense ring's on the slow link.
  Planner slow(PlannerSettings{}, Flat(4), Gigabit());
  EXPECT_LT(slow.CodecMicros(op, CodecId::kBf16), 0.6 * slow.CodecMicros(op, CodecId::kNone));
  EXPECT_GT(slow.CodecMicros(op, CodecId::kBf16), 0.4 * slow.CodecMicros(op, CodecId::kNone));
}

// A codec op's time corrects that codec's model, never the link's β: a
// codec that runs slower here than modelled (its CPU work shares cores with
// the trainers, its error feedback's passes) loses auto's choice.
TEST(Planner, AutoLearnsWhatACodecReallyCostsHere) {
  Planner p(PlannerSettings{}, Flat(2), Gigabit());
  PlanRequest op = CodecOp(64 << 20, "auto");
  op.keyed = true;
  const Plan first = p.Propose(op);
  ASSERT_EQ(first.codec, CodecId::kInt8);
  const double beta = p.link().beta_us_per_byte;
  const double modelled = p.CodecMicros(op, CodecId::kInt8);
  const double dense = p.CodecMicros(op, CodecId::kNone);
  // 1.5 times the model: still the fastest on this link.
  p.Observe(first, CollectiveKind::kAllreduce, op.bytes, 0, 1.5 * modelled + 100, 100, true);
  EXPECT_EQ(p.link().beta_us_per_byte, beta);
  EXPECT_NEAR(p.codec_correction(CodecId::kInt8), 1.5, 1e-9);
  EXPECT_EQ(p.Propose(op).codec, CodecId::kInt8);
  // The codecs not run yet share what int8 taught (the same CPU).
  EXPECT_NEAR(p.codec_correction(CodecId::kBf16), 1.5, 1e-9);
  // Slower than dense: auto runs dense, without trying the other codecs
  // one op at a time (their prior is int8's correction).
  p.Observe(first, CollectiveKind::kAllreduce, op.bytes, 0, 20 * dense, 0, true);
  p.Observe(first, CollectiveKind::kAllreduce, op.bytes, 0, 20 * dense, 0, true);
  EXPECT_GT(p.CodecMicros(op, CodecId::kInt8), dense);
  EXPECT_GT(p.CodecMicros(op, CodecId::kBf16), dense);
  const Plan after = p.Propose(op);
  EXPECT_EQ(after.codec, CodecId::kNone);
  EXPECT_STREQ(after.codec_note, "auto: no codec is modelled faster than dense on this link");
  // A codec that ran fast keeps its own correction: where bf16 proved
  // cheap and int8 slow, auto takes bf16 (it still halves the bytes of a
  // 1 Gbit/s link).
  Planner mixed(PlannerSettings{}, Flat(2), Gigabit());
  Plan bf16 = first;
  bf16.codec = CodecId::kBf16;
  mixed.Observe(bf16, CollectiveKind::kAllreduce, op.bytes, 0,
                mixed.CodecMicros(op, CodecId::kBf16), 0, true);
  mixed.Observe(first, CollectiveKind::kAllreduce, op.bytes, 0, 20 * dense, 0, true);
  EXPECT_NEAR(mixed.codec_correction(CodecId::kBf16), 1.0, 1e-6);
  EXPECT_EQ(mixed.Propose(op).codec, CodecId::kBf16);
  PlanRequest only_int8 = CodecOp(64 << 20, "auto:int8");
  only_int8.keyed = true;
  EXPECT_EQ(p.Propose(only_int8).codec, CodecId::kNone);
  // Small ops say little about a codec's throughput: not observed.
  Planner q(PlannerSettings{}, Flat(2), Gigabit());
  q.Observe(first, CollectiveKind::kAllreduce, 512 << 10, 0, 1e9, 0, true);
  EXPECT_EQ(q.codec_correction(CodecId::kInt8), 1.0);
}

// With ranks sharing daemons the op's time includes the in-memory stages;
// the stage among the daemons, timed on its own, corrects the codec.
TEST(Planner, AutoLearnsACodecsCostFromTheStageAmongDaemons) {
  Planner p(PlannerSettings{}, Shared(2, 4), Gigabit());
  PlanRequest op = CodecOp(64 << 20, "auto");
  op.keyed = true;
  const Plan first = p.Propose(op);
  ASSERT_TRUE(first.local_stage);
  ASSERT_EQ(first.codec, CodecId::kInt8);
  const double modelled = p.CodecMicros(op, CodecId::kInt8);
  // The whole op's time says nothing of the codec (Observe: hier is not flat).
  p.Observe(first, CollectiveKind::kAllreduce, op.bytes, 0, 100 * modelled, 0, true);
  EXPECT_EQ(p.codec_correction(CodecId::kInt8), 1.0);
  p.ObserveStage(first, CollectiveKind::kAllreduce, op.bytes, 2 * modelled);
  EXPECT_NEAR(p.codec_correction(CodecId::kInt8), 2.0, 1e-9);
  // A dense stage teaches the codecs nothing.
  Plan dense = first;
  dense.codec = CodecId::kNone;
  p.ObserveStage(dense, CollectiveKind::kAllreduce, op.bytes, 100 * modelled);
  EXPECT_NEAR(p.codec_correction(CodecId::kInt8), 2.0, 1e-9);
}

TEST(Planner, AgreeTakesRankZerosCodec) {
  Planner planner(PlannerSettings{}, Flat(2), Loopback());
  const PlanRequest op = CodecOp(1 << 20, "auto");
  Plan mine = planner.Propose(op);
  absl::StatusOr<Plan> p = planner.Agree(op, mine, Code(Algorithm::kRing), 0,
                                         static_cast<uint8_t>(CodecId::kFp16));
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_EQ(p->codec, CodecId::kFp16);
  p = planner.Agree(op, mine, Code(Algorithm::kRing), 0, 77);
  EXPECT_TRUE(absl::IsDataLoss(p.status())) << p.status();
  EXPECT_EQ(p.status().message(), "rank 0 proposed unknown codec 77");
}

// An f32 allreduce of `bytes` under `topk` (the text after "topk:").
PlanRequest TopkOp(size_t bytes, const char* topk, uint64_t ops_so_far = 0) {
  PlanRequest op = CodecOp(bytes, "");
  op.sparse = ParseSparseSpec(topk)->Code();
  op.keyed = true;
  op.sparse_ops_so_far = ops_so_far;
  return op;
}

TEST(Planner, TopkRunsAfterItsWarmUpOnNamedOpsAcrossDaemons) {
  Planner flat(PlannerSettings{}, Flat(4), Loopback());
  // Small enough for oneshot: topk still runs (on the ring's allgather).
  Plan p = flat.Propose(TopkOp(32 << 10, "0.01"));
  EXPECT_TRUE(p.sparse);
  EXPECT_EQ(p.codec, CodecId::kNone);
  EXPECT_FALSE(p.fused);
  EXPECT_EQ(p.CodecCode(), Plan::kSparseCodecCode);
  // The warm-up: dense for the first ops of the name.
  p = flat.Propose(TopkOp(1 << 20, "0.01,warmup=5", 4));
  EXPECT_FALSE(p.sparse);
  EXPECT_STREQ(p.codec_note, "topk warm-up: the first ops of each name run dense");
  EXPECT_TRUE(flat.Propose(TopkOp(1 << 20, "0.01,warmup=5", 5)).sparse);
  // Unnamed, or where it cannot apply: dense, saying why.
  PlanRequest unnamed = TopkOp(1 << 20, "0.01");
  unnamed.keyed = false;
  p = flat.Propose(unnamed);
  EXPECT_FALSE(p.sparse);
  EXPECT_TRUE(absl::StrContains(p.codec_note, "this op keeps no residual")) << p.codec_note;
  PlanRequest rs = TopkOp(1 << 20, "0.01");
  rs.kind = CollectiveKind::kReduceScatter;
  p = flat.Propose(rs);
  EXPECT_FALSE(p.sparse);
  EXPECT_STREQ(p.codec_note, "topk sparsifies allreduce only");
  // A device buffer's top-k op stages through its host twin (the selection
  // and the residual are the CPU's).
  PlanRequest device = TopkOp(1 << 20, "0.01");
  device.device_path = true;
  p = flat.Propose(device);
  EXPECT_TRUE(p.sparse);
  EXPECT_FALSE(p.on_device);
  // Ranks sharing daemons: the stage among them.
  Planner shared(PlannerSettings{}, Shared(2, 4), Loopback());
  p = shared.Propose(TopkOp(1 << 20, "0.01"));
  EXPECT_TRUE(p.sparse);
  EXPECT_EQ(p.node_algorithm, Algorithm::kRing);
  // Agree: rank 0's choice, which needs topk parameters on the op.
  const PlanRequest op = TopkOp(1 << 20, "0.01", 0);
  absl::StatusOr<Plan> a = flat.Agree(op, flat.Propose(op), Code(Algorithm::kRing), 0,
                                      Plan::kSparseCodecCode);
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_TRUE(a->sparse);
  a = flat.Agree(op, flat.Propose(op), Code(Algorithm::kRing), 0, 0);
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_FALSE(a->sparse);  // rank 0 was still warming up
  a = flat.Agree(CodecOp(1 << 20, ""), Plan{}, Code(Algorithm::kRing), 0, Plan::kSparseCodecCode);
  EXPECT_EQ(a.status().message(), "rank 0 proposed topk for an op without topk parameters");
}

TEST(Planner, AgreeCarriesRankZerosStreamsAndRefusesWhatThisDaemonCannotRun) {
  const PlanRequest big = Op(CollectiveKind::kAllreduce, 64 << 20);
  Planner flat(PlannerSettings{}, Flat(2), Loopback());  // no shards, one rank per daemon
  const Plan mine = flat.Propose(big);
  absl::StatusOr<Plan> p = flat.Agree(big, mine, Code(Algorithm::kRing), 2);
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_EQ(p->streams, 2);
  EXPECT_FALSE(p->local_stage);
  p = flat.Agree(big, mine, kParameterServerPlanCode, 0);
  EXPECT_TRUE(absl::IsFailedPrecondition(p.status())) << p.status();
  EXPECT_EQ(p.status().message(), "rank 0 chose the parameter server; this daemon has no shards");
  p = flat.Agree(big, mine, kHierarchicalPlanCode, 0);
  EXPECT_EQ(p.status().message(),
            "rank 0 chose the hierarchical path; this job has one rank per daemon");
  p = flat.Agree(big, mine, Code(Algorithm::kPairwise), 0);
  EXPECT_TRUE(absl::IsInvalidArgument(p.status())) << p.status();
  EXPECT_EQ(p.status().message(), "rank 0 chose 'pairwise', which does not implement allreduce");
  p = flat.Agree(big, mine, 77, 0);
  EXPECT_TRUE(absl::IsDataLoss(p.status())) << p.status();
  EXPECT_EQ(p.status().message(), "rank 0 proposed unknown plan code 77");
  PlanTopology t = Flat(2);
  t.ps_shards = 1;
  Planner ps(PlannerSettings{}, t, Loopback());
  const PlanRequest bcast = Op(CollectiveKind::kBroadcast, 1 << 20);
  p = ps.Agree(bcast, ps.Propose(bcast), kParameterServerPlanCode, 0);
  EXPECT_TRUE(absl::IsInvalidArgument(p.status())) << p.status();
  EXPECT_EQ(p.status().message(), "rank 0 chose 'ps', which does not implement broadcast");
}

}  // namespace
}  // namespace gradsync
