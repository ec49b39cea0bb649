#pragma once
// The buffer memory each tenant's sessions hold on one daemon, bounded by
// gradsyncd --tenant_memory_limit_mb. Sessions of jobs without a tenant (a
// coordinator without --tenants_file) count as one tenant "".

#include <cstdint>
#include <map>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"

namespace gradsync {

class TenantMemory {
 public:
  // limit_bytes 0: unlimited (only counted).
  explicit TenantMemory(uint64_t limit_bytes) : limit_(limit_bytes) {}

  // Takes `bytes` more for `tenant`, or RESOURCE_EXHAUSTED naming the tenant,
  // the quota and what it holds, and `what` (e.g. "session s1: allocating").
  absl::Status Charge(const std::string& tenant, uint64_t bytes, const std::string& what);
  // Whether Charge would succeed now (a check before building a segment;
  // Charge still decides).
  absl::Status Check(const std::string& tenant, uint64_t bytes, const std::string& what) const;
  void Release(const std::string& tenant, uint64_t bytes);

  uint64_t used(const std::string& tenant) const;
  uint64_t limit() const { return limit_; }

 private:
  absl::Status CheckLocked(const std::string& tenant, uint64_t bytes,
                           const std::string& what) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const uint64_t limit_;
  mutable absl::Mutex mu_;
  std::map<std::string, uint64_t> used_ ABSL_GUARDED_BY(mu_);  // no entry: 0
};

}  // namespace gradsync
