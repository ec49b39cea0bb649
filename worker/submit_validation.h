#pragma once
// What gradsyncd checks of a client's request before a session has it: the
// gRPC edge of an op (a SubmitRequest as an OpDesc; Session::Submit then runs
// ValidateOp, collective/op_validation.h, as for an op from the op queue) and
// the shape of an OpenSession.

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/op_desc.h"
#include "proto/worker.pb.h"

namespace gradsync {

// A SubmitRequest's fields as an OpDesc (the inverse of the SDK's
// SubmitRequestOf, client/op_channel.cc). INVALID_ARGUMENT, in ValidateOp's
// words and naming `rank` (the session's), for an enum value that is not
// valid; everything else is ValidateOp's to check.
absl::StatusOr<OpDesc> OpDescFromRequest(const v1::SubmitRequest& req, int rank);

// An OpenSession's world size (1..transport::kMaxWorldSize), rank (-1: any)
// and tcp_streams (0..16).
absl::Status CheckSessionShape(int world_size, int rank, int tcp_streams);

}  // namespace gradsync
