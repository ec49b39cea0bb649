// absl::Status <-> grpc::Status at service edges. Codes map 1:1 (both follow
// google.rpc.Code); messages are kept verbatim.
#ifndef GRADSYNC_COMMON_GRPC_STATUS_H_
#define GRADSYNC_COMMON_GRPC_STATUS_H_

#include <grpcpp/support/status.h>

#include "absl/status/status.h"

namespace gradsync {

inline grpc::Status ToGrpcStatus(const absl::Status& s) {
  if (s.ok()) return grpc::Status::OK;
  return grpc::Status(static_cast<grpc::StatusCode>(s.code()), std::string(s.message()));
}

inline absl::Status FromGrpcStatus(const grpc::Status& s) {
  if (s.ok()) return absl::OkStatus();
  return absl::Status(static_cast<absl::StatusCode>(s.error_code()), s.error_message());
}

}  // namespace gradsync

#endif  // GRADSYNC_COMMON_GRPC_STATUS_H_
