// The verbs emulation across processes (a linked fabric): a forked child is
// the responder, on its own node of the fabric; endpoints and results travel
// over a socketpair.
#include <infiniband/verbs.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstddef>
#include <cstring>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "gtest/gtest.h"
#include "rdma/verbs.h"
#include "rdma/verbs_emulation.h"
#include "rdma/verbs_emulation_link.h"

namespace gradsync::rdma {
namespace {

constexpr size_t kBytes = (1 << 20) + 13;

// Fabric names are abstract socket names, shared by every process of the
// network namespace: a sandbox's pid namespace repeats pids across concurrent
// runs, so the name carries the time too.
std::string UniqueFabric(absl::string_view what) {
  return absl::StrCat(what, "-", ::getpid(), "-", absl::ToUnixNanos(absl::Now()));
}
std::string FabricName() { return UniqueFabric("link-test"); }

// What the two sides tell each other.
struct Hello {
  char endpoint[QpEndpoint::kEncodedSize];
  RemoteMemory memory;
};
struct Result {
  int completions = 0;
  int status[4] = {};
  uint32_t imm = 0;
  uint32_t byte_len = 0;
  size_t mismatches = 0;
};

template <class T>
bool WriteAll(int fd, const T& v) {
  return ::write(fd, &v, sizeof(v)) == static_cast<ssize_t>(sizeof(v));
}
template <class T>
bool ReadAll(int fd, T* v) {
  size_t got = 0;
  while (got < sizeof(T)) {
    const ssize_t n = ::read(fd, reinterpret_cast<char*>(v) + got, sizeof(T) - got);
    if (n <= 0) return false;
    got += static_cast<size_t>(n);
  }
  return true;
}

// One side: a device on the fabric, a QP, a registered buffer.
struct Side {
  std::unique_ptr<VerbsEmulation> emu;
  std::unique_ptr<Context> ctx;
  std::unique_ptr<ProtectionDomain> pd;
  std::unique_ptr<CompletionQueue> cq;
  std::unique_ptr<QueuePair> qp;
  std::vector<char> buf = std::vector<char>(kBytes);
  std::unique_ptr<MemoryRegion> mr;
  QpEndpoint local;

