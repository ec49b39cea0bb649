// Registered gradsync-ps shards and their assignment to job epochs.
//
// Shards call RegisterShard on start and then periodically; a shard not seen
// for `timeout` is dead. A job epoch that wants K shards gets the K alive
// shards with the fewest assigned epochs (ties: shard id), chosen once and
// remembered, so every rank of the epoch gets the same list.
//
// A shard id belongs to the identity that registered it first (with TLS, the
// common name of its certificate): another identity can neither register it
// again (with its own endpoint) nor be given its key. The id is released
// only when the shard has been dead for `forget_after` and serves no job
// epoch. Each certificate holds at most kMaxShardsPerIdentity ids, and the
// registry at most kMaxShards.
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
  static constexpr int kMaxShards = 4096;
  static constexpr int kMaxShardsPerIdentity = 64;

  explicit ShardRegistry(absl::Duration timeout = absl::Seconds(5),
                         absl::Duration forget_after = absl::Hours(1))
      : timeout_(timeout), forget_after_(forget_after) {}

  // Registers or renews `shard_id` for `identity` (the caller's certificate
  // name; empty without TLS). PERMISSION_DENIED if another identity holds
  // the id, RESOURCE_EXHAUSTED over the limits above.
  absl::Status Register(const std::string& shard_id, const v1::Endpoint& endpoint,
                        const std::string& identity = "");
  // True if `identity` registered `shard_id` (a shard asks for its own key).
  bool IsRegisteredBy(const std::string& shard_id, const std::string& identity) const;
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
    std::string identity;
  };
  // Drops shards dead for forget_after_ that serve no job epoch.
  void ForgetDeadLocked(absl::Time now) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const absl::Duration timeout_;
  const absl::Duration forget_after_;
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
