// Test helper: becomes uid/gid 65534 (nobody), then calls every session call
// of gradsyncd on another process's session and prints one line per call:
//   CALL: CODE MESSAGE
//   foreign_uid_client TARGET SESSION_ID
// or, with `own`, opens its own session (job "foreign-own", world 1, tenant
// token from $GRADSYNC_TENANT_TOKEN) on a daemon without an fd socket and
// prints, for a named buffer and op queue, the segment's owner and whether
// it could open it:
//   buffer|queue: uid=UID open=ok|ERRNO
//   foreign_uid_client own TARGET
// or, with `sdk`, drops every supplementary group (a plain user in group
// 65534 only), opens a session with the C++ SDK (job "foreign-sdk", world 1;
// its op queue comes from the fd socket), allocates and fetches a buffer of
// 512 KiB and
// prints "sdk: ok" or "sdk: STATUS":
//   foreign_uid_client sdk TARGET
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>

#include <cstdio>
#include <memory>
#include <string>

#include <grp.h>

#include <grpcpp/grpcpp.h>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "client/client.h"
#include "proto/worker.grpc.pb.h"

namespace {

template <typename Call>
void Try(const char* name, Call call) {
  grpc::ClientContext ctx;
  ctx.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(5)));
  const grpc::Status s = call(&ctx);
  std::printf("%s: %d %s\n", name, static_cast<int>(s.error_code()), s.error_message().c_str());
}

void PrintSegment(const char* what, const std::string& name) {
  struct stat st {};
  const std::string path = "/dev/shm" + name;
  const long uid = ::stat(path.c_str(), &st) == 0 ? static_cast<long>(st.st_uid) : -1;
  const int fd = ::shm_open(name.c_str(), O_RDWR, 0);
  std::printf("%s: uid=%ld open=%s\n", what, uid, fd >= 0 ? "ok" : std::to_string(errno).c_str());
  if (fd >= 0) ::close(fd);
}

int OwnSession(const std::string& target) {
  auto stub = gradsync::v1::Worker::NewStub(
      grpc::CreateChannel(target, grpc::InsecureChannelCredentials()));
  gradsync::v1::OpenSessionRequest open;
  open.set_job_id("foreign-own");
  open.set_world_size(1);
  open.set_rank(0);
  open.set_timeout_ms(20000);
  if (const char* t = std::getenv("GRADSYNC_TENANT_TOKEN")) open.set_tenant_token(t);
  gradsync::v1::OpenSessionResponse session;
  {
    grpc::ClientContext ctx;
    const grpc::Status s = stub->OpenSession(&ctx, open, &session);
    if (!s.ok()) {
      std::printf("OpenSession: %d %s\n", static_cast<int>(s.error_code()),
                  s.error_message().c_str());
      return 1;
    }
  }
  gradsync::v1::AllocateBufferRequest alloc;
  alloc.set_session_id(session.session_id());
  alloc.set_size_bytes(4096);
  gradsync::v1::AllocateBufferResponse buffer;
  {
    grpc::ClientContext ctx;
    if (!stub->AllocateBuffer(&ctx, alloc, &buffer).ok()) return 1;
  }
  PrintSegment("buffer", buffer.shm_name());
  gradsync::v1::OpenOpQueueRequest oq;
  oq.set_session_id(session.session_id());
  gradsync::v1::OpenOpQueueResponse queue;
  {
    grpc::ClientContext ctx;
    if (!stub->OpenOpQueue(&ctx, oq, &queue).ok()) return 1;
  }
  PrintSegment("queue", queue.shm_name());
  gradsync::v1::CloseSessionRequest close;
  close.set_session_id(session.session_id());
  gradsync::v1::CloseSessionResponse closed;
  grpc::ClientContext ctx;
  return stub->CloseSession(&ctx, close, &closed).ok() ? 0 : 1;
}

int SdkSession(const std::string& target) {
  auto client = gradsync::client::Client::Connect(target, absl::Seconds(10));
  if (!client.ok()) {
    std::printf("sdk: %s\n", client.status().ToString().c_str());
    return 1;
  }
  gradsync::client::SessionOptions options;
  options.job_id = absl::StrCat("foreign-sdk-", ::getpid());
  options.world_size = 1;
  options.timeout = absl::Seconds(20);
  auto session = (*client)->OpenSession(options);
  if (!session.ok()) {
    std::printf("sdk: %s\n", session.status().ToString().c_str());
    return 1;
  }
  auto buffer = (*session)->AllocateBuffer(512 << 10);
  if (!buffer.ok()) {
    std::printf("sdk: %s\n", buffer.status().ToString().c_str());
    return 1;
  }
  std::printf("sdk: ok\n");
  return (*session)->Close().ok() ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 3) {
    std::fprintf(stderr, "usage: foreign_uid_client TARGET SESSION_ID | own TARGET | sdk TARGET\n");
    return 2;
  }
  if (std::string(argv[1]) == "sdk" && ::setgroups(0, nullptr) != 0) {
    std::printf("cannot drop the supplementary groups (not root?)\n");
    return 3;
  }
  if (::setgid(65534) != 0 || ::setuid(65534) != 0) {
    std::printf("cannot become uid 65534 (not root?)\n");
    return 3;
  }
  if (std::string(argv[1]) == "own") return OwnSession(argv[2]);
  if (std::string(argv[1]) == "sdk") return SdkSession(argv[2]);
  auto stub = gradsync::v1::Worker::NewStub(
      grpc::CreateChannel(argv[1], grpc::InsecureChannelCredentials()));
  const std::string id = argv[2];
  Try("AllocateBuffer", [&](grpc::ClientContext* ctx) {
    gradsync::v1::AllocateBufferRequest req;
    req.set_session_id(id);
    req.set_size_bytes(4096);
    gradsync::v1::AllocateBufferResponse resp;
    return stub->AllocateBuffer(ctx, req, &resp);
  });
  Try("Submit", [&](grpc::ClientContext* ctx) {
    gradsync::v1::SubmitRequest req;
    req.set_session_id(id);
    req.set_collective(gradsync::v1::COLLECTIVE_TYPE_ALLREDUCE);
    req.set_name("foreign");
    req.set_dtype(gradsync::v1::DATA_TYPE_F32);
    req.set_reduce_op(gradsync::v1::REDUCE_OP_SUM);
    req.set_count(1);
    req.set_buffer_id(1);
    gradsync::v1::SubmitResponse resp;
    return stub->Submit(ctx, req, &resp);
  });
  Try("OpenOpQueue", [&](grpc::ClientContext* ctx) {
    gradsync::v1::OpenOpQueueRequest req;
    req.set_session_id(id);
    gradsync::v1::OpenOpQueueResponse resp;
    return stub->OpenOpQueue(ctx, req, &resp);
  });
  Try("CloseSession", [&](grpc::ClientContext* ctx) {
    gradsync::v1::CloseSessionRequest req;
    req.set_session_id(id);
    gradsync::v1::CloseSessionResponse resp;
    return stub->CloseSession(ctx, req, &resp);
  });
  return 0;
}
