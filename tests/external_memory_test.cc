// Registered external memory against real processes (a coordinator and two
// gradsyncd on loopback): ranks pass memfds they filled themselves over the
// daemons' fd sockets, allreduce in place, and read the results through
// their own mappings; the fd socket refuses what it must and the daemon goes
// on serving.
#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <memory>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "cli/local_cluster.h"
#include "collective/reference.h"
#include "common/metrics_testing.h"
#include "common/net.h"
#include "common/status_macros.h"
#include "gtest/gtest.h"
#include "ipc/fd_registration.h"
#include "tests/cluster_util.h"

namespace gradsync {
namespace {

using testing::OnEveryRank;
using testing::OpenJob;

const size_t kPage = static_cast<size_t>(::sysconf(_SC_PAGESIZE));

using ExternalMemory = testing::SharedClusterTest<2>;

// A memfd of `bytes` bytes that the caller may seal (MFD_ALLOW_SEALING).
UniqueFd Memfd(size_t bytes) {
  UniqueFd fd(::memfd_create("external_memory_test", MFD_ALLOW_SEALING | MFD_CLOEXEC));
  EXPECT_TRUE(fd.valid());
  EXPECT_EQ(::ftruncate(fd.get(), static_cast<off_t>(bytes)), 0);
  return fd;
}

// This process's own mapping of [offset, offset+bytes) of `fd`.
struct Mapping {
  Mapping(int fd, size_t offset, size_t bytes) : size(bytes) {
    void* p = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd,
                     static_cast<off_t>(offset));
    data = p == MAP_FAILED ? nullptr : static_cast<char*>(p);
  }
  ~Mapping() {
    if (data != nullptr) ::munmap(data, size);
  }
  char* data;
  size_t size;
};

// Every rank fills a memfd through a mapping of its own, registers the range
// past its first page, and allreduces it twice: the results (bit-exact
// against the ring-order reference) appear in that mapping, with no copy
// through the SDK's buffer. The registered file can no longer shrink.
TEST_F(ExternalMemory, RegisteredMemfdsAllreduceInPlace) {
  auto job = OpenJob(*cluster_, "external-inplace", testing::FirstN(2));
  ASSERT_TRUE(job.ok()) << job.status();
  const size_t count = 300007;  // f32: a few pages, not a page multiple
  const size_t bytes = count * sizeof(float);
  std::vector<std::vector<char>> in(2);
  for (int r = 0; r < 2; ++r) in[r] = testing::RandomData(DType::kF32, count, r, 7);
  const std::vector<char> once = testing::RingOrderReference(in, DType::kF32, ReduceOp::kSum, count);
  const std::vector<char> twice =
      testing::RingOrderReference({once, once}, DType::kF32, ReduceOp::kSum, count);
  std::vector<std::string> errors(2);
  OnEveryRank(2, [&](int r) {
    auto fail = [&](const std::string& what) { errors[r] = what; };
    client::Session& s = *(*job)[r].session;
    UniqueFd fd = Memfd(kPage + bytes);
    Mapping mine(fd.get(), kPage, bytes);
    if (mine.data == nullptr) return fail("mmap of the memfd failed");
    std::memcpy(mine.data, in[r].data(), bytes);
    auto buf = s.RegisterBuffer(fd.get(), bytes, kPage);
    if (!buf.ok()) return fail(absl::StrCat("RegisterBuffer: ", buf.status().ToString()));
    if ((*buf)->size() != bytes) return fail(absl::StrCat("registered ", (*buf)->size()));
    if (::ftruncate(fd.get(), 0) == 0 || errno != EPERM) {
      return fail("a registered memfd could still shrink");
    }
    for (const std::vector<char>* want : {&once, &twice}) {
      client::CollectiveSpec spec;
      spec.buffer = buf->get();
      spec.count = count;
      spec.dtype = DType::kF32;
      spec.op = ReduceOp::kSum;
      spec.name = want == &once ? "external.1" : "external.2";
      spec.algorithm = "ring";
      auto res = s.Run(spec);
      if (!res.ok()) return fail(absl::StrCat(spec.name, ": ", res.status().ToString()));
      if (std::memcmp(mine.data, want->data(), bytes) != 0) {
        return fail(absl::StrCat(spec.name, ": the memfd's bytes differ from the reference"));
      }
    }
    absl::Status freed = s.FreeBuffer(std::move(*buf));
    if (!freed.ok()) return fail(absl::StrCat("FreeBuffer: ", freed.ToString()));
  });
  for (int r = 0; r < 2; ++r) EXPECT_EQ(errors[r], "") << "rank " << r;
  for (auto& r : *job) EXPECT_TRUE(r.session->Close().ok());
}

// Memory from malloc, handed over in place (AdoptMemory): each rank fills a
// large allocation, adopts it, and allreduces it twice; the results appear at
// the allocation's own addresses (bit-exact), its bytes outside the op are
// kept, and free() still releases it. A small (heap) allocation is refused
// saying why, and nothing of it changes.
TEST_F(ExternalMemory, AdoptedMallocMemoryAllreducesInPlace) {
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
  GTEST_SKIP() << "malloc is the sanitizer's, not glibc's: AdoptMemory refuses it "
                  "(//client:malloc_mapping_test checks that refusal)";
#endif
  auto job = OpenJob(*cluster_, "external-adopt", testing::FirstN(2));
  ASSERT_TRUE(job.ok()) << job.status();
  const size_t count = (40u << 20) / sizeof(float) + 3;  // above glibc's largest mmap threshold
  const size_t bytes = count * sizeof(float);
  std::vector<std::vector<char>> in(2);
  for (int r = 0; r < 2; ++r) in[r] = testing::RandomData(DType::kF32, count - 1, r, 11);
  const std::vector<char> once =
      testing::RingOrderReference(in, DType::kF32, ReduceOp::kSum, count - 1);
  const std::vector<char> twice =
      testing::RingOrderReference({once, once}, DType::kF32, ReduceOp::kSum, count - 1);
  std::vector<std::string> errors(2);
  OnEveryRank(2, [&](int r) {
    auto fail = [&](const std::string& what) { errors[r] = what; };
    client::Session& s = *(*job)[r].session;
    void* mem = nullptr;
    if (::posix_memalign(&mem, 64, bytes) != 0) return fail("posix_memalign failed");
    float* f = static_cast<float*>(mem);
    f[0] = 1234.5f;  // before the op's range: must survive the adoption
    std::memcpy(f + 1, in[r].data(), in[r].size());
    size_t offset = 0;
    auto buf = s.AdoptMemory(mem, bytes, &offset);
    if (!buf.ok()) return fail(absl::StrCat("AdoptMemory: ", buf.status().ToString()));
    if (offset + bytes > (*buf)->size()) return fail("the allocation is not inside the buffer");
    if (f[0] != 1234.5f || std::memcmp(f + 1, in[r].data(), in[r].size()) != 0) {
      return fail("adopting changed the allocation's bytes");
    }
    for (const std::vector<char>* want : {&once, &twice}) {
      client::CollectiveSpec spec;
      spec.buffer = buf->get();
      spec.offset_bytes = offset + sizeof(float);
      spec.count = count - 1;
      spec.dtype = DType::kF32;
      spec.op = ReduceOp::kSum;
      spec.name = want == &once ? "adopt.1" : "adopt.2";
      spec.algorithm = "ring";
      auto res = s.Run(spec);
      if (!res.ok()) return fail(absl::StrCat(spec.name, ": ", res.status().ToString()));
      if (std::memcmp(f + 1, want->data(), want->size()) != 0) {
        return fail(absl::StrCat(spec.name, ": the allocation's bytes differ from the reference"));
      }
    }
    if (f[0] != 1234.5f) return fail("the op wrote outside its range");
    ::free(mem);  // unmaps the allocation's (now shared) pages
    absl::Status freed = s.FreeBuffer(std::move(*buf));
    if (!freed.ok()) return fail(absl::StrCat("FreeBuffer: ", freed.ToString()));
    std::vector<char> small(100, 7);
    char* heap = static_cast<char*>(::malloc(small.size()));
    std::memcpy(heap, small.data(), small.size());
    auto refused = s.AdoptMemory(heap, small.size(), &offset);
    const bool said_why =
        !refused.ok() && refused.status().code() == absl::StatusCode::kFailedPrecondition &&
        absl::StrContains(refused.status().message(),
                          "cannot be shared in place: malloc placed it among other allocations");
    const bool kept = std::memcmp(heap, small.data(), small.size()) == 0;
    ::free(heap);
    if (!said_why) return fail(absl::StrCat("a heap allocation: ", refused.status().ToString()));
    if (!kept) return fail("a refused adoption changed the memory");
  });
  for (int r = 0; r < 2; ++r) EXPECT_EQ(errors[r], "") << "rank " << r;
  for (auto& r : *job) EXPECT_TRUE(r.session->Close().ok());
}

// The daemon's own checks reach the client with its reasons; requests that
// bypass the SDK (a wrong token, no descriptor, a raw unsealed file) are
// refused on the socket alike; the daemon then serves the job as before.
TEST_F(ExternalMemory, RefusalsNameTheCauseAndTheDaemonGoesOn) {
  auto job = OpenJob(*cluster_, "external-refusals", testing::FirstN(2));
  ASSERT_TRUE(job.ok()) << job.status();
  client::Session& s = *(*job)[0].session;

  UniqueFd small = Memfd(kPage);
  auto beyond = s.RegisterBuffer(small.get(), 2 * kPage);
  ASSERT_FALSE(beyond.ok());
  EXPECT_EQ(beyond.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(beyond.status().message().find(absl::StrCat("the file has ", kPage, " bytes")),
            std::string::npos)
      << beyond.status();

  UniqueFd read_only(::open(absl::StrCat("/proc/self/fd/", small.get()).c_str(), O_RDONLY));
  ASSERT_TRUE(read_only.valid());
  auto ro = s.RegisterBuffer(read_only.get(), kPage);
  ASSERT_FALSE(ro.ok());
  EXPECT_NE(ro.status().message().find("cannot map"), std::string::npos) << ro.status();

  UniqueFd locked = Memfd(kPage);  // sealing itself sealed: the SDK cannot add F_SEAL_SHRINK
  ASSERT_EQ(::fcntl(locked.get(), F_ADD_SEALS, F_SEAL_SEAL), 0);
  auto unsealable = s.RegisterBuffer(locked.get(), kPage);
  ASSERT_FALSE(unsealable.ok());
  EXPECT_EQ(unsealable.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(unsealable.status().message().find("cannot seal fd"), std::string::npos)
      << unsealable.status();

  auto unaligned = s.RegisterBuffer(small.get(), 64, 100);
  ASSERT_FALSE(unaligned.ok());
  EXPECT_NE(unaligned.status().message().find("not a multiple of the page size"),
            std::string::npos);

  // Raw requests on daemon 0's fd socket.
  const std::string fd_socket = cluster_->daemon_target(0) + ".fd";
  ipc::RegisterRequest forged;
  forged.session_id = s.id();
  forged.token = std::string(ipc::kRegistrationTokenBytes, 'x');
  forged.size = kPage;
  UniqueFd unsealed = Memfd(kPage);  // never sealed: the daemon's own check would refuse it too
  auto wrong_token =
      ipc::RegisterFd(fd_socket, forged, unsealed.get(), absl::Now() + absl::Seconds(10));
  ASSERT_TRUE(wrong_token.ok()) << wrong_token.status();
  EXPECT_EQ(wrong_token->status.code(), absl::StatusCode::kPermissionDenied);
  EXPECT_EQ(wrong_token->status.message(),
            absl::StrCat("no session '", s.id(), "' on this daemon with that registration token"));
  auto no_fd = ipc::RegisterFd(fd_socket, forged, -1, absl::Now() + absl::Seconds(10));
  ASSERT_TRUE(no_fd.ok()) << no_fd.status();
  EXPECT_EQ(no_fd->status.message(), "the registration request carried no descriptor");
  {  // garbage instead of a request
    auto address = ipc::ParseUnixAddress(fd_socket);
    ASSERT_TRUE(address.ok());
    auto conn = ipc::ConnectSeqpacket(*address, absl::Now() + absl::Seconds(10));
    ASSERT_TRUE(conn.ok()) << conn.status();
    ASSERT_TRUE(ipc::SendMessage(conn->get(), "not a request", -1,
                                 absl::Now() + absl::Seconds(10)).ok());
    UniqueFd none;
    auto reply = ipc::ReceiveMessage(conn->get(), 4096, &none, absl::Now() + absl::Seconds(10));
    ASSERT_TRUE(reply.ok()) << reply.status();
    auto decoded = ipc::DecodeResponse(*reply);
    ASSERT_TRUE(decoded.ok()) << decoded.status();
    EXPECT_EQ(decoded->status.code(), absl::StatusCode::kInvalidArgument) << decoded->status;
  }
  {  // a client that connects and says nothing is answered with a timeout and dropped
    auto address = ipc::ParseUnixAddress(fd_socket);
    ASSERT_TRUE(address.ok());
    auto silent = ipc::ConnectSeqpacket(*address, absl::Now() + absl::Seconds(10));
    ASSERT_TRUE(silent.ok());
    UniqueFd none;
    auto reply = ipc::ReceiveMessage(silent->get(), 4096, &none, absl::Now() + absl::Seconds(30));
    ASSERT_TRUE(reply.ok()) << reply.status();
    auto decoded = ipc::DecodeResponse(*reply);
    ASSERT_TRUE(decoded.ok()) << decoded.status();
    EXPECT_EQ(decoded->status.code(), absl::StatusCode::kDeadlineExceeded) << decoded->status;
    auto closed = ipc::ReceiveMessage(silent->get(), 4096, &none, absl::Now() + absl::Seconds(30));
    EXPECT_EQ(closed.status().code(), absl::StatusCode::kUnavailable) << closed.status();
  }

  // The job goes on: a registered buffer on every rank still allreduces.
  std::vector<std::string> errors(2);
  OnEveryRank(2, [&](int r) {
    client::Session& rs = *(*job)[r].session;
    UniqueFd fd = Memfd(kPage);
    Mapping mine(fd.get(), 0, kPage);
    auto* v = reinterpret_cast<int32_t*>(mine.data);
    for (size_t i = 0; i < kPage / 4; ++i) v[i] = static_cast<int32_t>(i) * (r + 1);
    auto buf = rs.RegisterBuffer(fd.get(), kPage);
    if (!buf.ok()) return void(errors[r] = buf.status().ToString());
    client::CollectiveSpec spec;
    spec.buffer = buf->get();
    spec.count = kPage / 4;
    spec.dtype = DType::kI32;
    spec.op = ReduceOp::kSum;
    spec.name = "after-refusals";
    auto res = rs.Run(spec);
    if (!res.ok()) return void(errors[r] = res.status().ToString());
    for (size_t i = 0; i < kPage / 4; ++i) {
      if (v[i] != static_cast<int32_t>(i) * 3) {
        return void(errors[r] = absl::StrCat("element ", i, " is ", v[i]));
      }
    }
  });
  for (int r = 0; r < 2; ++r) EXPECT_EQ(errors[r], "") << "rank " << r;
  for (auto& r : *job) EXPECT_TRUE(r.session->Close().ok());

  // Daemon 0 counted each result (its refusals of the SDK's requests too).
  auto page = HttpGet("127.0.0.1", cluster_->daemon_metrics_port(0), "/metrics");
  ASSERT_TRUE(page.ok()) << page.status();
  const std::string series = "gradsync_daemon_fd_registrations_total";
  auto denied = FindSample(*page, series + "{result=\"permission_denied\"}");
  ASSERT_TRUE(denied.ok()) << denied.status();
  EXPECT_EQ(*denied, 1);
  auto invalid = FindSample(*page, series + "{result=\"invalid_argument\"}");
  ASSERT_TRUE(invalid.ok()) << invalid.status();
  EXPECT_EQ(*invalid, 3);  // beyond the end, no descriptor, not a request
  auto deadline = FindSample(*page, series + "{result=\"deadline_exceeded\"}");
  ASSERT_TRUE(deadline.ok()) << deadline.status();
  EXPECT_EQ(*deadline, 1);
  auto ok = FindSample(*page, series + "{result=\"ok\"}");
  ASSERT_TRUE(ok.ok()) << ok.status();
  EXPECT_GE(*ok, 1);
}

// A daemon running without an fd socket (--fd_socket=) tells the client why
// it cannot register memory.
TEST(ExternalMemoryWithoutFdSocket, RegisterBufferSaysTheDaemonHasNone) {
  LocalClusterOptions o;
  o.daemons = 1;
  o.daemon_flags = {"--fd_socket="};
  auto cluster = LocalCluster::Start(o);
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  auto job = OpenJob(**cluster, "external-none", testing::FirstN(1));
  ASSERT_TRUE(job.ok()) << job.status();
  UniqueFd fd = Memfd(kPage);
  auto buf = (*job)[0].session->RegisterBuffer(fd.get(), kPage);
  ASSERT_FALSE(buf.ok());
  EXPECT_EQ(buf.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(buf.status().message().find("has no fd socket"), std::string::npos) << buf.status();
  EXPECT_TRUE((*job)[0].session->Close().ok());
  EXPECT_EQ((*cluster)->StopAll(), absl::OkStatus());
}

// A session holds at most --session_memory_limit_mb of buffers, allocated and
// registered together (a client was granted 200 buffers of 64 GiB before);
// beyond it is ResourceExhausted naming the quota, and freeing a buffer
// gives its bytes back.
TEST(SessionMemoryQuota, BuffersBeyondTheQuotaAreRefusedNamingIt) {
  auto cluster = testing::StartCluster(1, {"--session_memory_limit_mb=1"});
  ASSERT_NE(cluster, nullptr);
  auto job = OpenJob(*cluster, "quota", testing::FirstN(1));
  ASSERT_TRUE(job.ok()) << job.status();
  client::Session& s = *(*job)[0].session;
  auto a = s.AllocateBuffer(512 << 10);
  ASSERT_TRUE(a.ok()) << a.status();
  UniqueFd fd = Memfd(256 << 10);
  auto registered = s.RegisterBuffer(fd.get(), 256 << 10);
  ASSERT_TRUE(registered.ok()) << registered.status();
  auto b = s.AllocateBuffer(512 << 10);
  ASSERT_FALSE(b.ok());
  EXPECT_EQ(b.status().code(), absl::StatusCode::kResourceExhausted) << b.status();
  EXPECT_NE(b.status().message().find("allocating a buffer of 524288 bytes would exceed the "
                                      "session's buffer quota of 1048576 bytes (786432 in use"),
            std::string::npos)
      << b.status();
  auto huge = s.AllocateBuffer(size_t{64} << 30);
  EXPECT_EQ(huge.status().code(), absl::StatusCode::kResourceExhausted) << huge.status();
  ASSERT_TRUE(s.FreeBuffer(std::move(*a)).ok());
  b = s.AllocateBuffer(512 << 10);
  EXPECT_TRUE(b.ok()) << b.status();
  EXPECT_TRUE(s.Close().ok());
  EXPECT_EQ(cluster->StopAll(), absl::OkStatus());
}

// All sessions of one tenant on a daemon hold at most
// --tenant_memory_limit_mb together (across jobs); another tenant's
// sessions on the same daemon are charged apart, and closing a session
// gives its bytes back to its tenant.
TEST(TenantMemoryQuota, ATenantsSessionsShareOneQuotaPerDaemon) {
  constexpr char kOtherToken[] = "5e5e5e5e5e5e5e5e-quota-tenant";
  LocalClusterOptions o;
  o.daemons = 1;
  o.daemon_flags = {"--tenant_memory_limit_mb=1"};
  o.extra_tenants = {absl::StrCat("other ", kOtherToken)};
  auto cluster = LocalCluster::Start(o);
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  auto open = [&](const std::string& job, const std::string& token)
      -> absl::StatusOr<testing::RankHandle> {
    testing::RankHandle h;
    ASSIGN_OR_RETURN(h.client, client::Client::Connect((*cluster)->daemon_target(0),
                                                       absl::Seconds(10)));
    client::SessionOptions so;
    so.job_id = job;
    so.world_size = 1;
    so.rank = 0;
    so.timeout = absl::Seconds(20);
    so.tenant_token = token;
    ASSIGN_OR_RETURN(h.session, h.client->OpenSession(so));
    return h;
  };
  auto a = open("quota-a", "");
  ASSERT_TRUE(a.ok()) << a.status();
  auto b = open("quota-b", "");
  ASSERT_TRUE(b.ok()) << b.status();
  auto other = open("quota-a", kOtherToken);
  ASSERT_TRUE(other.ok()) << other.status();

  auto in_a = a->session->AllocateBuffer(768 << 10);
  ASSERT_TRUE(in_a.ok()) << in_a.status();
  auto in_b = b->session->AllocateBuffer(512 << 10);
  ASSERT_FALSE(in_b.ok());
  EXPECT_EQ(in_b.status().code(), absl::StatusCode::kResourceExhausted) << in_b.status();
  EXPECT_NE(in_b.status().message().find(
                "allocating a buffer of 524288 bytes would exceed tenant 'lab''s buffer quota on "
                "this daemon of 1048576 bytes (786432 held by its sessions"),
            std::string::npos)
      << in_b.status();
  UniqueFd fd = Memfd(512 << 10);
  auto registered = b->session->RegisterBuffer(fd.get(), 512 << 10);
  EXPECT_EQ(registered.status().code(), absl::StatusCode::kResourceExhausted)
      << registered.status();
  // The other tenant's session, same job id, same daemon: its own quota.
  auto in_other = other->session->AllocateBuffer(768 << 10);
  EXPECT_TRUE(in_other.ok()) << in_other.status();
  // Closing session a frees its 768 KiB for the tenant.
  ASSERT_TRUE(a->session->Close().ok());
  in_b = b->session->AllocateBuffer(1 << 20);
  EXPECT_TRUE(in_b.ok()) << in_b.status();
  EXPECT_TRUE(b->session->Close().ok());
  EXPECT_TRUE(other->session->Close().ok());
  EXPECT_EQ((*cluster)->StopAll(), absl::OkStatus());
}

}  // namespace
}  // namespace gradsync