  bool Open(const std::string& fabric) {
    EmulationOptions o;
    o.fabric = fabric;
    auto e = VerbsEmulation::Open(o);
    if (!e.ok()) return false;
    emu = *std::move(e);
    ctx = *Context::Open("emu_ib0", emu->verbs());
    pd = *ProtectionDomain::Create(*ctx);
    cq = *CompletionQueue::Create(*ctx, 64);
    qp = *QueuePair::Create(*pd, *cq, *cq);
    mr = *MemoryRegion::Register(*pd, buf.data(), buf.size());
    local = *qp->LocalEndpoint();
    return true;
  }
  Hello MakeHello() const {
    Hello h;
    const std::string e = local.Encode();
    std::memcpy(h.endpoint, e.data(), sizeof(h.endpoint));
    h.memory = mr->Remote();
    return h;
  }
  bool Connect(const Hello& peer) {
    auto remote = QpEndpoint::Decode(absl::string_view(peer.endpoint, sizeof(peer.endpoint)));
    return remote.ok() && qp->Connect(local, *remote).ok();
  }
  // Polls until `n` completions or `timeout`.
  std::vector<WorkCompletion> Await(size_t n, absl::Duration timeout) {
    std::vector<WorkCompletion> out;
    const absl::Time deadline = absl::Now() + timeout;
    while (out.size() < n && absl::Now() < deadline) {
      if (!cq->Poll(16, &out).ok()) break;
      absl::SleepFor(absl::Milliseconds(1));
    }
    return out;
  }
};

enum class Script { kReceiveTwo, kReceiveWhenTold, kReceiveOne, kExitAfterConnect };

// The child: connects, then follows `script`, reporting a Result.
int RunChild(int sock, const std::string& fabric, Script script) {
  Side s;
  if (!s.Open(fabric)) return 10;
  Hello peer;
  if (!WriteAll(sock, s.MakeHello()) || !ReadAll(sock, &peer) || !s.Connect(peer)) return 11;
  // Our QP is ready to receive: only now may the parent post to it (a work
  // request to a QP not yet connected finds nobody, as on a real fabric).
  const char connected = 1;
  if (!WriteAll(sock, connected)) return 16;
  if (script == Script::kExitAfterConnect) return 0;
  const int recvs = script == Script::kReceiveOne ? 1 : 2;
  if (script == Script::kReceiveWhenTold) {
    char go;
    if (!ReadAll(sock, &go)) return 12;
  }
  for (int i = 0; i < recvs; ++i) {
    if (!s.qp->PostRecv(*s.mr, 0, 64, 100 + i).ok()) return 13;
  }
  char ready = 1;
  if (!WriteAll(sock, ready)) return 14;
  std::vector<WorkCompletion> wcs = s.Await(recvs, absl::Seconds(20));
  Result r;
  r.completions = static_cast<int>(wcs.size());
  for (size_t i = 0; i < wcs.size() && i < 4; ++i) {
    r.status[i] = wcs[i].status;
    if (wcs[i].has_imm) {
      r.imm = wcs[i].imm_data;
      r.byte_len = wcs[i].byte_len;
    }
  }
  for (size_t i = 0; i < 4096; ++i) {  // the write lands at offset 4096
    r.mismatches += s.buf[4096 + i] != static_cast<char>(i * 31 + 7) ? 1 : 0;
  }
  for (size_t i = 4096 * 2; i < kBytes - 4096; ++i) {
    r.mismatches += s.buf[i] != static_cast<char>(i * 31 + 7) ? 1 : 0;
  }
  return WriteAll(sock, r) ? 0 : 15;
}

class LinkedEmulation : public ::testing::Test {
 protected:
  // Forks the child before this process has any thread.
  void StartChild(Script script) {
    int sv[2];
    ASSERT_EQ(::socketpair(AF_UNIX, SOCK_STREAM, 0, sv), 0);
    fabric_ = FabricName();
    child_ = ::fork();
    ASSERT_GE(child_, 0);
    if (child_ == 0) {
      ::close(sv[0]);
      ::_exit(RunChild(sv[1], fabric_, script));
    }
    ::close(sv[1]);
    sock_ = sv[0];
    ASSERT_TRUE(side_.Open(fabric_));
    Hello peer;
    ASSERT_TRUE(ReadAll(sock_, &peer));
    ASSERT_TRUE(WriteAll(sock_, side_.MakeHello()));
    ASSERT_TRUE(side_.Connect(peer));
    char connected = 0;
    ASSERT_TRUE(ReadAll(sock_, &connected));  // the child's QP is connected too
    peer_memory_ = peer.memory;
    for (size_t i = 0; i < kBytes; ++i) side_.buf[i] = static_cast<char>(i * 31 + 7);
  }
  int ChildExit() {
    int st = 0;
    ::waitpid(child_, &st, 0);
    child_ = -1;
    return WIFEXITED(st) ? WEXITSTATUS(st) : 100 + WTERMSIG(st);
  }
  void TearDown() override {
    if (child_ > 0) {
      ::kill(child_, SIGKILL);
      ChildExit();
    }
    if (sock_ >= 0) ::close(sock_);
  }
  std::string fabric_;
  pid_t child_ = -1;
  int sock_ = -1;
  Side side_;
  RemoteMemory peer_memory_;
};

TEST_F(LinkedEmulation, EachProcessIsItsOwnNodeWithItsOwnLid) {
  StartChild(Script::kExitAfterConnect);
  EXPECT_GE(side_.emu->node(), 1);
  EXPECT_EQ(side_.local.lid, side_.emu->node() * 16 + 1);
  EXPECT_EQ(ChildExit(), 0);
}

TEST_F(LinkedEmulation, WritesLandInTheOtherProcessBitExact) {
  StartChild(Script::kReceiveTwo);
  char ready;
  ASSERT_TRUE(ReadAll(sock_, &ready));
  // A plain write of the middle, then a write with immediate of one page.
  ASSERT_TRUE(side_.qp->PostWrite(*side_.mr, 8192, kBytes - 8192 - 4096, peer_memory_, 8192, 1,
                                  false)
                  .ok());
  const uint32_t imm = 0x00c0ffee;
  ASSERT_TRUE(side_.qp->PostWrite(*side_.mr, 0, 4096, peer_memory_, 4096, 2, true, &imm).ok());
  const char hello[] = "clear to send";
  ASSERT_TRUE(side_.qp->PostSendInline(hello, sizeof(hello), 3, true).ok());
  std::vector<WorkCompletion> wcs = side_.Await(2, absl::Seconds(20));
  ASSERT_EQ(wcs.size(), 2u);
  EXPECT_TRUE(wcs[0].ok) << wcs[0].status_text;
  EXPECT_EQ(wcs[0].wr_id, 2u);
  EXPECT_TRUE(wcs[1].ok) << wcs[1].status_text;
  Result r;
  ASSERT_TRUE(ReadAll(sock_, &r));
  EXPECT_EQ(r.completions, 2);
  EXPECT_EQ(r.status[0], IBV_WC_SUCCESS);
  EXPECT_EQ(r.status[1], IBV_WC_SUCCESS);
  EXPECT_EQ(r.imm, imm);
  EXPECT_EQ(r.byte_len, 4096u);
  // The child's buffer at 4096..8191 got bytes 0..4095 of ours: the pattern
  // there is i*31+7 of the source index, which RunChild checks as such.
  EXPECT_EQ(r.mismatches, 0u);
  EXPECT_EQ(ChildExit(), 0);
}

TEST_F(LinkedEmulation, ASendWaitsForTheReceiverToPostAReceive) {
  StartChild(Script::kReceiveWhenTold);
  const uint32_t imm = 7;
  ASSERT_TRUE(side_.qp->PostWrite(*side_.mr, 0, 4096, peer_memory_, 4096, 1, true, &imm).ok());
  ASSERT_TRUE(side_.qp->PostWrite(*side_.mr, 8192, kBytes - 8192 - 4096, peer_memory_, 8192, 2,
                                  true, &imm)
                  .ok());
  // Receiver not ready (rnr_retry 7: forever): nothing completes yet.
  EXPECT_TRUE(side_.Await(1, absl::Milliseconds(300)).empty());
  const char go = 1;
  ASSERT_TRUE(WriteAll(sock_, go));
  std::vector<WorkCompletion> wcs = side_.Await(2, absl::Seconds(20));
  ASSERT_EQ(wcs.size(), 2u);
  EXPECT_TRUE(wcs[0].ok && wcs[1].ok);
  EXPECT_EQ(wcs[0].wr_id, 1u);  // in posting order
  char ready;
  ASSERT_TRUE(ReadAll(sock_, &ready));
  Result r;
  ASSERT_TRUE(ReadAll(sock_, &r));
  EXPECT_EQ(r.completions, 2);
  EXPECT_EQ(r.mismatches, 0u);
  EXPECT_EQ(ChildExit(), 0);
}

TEST_F(LinkedEmulation, AWrongRkeyIsARemoteAccessErrorAndBreaksBothQps) {
  StartChild(Script::kReceiveOne);
  char ready;
  ASSERT_TRUE(ReadAll(sock_, &ready));
  RemoteMemory wrong = peer_memory_;
  wrong.rkey ^= 0x40;
  const uint32_t imm = 1;
  ASSERT_TRUE(side_.qp->PostWrite(*side_.mr, 0, 64, wrong, 0, 9, true, &imm).ok());
  std::vector<WorkCompletion> wcs = side_.Await(1, absl::Seconds(20));
  ASSERT_EQ(wcs.size(), 1u);
  EXPECT_EQ(wcs[0].status, IBV_WC_REM_ACCESS_ERR);
  Result r;
  ASSERT_TRUE(ReadAll(sock_, &r));
  ASSERT_EQ(r.completions, 1);
  EXPECT_EQ(r.status[0], IBV_WC_WR_FLUSH_ERR);  // its QP entered ERR
  EXPECT_EQ(ChildExit(), 0);
}

TEST_F(LinkedEmulation, APeerProcessThatIsGoneFailsTheWriteWithRetryExceeded) {
  StartChild(Script::kExitAfterConnect);
  EXPECT_EQ(ChildExit(), 0);
  const uint32_t imm = 1;
  ASSERT_TRUE(side_.qp->PostWrite(*side_.mr, 0, 64, peer_memory_, 0, 5, true, &imm).ok());
  std::vector<WorkCompletion> wcs = side_.Await(1, absl::Seconds(20));
  ASSERT_EQ(wcs.size(), 1u);
  EXPECT_EQ(wcs[0].status, IBV_WC_RETRY_EXC_ERR);
  // Later ones flush at once: the QP is in ERR.
  ASSERT_TRUE(side_.qp->PostWrite(*side_.mr, 0, 64, peer_memory_, 0, 6, true, &imm).ok());
  wcs = side_.Await(1, absl::Seconds(5));
  ASSERT_EQ(wcs.size(), 1u);
  EXPECT_EQ(wcs[0].status, IBV_WC_WR_FLUSH_ERR);
}

TEST(EmulationLink, NodesAreAllocatedByBindingTheLowestFreeNumber) {
  const std::string fabric = UniqueFabric("alloc");
  auto a = EmulationLink::Open(fabric);
  auto b = EmulationLink::Open(fabric);
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_EQ((*a)->node(), 1);
  EXPECT_EQ((*b)->node(), 2);
  a->reset();
  auto c = EmulationLink::Open(fabric);
  ASSERT_TRUE(c.ok());
  EXPECT_EQ((*c)->node(), 1);
  EXPECT_FALSE(EmulationLink::Open("bad/name").ok());
}

// Answers that arrive together with the end of the connection (a responder
// that replies and exits at once) are delivered before the loss is reported.
TEST(EmulationLink, RepliesThatArriveWithTheCloseAreDeliveredFirst) {
  const std::string fabric = UniqueFabric("close");
  auto link = EmulationLink::Open(fabric);
  ASSERT_TRUE(link.ok());
  ASSERT_EQ((*link)->node(), 1);
  // Node 2 is a bare socket this test answers from.
  UniqueFd listener(::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0));
  sockaddr_un a;
  std::memset(&a, 0, sizeof(a));
  a.sun_family = AF_UNIX;
  const std::string name = EmulationSocketName(fabric, 2);
  std::memcpy(a.sun_path + 1, name.data(), name.size());
  const auto alen = static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + 1 + name.size());
  ASSERT_EQ(::bind(listener.get(), reinterpret_cast<sockaddr*>(&a), alen), 0);
  ASSERT_EQ(::listen(listener.get(), 4), 0);

