// The worker-daemon side of the parameter-server data path.
//
// A PsWorker connects one worker rank of one job to the job's K shards and
// runs synchronous steps: PushPull cuts the tensor with the Slicer, sends each
// shard a step header, pushes every partition to its shard and receives every
// partition's reduced result straight into the caller's buffer.
//
// Transport: the connections are one client context of the data plane's
// device (transport::Device::ConnectToServers: shard k = peer k), made at the
// first step and kept while steps succeed. The result of every partition in
// flight is a posted receive, so results complete in whatever order the
// shards finish them.
//
// Pipelining: one thread (the caller's) drives the context: pushes and
// results interleave, so partition 0's result arrives while partition 7 is
// still being pushed. At most `max_inflight` partitions per shard are pushed
// and not yet pulled back.
//
// Result: each partition's bytes are the shard's rank-order reduction (see
// ps/shard.h), the same on every worker.
//
// Errors (the step is then failed on every worker of the job):
//   * Unavailable "ps shard 1 (127.0.0.1:5000) lost while pulling partition 7
//     of step 3: closed by peer" when a shard connection breaks (also
//     "...while pushing partition 7...", "ps shard 1 (...): cannot connect: ...");
//   * DeadlineExceeded "ps shard 1 (127.0.0.1:5000): step 3 timed out waiting
//     for partition 7 (...)" at `deadline`;
//   * errors the shard reports (a rank that never pushed, mismatched step
//     headers, a refused stale step, ...) verbatim, with the shard's code;
//   * InvalidArgument for bad arguments or a slicer that breaks its contract;
//   * the Abort() reason.
// After an error the PsWorker tells every shard it can reach (an ABORT for
// the step with the error's code) and closes the context; the next PushPull
// reconnects. So does a step after a shard closed an idle connection.
//
// Thread-safety: PushPull from one thread at a time; Abort and stats from any.
#ifndef GRADSYNC_PS_WORKER_CLIENT_H_
#define GRADSYNC_PS_WORKER_CLIENT_H_

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/net.h"
#include "common/types.h"
#include "ps/slicer.h"
#include "common/tls.h"
#include "transport/device.h"
#include "transport/memory.h"

namespace gradsync::ps {

struct PsWorkerOptions {
  // The job's id as the daemons key it ("TENANT/JOB" or "JOB", at most
  // kMaxJobIdBytes = 189 bytes); the connections use "ps/<job_id>".
  std::string job_id;
  uint64_t epoch = 0;
  // Shard k's address; every worker of the job lists the same shards in the
  // same order.
  std::vector<HostPort> shards;
  // The key shard k proves, and this worker proves back, at each connection
  // (PsShardKey of the job key and the shard's id; missing: empty).
  std::vector<std::string> shard_keys;
  // TLS on every shard connection, bound to its shard key (the job's
  // data_tls); each shard must present a PS certificate (OU=ps).
  bool encrypt = false;
  // Partitions pushed to one shard and not yet pulled back (>= 1).
  int max_inflight = 8;
  // The data plane's device (not owned; outlives the PsWorker). Null: a
  // dial-only TCP device of the PsWorker's own, with socket_buffer_bytes and
  // the node certificate `tls` (for `encrypt`).
  transport::Device* device = nullptr;
  int socket_buffer_bytes = 0;  // 0: the kernel's autotuned buffers
  TlsConfig tls;
};

struct PsWorkerStats {
  uint64_t steps = 0;  // PushPull calls that succeeded
  uint64_t steps_failed = 0;
  uint64_t bytes_pushed = 0;  // partition payload bytes
  uint64_t bytes_pulled = 0;
  uint64_t connects = 0;  // shard connections made
};

// The buffer a PushPull's data lies in and what keeps it alive (a daemon's
// shared-memory segment): the PsWorker registers it once per connection to
// the shards instead of once per step.
struct PsMemory {
  transport::Buffer whole;
  std::weak_ptr<const void> owner;
};

class PsWorker {
 public:
  // Checks the options (InvalidArgument); connects nothing yet.
  static absl::StatusOr<std::unique_ptr<PsWorker>> Create(PsWorkerOptions options);
  ~PsWorker();

  // One synchronous step: data[0, count) of `dtype` is reduced with `op`
  // across the job's `world` workers (this one is `rank`) and replaced by
  // the result. Steps must increase from call to call. `partition_bytes` and
  // `slicer` cut the tensor (every worker must pass the same). count == 0
  // returns OK at once. `world` and `rank` name this worker in the
  // connections: a call with other values than the previous one reconnects.
  // With `memory` (data lies in memory->whole), the registration is cached.
  absl::Status PushPull(uint64_t step, void* data, size_t count, DType dtype, ReduceOp op,
                        int world, int rank, uint64_t partition_bytes, const Slicer& slicer,
                        absl::Time deadline, const PsMemory* memory = nullptr);

  // Fails the running PushPull (it returns promptly) and every later one with
  // `reason`. Any thread.
  void Abort(const absl::Status& reason);

  PsWorkerStats stats() const;
  int shards() const { return static_cast<int>(options_.shards.size()); }

 private:
  class Run;  // one PushPull's state (worker_client.cc)
  explicit PsWorker(PsWorkerOptions options, std::string ps_job_id);
  std::string ShardName(int k) const;
  // Keeps the context if every shard is still there, else connects anew.
  absl::Status EnsureContext(absl::Time deadline);
  void DropContext();

  const PsWorkerOptions options_;
  const std::string ps_job_id_;
  std::unique_ptr<transport::Device> own_device_;  // when options_.device is null
  transport::Device* device_ = nullptr;
  std::unique_ptr<transport::Context> ctx_;  // the shards; null: not connected
  transport::RegistrationCache registrations_;  // PsMemory buffers on ctx_
  int world_ = -1;
  int rank_ = -1;

  mutable absl::Mutex mu_;
  absl::Status aborted_ ABSL_GUARDED_BY(mu_);
  transport::Context* running_ ABSL_GUARDED_BY(mu_) = nullptr;  // ctx_, for Abort()
  std::atomic<bool> is_aborted_{false};

  std::atomic<uint64_t> steps_{0};
  std::atomic<uint64_t> steps_failed_{0};
  std::atomic<uint64_t> bytes_pushed_{0};
  std::atomic<uint64_t> bytes_pulled_{0};
  std::atomic<uint64_t> connects_{0};
};

}  // namespace gradsync::ps

#endif  // GRADSYNC_PS_WORKER_CLIENT_H_
