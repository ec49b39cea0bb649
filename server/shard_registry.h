// Registered gradsync-ps shards and their assignment to job epochs.
//
// Shards call RegisterShard on start and then periodically; a shard not seen
// for `timeout` is dead. A job epoch that wants K shards gets the K alive
// shards with the fewest assigned epochs (ties: shard id), chosen once and
// remembered, so every rank of the epoch gets the same list.
#ifndef GRADSYNC_SERVER_SHARD_REGISTRY_H_
#define GRADSYNC_SERVER_SHARD_REGISTRY_H_

#include <map>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "proto/coordinator.pb.h"
#include "server/job_registry_observer.h"

namespace gradsync {

class ShardRegistry {
 public:
  explicit ShardRegistry(absl::Duration timeout = absl::Seconds(5)) : timeout_(timeout) {}

  absl::Status Register(const std::string& shard_id, const v1::Endpoint& endpoint);
  std::vector<v1::ShardStatus> List() const;

  struct Assignment {
    std::vector<std::string> ids;
    std::vector<v1::Endpoint> endpoints;
  };
  // The shards of (job, epoch), choosing them on the first call.
  // FailedPrecondition naming the counts if fewer than `k` are alive.
  absl::StatusOr<Assignment> AssignForJob(const std::string& job_id, int64_t epoch, int k);
  // True if shard `shard_id` serves (job, epoch).
  bool IsAssigned(const std::string& job_id, int64_t epoch, const std::string& shard_id) const;
  // Forgets assignments of epochs of `job_id` other than `keep_epoch`.
  void ForgetJob(const std::string& job_id, int64_t keep_epoch = -1);
  // Forgets the assignment of (job, epoch).
  void ForgetEpoch(const std::string& job_id, int64_t epoch);

 private:
  struct Shard {
    v1::Endpoint endpoint;
    absl::Time last_seen;
  };
  const absl::Duration timeout_;
  mutable absl::Mutex mu_;
  std::map<std::string, Shard> shards_ ABSL_GUARDED_BY(mu_);
  std::map<std::pair<std::string, int64_t>, Assignment> assigned_ ABSL_GUARDED_BY(mu_);
};

// Releases a job's shard assignments when the job registry ends it (a failed
// epoch, the job removed), so a shard's load counts only live jobs.
class ShardRelease final : public JobRegistryObserver {
 public:
  explicit ShardRelease(ShardRegistry* shards) : shards_(shards) {}
  void OnEpochFailed(const std::string& job_id, int64_t epoch) override {
    shards_->ForgetEpoch(job_id, epoch);
  }
  void OnJobRemoved(const std::string& job_id) override { shards_->ForgetJob(job_id); }

 private:
  ShardRegistry* const shards_;  // not owned
};

}  // namespace gradsync

#endif  // GRADSYNC_SERVER_SHARD_REGISTRY_H_
