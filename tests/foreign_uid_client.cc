// Test helper: becomes uid/gid 65534 (nobody), then calls every session call
// of gradsyncd on another process's session and prints one line per call:
//   CALL: CODE MESSAGE
//   foreign_uid_client TARGET SESSION_ID
#include <unistd.h>

#include <cstdio>
#include <memory>
#include <string>

#include <grpcpp/grpcpp.h>

#include "absl/time/clock.h"
#include "proto/worker.grpc.pb.h"

namespace {

template <typename Call>
void Try(const char* name, Call call) {
  grpc::ClientContext ctx;
  ctx.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(5)));
  const grpc::Status s = call(&ctx);
  std::printf("%s: %d %s\n", name, static_cast<int>(s.error_code()), s.error_message().c_str());
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 3) {
    std::fprintf(stderr, "usage: foreign_uid_client TARGET SESSION_ID\n");
    return 2;
  }
  if (::setgid(65534) != 0 || ::setuid(65534) != 0) {
    std::printf("cannot become uid 65534 (not root?)\n");
    return 3;
  }
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
