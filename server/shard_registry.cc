#include "server/shard_registry.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace gradsync {

absl::Status ShardRegistry::Register(const std::string& shard_id, const v1::Endpoint& endpoint) {
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
  shards_[shard_id] = Shard{endpoint, absl::Now()};
  return absl::OkStatus();
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
