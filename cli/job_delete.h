// `gradsync job delete ID`: ends a job at the coordinator (operator
// certificate; with a tenant token, only that tenant's jobs).
#ifndef GRADSYNC_CLI_JOB_DELETE_H_
#define GRADSYNC_CLI_JOB_DELETE_H_

#include <string>

#include "absl/status/statusor.h"
#include "cli/status.h"

namespace gradsync {

// Deletes o.job (o.coordinator, o.tls, o.tenant_token or
// $GRADSYNC_TENANT_TOKEN) and returns the line to print; the coordinator's
// error, naming the cause, otherwise.
absl::StatusOr<std::string> RunJobDelete(const StatusOptions& o, const std::string& reason);

}  // namespace gradsync

#endif  // GRADSYNC_CLI_JOB_DELETE_H_
