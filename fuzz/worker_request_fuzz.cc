// libFuzzer target: gradsyncd's validation of what a local client sends — a
// Submit (worker/submit_validation.h turns it into an OpDesc; ValidateOp and
// CheckOpBuffer, collective/op_validation.h: fields, ranges, the requested
// plan against the job, where the op sits in its buffer) and an OpenSession
// (session shape, and the job id and options the daemon passes on to the
// coordinator, server/job_validation.cc). Input: [world_size lo, hi]
// [flags] [buffer size, 8 bytes] [kind] then the request message. Traps when
// an accepted request breaks what the executor relies on.
#include <cstdint>
#include <cstring>
#include <string>

#include "collective/op_validation.h"
#include "proto/worker.pb.h"
#include "server/job_registry.h"
#include "worker/submit_validation.h"

namespace {

void Check(bool ok) {
  if (!ok) __builtin_trap();
}

constexpr const char* kJobAlgorithms[] = {"", "auto", "ring", "tree", "hier", "ps", "oneshot",
                                          "bogus"};

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 12) return 0;
  gradsync::OpContext job;
  job.rank = 0;
  job.job_id = "fuzz";
  job.world_size = 1 + ((data[0] | (data[1] << 8)) % 4096);
  job.has_ps = (data[2] & 1) != 0;
  job.one_rank_per_daemon = (data[2] & 2) != 0;
  job.job_algorithm = kJobAlgorithms[(data[2] >> 2) % 8];
  // The job's codec: none, one, auto, or one that does not parse.
  static const char* const kJobCodecs[] = {"", "bf16", "auto:int8,fp8", "zip"};
  job.job_codec = kJobCodecs[(data[11] >> 1) % 4];
  uint64_t buffer_bytes;
  std::memcpy(&buffer_bytes, data + 3, 8);
  buffer_bytes %= uint64_t{1} << 41;
  const bool open_session = data[11] & 1;
  const std::string bytes(reinterpret_cast<const char*>(data + 12), size - 12);

  if (open_session) {
    gradsync::v1::OpenSessionRequest req;
    if (!req.ParseFromString(bytes)) return 0;
    if (gradsync::CheckSessionShape(req.world_size(), req.rank(), req.options().tcp_streams())
            .ok()) {
      Check(req.world_size() >= 1 && req.rank() < req.world_size());
    }
    if (gradsync::ValidateJobId(req.job_id()).ok()) {
      Check(!req.job_id().empty() && req.job_id().size() <= gradsync::kMaxScopedJobIdLength);
    }
    (void)gradsync::ValidateJobOptions(req.job_id(), req.options());
    return 0;
  }
  gradsync::v1::SubmitRequest req;
  if (!req.ParseFromString(bytes)) return 0;
  auto args = gradsync::OpDescFromRequest(req, 0);
  if (!args.ok()) return 0;
  auto shape = gradsync::ValidateOp(*args, job);
  if (!shape.ok()) {
    Check(!shape.status().message().empty());
    return 0;
  }
  const uint64_t esize = gradsync::DTypeSize(args->dtype);
  Check(esize > 0 && args->timeout >= absl::ZeroDuration());
  Check(shape->bytes == args->count * esize * shape->blocks);
  Check(shape->bytes <= gradsync::kMaxOpBytes);
  Check(args->buffer_id != 0 || args->kind == gradsync::CollectiveKind::kBarrier);
  if (gradsync::IsRootedCollective(args->kind)) {
    Check(args->root >= 0 && args->root < job.world_size);
  }
  if (gradsync::CheckOpBuffer(*args, job, *shape, buffer_bytes).ok()) {
    Check(args->offset_bytes <= buffer_bytes && shape->bytes <= buffer_bytes - args->offset_bytes);
    Check(args->offset_bytes % esize == 0);
  }
  return 0;
}
