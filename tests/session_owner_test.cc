// Sessions belong to the uid that opened them: a process of another uid on
// the same node (tests/foreign_uid_client, as uid 65534) that knows a
// session's id cannot allocate in it, submit to it, take its op queue or
// close it; each call is refused naming both uids, and the owner's session
// keeps working. Needs root (to become another uid); skipped otherwise.
#include <grp.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "gtest/gtest.h"
#include "tests/cluster_util.h"

namespace gradsync {
namespace {

using SessionOwner = testing::SharedClusterTest<1>;

TEST_F(SessionOwner, AnotherUidCannotUseOrCloseASession) {
  if (::geteuid() != 0) GTEST_SKIP() << "needs root to run a client as another uid";
  auto job = testing::OpenJob(*cluster(), "owned", {0});
  ASSERT_TRUE(job.ok()) << job.status();
  client::Session& s = *(*job)[0].session;
  const std::string out = testing::RunCommand(absl::StrCat(
      "tests/foreign_uid_client '", cluster()->daemon_target(0), "' '", s.id(), "' 2>&1"));
  const std::vector<std::string> lines = absl::StrSplit(out, '\n', absl::SkipEmpty());
  ASSERT_EQ(lines.size(), 4u) << out;
  for (const char* call : {"AllocateBuffer", "Submit", "OpenOpQueue", "CloseSession"}) {
    const std::string want =
        absl::StrCat(call, ": 7 session ", s.id(), " belongs to uid 0; uid 65534 may not call ",
                     call, " on it");  // 7: PERMISSION_DENIED
    bool found = false;
    for (const std::string& l : lines) found = found || l == want;
    EXPECT_TRUE(found) << "want '" << want << "' in:\n" << out;
  }
  // The owner's session still works.
  auto buf = s.AllocateBuffer(1024 * 4);
  ASSERT_TRUE(buf.ok()) << buf.status();
  auto* v = static_cast<float*>((*buf)->data());
  for (int i = 0; i < 1024; ++i) v[i] = static_cast<float>(i);
  client::CollectiveSpec spec;
  spec.buffer = buf->get();
  spec.count = 1024;
  spec.name = "after";
  auto res = s.Run(spec);
  ASSERT_TRUE(res.ok()) << res.status();
  EXPECT_EQ(v[1023], 1023.0f);
  EXPECT_TRUE(s.Close().ok());
}

// Without an fd socket, buffers and op queues are named segments (mode
// 0600); the daemon (root) gives them to the session's uid, so that uid can
// open them and no other uid can.
TEST(SessionOwnerSegments, NamedSegmentsBelongToTheSessionsUid) {
  if (::geteuid() != 0) GTEST_SKIP() << "needs root to run a client as another uid";
  auto cluster = testing::StartCluster(1, {"--fd_socket="});
  ASSERT_NE(cluster, nullptr);
  const std::string out = testing::RunCommand(absl::StrCat(
      "tests/foreign_uid_client own '", cluster->daemon_target(0), "' 2>&1"));
  EXPECT_NE(out.find("buffer: uid=65534 open=ok\n"), std::string::npos) << out;
  EXPECT_NE(out.find("queue: uid=65534 open=ok\n"), std::string::npos) << out;
  EXPECT_EQ(cluster->StopAll(), absl::OkStatus());
}

// A path socket is mode 0660 and, with --socket_group, in that group; a
// client reaches the daemon through it.
TEST(SessionOwnerSocket, APathSocketIs0660InTheSocketGroup) {
  struct group* g = ::getgrnam("nogroup");
  if (g == nullptr) GTEST_SKIP() << "no group 'nogroup' on this system";
  // Not under TEST_TMPDIR: unix socket paths are limited to 107 bytes.
  const std::string path = absl::StrCat("/tmp/gradsync-owner-test-", ::getpid(), ".sock");
  auto cluster = testing::StartCluster(1, {"--listen=unix:" + path, "--socket_group=nogroup"});
  ASSERT_NE(cluster, nullptr);
  struct stat st {};
  ASSERT_EQ(::stat(path.c_str(), &st), 0) << path;
  EXPECT_TRUE(S_ISSOCK(st.st_mode));
  EXPECT_EQ(st.st_mode & 0777, 0660u);
  EXPECT_EQ(st.st_gid, g->gr_gid);
  auto c = client::Client::Connect("unix:" + path, absl::Seconds(10));
  ASSERT_TRUE(c.ok()) << c.status();
  client::SessionOptions so;
  so.job_id = "via-path";
  so.timeout = absl::Seconds(20);
  auto session = (*c)->OpenSession(so);
  ASSERT_TRUE(session.ok()) << session.status();
  EXPECT_TRUE((*session)->Close().ok());
}

}  // namespace
}  // namespace gradsync
