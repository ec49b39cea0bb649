// Test helpers for the parameter server: in-process shards on 127.0.0.1,
// PsWorkers, deterministic inputs and the rank-order reference.
#ifndef GRADSYNC_PS_PS_TESTING_H_
#define GRADSYNC_PS_PS_TESTING_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "common/net.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/types.h"
#include "ps/shard.h"
#include "ps/worker_client.h"
#include "transport/wire.h"

namespace gradsync::ps::testing {

// Pseudo-random values for `rank` (floats in [-3, 3), full-range integers).
std::vector<char> RandomData(DType t, size_t count, int rank, uint32_t seed);

// What every shard computes: acc = x_0, then ReduceInto(acc, x_r) for
// r = 1..N-1 (acc the first operand); avg divides by N once at the end.
std::vector<char> RankOrderReference(const std::vector<std::vector<char>>& inputs, DType t,
                                     ReduceOp op, size_t count);

// `n` shards listening on 127.0.0.1 (fails the test if one cannot start).
std::vector<std::unique_ptr<PsShard>> StartShards(int n, PsShardOptions options = {});
std::vector<HostPort> Addresses(const std::vector<std::unique_ptr<PsShard>>& shards);

// PsWorkers for ranks 0..n-1 of `job` (epoch 1) over `shards`.
std::vector<std::unique_ptr<PsWorker>> MakeWorkers(int n, const std::string& job,
                                                   const std::vector<HostPort>& shards,
                                                   int max_inflight = 8);

// Writes header + payload (writev) within the deadline, on a blocking or
// non-blocking socket. Unavailable on a socket error, DeadlineExceeded.
absl::Status WriteFrame(int fd, const transport::FrameHeader& h, const void* payload,
                        absl::Time deadline);

// A hand-driven worker connection (PsWorker uses transport::Device::ConnectToServers): connects to a shard, sends the Hello for
// `ps_job_id` (a PsJobId), proves `key` as a worker does, reads the shard's
// admission and tunes the socket (TCP_NODELAY, buffers, non-blocking). A
// refusal comes back with the shard's code and "refused: <message>"; a shard
// that did not prove the key (it has none for the job) is UNAUTHENTICATED.
absl::StatusOr<UniqueFd> ConnectToShard(const HostPort& addr, const std::string& ps_job_id,
                                        uint64_t epoch, int rank, int workers, int shard,
                                        absl::Time deadline, int socket_buffer_bytes,
                                        const std::string& key = "");

// Runs fn(rank) for every rank in `ranks`, each on its own thread; returns
// the statuses in the same order.
std::vector<absl::Status> RunRanks(const std::vector<int>& ranks,
                                   const std::function<absl::Status(int)>& fn);

}  // namespace gradsync::ps::testing

#endif  // GRADSYNC_PS_PS_TESTING_H_
