// The verbs emulation's RC semantics, through the RAII wrappers of verbs.h:
// what the RDMA transport's tests rely on it to do.
#include "rdma/verbs_emulation.h"

#include <infiniband/verbs.h>

#include <cstring>
#include <vector>

#include "gtest/gtest.h"
#include "rdma/verbs.h"

namespace gradsync::rdma {
namespace {

// Two connected QPs on one emulated device, each with its own CQ.
struct Pair {
  std::unique_ptr<Context> ctx;
  std::unique_ptr<ProtectionDomain> pd;
  std::unique_ptr<CompletionQueue> cq[2];
  std::unique_ptr<QueuePair> qp[2];
};

Pair Connect(const VerbsEmulation& emu, QueuePairOptions qopt = {}, ConnectOptions copt = {}) {
  Pair p;
  p.ctx = *Context::Open("emu_ib0", emu.verbs());
  p.pd = *ProtectionDomain::Create(*p.ctx);
  for (int i = 0; i < 2; ++i) {
    p.cq[i] = *CompletionQueue::Create(*p.ctx, 64);
    p.qp[i] = *QueuePair::Create(*p.pd, *p.cq[i], *p.cq[i], qopt);
  }
  QpEndpoint e[2];
  for (int i = 0; i < 2; ++i) e[i] = *p.qp[i]->LocalEndpoint(copt);
  for (int i = 0; i < 2; ++i) {
    EXPECT_TRUE(p.qp[i]->Connect(e[i], e[1 - i], copt).ok());
  }
  return p;
}

std::vector<WorkCompletion> Drain(CompletionQueue& cq) {
  std::vector<WorkCompletion> out;
  EXPECT_TRUE(cq.Poll(64, &out).ok());
  return out;
}

TEST(VerbsEmulation, ListsDevicesAndPorts) {
  VerbsEmulation emu(EmulationOptions{.devices = 2});
  auto devices = ListVerbsDevices(emu.verbs());
  ASSERT_TRUE(devices.ok()) << devices.status();
  ASSERT_EQ(devices->size(), 2u);
  EXPECT_EQ((*devices)[1].name, "emu_ib1");
  ASSERT_EQ((*devices)[0].ports.size(), 1u);
  EXPECT_EQ((*devices)[0].ports[0].state, PortState::kActive);
  EXPECT_EQ((*devices)[0].ports[0].active_mtu, 4096);
  EXPECT_EQ((*devices)[0].ports[0].lid, 1);
}

TEST(VerbsEmulation, WriteWithImmediateLandsAndCompletesOnBothSides) {
  VerbsEmulation emu;
  Pair p = Connect(emu);
  std::vector<char> src(1000), dst(1000, 0);
  for (size_t i = 0; i < src.size(); ++i) src[i] = static_cast<char>(i * 7);
  auto smr = *MemoryRegion::Register(*p.pd, src.data(), src.size());
  auto dmr = *MemoryRegion::Register(*p.pd, dst.data(), dst.size());
  ASSERT_TRUE(p.qp[1]->PostRecv(*dmr, 0, 0, /*wr_id=*/77).ok());
  const uint32_t imm = 0xabcd1234;
  ASSERT_TRUE(p.qp[0]->PostWrite(*smr, 0, 600, dmr->Remote(100), 0, 5, true, &imm).ok());
  auto sc = Drain(*p.cq[0]);
  ASSERT_EQ(sc.size(), 1u);
  EXPECT_TRUE(sc[0].ok);
  EXPECT_EQ(sc[0].wr_id, 5u);
  auto rc = Drain(*p.cq[1]);
  ASSERT_EQ(rc.size(), 1u);
  EXPECT_TRUE(rc[0].ok);
  EXPECT_EQ(rc[0].wr_id, 77u);
  EXPECT_TRUE(rc[0].has_imm);
  EXPECT_EQ(rc[0].imm_data, imm);
  EXPECT_EQ(rc[0].byte_len, 600u);
  EXPECT_EQ(std::memcmp(dst.data() + 100, src.data(), 600), 0);
  EXPECT_EQ(dst[99], 0);
  EXPECT_EQ(dst[700], 0);
}

TEST(VerbsEmulation, BadRkeyIsRemoteAccessErrorAndFlushesTheRest) {
  VerbsEmulation emu;
  Pair p = Connect(emu);
  std::vector<char> src(64), dst(64);
  auto smr = *MemoryRegion::Register(*p.pd, src.data(), src.size());
  auto dmr = *MemoryRegion::Register(*p.pd, dst.data(), dst.size());
  RemoteMemory bad = dmr->Remote();
  bad.rkey ^= 1;
  ASSERT_TRUE(p.qp[0]->PostWrite(*smr, 0, 8, bad, 0, 1, true).ok());
  ASSERT_TRUE(p.qp[0]->PostWrite(*smr, 0, 8, dmr->Remote(), 0, 2, true).ok());
  auto sc = Drain(*p.cq[0]);
  ASSERT_EQ(sc.size(), 2u);
  EXPECT_EQ(sc[0].status, IBV_WC_REM_ACCESS_ERR) << sc[0].status_text;
  EXPECT_EQ(sc[1].status, IBV_WC_WR_FLUSH_ERR);
  // Out of bounds of a valid key is the same error.
  Pair q = Connect(emu);
  auto smr2 = *MemoryRegion::Register(*q.pd, src.data(), src.size());
  auto dmr2 = *MemoryRegion::Register(*q.pd, dst.data(), dst.size());
  RemoteMemory over = dmr2->Remote(60);
  over.length = 64;  // lie about the length: the key check still bounds it
  ASSERT_TRUE(q.qp[0]->PostWrite(*smr2, 0, 8, over, 0, 3, true).ok());
  sc = Drain(*q.cq[0]);
  ASSERT_EQ(sc.size(), 1u);
  EXPECT_EQ(sc[0].status, IBV_WC_REM_ACCESS_ERR);
}

TEST(VerbsEmulation, SendWaitsForAReceiveAndShortReceiveIsLengthError) {
  VerbsEmulation emu;
  Pair p = Connect(emu, QueuePairOptions{.max_inline_data = 64});
  std::vector<char> dst(16);
  auto dmr = *MemoryRegion::Register(*p.pd, dst.data(), dst.size());
  const char msg[] = "clear to send";
  ASSERT_TRUE(p.qp[0]->PostSendInline(msg, sizeof(msg), 9, true).ok());
  EXPECT_TRUE(Drain(*p.cq[0]).empty());  // receiver not ready: it waits
  ASSERT_TRUE(p.qp[1]->PostRecv(*dmr, 0, dst.size(), 10).ok());
  auto sc = Drain(*p.cq[0]);
  ASSERT_EQ(sc.size(), 1u);
  EXPECT_TRUE(sc[0].ok);
  auto rc = Drain(*p.cq[1]);
  ASSERT_EQ(rc.size(), 1u);
  EXPECT_EQ(rc[0].byte_len, sizeof(msg));
  EXPECT_STREQ(dst.data(), msg);
  EXPECT_EQ(emu.stats().rnr_waits, 1u);

  ASSERT_TRUE(p.qp[1]->PostRecv(*dmr, 0, 4, 11).ok());
  ASSERT_TRUE(p.qp[0]->PostSendInline(msg, sizeof(msg), 12, true).ok());
  rc = Drain(*p.cq[1]);
  ASSERT_EQ(rc.size(), 1u);
  EXPECT_EQ(rc[0].status, IBV_WC_LOC_LEN_ERR);
  sc = Drain(*p.cq[0]);
  ASSERT_EQ(sc.size(), 1u);
  EXPECT_EQ(sc[0].status, IBV_WC_REM_INV_REQ_ERR);
}

// Each RDMA context (job epoch) has a protection domain of its own: an rkey
// of memory registered on another domain is refused as a bad key would be.
TEST(VerbsEmulation, AnRkeyOfAnotherProtectionDomainIsARemoteAccessError) {
  VerbsEmulation emu;
  Pair p = Connect(emu);
  auto other = *ProtectionDomain::Create(*p.ctx);  // another job's domain on the same NIC
  std::vector<char> src(64, 's'), foreign(64, 'f');
  auto smr = *MemoryRegion::Register(*p.pd, src.data(), src.size());
  auto fmr = *MemoryRegion::Register(*other, foreign.data(), foreign.size());
  ASSERT_TRUE(p.qp[0]->PostWrite(*smr, 0, 64, fmr->Remote(), 0, 1, true).ok());
  auto sc = Drain(*p.cq[0]);
  ASSERT_EQ(sc.size(), 1u);
  EXPECT_EQ(sc[0].status, IBV_WC_REM_ACCESS_ERR);
  EXPECT_EQ(foreign, std::vector<char>(64, 'f'));  // untouched
}

TEST(VerbsEmulation, FullSendQueueRefusesUntilCompletionsArePolled) {
  VerbsEmulation emu;
  Pair p = Connect(emu, QueuePairOptions{.max_send_wr = 4});
  std::vector<char> src(8), dst(8);
  auto smr = *MemoryRegion::Register(*p.pd, src.data(), src.size());
  auto dmr = *MemoryRegion::Register(*p.pd, dst.data(), dst.size());
  for (int i = 0; i < 4; ++i) {
    ASSERT_TRUE(p.qp[0]->PostWrite(*smr, 0, 8, dmr->Remote(), 0, i, i == 3).ok());
  }
  absl::Status full = p.qp[0]->PostWrite(*smr, 0, 8, dmr->Remote(), 0, 4, true);
  EXPECT_EQ(full.code(), absl::StatusCode::kResourceExhausted) << full;
  EXPECT_EQ(Drain(*p.cq[0]).size(), 1u);  // the signaled one frees all four
  EXPECT_TRUE(p.qp[0]->PostWrite(*smr, 0, 8, dmr->Remote(), 0, 5, true).ok());
  EXPECT_EQ(emu.stats().sq_full, 1u);
}

TEST(VerbsEmulation, DeadPeerIsRetryExceeded) {
  VerbsEmulation emu;
  Pair p = Connect(emu);
  std::vector<char> src(8), dst(8);
  auto smr = *MemoryRegion::Register(*p.pd, src.data(), src.size());
  auto dmr = *MemoryRegion::Register(*p.pd, dst.data(), dst.size());
  p.qp[1].reset();
  ASSERT_TRUE(p.qp[0]->PostWrite(*smr, 0, 8, dmr->Remote(), 0, 1, true).ok());
  auto sc = Drain(*p.cq[0]);
  ASSERT_EQ(sc.size(), 1u);
  EXPECT_EQ(sc[0].status, IBV_WC_RETRY_EXC_ERR) << sc[0].status_text;
}

TEST(VerbsEmulation, CompletionQueueOverrunFailsThePoll) {
  VerbsEmulation emu;
  emu.SetFaults(EmulatedFaults{.cq_capacity = 2});
  Pair p = Connect(emu);
  std::vector<char> src(8), dst(8);
  auto smr = *MemoryRegion::Register(*p.pd, src.data(), src.size());
  auto dmr = *MemoryRegion::Register(*p.pd, dst.data(), dst.size());
  for (int i = 0; i < 3; ++i) {
    ASSERT_TRUE(p.qp[0]->PostWrite(*smr, 0, 8, dmr->Remote(), 0, i, true).ok());
  }
  std::vector<WorkCompletion> out;
  absl::StatusOr<int> n = p.cq[0]->Poll(8, &out);
  ASSERT_FALSE(n.ok());
  EXPECT_NE(n.status().message().find("ibv_poll_cq"), std::string::npos) << n.status();
}

TEST(VerbsEmulation, CompletionChannelTurnsReadableWhenArmed) {
  VerbsEmulation emu;
  auto ctx = *Context::Open("emu_ib0", emu.verbs());
  auto pd = *ProtectionDomain::Create(*ctx);
  auto ch = *CompletionChannel::Create(*ctx);
  auto cq0 = *CompletionQueue::Create(*ctx, 8);
  auto cq1 = *CompletionQueue::Create(*ctx, 8, ch.get());
  auto a = *QueuePair::Create(*pd, *cq0, *cq0);
  auto b = *QueuePair::Create(*pd, *cq1, *cq1);
  QpEndpoint ea = *a->LocalEndpoint(), eb = *b->LocalEndpoint();
  ASSERT_TRUE(a->Connect(ea, eb).ok());
  ASSERT_TRUE(b->Connect(eb, ea).ok());
  std::vector<char> dst(8);
  auto dmr = *MemoryRegion::Register(*pd, dst.data(), dst.size());
  ASSERT_TRUE(b->PostRecv(*dmr, 0, 8, 1).ok());
  ASSERT_TRUE(cq1->RequestNotify().ok());
  ASSERT_TRUE(a->PostSendInline("hi", 2, 1, false).ok());
  ASSERT_TRUE(ch->TakeEvents().ok());  // blocking fd: an event is there
  std::vector<WorkCompletion> out;
  ASSERT_EQ(*cq1->Poll(8, &out), 1);
  EXPECT_EQ(out[0].byte_len, 2u);
}

}  // namespace
}  // namespace gradsync::rdma
