// gradsyncd's local sockets, attacked with real processes: the fd socket
// carries --socket_group like the client socket, so a plain user in that
// group can use the SDK (tests/foreign_uid_client, uid 65534 with no
// supplementary groups); one uid's silent connections to the fd socket do
// not lock other users out; a group with an abstract socket is refused at
// start. Needs root (to become another uid); skipped otherwise.
#include <grp.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "gtest/gtest.h"
#include "ipc/fd_registration.h"
#include "tests/cluster_util.h"
#include "worker/buffer_fd_server.h"

namespace gradsync {
namespace {

// Not under TEST_TMPDIR: unix socket paths are limited to 107 bytes.
std::string SocketPath(const char* name) {
  return absl::StrCat("/tmp/gradsync-", name, "-", ::getpid(), ".sock");
}

TEST(LocalSocket, TheFdSocketIsInTheSocketGroupForAPlainUser) {
  if (::geteuid() != 0) GTEST_SKIP() << "needs root to run a client as another uid";
  struct group* g = ::getgrnam("nogroup");
  ASSERT_NE(g, nullptr) << "no group 'nogroup'";
  ASSERT_EQ(g->gr_gid, 65534u);  // foreign_uid_client's only group
  const std::string path = SocketPath("fdgroup");
  auto cluster = testing::StartCluster(1, {"--listen=unix:" + path, "--socket_group=nogroup"});
  ASSERT_NE(cluster, nullptr);
  struct stat st {};
  ASSERT_EQ(::stat((path + ".fd").c_str(), &st), 0) << path << ".fd";
  EXPECT_TRUE(S_ISSOCK(st.st_mode));
  EXPECT_EQ(st.st_mode & 0777, 0660u);
  EXPECT_EQ(st.st_gid, g->gr_gid);
  // The SDK takes its op queue and buffers from the fd socket.
  const std::string out =
      testing::RunCommand(absl::StrCat("tests/foreign_uid_client sdk 'unix:", path, "' 2>&1"));
  EXPECT_EQ(out, "sdk: ok\n");
  EXPECT_EQ(cluster->StopAll(), absl::OkStatus());
}

// 80 silent connections of one uid: the daemon keeps 16 and closes the rest
// at once; another uid's client is served meanwhile (one connection at a
// time, each silent one held the socket for 1 s: 80 s).
TEST(LocalSocket, SilentConnectionsDoNotLockOutOtherUsers) {
  if (::geteuid() != 0) GTEST_SKIP() << "needs root to run a client as another uid";
  const std::string path = SocketPath("fdsilent");
  auto cluster = testing::StartCluster(1, {"--listen=unix:" + path, "--socket_group=nogroup"});
  ASSERT_NE(cluster, nullptr);
  absl::StatusOr<ipc::UnixAddress> address = ipc::ParseUnixAddress("unix:" + path + ".fd");
  ASSERT_TRUE(address.ok()) << address.status();
  constexpr int kSilent = 80;
  std::vector<UniqueFd> silent;
  for (int i = 0; i < kSilent; ++i) {
    absl::StatusOr<UniqueFd> c = ipc::ConnectSeqpacket(*address, absl::Now() + absl::Seconds(5));
    ASSERT_TRUE(c.ok()) << i << ": " << c.status();
    silent.push_back(*std::move(c));
  }
  const absl::Time start = absl::Now();
  const std::string out =
      testing::RunCommand(absl::StrCat("tests/foreign_uid_client sdk 'unix:", path, "' 2>&1"));
  EXPECT_EQ(out, "sdk: ok\n");
  EXPECT_LT(absl::Now() - start, absl::Seconds(5));
  // Those over the per-uid limit were closed unanswered; the others were
  // answered DEADLINE_EXCEEDED after BufferFdServer::kRequestTimeout.
  int answered = 0, closed = 0;
  const absl::Time deadline = absl::Now() + absl::Seconds(5);
  for (UniqueFd& c : silent) {
    UniqueFd fd;
    absl::StatusOr<std::string> bytes = ipc::ReceiveMessage(c.get(), 4096, &fd, deadline);
    if (bytes.ok()) {
      absl::StatusOr<ipc::RegisterResponse> r = ipc::DecodeResponse(*bytes);
      ASSERT_TRUE(r.ok()) << r.status();
      EXPECT_EQ(r->status.code(), absl::StatusCode::kDeadlineExceeded) << r->status;
      ++answered;
    } else {
      EXPECT_EQ(bytes.status().code(), absl::StatusCode::kUnavailable) << bytes.status();
      ++closed;
    }
  }
  EXPECT_EQ(answered, BufferFdServer::kMaxConnectionsPerUid);
  EXPECT_EQ(closed, kSilent - BufferFdServer::kMaxConnectionsPerUid);
  EXPECT_EQ(cluster->StopAll(), absl::OkStatus());
}

// A burst of one uid's clients, each sending its request at once, larger
// than the per-uid limit and all waiting before the daemon's fd thread gets
// to any (the daemon is stopped meanwhile, as a loaded machine deschedules
// it): every one is answered, none closed unanswered.
TEST(LocalSocket, ABurstOfOneUidsRequestsIsAnsweredInFull) {
  const std::string path = SocketPath("fdburst");
  auto cluster = testing::StartCluster(1, {"--listen=unix:" + path});
  ASSERT_NE(cluster, nullptr);
  absl::StatusOr<ipc::UnixAddress> address = ipc::ParseUnixAddress("unix:" + path + ".fd");
  ASSERT_TRUE(address.ok()) << address.status();
  ipc::FetchRequest request;
  request.session_id = "no-such-session";
  request.token = std::string(ipc::kRegistrationTokenBytes, 'x');
  const std::string bytes = ipc::EncodeFetchRequest(request);
  constexpr int kBurst = 3 * BufferFdServer::kMaxConnectionsPerUid;  // within listen()'s 64
  cluster->SignalDaemon(0, SIGSTOP);
  std::vector<UniqueFd> clients;
  for (int i = 0; i < kBurst; ++i) {
    absl::StatusOr<UniqueFd> c = ipc::ConnectSeqpacket(*address, absl::Now() + absl::Seconds(5));
    ASSERT_TRUE(c.ok()) << i << ": " << c.status();
    ASSERT_TRUE(ipc::SendMessage(c->get(), bytes, -1, absl::Now() + absl::Seconds(5)).ok()) << i;
    clients.push_back(*std::move(c));
  }
  cluster->SignalDaemon(0, SIGCONT);
  const absl::Time deadline = absl::Now() + absl::Seconds(20);
  for (int i = 0; i < kBurst; ++i) {
    UniqueFd fd;
    absl::StatusOr<std::string> answer = ipc::ReceiveMessage(clients[i].get(), 4096, &fd, deadline);
    ASSERT_TRUE(answer.ok()) << "connection " << i << ": " << answer.status();
    absl::StatusOr<ipc::RegisterResponse> r = ipc::DecodeResponse(*answer);
    ASSERT_TRUE(r.ok()) << r.status();
    EXPECT_EQ(r->status.code(), absl::StatusCode::kPermissionDenied) << i << ": " << r->status;
    EXPECT_NE(r->status.message().find("no-such-session"), std::string::npos) << r->status;
  }
  EXPECT_EQ(cluster->StopAll(), absl::OkStatus());
}

// An abstract socket has no file permissions: a group cannot restrict it.
TEST(LocalSocket, AGroupWithAnAbstractSocketIsRefusedAtStart) {
  const std::string name = absl::StrCat("gradsync-abstract-", ::getpid());
  const std::string common = " --insecure --coordinator=127.0.0.1:1 --data_listen=127.0.0.1:0 "
                             "--status_listen= --metrics_listen= --socket_group=nogroup";
  std::string out = testing::RunCommand(absl::StrCat(
      "timeout 10 worker/gradsyncd --listen=unix-abstract:", name, common, " 2>&1; echo rc=$?"));
  EXPECT_NE(out.find(absl::StrCat(
                "cannot start: --socket_group 'nogroup' cannot restrict the client socket "
                "(--listen) unix-abstract:", name,
                ": an abstract socket has no file permissions, so any process on the host could "
                "connect; use a unix:PATH socket, or drop --socket_group")),
            std::string::npos)
      << out;
  EXPECT_NE(out.find("rc=2\n"), std::string::npos) << out;
  // The same for an abstract fd socket next to a path client socket.
  out = testing::RunCommand(absl::StrCat("timeout 10 worker/gradsyncd --listen=unix:",
                                         SocketPath("abstractfd"), " --fd_socket=unix-abstract:",
                                         name, common, " 2>&1; echo rc=$?"));
  EXPECT_NE(out.find(absl::StrCat("cannot start: --socket_group 'nogroup' cannot restrict the fd "
                                  "socket (--fd_socket) unix-abstract:",
                                  name, ": an abstract socket")),
            std::string::npos)
      << out;
  EXPECT_NE(out.find("rc=2\n"), std::string::npos) << out;
}

}  // namespace
}  // namespace gradsync
