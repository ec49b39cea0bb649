// gradsync-ps shard: the server side of the parameter-server data path.
//
// Workers (PsWorker, one per worker daemon and job) push the partitions of a
// tensor that this shard owns; the shard sums them in place with the CPU
// kernels (every dtype and reduce op of the allreduce) and sends each
// partition's result back to every worker as soon as the last push of that
// partition has been reduced, while later partitions are still arriving.
//
// Partitions: every partition is pinned to one aggregation thread (partition
// id % threads) that owns its accumulator, so pushes of different partitions
// never share a lock. Each worker connection is a server context of the
// data plane's device (transport::Device::AcceptClient) driven by one thread:
// step headers, pushes and worker aborts in; results and errors out.
//
// Determinism: partition p's result is exactly
//     acc = x_0; ReduceInto(acc, x_1); ReduceInto(acc, x_2); ... x_{N-1}
// (x_r = rank r's pushed bytes, acc the first operand), in rank order
// whatever order pushes arrive in (early pushes are staged until their turn);
// avg is that sum followed by one DivideBy(N). So float results are the same
// bits on every run and equal to that reference.
//
// Steps (synchronous mode): a job (job id, epoch) has at most one running
// step on a shard. The first step header of step s starts it; every worker's
// header must match it (else every worker gets InvalidArgument naming the
// ranks, once all headers are in or at the timeout). The step completes when
// every worker pushed every partition of this shard. A step fails, and every
// connected worker of the job gets the error as an ABORT frame for that step:
//   * DeadlineExceeded after `step_timeout` (from the first header) naming the
//     ranks that still owe pushes and the first partition they owe;
//   * Unavailable when a worker that joined the step disconnects before
//     pushing everything, naming its rank;
//   * the worker's own code when a worker aborts the step (PsWorker does so
//     when it fails), naming the rank and its reason;
//   * Aborted when a worker starts a newer step first;
//   * ResourceExhausted when the step would not fit into `max_memory_bytes`.
// Steps only move forward: a header or push for a step that is finished (or
// older than the running one) is refused with FailedPrecondition to that
// worker and its bytes are discarded, never summed into another step.
//
// Thread-safety: all methods may be called from any thread.
#ifndef GRADSYNC_PS_SHARD_H_
#define GRADSYNC_PS_SHARD_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/net.h"
#include "common/tls.h"
#include "transport/device.h"

namespace gradsync::ps {

// What a shard holds for a job epoch: the key its workers' connections must
// prove, and whether they then run TLS (the job's data_tls).
struct ShardJobKey {
  std::string key;
  bool data_tls = false;
};

// Where a shard gets a job epoch's key (the job id without "ps/").
using JobKeySource =
    std::function<absl::StatusOr<ShardJobKey>(const std::string& job_id, uint64_t epoch)>;

struct PsShardOptions {
  // Where workers connect (transport::TcpListener); port 0 picks a free port.
  HostPort listen{"0.0.0.0", 0};
  // Aggregation threads; partition p is reduced on thread p % threads.
  int threads = 4;
  // A step not completed this long after its first header fails.
  absl::Duration step_timeout = absl::Seconds(30);
  // Admission bound: a step reserves workers x (its bytes on this shard) for
  // staging until it ends; a step that would exceed this fails with
  // ResourceExhausted. Results waiting in send queues come on top.
  uint64_t max_memory_bytes = 8ull << 30;
  int socket_buffer_bytes = 0;  // 0: the kernel's autotuned buffers
  // Makes the server contexts of the workers' connections (not owned;
  // outlives the shard). Null: a TCP device of the shard's own.
  transport::Device* device = nullptr;
  // Makes them for workers whose Hello asks for RDMA (kRdmaBootstrapStream;
  // not owned, outlives the shard). Null: such workers are refused, saying
  // this shard has no RDMA port.
  transport::Device* rdma_device = nullptr;
  // A job with no connections for this long is forgotten (its step history:
  // steps at or below the last finished one are refused until then).
  absl::Duration idle_job_timeout = absl::Seconds(300);
  // The key a worker's connection for (job, epoch) must prove: this shard's
  // key of the job, from the coordinator (gradsync-ps asks GetShardKey), and
  // whether the connection then runs TLS. An error refuses the connection
  // with its message. Null: the empty key, no TLS (a shard without a
  // coordinator: connections are not authenticated).
  JobKeySource job_key;
  // This shard's certificate (OU=ps) for the TLS of jobs with data_tls,
  // when the shard makes its own device; empty: their workers are refused.
  TlsConfig tls;
};

// One job's counters on a shard (since the shard first saw the job, or since
// it forgot the idle job and saw it again).
struct PsJobStats {
  std::string job;  // the job id, without the "ps/" prefix
  uint64_t steps_completed = 0;
  uint64_t steps_failed = 0;
  uint64_t bytes_pushed = 0;
  uint64_t bytes_pulled = 0;
};

struct PsShardStats {
  uint64_t connections = 0;          // worker connections accepted
  uint64_t tls_connections = 0;      // ... of them with TLS (jobs with data_tls)
  uint64_t rdma_connections = 0;     // ... of them over RDMA
  uint64_t connections_refused = 0;  // handshakes refused (world size / shard index mismatch)
  // Connections refused for the job key: no key for the job epoch here, no
  // nonce, or a wrong proof.
  uint64_t auth_failures = 0;
  uint64_t steps_completed = 0;
  uint64_t steps_failed = 0;
  uint64_t bytes_pushed = 0;    // partition payload bytes received
  uint64_t bytes_pulled = 0;    // result payload bytes sent
  uint64_t pushes_refused = 0;  // pushes discarded (stale, refused or failed step)
  uint64_t jobs = 0;            // jobs with state here
  uint64_t reserved_bytes = 0;  // staging memory reserved by running steps
  std::vector<PsJobStats> per_job;  // jobs with state here, by job id
};

class PsShard {
 public:
  // Listens and starts the threads. InvalidArgument for bad options,
  // Unavailable if the address cannot be bound.
  static absl::StatusOr<std::unique_ptr<PsShard>> Start(const PsShardOptions& options);
  ~PsShard();  // Shutdown()

  int port() const;
  PsShardStats stats() const;

  // Stops accepting, fails running steps, tells every connected worker
  // (ABORT "ps shard K: shutting down", Unavailable), closes the connections
  // and joins every thread. Bounded (about a second); idempotent.
  void Shutdown();

 private:
  class Impl;
  explicit PsShard(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace gradsync::ps

#endif  // GRADSYNC_PS_SHARD_H_
