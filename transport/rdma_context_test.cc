// The RDMA transport's protocol against the verbs emulation: receiver-driven
// clear-to-send flow, bit-exact delivery with no copies, back-pressure, size
// mismatches, verbs faults and a dead peer, the registration cache. Every
// rank has its own TCP listener (the bootstrap) and RdmaDevice, as daemons do.
#include <fcntl.h>
#include <sys/mman.h>

#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "gtest/gtest.h"
#include "rdma/verbs_emulation.h"
#include "transport/memory.h"
#include "transport/rdma_device.h"
#include "transport/tcp_listener.h"

namespace gradsync::transport {
namespace {

using rdma::EmulatedFaults;
using rdma::VerbsEmulation;

class RdmaContextTest : public ::testing::Test {
 protected:
  // `world` connected contexts of job `job`.
  std::vector<std::unique_ptr<RdmaContext>> Connect(int world, int max_in_flight = 8) {
    std::vector<HostPort> addrs;
    for (int r = 0; r < world; ++r) {
      ListenerOptions lo;
      lo.listen = {"127.0.0.1", 0};
      auto l = TcpListener::Start(lo);
      EXPECT_TRUE(l.ok()) << l.status();
      addrs.push_back({"127.0.0.1", (*l)->port()});
      RdmaDeviceOptions o;
      o.verbs = &emu_.verbs();
      o.max_in_flight = max_in_flight;
      o.bootstrap.listener = l->get();
      auto d = RdmaDevice::Open(o);
      EXPECT_TRUE(d.ok()) << d.status();
      devices_.push_back(std::move(*d));
      listeners_.push_back(std::move(*l));
    }
    std::vector<std::unique_ptr<RdmaContext>> out(world);
    std::vector<std::thread> threads;
    for (int r = 0; r < world; ++r) {
      threads.emplace_back([&, r] {
        ContextSpec s;
        s.job_id = "rdma-test";
        s.epoch = 1;
        s.rank = r;
        s.world_size = world;
        s.peers = addrs;
        s.job_key = "k";
        s.deadline = absl::Now() + absl::Seconds(10);
        auto ctx = devices_[r]->CreateContext(s);
        ASSERT_TRUE(ctx.ok()) << ctx.status();
        out[r].reset(static_cast<RdmaContext*>(ctx->release()));
      });
    }
    for (auto& t : threads) t.join();
    return out;
  }

  static absl::Status Wait(Context& c, const Request& req, absl::Duration limit = absl::Seconds(10)) {
    const absl::Time deadline = absl::Now() + limit;
    while (!req.done) {
      absl::Status s = c.Progress(deadline);
      if (!s.ok()) return s;
    }
    return absl::OkStatus();
  }

