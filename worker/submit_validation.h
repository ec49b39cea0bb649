#pragma once
// The checks of an op a client submits (gRPC Submit or its op queue) that
// need no session state: fields, ranges, the requested plan against the job.
// Session::Submit runs them, then checks the buffer under its lock.

#include <cstdint>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "common/types.h"
#include "proto/worker.pb.h"

namespace gradsync {

// The strings are views: the caller keeps them alive during Submit (the
// session copies what it keeps).
struct SubmitArgs {
  CollectiveKind kind = CollectiveKind::kAllreduce;
  absl::string_view name;
  DType dtype = DType::kF32;
  ReduceOp op = ReduceOp::kSum;
  uint64_t count = 0;
  uint64_t buffer_id = 0;  // 0 with count 0: no buffer (barrier)
  uint64_t offset_bytes = 0;
  int root = 0;
  absl::string_view algorithm;  // "" or "auto": the job's, else the cost model's choice
  absl::Duration timeout = absl::ZeroDuration();  // zero: the job default
};

// What a submission is checked against.
struct SubmitJob {
  absl::string_view job_id;
  int world_size = 1;
  absl::string_view job_algorithm;  // forced for the job; "" = cost model
  bool has_ps = false;              // the epoch has parameter-server shards
  bool one_rank_per_daemon = true;  // no two ranks share a daemon ("hier" has nothing to do)
};

// What the checks found.
struct SubmitShape {
  uint64_t bytes = 0;   // of the op in its buffer (count x element size x blocks)
  uint64_t blocks = 1;  // world size for the blocked collectives, else 1
  uint8_t plan_code = 0;  // RequestedPlanCode
};

// A SubmitRequest's fields as SubmitArgs (views into `req`); INVALID_ARGUMENT
// for an enum value out of range or a negative timeout.
absl::StatusOr<SubmitArgs> SubmitArgsFromRequest(const v1::SubmitRequest& req);

// Root range, name length, count (at most 2^40 bytes), the plan, the
// timeout, and a barrier without a buffer having count 0. INVALID_ARGUMENT
// naming the op.
absl::StatusOr<SubmitShape> CheckSubmit(const SubmitArgs& a, const SubmitJob& job);

// The op's `shape.bytes` at a.offset_bytes fit a buffer of `buffer_bytes`
// and the offset is aligned to the element size.
absl::Status CheckBufferRange(const SubmitArgs& a, const SubmitShape& shape,
                              uint64_t buffer_bytes);

// An OpenSession's world size (1..transport::kMaxWorldSize), rank (-1: any)
// and tcp_streams (0..16).
absl::Status CheckSessionShape(int world_size, int rank, int tcp_streams);

}  // namespace gradsync
