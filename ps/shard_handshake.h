// The shard's half of a worker connection's handshake: the worker sends its
// Hello, the job id and a nonce; the shard answers HelloAck + its nonce +
// its proof of the job's shard key, and takes the connection only once the
// worker proved the key back (transport/wire.h; the same HMAC as between
// daemons). The key is PsShardKey(job key, shard id) (common/tls.h), which
// the coordinator gives only to the shards it assigned to the job epoch.
#ifndef GRADSYNC_PS_SHARD_HANDSHAKE_H_
#define GRADSYNC_PS_SHARD_HANDSHAKE_H_

#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "ps/shard.h"
#include "transport/tcp_listener.h"

namespace gradsync::ps {

// Keys fetched once per job epoch and kept for `ttl` (errors are not kept).
// Null source: every job's key is empty (a shard without a coordinator).
class ShardKeyCache {
 public:
  explicit ShardKeyCache(JobKeySource source, absl::Duration ttl = absl::Minutes(10))
      : source_(std::move(source)), ttl_(ttl) {}
  absl::StatusOr<ShardJobKey> Get(const std::string& job_id, uint64_t epoch);

 private:
  static constexpr size_t kMaxEntries = 4096;
  const JobKeySource source_;
  const absl::Duration ttl_;
  absl::Mutex mu_;
  std::map<std::pair<std::string, uint64_t>, std::pair<ShardJobKey, absl::Time>> keys_
      ABSL_GUARDED_BY(mu_);
};

// Reads the worker's nonce (it follows the job id).
absl::StatusOr<std::string> ReadWorkerNonce(const transport::RoutedConnection& rc,
                                            absl::Time deadline);
// Sends HelloAck(OK), the shard's nonce and proof, then reads and checks the
// worker's proof: UNAUTHENTICATED for a wrong one.
absl::Status ProveJobKey(const transport::RoutedConnection& rc, const std::string& key,
                         const std::string& worker_nonce, absl::Time deadline);

}  // namespace gradsync::ps

#endif  // GRADSYNC_PS_SHARD_HANDSHAKE_H_