  VerbsEmulation emu_;
  std::vector<std::unique_ptr<TcpListener>> listeners_;
  std::vector<std::unique_ptr<RdmaDevice>> devices_;
};

MessageTag Tag(uint64_t op, uint32_t slot) {
  MessageTag t;
  t.op_seq = op;
  t.slot = slot;
  return t;
}

TEST_F(RdmaContextTest, DeviceDescribesThePortAndGpuDirect) {
  auto ctx = Connect(1);
  EXPECT_EQ(devices_[0]->properties().name, "rdma");
  EXPECT_EQ(devices_[0]->properties().link_gbps, 200);
  EXPECT_FALSE(devices_[0]->gpudirect());
  EXPECT_NE(devices_[0]->description().find("emu_ib0 port 1: InfiniBand, lid 0x1, mtu 4096"),
            std::string::npos)
      << devices_[0]->description();
  EXPECT_NE(devices_[0]->description().find("GPUDirect RDMA: no"), std::string::npos);
}

TEST_F(RdmaContextTest, MessagesArriveBitExactWrittenOnceByTheSender) {
  auto c = Connect(2);
  const std::vector<size_t> sizes = {0, 1, 4093, (1 << 20) + 3};
  size_t total = 0;
  for (size_t n : sizes) total += n;
  std::vector<char> src(total), dst(total + 64, 0);
  for (size_t i = 0; i < total; ++i) src[i] = static_cast<char>(i * 131 + 7);
  auto smr = *c[0]->RegisterMemory(src.data(), src.size());
  auto dmr = *c[1]->RegisterMemory(dst.data(), dst.size());
  const uint64_t written_before = emu_.stats().write_bytes;
  std::vector<Request> sends(sizes.size()), recvs(sizes.size());
  size_t off = 0;
  for (size_t i = 0; i < sizes.size(); ++i) {
    ASSERT_TRUE(
        c[1]->PostRecv(0, *dmr, off, sizes[i] + (i == 2 ? 64 : 0), i != 2, Tag(1, i), &recvs[i])
            .ok());
    ASSERT_TRUE(c[0]->PostSend(1, *smr, off, sizes[i], Tag(1, i), &sends[i]).ok());
    off += sizes[i];
  }
  std::thread receiver([&] {
    for (auto& r : recvs) EXPECT_TRUE(Wait(*c[1], r).ok());
  });
  for (auto& s : sends) EXPECT_TRUE(Wait(*c[0], s).ok());
  receiver.join();
  for (size_t i = 0; i < sizes.size(); ++i) EXPECT_EQ(recvs[i].bytes, sizes[i]) << i;
  EXPECT_EQ(std::memcmp(src.data(), dst.data(), total), 0);
  // One CTS per receive, one RDMA WRITE per message, every payload byte
  // written once (straight from the source into the destination).
  EXPECT_EQ(c[1]->counters().control_sent, sizes.size());
  EXPECT_EQ(c[0]->counters().cts_received, sizes.size());
  EXPECT_EQ(c[0]->counters().writes, sizes.size());
  EXPECT_EQ(emu_.stats().write_bytes - written_before, total);
  EXPECT_EQ(c[0]->BytesSentTo(1), total);
  EXPECT_EQ(c[1]->BytesReceivedFrom(0), total);
}

TEST_F(RdmaContextTest, SendWaitsForItsClearToSend) {
  auto c = Connect(2);
  std::vector<char> src(256, 'x'), dst(256);
  auto smr = *c[0]->RegisterMemory(src.data(), src.size());
  auto dmr = *c[1]->RegisterMemory(dst.data(), dst.size());
  Request send, recv;
  ASSERT_TRUE(c[0]->PostSend(1, *smr, 0, 256, Tag(7, 0), &send).ok());
  absl::Status s = c[0]->Progress(absl::Now() + absl::Milliseconds(50));
  EXPECT_TRUE(absl::IsDeadlineExceeded(s)) << s;  // no CTS yet: nothing written
  EXPECT_FALSE(send.done);
  EXPECT_EQ(c[0]->counters().writes, 0u);
  ASSERT_TRUE(c[1]->PostRecv(0, *dmr, 0, 256, true, Tag(7, 0), &recv).ok());
  std::thread receiver([&] { EXPECT_TRUE(Wait(*c[1], recv).ok()); });
  EXPECT_TRUE(Wait(*c[0], send).ok());
  receiver.join();
  EXPECT_EQ(dst, src);
}

TEST_F(RdmaContextTest, PostingBeyondTheWindowIsResourceExhausted) {
  auto c = Connect(2, /*max_in_flight=*/4);
  std::vector<char> buf(64);
  auto mr = *c[0]->RegisterMemory(buf.data(), buf.size());
  std::vector<Request> reqs(10);
  for (int i = 0; i < 4; ++i) ASSERT_TRUE(c[0]->PostSend(1, *mr, 0, 8, Tag(1, i), &reqs[i]).ok());
  absl::Status s = c[0]->PostSend(1, *mr, 0, 8, Tag(1, 4), &reqs[4]);
  EXPECT_EQ(s.code(), absl::StatusCode::kResourceExhausted) << s;
  for (int i = 0; i < 4; ++i) {
    ASSERT_TRUE(c[0]->PostRecv(1, *mr, 0, 8, true, Tag(2, i), &reqs[5 + i]).ok());
  }
  s = c[0]->PostRecv(1, *mr, 0, 8, true, Tag(2, 4), &reqs[9]);
  EXPECT_EQ(s.code(), absl::StatusCode::kResourceExhausted) << s;
}

TEST_F(RdmaContextTest, SizeMismatchIsAProtocolErrorBothSidesSee) {
  auto c = Connect(2);
  std::vector<char> buf(128);
  auto smr = *c[0]->RegisterMemory(buf.data(), buf.size());
  auto dmr = *c[1]->RegisterMemory(buf.data(), buf.size());
  Request send, recv;
  ASSERT_TRUE(c[1]->PostRecv(0, *dmr, 0, 100, true, Tag(3, 1), &recv).ok());
  ASSERT_TRUE(c[0]->PostSend(1, *smr, 0, 50, Tag(3, 1), &send).ok());
  absl::Status s0 = Wait(*c[0], send);
  EXPECT_EQ(s0.code(), absl::StatusCode::kDataLoss) << s0;
  EXPECT_NE(s0.message().find("rank 1 takes exactly 100 bytes for op 3 message 1"),
            std::string::npos)
      << s0;
  absl::Status s1 = Wait(*c[1], recv);
  EXPECT_EQ(s1.code(), absl::StatusCode::kAborted) << s1;
  EXPECT_NE(s1.message().find("aborted by rank 0"), std::string::npos) << s1;
}

TEST_F(RdmaContextTest, BadRkeyFailsTheSenderNamingThePeerAndVerbsStatus) {
  auto c = Connect(2);
  std::vector<char> buf(64);
  auto smr = *c[0]->RegisterMemory(buf.data(), buf.size());
  auto dmr = *c[1]->RegisterMemory(buf.data(), buf.size());
  emu_.SetFaults(EmulatedFaults{.bad_rkey_at = 1});
  Request send, recv;
  ASSERT_TRUE(c[1]->PostRecv(0, *dmr, 0, 64, true, Tag(1, 0), &recv).ok());
  ASSERT_TRUE(c[0]->PostSend(1, *smr, 0, 64, Tag(1, 0), &send).ok());
  absl::Status s0 = Wait(*c[0], send);
  EXPECT_EQ(s0.code(), absl::StatusCode::kUnavailable) << s0;
  EXPECT_NE(s0.message().find("RDMA connection to rank 1 failed while sending: remote access"),
            std::string::npos)
      << s0;
  EXPECT_EQ(c[0]->fault().kind, PeerFault::kLost);
  EXPECT_EQ(c[0]->fault().peer, 1);
  absl::Status s1 = Wait(*c[1], recv);
  EXPECT_FALSE(s1.ok());  // its QP is in error too, or rank 0's ABORT came first
  EXPECT_NE(s1.message().find("rank 0"), std::string::npos) << s1;
}

TEST_F(RdmaContextTest, LostWorkRequestIsRetryExceededWithinTheDeadline) {
  auto c = Connect(2);
  std::vector<char> buf(64);
  auto smr = *c[0]->RegisterMemory(buf.data(), buf.size());
  auto dmr = *c[1]->RegisterMemory(buf.data(), buf.size());
  Request send, recv;
  ASSERT_TRUE(c[1]->PostRecv(0, *dmr, 0, 64, true, Tag(1, 0), &recv).ok());
  // Rank 1's CTS reaches rank 0, then rank 0's write is lost on the wire.
  std::thread receiver([&] { (void)Wait(*c[1], recv, absl::Seconds(5)); });
  emu_.SetFaults(EmulatedFaults{.drop_at = 1});
  ASSERT_TRUE(c[0]->PostSend(1, *smr, 0, 64, Tag(1, 0), &send).ok());
  absl::Status s0 = Wait(*c[0], send, absl::Seconds(5));
  receiver.join();
  EXPECT_EQ(s0.code(), absl::StatusCode::kUnavailable) << s0;
  EXPECT_NE(s0.message().find("transport retry counter exceeded"), std::string::npos) << s0;
}

TEST_F(RdmaContextTest, DelayedDeliveryKeepsOrderAndData) {
  auto c = Connect(2);
  emu_.SetFaults(EmulatedFaults{.delay = absl::Milliseconds(5)});
  constexpr int kMessages = 6;
  std::vector<uint32_t> src(kMessages * 1000), dst(src.size());
  for (size_t i = 0; i < src.size(); ++i) src[i] = static_cast<uint32_t>(i * 2654435761u);
  auto smr = *c[0]->RegisterMemory(src.data(), src.size() * 4);
  auto dmr = *c[1]->RegisterMemory(dst.data(), dst.size() * 4);
  std::vector<Request> sends(kMessages), recvs(kMessages);
  for (int i = 0; i < kMessages; ++i) {
    ASSERT_TRUE(c[1]->PostRecv(0, *dmr, i * 4000, 4000, true, Tag(1, i), &recvs[i]).ok());
    ASSERT_TRUE(c[0]->PostSend(1, *smr, i * 4000, 4000, Tag(1, i), &sends[i]).ok());
  }
  std::thread receiver([&] {
    for (auto& r : recvs) EXPECT_TRUE(Wait(*c[1], r).ok());
  });
  for (int i = 0; i < kMessages; ++i) {
    EXPECT_TRUE(Wait(*c[0], sends[i]).ok());
    for (int j = i + 1; j < kMessages; ++j) EXPECT_FALSE(sends[j].done && !sends[i].done);
  }
  receiver.join();
  EXPECT_EQ(dst, src);
}

TEST_F(RdmaContextTest, DeadPeerMidOpFailsTheOthersNamingIt) {
  auto c = Connect(3);
  std::vector<char> buf(1 << 16);
  auto mr0 = *c[0]->RegisterMemory(buf.data(), buf.size());
  Request from2;
  ASSERT_TRUE(c[0]->PostRecv(2, *mr0, 0, buf.size(), true, Tag(1, 0), &from2).ok());
  c[2].reset();  // the process of rank 2 is gone: its QPs and connections with it
  absl::Status s = Wait(*c[0], from2, absl::Seconds(5));
  EXPECT_EQ(s.code(), absl::StatusCode::kUnavailable) << s;
  EXPECT_NE(s.message().find("rank 2"), std::string::npos) << s;
  EXPECT_EQ(c[0]->fault().peer, 2);
  // Rank 1 learns it from rank 2's closed connection, or rank 0's ABORT.
  Request never;
  auto mr1 = *c[1]->RegisterMemory(buf.data(), buf.size());
  absl::Status post = c[1]->PostRecv(0, *mr1, 0, 8, true, Tag(1, 1), &never);
  absl::Status s1 = post.ok() ? Wait(*c[1], never, absl::Seconds(5)) : post;
  EXPECT_FALSE(s1.ok());
  EXPECT_NE(s1.message().find("rank 2"), std::string::npos) << s1;
}

// Calls CheckPeers until it fails (10 s at most); its last result.
absl::Status CheckPeersUntilFailed(Context& ctx) {
  const absl::Time deadline = absl::Now() + absl::Seconds(10);
  absl::Status s;
  while ((s = ctx.CheckPeers()).ok() && absl::Now() < deadline) std::this_thread::yield();
  return s;
}

// CheckPeers (a daemon waiting for a local rank): a clear-to-send that came
// early stays for the send posted later; a peer's ABORT fails the context,
// naming the peer, from the bootstrap connections.
TEST_F(RdmaContextTest, CheckPeersSeesAnAbortAndLeavesEarlyClearToSends) {
  auto c = Connect(2);
  std::vector<char> src(4096), dst(4096, 0);
  for (size_t i = 0; i < src.size(); ++i) src[i] = static_cast<char>(i * 29 + 1);
  auto smr = *c[0]->RegisterMemory(src.data(), src.size());
  auto dmr = *c[1]->RegisterMemory(dst.data(), dst.size());
  Request recv, send;
  ASSERT_TRUE(c[1]->PostRecv(0, *dmr, 0, dst.size(), true, Tag(1, 0), &recv).ok());
  for (int i = 0; i < 5; ++i) ASSERT_TRUE(c[0]->CheckPeers().ok());
  ASSERT_TRUE(c[0]->PostSend(1, *smr, 0, src.size(), Tag(1, 0), &send).ok());
  std::thread receiver([&] { EXPECT_TRUE(Wait(*c[1], recv).ok()); });
  EXPECT_TRUE(Wait(*c[0], send).ok());
  receiver.join();
  EXPECT_EQ(src, dst);
  // Rank 1 fails; rank 0, posting nothing, learns it from its ABORT.
  (void)c[1]->Fail(absl::UnavailableError("daemon 1 stopping"));
  absl::Status s = CheckPeersUntilFailed(*c[0]);
  EXPECT_TRUE(absl::IsAborted(s)) << s;
  EXPECT_EQ(s.message(), "aborted by rank 1: daemon 1 stopping");
  EXPECT_EQ(c[0]->fault().kind, PeerFault::kAborted);
  EXPECT_EQ(c[0]->fault().peer, 1);
  EXPECT_EQ(c[0]->fault().code, absl::StatusCode::kUnavailable);
}

TEST_F(RdmaContextTest, CheckPeersNoticesAPeerThatIsGone) {
  auto d = Connect(2);
  EXPECT_TRUE(d[0]->CheckPeers().ok());
  d[1].reset();  // the process of rank 1 is gone: its connections with it
  absl::Status s = CheckPeersUntilFailed(*d[0]);
  EXPECT_TRUE(absl::IsUnavailable(s)) << s;
  EXPECT_NE(s.message().find("connection to rank 1 lost"), std::string::npos) << s;
  EXPECT_EQ(d[0]->fault().kind, PeerFault::kLost);
  EXPECT_EQ(d[0]->fault().peer, 1);
}

TEST_F(RdmaContextTest, RegistrationsAreCachedPerBufferAndDroppedWithIt) {
  auto c = Connect(1);
  std::vector<char> a(4096), b(4096);
  auto owner = std::make_shared<int>(0);
  RegistrationCache cache;
  const uint64_t before = emu_.stats().reg_mr;
  const Buffer whole{a.data(), a.size()};
  ASSERT_TRUE(cache.Get(*c[0], whole, owner).ok());
  ASSERT_TRUE(cache.Get(*c[0], whole, owner).ok());
  EXPECT_EQ(emu_.stats().reg_mr - before, 1u);  // a hit
  // Another size at the same address is another registration.
  ASSERT_TRUE(cache.Get(*c[0], Buffer{a.data(), 2048}, owner).ok());
  EXPECT_EQ(emu_.stats().reg_mr - before, 2u);
  const uint64_t live = emu_.stats().live_mrs;
  cache.Invalidate(a.data());  // the buffer is freed: its registrations go
  EXPECT_LT(emu_.stats().live_mrs, live);
  ASSERT_TRUE(cache.Get(*c[0], Buffer{b.data(), b.size()}, owner).ok());
  owner.reset();  // its owner is gone: the next Get drops the stale entry
  auto owner2 = std::make_shared<int>(0);
  ASSERT_TRUE(cache.Get(*c[0], Buffer{b.data(), b.size()}, owner2).ok());
  EXPECT_EQ(cache.size(), 1u);
}

TEST_F(RdmaContextTest, DeviceMemoryWithoutGpuDirectIsRefusedWithTheReason) {
  auto c = Connect(1);
  char x[16];
  auto r = c[0]->RegisterMemory(x, sizeof(x), MemKind::Cuda(0));
  EXPECT_EQ(r.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(r.status().message().find("cannot register cuda:0 memory: GPUDirect RDMA is not"),
            std::string::npos)
      << r.status();
}

// GPUDirect by dma-buf, the registration path: the exporter is asked for the
// device range, ibv_reg_dmabuf_mr gets its descriptor and offset (and the
// range as the iova), the descriptor is closed after, and the region moves
// data. The "device memory" is host memory here: only a GPU and a NIC show
// the real mapping.
TEST(RdmaGpuDirect, DeviceMemoryRegistersByDmaBufFromTheExporter) {
  VerbsEmulation emu;
  std::vector<std::unique_ptr<TcpListener>> listeners;
  std::vector<std::unique_ptr<RdmaDevice>> devices;
  std::vector<HostPort> addrs;
  std::vector<std::pair<const void*, size_t>> exported;
  std::vector<int> fds;
  for (int r = 0; r < 2; ++r) {
    ListenerOptions lo;
    lo.listen = {"127.0.0.1", 0};
    listeners.push_back(*TcpListener::Start(lo));
    addrs.push_back({"127.0.0.1", listeners.back()->port()});
    RdmaDeviceOptions o;
    o.verbs = &emu.verbs();
    o.bootstrap.listener = listeners.back().get();
    o.export_dmabuf = [&](const void* ptr, size_t size) -> absl::StatusOr<DmaBuf> {
      exported.emplace_back(ptr, size);
      const int fd = ::memfd_create("fake-dmabuf", MFD_CLOEXEC);
      fds.push_back(fd);
      return DmaBuf{fd, 0};
    };
    devices.push_back(*RdmaDevice::Open(o));
  }
  EXPECT_TRUE(devices[0]->gpudirect());
  EXPECT_EQ(devices[0]->gpudirect_mode(), GpuDirect::kDmaBuf);
  EXPECT_TRUE(devices[0]->properties().Supports(MemKind::Cuda(0)));
  EXPECT_NE(devices[0]->description().find("GPUDirect RDMA: yes (dma-buf"), std::string::npos);
  std::vector<std::unique_ptr<Context>> c(2);
  std::vector<std::thread> threads;
  for (int r = 0; r < 2; ++r) {
    threads.emplace_back([&, r] {
      ContextSpec s;
      s.job_id = "dmabuf";
      s.epoch = 1;
      s.rank = r;
      s.world_size = 2;
      s.peers = addrs;
      s.deadline = absl::Now() + absl::Seconds(10);
      auto ctx = devices[r]->CreateContext(s);
      ASSERT_TRUE(ctx.ok()) << ctx.status();
      c[r] = std::move(*ctx);
    });
  }
  for (auto& t : threads) t.join();
  ASSERT_TRUE(c[0] != nullptr && c[1] != nullptr);
  std::vector<char> src(100000), dst(100000, 0);
  for (size_t i = 0; i < src.size(); ++i) src[i] = static_cast<char>(i * 7 + 1);
  const uint64_t reg_before = emu.stats().reg_mr;
  auto smr = c[0]->RegisterMemory(src.data(), src.size(), MemKind::Cuda(0));
  ASSERT_TRUE(smr.ok()) << smr.status();
  auto dmr = c[1]->RegisterMemory(dst.data(), dst.size(), MemKind::Cuda(1));
  ASSERT_TRUE(dmr.ok()) << dmr.status();
  EXPECT_EQ(emu.stats().reg_mr - reg_before, 2u);
  ASSERT_EQ(exported.size(), 2u);
  EXPECT_EQ(exported[0], std::make_pair(static_cast<const void*>(src.data()), src.size()));
  for (int fd : fds) EXPECT_EQ(::fcntl(fd, F_GETFD), -1) << "descriptor " << fd << " left open";
  Request send, recv;
  ASSERT_TRUE(c[1]->PostRecv(0, **dmr, 0, dst.size(), true, Tag(1, 0), &recv).ok());
  ASSERT_TRUE(c[0]->PostSend(1, **smr, 0, src.size(), Tag(1, 0), &send).ok());
  std::thread receiver([&] {
    const absl::Time deadline = absl::Now() + absl::Seconds(10);
    while (!recv.done) ASSERT_TRUE(c[1]->Progress(deadline).ok());
  });
  const absl::Time deadline = absl::Now() + absl::Seconds(10);
  while (!send.done) ASSERT_TRUE(c[0]->Progress(deadline).ok());
  receiver.join();
  EXPECT_EQ(src, dst);
  // An exporter that fails: the registration fails with its reason.
  RdmaDeviceOptions broken;
  broken.verbs = &emu.verbs();
  broken.export_dmabuf = [](const void*, size_t) -> absl::StatusOr<DmaBuf> {
    return absl::FailedPreconditionError("cuMemGetHandleForAddressRange: not supported");
  };
  broken.bootstrap.listener = listeners[0].get();
  auto d = RdmaDevice::Open(broken);
  ASSERT_TRUE(d.ok());
  ContextSpec alone;
  alone.job_id = "dmabuf-alone";
  alone.epoch = 1;
  alone.peers = {addrs[0]};
  alone.deadline = absl::Now() + absl::Seconds(10);
  auto lone = (*d)->CreateContext(alone);
  ASSERT_TRUE(lone.ok()) << lone.status();
  auto refused = (*lone)->RegisterMemory(src.data(), src.size(), MemKind::Cuda(0));
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(refused.status().message(), "cuMemGetHandleForAddressRange: not supported");
}

TEST(RdmaDevice, OpenSaysWhyThereIsNone) {
  // This host's libibverbs: no RDMA devices (or, on a host with a NIC, a
  // device); a name that does not exist is NotFound.
  RdmaDeviceOptions o;
  o.device_name = "no_such_device0";
  auto d = RdmaDevice::Open(o);
  ASSERT_FALSE(d.ok());
  EXPECT_TRUE(absl::IsNotFound(d.status()) || absl::IsUnavailable(d.status())) << d.status();
  EXPECT_NE(d.status().message().find("no_such_device0"), std::string::npos) << d.status();

  VerbsEmulation emu;
  RdmaDeviceOptions e;
  e.verbs = &emu.verbs();
  e.device_name = "emu_ib7";
  d = RdmaDevice::Open(e);
  EXPECT_TRUE(absl::IsNotFound(d.status())) << d.status();
  EXPECT_NE(d.status().message().find("devices: emu_ib0"), std::string::npos) << d.status();
}

TEST(RdmaDevice, RoceChoosesTheIpv4MappedRoceV2Gid) {
  VerbsEmulation emu(rdma::EmulationOptions{.link_layer = rdma::LinkLayer::kEthernet});
  RdmaDeviceOptions o;
  o.verbs = &emu.verbs();
  auto d = RdmaDevice::Open(o);
  ASSERT_TRUE(d.ok()) << d.status();
  EXPECT_NE((*d)->description().find("GID index 3"), std::string::npos) << (*d)->description();
  o.gid_index = 1;  // forced
  d = RdmaDevice::Open(o);
  ASSERT_TRUE(d.ok()) << d.status();
  EXPECT_NE((*d)->description().find("GID index 1"), std::string::npos) << (*d)->description();
}

}  // namespace
}  // namespace gradsync::transport
