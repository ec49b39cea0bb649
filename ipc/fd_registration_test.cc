#include "ipc/fd_registration.h"

#include <sys/mman.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstddef>
#include <cstring>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "gtest/gtest.h"

namespace gradsync::ipc {
namespace {

RegisterRequest SampleRequest() {
  RegisterRequest r;
  r.session_id = "node-1-42-7";
  r.token = std::string(kRegistrationTokenBytes, '\x5a');
  r.offset = 4096;
  r.size = 123456;
  return r;
}

TEST(FdRegistration, RequestRoundTrips) {
  const RegisterRequest in = SampleRequest();
  auto out = DecodeRequest(EncodeRequest(in));
  ASSERT_TRUE(out.ok()) << out.status();
  EXPECT_EQ(out->session_id, in.session_id);
  EXPECT_EQ(out->token, in.token);
  EXPECT_EQ(out->offset, 4096u);
  EXPECT_EQ(out->size, 123456u);
}

TEST(FdRegistration, MalformedRequestsNameTheProblem) {
  const std::string good = EncodeRequest(SampleRequest());
  auto expect = [](const std::string& bytes, const std::string& why) {
    auto r = DecodeRequest(bytes);
    ASSERT_FALSE(r.ok());
    EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_NE(r.status().message().find(why), std::string::npos) << r.status();
  };
  expect(good.substr(0, 10), "at least 40 expected");
  std::string bad_magic = good;
  bad_magic[0] ^= 1;
  expect(bad_magic, "bad magic");
  std::string bad_version = good;
  bad_version[4] = 9;
  expect(bad_version, "protocol version 9");
  expect(good + "x", "session id");                      // length disagrees
  expect(good.substr(0, sizeof(RegisterRequestWire)), "session id");  // empty id
}

TEST(FdRegistration, FetchRequestRoundTripsAndIsToldFromARegistration) {
  FetchRequest in;
  in.session_id = "node-1-42-7";
  in.token = std::string(kRegistrationTokenBytes, '\x11');
  in.kind = SegmentKind::kOpQueue;
  in.id = 77;
  const std::string bytes = EncodeFetchRequest(in);
  EXPECT_EQ(RequestMagic(bytes), kFetchRequestMagic);
  EXPECT_EQ(RequestMagic(EncodeRequest(SampleRequest())), kRegisterRequestMagic);
  EXPECT_EQ(RequestMagic("ab"), 0u);
  auto out = DecodeFetchRequest(bytes);
  ASSERT_TRUE(out.ok()) << out.status();
  EXPECT_EQ(out->session_id, in.session_id);
  EXPECT_EQ(out->token, in.token);
  EXPECT_EQ(out->kind, SegmentKind::kOpQueue);
  EXPECT_EQ(out->id, 77u);
  // A registration is not a fetch, and an unknown kind is named.
  auto wrong = DecodeFetchRequest(EncodeRequest(SampleRequest()));
  ASSERT_FALSE(wrong.ok());
  EXPECT_NE(wrong.status().message().find("fetch request with bad magic"), std::string::npos);
  std::string bad_kind = bytes;
  bad_kind[offsetof(FetchRequestWire, kind)] = 9;
  auto unknown = DecodeFetchRequest(bad_kind);
  ASSERT_FALSE(unknown.ok());
  EXPECT_NE(unknown.status().message().find("segment kind 9"), std::string::npos)
      << unknown.status();
  // Reserved bytes must be zero (fuzz_smoke_test found them ignored).
  std::string reserved = bytes;
  reserved[offsetof(FetchRequestWire, reserved)] = 1;
  auto nonzero = DecodeFetchRequest(reserved);
  ASSERT_FALSE(nonzero.ok());
  EXPECT_NE(nonzero.status().message().find("non-zero reserved"), std::string::npos);
}

TEST(FdRegistration, ResponseCarriesTheDaemonsStatus) {
  RegisterResponse in;
  in.status = absl::FailedPreconditionError("the fd is not sealed against shrinking");
  auto out = DecodeResponse(EncodeResponse(in));
  ASSERT_TRUE(out.ok()) << out.status();
  EXPECT_EQ(out->status, in.status);
  RegisterResponse ok;
  ok.buffer_id = 9;
  ok.size = 77;
  out = DecodeResponse(EncodeResponse(ok));
  ASSERT_TRUE(out.ok());
  EXPECT_TRUE(out->status.ok());
  EXPECT_EQ(out->buffer_id, 9u);
  EXPECT_EQ(out->size, 77u);
  EXPECT_EQ(DecodeResponse("short").status().code(), absl::StatusCode::kDataLoss);
}

TEST(FdRegistration, ParsesUnixAddresses) {
  auto path = ParseUnixAddress("unix:/run/gradsync/gradsyncd.sock.fd");
  ASSERT_TRUE(path.ok());
  EXPECT_FALSE(path->abstract);
  EXPECT_EQ(path->path, "/run/gradsync/gradsyncd.sock.fd");
  auto abstract = ParseUnixAddress("unix-abstract:gradsync-x.fd");
  ASSERT_TRUE(abstract.ok());
  EXPECT_TRUE(abstract->abstract);
  EXPECT_EQ(abstract->addr.sun_path[0], '\0');
  EXPECT_EQ(std::string(abstract->addr.sun_path + 1, 13), "gradsync-x.fd");
  EXPECT_FALSE(ParseUnixAddress("127.0.0.1:5000").ok());
  EXPECT_FALSE(ParseUnixAddress("unix:").ok());
  EXPECT_FALSE(ParseUnixAddress("unix:/" + std::string(200, 'a')).ok());
}

// A descriptor sent over a seqpacket pair arrives as a descriptor of the same file.
TEST(FdRegistration, PassesADescriptor) {
  int sv[2];
  ASSERT_EQ(::socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, sv), 0);
  UniqueFd a(sv[0]), b(sv[1]);
  UniqueFd mem(::memfd_create("fd-test", MFD_CLOEXEC));
  ASSERT_TRUE(mem.valid());
  ASSERT_EQ(::write(mem.get(), "hello", 5), 5);
  const absl::Time deadline = absl::Now() + absl::Seconds(5);
  ASSERT_TRUE(SendMessage(a.get(), "payload", mem.get(), deadline).ok());
  UniqueFd got;
  auto msg = ReceiveMessage(b.get(), 64, &got, deadline);
  ASSERT_TRUE(msg.ok()) << msg.status();
  EXPECT_EQ(*msg, "payload");
  ASSERT_TRUE(got.valid());
  EXPECT_NE(got.get(), mem.get());
  char buf[5];
  ASSERT_EQ(::pread(got.get(), buf, 5, 0), 5);
  EXPECT_EQ(std::string(buf, 5), "hello");
}

TEST(FdRegistration, RefusesLongMessagesExtraDescriptorsAndSilence) {
  int sv[2];
  ASSERT_EQ(::socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, sv), 0);
  UniqueFd a(sv[0]), b(sv[1]);
  const absl::Time deadline = absl::Now() + absl::Seconds(5);
  ASSERT_TRUE(SendMessage(a.get(), std::string(100, 'x'), -1, deadline).ok());
  UniqueFd got;
  auto msg = ReceiveMessage(b.get(), 64, &got, deadline);
  ASSERT_FALSE(msg.ok());
  EXPECT_NE(msg.status().message().find("longer than 64"), std::string::npos) << msg.status();

