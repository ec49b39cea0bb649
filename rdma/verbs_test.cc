#include "rdma/verbs.h"

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace gradsync {
namespace rdma {
namespace {

using ::testing::HasSubstr;

bool HaveDevices() { return ListVerbsDevices().ok(); }

TEST(Verbs, ListDevicesReportsWhyThereAreNone) {
  const absl::StatusOr<std::vector<VerbsDeviceInfo>> devices = ListVerbsDevices();
  if (devices.ok()) {
    ASSERT_FALSE(devices->empty());
    for (const VerbsDeviceInfo& d : *devices) {
      EXPECT_FALSE(d.name.empty());
      if (d.error.empty()) {
        EXPECT_EQ(d.ports.size(), static_cast<size_t>(d.num_ports));
      }
    }
    GTEST_SKIP() << "RDMA devices present; the no-device path is not exercised";
  }
  EXPECT_EQ(devices.status().code(), absl::StatusCode::kUnavailable);
  const std::string msg(devices.status().message());
  std::printf("no RDMA: %s\n", msg.c_str());
  if (msg != "no RDMA devices found") {
    // e.g. "no RDMA devices: ibv_get_device_list failed: Function not implemented (errno 38)"
    EXPECT_THAT(msg, HasSubstr("no RDMA devices: ibv_get_device_list failed: "));
    EXPECT_THAT(msg, HasSubstr("(errno "));
  }
}

TEST(Verbs, OpenFailsCleanlyNamingTheDevice) {
  const char* name = HaveDevices() ? "gradsync-no-such-device" : "mlx5_0";
  const absl::StatusOr<std::unique_ptr<Context>> ctx = Context::Open(name);
  ASSERT_FALSE(ctx.ok());
  EXPECT_THAT(std::string(ctx.status().message()), HasSubstr(name));
  if (HaveDevices()) {
    EXPECT_EQ(ctx.status().code(), absl::StatusCode::kNotFound);
  } else {
    EXPECT_EQ(ctx.status().code(), absl::StatusCode::kUnavailable);
    EXPECT_THAT(std::string(ctx.status().message()), HasSubstr("no RDMA devices"));
  }
}

TEST(Verbs, ErrnoTextNamesTheErrno) {
  EXPECT_EQ(ErrnoText(ENOSYS), "Function not implemented (errno 38)");
}

TEST(QpEndpoint, RoundTripsThroughTheWireForm) {
  QpEndpoint e;
  e.lid = 0x1234;
  for (int i = 0; i < 16; ++i) e.gid[i] = static_cast<uint8_t>(0xf0 + i);
  e.qpn = 0xabcdef;
  e.psn = 0x123456;
  const std::string wire = e.Encode();
  ASSERT_EQ(wire.size(), QpEndpoint::kEncodedSize);
  EXPECT_EQ(static_cast<uint8_t>(wire[0]), 1);     // version
  EXPECT_EQ(static_cast<uint8_t>(wire[2]), 0x12);  // big-endian lid
  EXPECT_EQ(static_cast<uint8_t>(wire[3]), 0x34);
  const absl::StatusOr<QpEndpoint> back = QpEndpoint::Decode(wire);
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(*back, e);
  EXPECT_THAT(e.DebugString(), HasSubstr("qpn 0xabcdef"));
  EXPECT_THAT(e.DebugString(), HasSubstr("gid f0f1:f2f3:"));
}

TEST(QpEndpoint, RejectsMalformedInput) {
  EXPECT_EQ(QpEndpoint::Decode("short").status().code(), absl::StatusCode::kInvalidArgument);
  std::string wire = QpEndpoint().Encode();
  wire[0] = 2;
  EXPECT_THAT(std::string(QpEndpoint::Decode(wire).status().message()), HasSubstr("version 2"));
  QpEndpoint big;
  big.qpn = 0x1000000;  // 25 bits
  EXPECT_EQ(QpEndpoint::Decode(big.Encode()).status().code(), absl::StatusCode::kInvalidArgument);
}

// Needs an RDMA NIC (never the case on CI hosts, whose kernel has no RDMA).
TEST(Verbs, RegistersMemoryOnTheFirstDevice) {
  const absl::StatusOr<std::vector<VerbsDeviceInfo>> devices = ListVerbsDevices();
  if (!devices.ok()) GTEST_SKIP() << "no RDMA device: " << devices.status().message();
  absl::StatusOr<std::unique_ptr<Context>> ctx = Context::Open(devices->front().name);
  ASSERT_TRUE(ctx.ok()) << ctx.status();
  EXPECT_EQ((*ctx)->name(), devices->front().name);
  EXPECT_GE((*ctx)->num_ports(), 1);

  absl::StatusOr<std::unique_ptr<ProtectionDomain>> pd = ProtectionDomain::Create(**ctx);
  ASSERT_TRUE(pd.ok()) << pd.status();

  constexpr size_t kSize = 1 << 20;
  std::vector<char> buffer(kSize, 0);
  absl::StatusOr<std::unique_ptr<MemoryRegion>> mr =
      MemoryRegion::Register(**pd, buffer.data(), kSize);
  ASSERT_TRUE(mr.ok()) << mr.status();
  EXPECT_EQ((*mr)->addr(), buffer.data());
  EXPECT_EQ((*mr)->length(), kSize);
  EXPECT_NE((*mr)->lkey(), 0u);
  EXPECT_NE((*mr)->rkey(), 0u);
  const RemoteMemory remote = (*mr)->Remote(4096);
  EXPECT_EQ(remote.addr, reinterpret_cast<uintptr_t>(buffer.data()) + 4096);
  EXPECT_EQ(remote.length, kSize - 4096);
  EXPECT_EQ(remote.rkey, (*mr)->rkey());

  const absl::StatusOr<std::unique_ptr<MemoryRegion>> empty =
      MemoryRegion::Register(**pd, nullptr, 0);
  EXPECT_EQ(empty.status().code(), absl::StatusCode::kInvalidArgument);

  // A CQ and an RC QP can be created and brought to INIT.
  absl::StatusOr<std::unique_ptr<CompletionQueue>> cq = CompletionQueue::Create(**ctx, 64);
  ASSERT_TRUE(cq.ok()) << cq.status();
  absl::StatusOr<std::unique_ptr<QueuePair>> qp = QueuePair::Create(**pd, **cq, **cq);
  ASSERT_TRUE(qp.ok()) << qp.status();
  EXPECT_NE((*qp)->qpn(), 0u);
  EXPECT_TRUE((*qp)->ModifyToInit(ConnectOptions()).ok());
  std::vector<WorkCompletion> completions;
  const absl::StatusOr<int> polled = (*cq)->Poll(8, &completions);
  ASSERT_TRUE(polled.ok()) << polled.status();
  EXPECT_EQ(*polled, 0);
  // Destroyed in reverse order: qp, cq, mr, pd, ctx.
  qp->reset();
  cq->reset();
  mr->reset();
  pd->reset();
}

}  // namespace
}  // namespace rdma
}  // namespace gradsync
