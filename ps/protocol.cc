#include "ps/protocol.h"

#include <errno.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/uio.h>

#include <algorithm>
#include <cstring>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/strip.h"
#include "common/status_macros.h"

namespace gradsync::ps {

using transport::FrameHeader;
using transport::FrameType;

static_assert(kMaxPartitionBytes == transport::kMaxFrameBytes, "a partition travels as one frame");

absl::StatusOr<std::string> PsJobId(absl::string_view job_id) {
  if (job_id.empty() || job_id.size() > kMaxJobIdBytes) {
    return absl::InvalidArgumentError(absl::StrCat("parameter-server job ids are 1..",
                                                   kMaxJobIdBytes, " bytes, got ", job_id.size()));
  }
  return absl::StrCat(kPsJobPrefix, job_id);
}

absl::string_view JobOfPsJobId(absl::string_view ps_job_id) {
  absl::ConsumePrefix(&ps_job_id, kPsJobPrefix);
  return ps_job_id;
}

std::string EncodeStepHeader(const StepHeader& h) {
  StepHeaderWire w;
  std::memset(&w, 0, sizeof(w));
  w.magic = kStepHeaderMagic;
  w.version = kStepHeaderVersion;
  w.dtype = static_cast<uint8_t>(h.dtype);
  w.reduce_op = static_cast<uint8_t>(h.op);
  w.workers = h.workers;
  w.rank = h.rank;
  w.shards = h.shards;
  w.shard = h.shard;
  w.partitions = h.partitions;
  w.shard_partitions = static_cast<uint32_t>(h.table.size());
  w.tensor_bytes = h.tensor_bytes;
  w.partition_bytes = h.partition_bytes;
  std::string out(sizeof(w) + h.table.size() * sizeof(PartitionEntryWire), '\0');
  std::memcpy(out.data(), &w, sizeof(w));
  char* p = out.data() + sizeof(w);
  for (const Partition& part : h.table) {
    PartitionEntryWire e{part.id, 0, part.offset_bytes, part.bytes};
    std::memcpy(p, &e, sizeof(e));
    p += sizeof(e);
  }
  return out;
}

absl::StatusOr<StepHeader> DecodeStepHeader(uint64_t step, absl::string_view payload) {
  auto bad = [](auto&&... args) {
    return absl::InvalidArgumentError(absl::StrCat("bad step header: ", args...));
  };
  StepHeaderWire w;
  if (payload.size() < sizeof(w)) return bad(payload.size(), " bytes");
  std::memcpy(&w, payload.data(), sizeof(w));
  if (w.magic != kStepHeaderMagic) return bad(absl::StrFormat("magic 0x%08x", w.magic));
  if (w.version != kStepHeaderVersion) return bad("version ", w.version);
  if (!IsValidDType(w.dtype)) return bad("dtype ", w.dtype);
  if (!IsValidReduceOp(w.reduce_op)) return bad("reduce op ", w.reduce_op);
  if (w.workers < 1 || w.workers > transport::kMaxWorldSize || w.rank < 0 || w.rank >= w.workers) {
    return bad("rank ", w.rank, " of ", w.workers, " workers");
  }
  if (w.shards < 1 || w.shards > transport::kMaxWorldSize || w.shard < 0 || w.shard >= w.shards) {
    return bad("shard ", w.shard, " of ", w.shards);
  }
  StepHeader h;
  h.step = step;
  h.dtype = static_cast<DType>(w.dtype);
  h.op = static_cast<ReduceOp>(w.reduce_op);
  h.workers = w.workers;
  h.rank = w.rank;
  h.shards = w.shards;
  h.shard = w.shard;
  h.tensor_bytes = w.tensor_bytes;
  h.partition_bytes = w.partition_bytes;
  h.partitions = w.partitions;
  const uint64_t es = DTypeSize(h.dtype);
  if (h.tensor_bytes == 0 || h.tensor_bytes > kMaxTensorBytes || h.tensor_bytes % es != 0) {
    return bad("tensor of ", h.tensor_bytes, " bytes (", DTypeName(h.dtype), ", at most ",
               kMaxTensorBytes, ")");
  }
  if (h.partition_bytes == 0) return bad("partition size 0");
  if (h.partitions == 0 || h.partitions > kMaxPartitions) {
    return bad(h.partitions, " partitions (at most ", kMaxPartitions, ")");
  }
  if (w.shard_partitions == 0 || w.shard_partitions > h.partitions ||
      payload.size() != sizeof(w) + uint64_t{w.shard_partitions} * sizeof(PartitionEntryWire)) {
    return bad(w.shard_partitions, " of ", h.partitions, " partitions in ", payload.size(),
               " bytes");
  }
  h.table.resize(w.shard_partitions);
  const char* p = payload.data() + sizeof(w);
  for (uint32_t i = 0; i < w.shard_partitions; ++i, p += sizeof(PartitionEntryWire)) {
    PartitionEntryWire e;
    std::memcpy(&e, p, sizeof(e));
    if (e.id >= h.partitions || (i > 0 && e.id <= h.table[i - 1].id)) {
      return bad("partition id ", e.id, " at entry ", i, " (ids must increase, below ",
                 h.partitions, ")");
    }
    if (e.bytes == 0 || e.bytes > kMaxPartitionBytes || e.bytes % es != 0 || e.offset % es != 0 ||
        e.offset > h.tensor_bytes || e.bytes > h.tensor_bytes - e.offset) {
      return bad("partition ", e.id, " [", e.offset, ", +", e.bytes, ") of a ", h.tensor_bytes,
                 "-byte ", DTypeName(h.dtype), " tensor");
    }
    h.table[i] = Partition{e.id, e.offset, e.bytes, h.shard};
  }
  return h;
}

bool SameStep(const StepHeader& a, const StepHeader& b) {
  return a.step == b.step && a.dtype == b.dtype && a.op == b.op && a.workers == b.workers &&
         a.shards == b.shards && a.shard == b.shard && a.tensor_bytes == b.tensor_bytes &&
         a.partition_bytes == b.partition_bytes && a.partitions == b.partitions &&
         a.table == b.table;
}

std::string DescribeStepHeader(const StepHeader& h) {
  uint64_t digest = 1469598103934665603ull;  // FNV-1a of the table
  for (const Partition& p : h.table) {
    for (uint64_t v : {uint64_t{p.id}, p.offset_bytes, p.bytes}) {
      for (int b = 0; b < 8; ++b) {
        digest ^= (v >> (8 * b)) & 0xff;
        digest *= 1099511628211ull;
      }
    }
  }
  return absl::StrFormat(
      "%s %s of %d bytes in %d partitions of %d bytes over %d shards by %d workers (%d "
      "partitions here, table %08x)",
      DTypeName(h.dtype), ReduceOpName(h.op), h.tensor_bytes, h.partitions, h.partition_bytes,
      h.shards, h.workers, h.table.size(), static_cast<uint32_t>(digest ^ (digest >> 32)));
}

FrameHeader MakeFrame(FrameType type, uint64_t job_tag, uint64_t epoch, uint64_t step,
                      uint32_t slot, uint8_t dtype, uint64_t offset, uint32_t length) {
  FrameHeader h;
  h.magic = transport::kFrameMagic;
  h.version = transport::kWireVersion;
  h.type = static_cast<uint8_t>(type);
  h.dtype = dtype;
  h.length = length;
  h.slot = slot;
  h.job_tag = job_tag;
  h.epoch = epoch;
  h.op_seq = step;
  h.offset = offset;
  return h;
}

FrameHeader MakeAbortFrame(uint64_t job_tag, uint64_t epoch, uint64_t step,
                           const absl::Status& status, std::string* payload) {
  *payload = std::string(status.message().substr(0, transport::kMaxAbortBytes));
  const absl::StatusCode code = status.ok() ? absl::StatusCode::kAborted : status.code();
  return MakeFrame(FrameType::kAbort, job_tag, epoch, step, transport::kControlSlot, 0,
                   static_cast<uint64_t>(code), static_cast<uint32_t>(payload->size()));
}

absl::Status AbortStatus(const FrameHeader& h, absl::string_view message) {
  absl::StatusCode code = absl::StatusCode::kAborted;
  if (h.offset > 0 && h.offset <= static_cast<uint64_t>(absl::StatusCode::kUnauthenticated)) {
    code = static_cast<absl::StatusCode>(h.offset);
  }
  return absl::Status(code, message);
}


}  // namespace gradsync::ps
