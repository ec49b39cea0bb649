#include "server/shard_registry.h"

#include <algorithm>
#include <set>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace gradsync {

absl::Status ShardRegistry::Register(const std::string& shard_id, const v1::Endpoint& endpoint,
                                     const std::string& identity) {
  if (shard_id.empty() || shard_id.size() > 256) {
    return absl::InvalidArgumentError("shard_id must have 1..256 characters");
  }
  if (endpoint.host().empty() || endpoint.port() <= 0 || endpoint.port() > 65535) {
    return absl::InvalidArgumentError(absl::StrCat("shard '", shard_id, "': bad endpoint '",
                                                   endpoint.host(), ":", endpoint.port(), "'"));
  }
  const std::string& rdma = endpoint.rdma();
  if (rdma.size() > 128 ||
      std::any_of(rdma.begin(), rdma.end(), [](char c) { return c < 0x20 || c > 0x7e; })) {
    return absl::InvalidArgumentError(absl::StrCat(
        "shard '", shard_id, "': its RDMA port description must be at most 128 printable "
        "characters"));
  }
  absl::MutexLock l(&mu_);
  const absl::Time now = absl::Now();
  auto it = shards_.find(shard_id);
  if (it != shards_.end() && it->second.identity == identity) {  // a renewal
    it->second.endpoint = endpoint;
    it->second.last_seen = now;
    return absl::OkStatus();
  }
  ForgetDeadLocked(now);
  it = shards_.find(shard_id);
  if (it != shards_.end()) {
    return absl::PermissionDeniedError(absl::StrCat(
        "shard '", shard_id, "' is registered by certificate '", it->second.identity,
        "'; certificate '", identity, "' may not register it (give each shard its own id)"));
  }
  int held = 0;
  for (const auto& [id, s] : shards_) held += s.identity == identity;
  if (!identity.empty() && held >= kMaxShardsPerIdentity) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "certificate '", identity, "' already registered ", held, " shards (at most ",
        kMaxShardsPerIdentity, "); shard '", shard_id, "' is refused"));
  }
  if (shards_.size() >= static_cast<size_t>(kMaxShards)) {
    return absl::ResourceExhaustedError(absl::StrCat("the coordinator has ", shards_.size(),
                                                     " shards registered (at most ", kMaxShards,
                                                     "); shard '", shard_id, "' is refused"));
  }
  shards_[shard_id] = Shard{endpoint, now, identity};
  return absl::OkStatus();
}

bool ShardRegistry::IsRegisteredBy(const std::string& shard_id,
                                   const std::string& identity) const {
  absl::MutexLock l(&mu_);
  auto it = shards_.find(shard_id);
  return it != shards_.end() && it->second.identity == identity;
}

void ShardRegistry::ForgetDeadLocked(absl::Time now) {
  std::set<std::string> serving;
  for (const auto& [key, a] : assigned_) serving.insert(a.ids.begin(), a.ids.end());
  for (auto it = shards_.begin(); it != shards_.end();) {
    if (now - it->second.last_seen > forget_after_ && serving.count(it->first) == 0) {
      it = shards_.erase(it);
    } else {
      ++it;
    }
  }
}

std::vector<v1::ShardStatus> ShardRegistry::List() const {
  absl::MutexLock l(&mu_);
  const absl::Time now = absl::Now();
  std::map<std::string, int> load;
  for (const auto& [key, a] : assigned_) {
    for (const auto& id : a.ids) ++load[id];
  }
  std::vector<v1::ShardStatus> out;
  for (const auto& [id, s] : shards_) {
    v1::ShardStatus st;
    st.set_shard_id(id);
    *st.mutable_endpoint() = s.endpoint;
    st.set_alive(now - s.last_seen <= timeout_);
    st.set_last_seen_age_ms(absl::ToInt64Milliseconds(now - s.last_seen));
    st.set_jobs(load[id]);
    st.set_identity(s.identity);
    out.push_back(st);
  }
  return out;
}

bool ShardRegistry::IsAssigned(const std::string& job_id, int64_t epoch,
                               const std::string& shard_id) const {
  absl::MutexLock l(&mu_);
  auto it = assigned_.find({job_id, epoch});
  return it != assigned_.end() &&
         std::find(it->second.ids.begin(), it->second.ids.end(), shard_id) != it->second.ids.end();
}

absl::StatusOr<ShardRegistry::Assignment> ShardRegistry::AssignForJob(const std::string& job_id,
                                                                      int64_t epoch, int k) {
  absl::MutexLock l(&mu_);
  auto it = assigned_.find({job_id, epoch});
  if (it != assigned_.end()) return it->second;
  const absl::Time now = absl::Now();
  std::map<std::string, int> load;
  for (const auto& [key, a] : assigned_) {
    for (const auto& id : a.ids) ++load[id];
  }
  std::vector<std::string> alive;
  for (const auto& [id, s] : shards_) {
    if (now - s.last_seen <= timeout_) alive.push_back(id);
  }
  if (static_cast<int>(alive.size()) < k) {
    return absl::FailedPreconditionError(absl::StrCat(
        "job '", job_id, "' wants ", k, " parameter-server shards but ", alive.size(),
        " are registered and alive", alive.empty() ? "" : absl::StrCat(" (", absl::StrJoin(alive, ", "), ")"),
        "; start more gradsync-ps"));
  }
  std::stable_sort(alive.begin(), alive.end(),
                   [&](const std::string& a, const std::string& b) { return load[a] < load[b]; });
  Assignment a;
  for (int i = 0; i < k; ++i) {
    a.ids.push_back(alive[i]);
    a.endpoints.push_back(shards_[alive[i]].endpoint);
  }
  assigned_[{job_id, epoch}] = a;
  return a;
}

void ShardRegistry::ForgetJob(const std::string& job_id, int64_t keep_epoch) {
  absl::MutexLock l(&mu_);
  for (auto it = assigned_.begin(); it != assigned_.end();) {
    if (it->first.first == job_id && it->first.second != keep_epoch) {
      it = assigned_.erase(it);
    } else {
      ++it;
    }
  }
}

void ShardRegistry::ForgetEpoch(const std::string& job_id, int64_t epoch) {
  absl::MutexLock l(&mu_);
  assigned_.erase({job_id, epoch});
}

}  // namespace gradsync