  // Two descriptors in one message.
  int fds[2] = {::memfd_create("x", MFD_CLOEXEC), ::memfd_create("y", MFD_CLOEXEC)};
  alignas(struct cmsghdr) char control[CMSG_SPACE(sizeof(fds))] = {};
  char byte = 'z';
  struct iovec iov = {&byte, 1};
  struct msghdr m {};
  m.msg_iov = &iov;
  m.msg_iovlen = 1;
  m.msg_control = control;
  m.msg_controllen = sizeof(control);
  struct cmsghdr* c = CMSG_FIRSTHDR(&m);
  c->cmsg_level = SOL_SOCKET;
  c->cmsg_type = SCM_RIGHTS;
  c->cmsg_len = CMSG_LEN(sizeof(fds));
  std::memcpy(CMSG_DATA(c), fds, sizeof(fds));
  ASSERT_EQ(::sendmsg(a.get(), &m, 0), 1);
  ::close(fds[0]);
  ::close(fds[1]);
  msg = ReceiveMessage(b.get(), 64, &got, deadline);
  ASSERT_FALSE(msg.ok());
  EXPECT_NE(msg.status().message().find("one is allowed"), std::string::npos) << msg.status();
  EXPECT_FALSE(got.valid());

  msg = ReceiveMessage(b.get(), 64, &got, absl::Now() + absl::Milliseconds(50));
  EXPECT_EQ(msg.status().code(), absl::StatusCode::kDeadlineExceeded) << msg.status();
  a.Reset();
  msg = ReceiveMessage(b.get(), 64, &got, deadline);
  EXPECT_EQ(msg.status().code(), absl::StatusCode::kUnavailable) << msg.status();
}

