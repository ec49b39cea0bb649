// The context of gradsyncd's calls to the coordinator about a job.
#ifndef GRADSYNC_WORKER_COORDINATOR_RPC_H_
#define GRADSYNC_WORKER_COORDINATOR_RPC_H_

#include <grpcpp/grpcpp.h>

#include <memory>
#include <string>

#include "absl/time/clock.h"
#include "absl/time/time.h"

namespace gradsync {

// A deadline `timeout` from now, and the tenant's token as bearer metadata
// when the session has one.
inline std::unique_ptr<grpc::ClientContext> CoordinatorRpcContext(
    absl::Duration timeout, const std::string& tenant_token = "") {
  auto ctx = std::make_unique<grpc::ClientContext>();
  ctx->set_deadline(absl::ToChronoTime(absl::Now() + timeout));
  if (!tenant_token.empty()) ctx->AddMetadata("authorization", "Bearer " + tenant_token);
  return ctx;
}

}  // namespace gradsync

#endif  // GRADSYNC_WORKER_COORDINATOR_RPC_H_