  // The first reply holds the link's thread until the second reply and the
  // close are both in the socket, so that one read sees them together.
  struct Recorder : EmulationLink::Handler {
    absl::Mutex mu;
    bool release = false;
    std::vector<std::string> events;
    void OnRequest(uint64_t, absl::string_view) override {}
    void OnReply(int node, absl::string_view body) override {
      absl::MutexLock l(&mu);
      events.push_back(absl::StrCat("reply ", node, " ", body));
      if (events.size() == 1) mu.Await(absl::Condition(&release));
    }
    void OnNodeLost(int node, const std::string& why) override {
      absl::MutexLock l(&mu);
      events.push_back(absl::StrCat("lost ", node, ": ", why));
    }
  } handler;
  (*link)->Start(&handler);
  (*link)->Send(2, "one");
  (*link)->Send(2, "two");
  UniqueFd peer(::accept(listener.get(), nullptr, nullptr));
  ASSERT_TRUE(peer.valid());
  auto frame = [](absl::string_view body) {
    const uint32_t n = static_cast<uint32_t>(body.size());
    return std::string(reinterpret_cast<const char*>(&n), sizeof(n)) + std::string(body);
  };
  const std::string requests = frame("one") + frame("two");
  std::string got(requests.size(), '\0');
  size_t have = 0;
  while (have < got.size()) {
    const ssize_t n = ::read(peer.get(), got.data() + have, got.size() - have);
    ASSERT_GT(n, 0);
    have += static_cast<size_t>(n);
  }
  EXPECT_EQ(got, requests);
  const std::string first = frame("ok-one");
  ASSERT_EQ(::write(peer.get(), first.data(), first.size()), static_cast<ssize_t>(first.size()));
  {
    absl::MutexLock l(&handler.mu);
    auto one = [&handler] { return handler.events.size() == 1; };
    ASSERT_TRUE(handler.mu.AwaitWithTimeout(absl::Condition(&one), absl::Seconds(20)));
  }
  const std::string second = frame("ok-two");
  ASSERT_EQ(::write(peer.get(), second.data(), second.size()),
            static_cast<ssize_t>(second.size()));
  peer.Reset();
  {
    absl::MutexLock l(&handler.mu);
    handler.release = true;
    auto three = [&handler] { return handler.events.size() == 3; };
    ASSERT_TRUE(handler.mu.AwaitWithTimeout(absl::Condition(&three), absl::Seconds(20)));
    EXPECT_EQ(handler.events, (std::vector<std::string>{"reply 2 ok-one", "reply 2 ok-two",
                                                        "lost 2: node 2: connection closed"}));
  }
  link->reset();
}

}  // namespace
}  // namespace gradsync::rdma
