#include "cli/job_delete.h"

#include <grpcpp/grpcpp.h>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/grpc_status.h"
#include "proto/coordinator.grpc.pb.h"

namespace gradsync {

absl::StatusOr<std::string> RunJobDelete(const StatusOptions& o, const std::string& reason) {
  if (o.job.empty()) return absl::InvalidArgumentError("which job? (gradsync job delete ID)");
  absl::StatusOr<std::unique_ptr<v1::Coordinator::Stub>> coord = CoordinatorStub(o);
  if (!coord.ok()) return coord.status();
  const std::string token = TenantToken(o);
  grpc::ClientContext ctx;
  ctx.set_deadline(absl::ToChronoTime(absl::Now() + o.timeout));
  if (!token.empty()) ctx.AddMetadata("authorization", "Bearer " + token);
  v1::DeleteJobRequest req;
  req.set_job_id(o.job);
  req.set_reason(reason);
  v1::DeleteJobResponse resp;
  grpc::Status s = (*coord)->DeleteJob(&ctx, req, &resp);
  if (!s.ok()) {
    return absl::Status(FromGrpcStatus(s).code(),
                        absl::StrCat("coordinator ", o.coordinator, ": ", s.error_message()));
  }
  return absl::StrCat("deleted job '", o.job, "' (epoch ", resp.epoch(), ", ", resp.members(),
                      " members; running ranks fail at their next heartbeat)");
}

}  // namespace gradsync
