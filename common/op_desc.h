// One description of a collective op from the SDK to the executor, and one of
// its outcome (NCCL's ncclInfo, Gloo's AllreduceOptions): the C++ SDK
// (client::CollectiveSpec adds the mapped Buffer), the shared-memory op queue
// (ipc::EncodeSubmission / DecodeSubmission), the gRPC Submit path and
// Session::Submit all pass an OpDesc; nothing copies it field by field into
// a look-alike. The edges that carry an op in another form convert it in one
// function each (docs/architecture.md, "One op, end to end").
//
// Plain data: no checks here. collective/op_validation.h (ValidateOp) is the
// one validator, shared by the C API, the SDK and gradsyncd.
#ifndef GRADSYNC_COMMON_OP_DESC_H_
#define GRADSYNC_COMMON_OP_DESC_H_

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "common/types.h"

namespace gradsync {

// One collective on a buffer of the submitting session. Buffer layouts
// (docs/collectives.md): allreduce, broadcast and reduce use `count`
// elements; reduce_scatter, allgather, alltoall, gather and scatter use
// world_size blocks of `count` elements each (rank r's own block is block r;
// gather's and scatter's non-root ranks use only that block); barrier uses
// none (buffer_id 0, count 0); send and recv use `count` elements (a recv's
// tensor must be the message's size and dtype).
struct OpDesc {
  CollectiveKind kind = CollectiveKind::kAllreduce;
  DType dtype = DType::kF32;
  ReduceOp op = ReduceOp::kSum;  // allreduce, reduce_scatter, reduce
  int root = 0;                  // broadcast, reduce, gather, scatter; the peer of
                                 // send and recv (recv: -1 = from any source)
  int32_t tag = 0;               // send, recv: matches them (torch's tag)
  double premul_factor = 1.0;    // premul_sum: this rank's input is multiplied by it
  uint64_t count = 0;            // elements (per block for the blocked collectives)
  uint64_t buffer_id = 0;        // the daemon's id; 0 = no buffer (a barrier only)
  uint64_t offset_bytes = 0;     // where the op starts in the buffer
  std::string name;              // identifies the op across ranks (<= kMaxOpNameBytes)
  std::string algorithm;         // "" or "auto": the job's choice, else the cost model's
  std::string codec;             // "": the job's; else collective/codec_request.h
  absl::Duration timeout = absl::ZeroDuration();  // from submission; zero = the job's default
};

// What a finished op reports.
struct OpResult {
  absl::Status status;           // the op's own outcome
  std::string algorithm;         // the plan that ran, e.g. "ring", "hier"
  absl::Duration queued_time;    // submission to start
  absl::Duration run_time;       // start to completion
  int source = -1;               // recv: the rank the message came from; send: the peer
};

// An op's timeout as the wires carry it (timeout_ms): whole milliseconds,
// a positive sub-millisecond value rounded up to 1 (so it stays a bound and
// does not become "the job's default").
inline int64_t TimeoutMillis(absl::Duration d) {
  int64_t ms = absl::ToInt64Milliseconds(d);
  if (d > absl::Milliseconds(ms)) ++ms;
  return ms;
}

}  // namespace gradsync

#endif  // GRADSYNC_COMMON_OP_DESC_H_
