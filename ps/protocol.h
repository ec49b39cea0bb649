// The parameter-server wire protocol between a worker daemon (PsWorker) and a
// shard (PsShard), on the data-plane framing of transport/wire.h. The full
// description is in ps/README.md; in short:
//
//   * One TCP connection per (worker, shard) pair per job. The Hello names the
//     job "ps/<job>" (PsJobId), src_rank = worker rank, dst_rank = shard index,
//     world_size = number of workers. The shard answers the HelloAck.
//   * Per step, the worker sends a step header: a DATA frame with slot =
//     kControlSlot, op_seq = step, dtype, payload = StepHeaderWire + this
//     shard's partition table (PartitionEntryWire, id order).
//   * Then it pushes each partition of that shard: a DATA frame with op_seq =
//     step, slot = partition id, offset = partition offset, dtype, payload =
//     the partition's bytes.
//   * The shard sends each partition's reduced result back the same way, as
//     soon as it is ready (any partition order).
//   * Errors travel as ABORT frames: op_seq = the step they fail (or
//     kConnectionStep: the connection is about to close), offset = the
//     absl::StatusCode, payload = the message. Unlike the collective
//     transport, an ABORT for a step leaves the connection usable.
//
// Everything here is stateless and thread-safe.
#ifndef GRADSYNC_PS_PROTOCOL_H_
#define GRADSYNC_PS_PROTOCOL_H_

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "common/net.h"
#include "common/types.h"
#include "ps/slicer.h"
#include "transport/wire.h"

namespace gradsync::ps {

// Data-plane job ids of parameter-server connections start with this. Job
// ids are [A-Za-z0-9._-], after "TENANT/" for a tenant's job, and no tenant
// may be called "ps" (server/tenants.h), so they never collide.
inline constexpr char kPsJobPrefix[] = "ps/";
inline constexpr size_t kMaxJobIdBytes = transport::kMaxJobIdBytes - (sizeof(kPsJobPrefix) - 1);

// "ps/<job_id>"; InvalidArgument if job_id is empty or longer than kMaxJobIdBytes.
absl::StatusOr<std::string> PsJobId(absl::string_view job_id);
// The job id inside a PS job id ("ps/j" -> "j"); other ids unchanged.
absl::string_view JobOfPsJobId(absl::string_view ps_job_id);

// op_seq of an ABORT frame that is about the whole connection, not one step.
inline constexpr uint64_t kConnectionStep = ~0ull;
// The largest tensor a step may carry.
inline constexpr uint64_t kMaxTensorBytes = 1ull << 40;

inline constexpr uint32_t kStepHeaderMagic = 0x48535350;  // "PSSH"
inline constexpr uint16_t kStepHeaderVersion = 1;

// Payload of a step-header frame (little-endian), followed by
// `shard_partitions` PartitionEntryWire.
struct StepHeaderWire {
  uint32_t magic;             // kStepHeaderMagic
  uint16_t version;           // kStepHeaderVersion
  uint8_t dtype;              // gradsync::DType
  uint8_t reduce_op;          // gradsync::ReduceOp
  int32_t workers;            // N, the job's workers
  int32_t rank;               // the sender, 0 <= rank < N
  int32_t shards;             // K, the shards the tensor is spread over
  int32_t shard;              // the receiving shard, 0 <= shard < K
  uint32_t partitions;        // partitions of the whole tensor
  uint32_t shard_partitions;  // table entries that follow (this shard's)
  uint64_t tensor_bytes;
  uint64_t partition_bytes;  // as passed to the slicer
};
static_assert(sizeof(StepHeaderWire) == 48, "StepHeaderWire is 48 bytes on the wire");

struct PartitionEntryWire {
  uint32_t id;
  uint32_t reserved;  // 0
  uint64_t offset;
  uint64_t bytes;
};
static_assert(sizeof(PartitionEntryWire) == 24, "PartitionEntryWire is 24 bytes on the wire");

// The largest step-header payload: the fixed part and one entry per partition.
inline constexpr uint64_t kMaxStepHeaderBytes =
    sizeof(StepHeaderWire) + uint64_t{kMaxPartitions} * sizeof(PartitionEntryWire);

// A step header, decoded.
struct StepHeader {
  uint64_t step = 0;  // op_seq of the frame
  DType dtype = DType::kF32;
  ReduceOp op = ReduceOp::kSum;
  int workers = 1;
  int rank = 0;
  int shards = 1;
  int shard = 0;
  uint64_t tensor_bytes = 0;
  uint64_t partition_bytes = 0;
  uint32_t partitions = 0;
  std::vector<Partition> table;  // this shard's partitions, increasing ids
};

// The frame payload for `h` (the step travels in the frame's op_seq).
std::string EncodeStepHeader(const StepHeader& h);
// Parses and checks a step-header payload: field ranges, sizes (at most
// kMaxTensorBytes, kMaxPartitions, kMaxPartitionBytes), a non-empty table in
// increasing id order whose partitions are whole elements inside the tensor.
// InvalidArgument naming the problem.
absl::StatusOr<StepHeader> DecodeStepHeader(uint64_t step, absl::string_view payload);
// Whether two workers' headers describe the same step (all fields but rank).
bool SameStep(const StepHeader& a, const StepHeader& b);
// e.g. "f32 sum of 4000 bytes in 4 partitions of 1024 bytes over 2 shards by 3 workers
// (2 partitions here, table 5f0e3a21)".
std::string DescribeStepHeader(const StepHeader& h);

transport::FrameHeader MakeFrame(transport::FrameType type, uint64_t job_tag, uint64_t epoch,
                                 uint64_t step, uint32_t slot, uint8_t dtype, uint64_t offset,
                                 uint32_t length);
// The ABORT frame for `status` (not OK) about `step`; the message is cut to
// kMaxAbortBytes. Returns the header; *payload receives the message bytes.
transport::FrameHeader MakeAbortFrame(uint64_t job_tag, uint64_t epoch, uint64_t step,
                                      const absl::Status& status, std::string* payload);
// The status an ABORT frame carries (Aborted if its code is not a valid one).
absl::Status AbortStatus(const transport::FrameHeader& h, absl::string_view message);


}  // namespace gradsync::ps

#endif  // GRADSYNC_PS_PROTOCOL_H_
