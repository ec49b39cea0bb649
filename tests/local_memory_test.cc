// gradsyncd's bounds on client buffer memory, with real processes: without
// tenants each uid has its own share (tests/foreign_uid_client, uid 65534,
// next to this root process); the defaults are sized from the machine, so a
// session cannot be granted more buffer memory than the node can back; and
// one uid's sessions are bounded (--max_sessions_per_uid).
#include <unistd.h>

#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "tests/cluster_util.h"
#include "worker/buffer_limits.h"

namespace gradsync {
namespace {

TEST(LocalMemory, WithoutTenantsEachUidHasItsOwnQuota) {
  if (::geteuid() != 0) GTEST_SKIP() << "needs root to run a client as another uid";
  const std::string path = absl::StrCat("/tmp/gradsync-uidquota-", ::getpid(), ".sock");
  LocalClusterOptions o;
  o.daemons = 1;
  o.tenants = false;
  o.daemon_flags = {"--listen=unix:" + path, "--socket_group=nogroup",
                    "--tenant_memory_limit_mb=1"};
  auto started = LocalCluster::Start(o);
  ASSERT_TRUE(started.ok()) << started.status();
  LocalCluster* cluster = started->get();
  auto c = client::Client::Connect("unix:" + path, absl::Seconds(10));
  ASSERT_TRUE(c.ok()) << c.status();
  client::SessionOptions so;
  so.job_id = "uid-quota";
  so.timeout = absl::Seconds(20);
  auto mine = (*c)->OpenSession(so);
  ASSERT_TRUE(mine.ok()) << mine.status();
  auto held = (*mine)->AllocateBuffer(768 << 10);
  ASSERT_TRUE(held.ok()) << held.status();
  // Root's share is nearly spent ...
  so.job_id = "uid-quota-2";
  auto second = (*c)->OpenSession(so);
  ASSERT_TRUE(second.ok()) << second.status();
  auto over = (*second)->AllocateBuffer(512 << 10);
  ASSERT_FALSE(over.ok());
  EXPECT_EQ(over.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_NE(over.status().message().find(
                "allocating a buffer of 524288 bytes would exceed uid 0's buffer quota on this "
                "daemon of 1048576 bytes (786432 held by its sessions"),
            std::string::npos)
      << over.status();
  // ... and uid 65534 still gets its own 512 KiB.
  const std::string out =
      testing::RunCommand(absl::StrCat("tests/foreign_uid_client sdk 'unix:", path, "' 2>&1"));
  EXPECT_EQ(out, "sdk: ok\n");
  EXPECT_EQ(cluster->StopAll(), absl::OkStatus());
}

// With the default limits a session is granted at most half of what the
// machine can back (it used to be all physical memory, per session).
TEST(LocalMemory, DefaultLimitsAreSizedFromTheMachine) {
  auto cluster = testing::StartCluster(1);
  ASSERT_NE(cluster, nullptr);
  auto c = client::Client::Connect(cluster->daemon_target(0), absl::Seconds(10));
  ASSERT_TRUE(c.ok()) << c.status();
  client::SessionOptions so;
  so.job_id = "default-limits";
  so.timeout = absl::Seconds(20);
  auto session = (*c)->OpenSession(so);
  ASSERT_TRUE(session.ok()) << session.status();
  const uint64_t machine = MachineBufferMemory();
  const uint64_t limit = DefaultBufferLimits(machine).session;
  auto too_big = (*session)->AllocateBuffer(machine / 4 * 3);
  ASSERT_FALSE(too_big.ok());
  EXPECT_EQ(too_big.status().code(), absl::StatusCode::kResourceExhausted) << too_big.status();
  EXPECT_NE(too_big.status().message().find(absl::StrCat(
                "would exceed the session's buffer quota of ", limit, " bytes")),
            std::string::npos)
      << too_big.status();
  EXPECT_EQ(cluster->StopAll(), absl::OkStatus());
}

// One local user opening session after session (each a job membership, an
// op queue and an executor thread in gradsyncd) is held at its limit, with
// an error naming the uid; closing one makes room again.
TEST(LocalMemory, OneUidsSessionsAreBounded) {
  auto cluster = testing::StartCluster(1, {"--max_sessions_per_uid=3"});
  ASSERT_NE(cluster, nullptr);
  auto c = client::Client::Connect(cluster->daemon_target(0), absl::Seconds(10));
  ASSERT_TRUE(c.ok()) << c.status();
  std::vector<std::unique_ptr<client::Session>> sessions;
  auto open = [&](int i) {
    client::SessionOptions so;
    so.job_id = absl::StrCat("many-", i);
    so.timeout = absl::Seconds(20);
    return (*c)->OpenSession(so);
  };
  for (int i = 0; i < 3; ++i) {
    auto s = open(i);
    ASSERT_TRUE(s.ok()) << i << ": " << s.status();
    sessions.push_back(std::move(*s));
  }
  auto refused = open(3);
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kResourceExhausted) << refused.status();
  EXPECT_NE(refused.status().message().find(absl::StrCat(
                "uid ", ::geteuid(), " already has 3 sessions on this gradsyncd (at most 3, "
                "--max_sessions_per_uid)")),
            std::string::npos)
      << refused.status();
  ASSERT_TRUE(sessions.back()->Close().ok());
  sessions.pop_back();
  auto again = open(4);
  EXPECT_TRUE(again.ok()) << again.status();
  EXPECT_EQ(cluster->StopAll(), absl::OkStatus());
}

}  // namespace
}  // namespace gradsync
