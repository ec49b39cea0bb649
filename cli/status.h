// `gradsync status`: jobs, ranks, epochs, each rank's last completed op, and
// for an op that is waiting: which ranks have arrived, which have not, for
// how long. The answer to "which rank is hanging my job?".
#ifndef GRADSYNC_CLI_STATUS_H_
#define GRADSYNC_CLI_STATUS_H_

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "common/tls.h"
#include "absl/time/time.h"
#include "proto/coordinator.grpc.pb.h"

namespace gradsync {

struct StatusOptions {
  std::string coordinator = "127.0.0.1:7070";
  std::string job;  // "" = every job
  absl::Duration timeout = absl::Seconds(5);
  TlsConfig tls;  // toward the coordinator and the daemons' status services
  // A tenant's token: only that tenant's jobs, by their own ids. "":
  // $GRADSYNC_TENANT_TOKEN, else none (an operator then sees every job as
  // TENANT/JOB).
  std::string tenant_token;
};

// A stub for o.coordinator with o.tls's credentials.
absl::StatusOr<std::unique_ptr<v1::Coordinator::Stub>> CoordinatorStub(const StatusOptions& o);
// o.tenant_token, else $GRADSYNC_TENANT_TOKEN, else "".
std::string TenantToken(const StatusOptions& o);

// Prints the report to stdout. Returns the number of ranks found hanging
// (blocking an op of their job for longer than a second).
absl::StatusOr<int> RunStatus(const StatusOptions& options);

}  // namespace gradsync

#endif  // GRADSYNC_CLI_STATUS_H_