TEST(FdRegistration, ListensAndConnectsOnAnAbstractName) {
  auto address = ParseUnixAddress(absl::StrCat("unix-abstract:gradsync-fd-test-", ::getpid()));
  ASSERT_TRUE(address.ok());
  auto listener = ListenSeqpacket(*address, 0660);
  ASSERT_TRUE(listener.ok()) << listener.status();
  const absl::Time deadline = absl::Now() + absl::Seconds(5);
  auto conn = ConnectSeqpacket(*address, deadline);
  ASSERT_TRUE(conn.ok()) << conn.status();
  ASSERT_TRUE(SendMessage(conn->get(), "ping", -1, deadline).ok());
  UniqueFd accepted(::accept4(listener->get(), nullptr, nullptr, SOCK_CLOEXEC));
  ASSERT_TRUE(accepted.valid());
  auto msg = ReceiveMessage(accepted.get(), 16, nullptr, deadline);
  ASSERT_TRUE(msg.ok()) << msg.status();
  EXPECT_EQ(*msg, "ping");
  // Nobody listens here.
  auto none = ParseUnixAddress("unix-abstract:gradsync-fd-test-nobody");
  EXPECT_EQ(ConnectSeqpacket(*none, deadline).status().code(), absl::StatusCode::kUnavailable);
}

// A socket file that a live process serves is not taken over (a second
// daemon on the same path); one left by a process that is gone is replaced.
TEST(FdRegistration, ListeningOnALiveSocketPathIsRefused) {
  const std::string path = absl::StrCat("/tmp/gradsync-fdreg-", ::getpid(), ".sock");
  auto address = ParseUnixAddress("unix:" + path);
  ASSERT_TRUE(address.ok()) << address.status();
  {
    auto first = ListenSeqpacket(*address, 0660);
    ASSERT_TRUE(first.ok()) << first.status();
    auto second = ListenSeqpacket(*address, 0660);
    ASSERT_FALSE(second.ok());
    EXPECT_EQ(second.status().code(), absl::StatusCode::kAlreadyExists);
    EXPECT_NE(second.status().message().find("another process serves"), std::string::npos)
        << second.status();
  }
  auto after = ListenSeqpacket(*address, 0660);  // the file stayed; nobody serves it
  EXPECT_TRUE(after.ok()) << after.status();
  ::unlink(path.c_str());
}

TEST(FdRegistration, RandomBytesDiffer) {
  auto a = RandomBytes(kRegistrationTokenBytes);
  auto b = RandomBytes(kRegistrationTokenBytes);
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_EQ(a->size(), kRegistrationTokenBytes);
  EXPECT_NE(*a, *b);
}

}  // namespace
}  // namespace gradsync::ipc
