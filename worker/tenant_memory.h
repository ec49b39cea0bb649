#pragma once
// The buffer memory sessions hold on one daemon, by account, bounded by
// gradsyncd --tenant_memory_limit_mb per account and --buffer_memory_limit_mb
// for all accounts together. An account is a tenant ("tenant 'vision'"), or,
// for jobs without a tenant (a coordinator without --tenants_file), the uid
// that opened the session ("uid 1000"): each uid its own share, so one user
// of a node without tenants cannot take every other user's buffer memory.

#include <cstdint>
#include <map>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"

namespace gradsync {

// The account a session's buffers are charged to: "tenant 'NAME'", or
// without a tenant "uid UID" (owner_uid -1, a TCP client: "uid unknown").
std::string MemoryAccount(const std::string& tenant, int64_t owner_uid);

class TenantMemory {
 public:
  // 0: unlimited (only counted).
  explicit TenantMemory(uint64_t account_limit_bytes, uint64_t total_limit_bytes = 0)
      : limit_(account_limit_bytes), total_limit_(total_limit_bytes) {}

  // Takes `bytes` more for `account`, or RESOURCE_EXHAUSTED naming the
  // account (or the daemon's total), the quota and what it holds, and `what`
  // (e.g. "session s1: allocating").
  absl::Status Charge(const std::string& account, uint64_t bytes, const std::string& what);
  // Whether Charge would succeed now (a check before building a segment;
  // Charge still decides).
  absl::Status Check(const std::string& account, uint64_t bytes, const std::string& what) const;
  void Release(const std::string& account, uint64_t bytes);

  uint64_t used(const std::string& account) const;
  uint64_t total_used() const;
  uint64_t limit() const { return limit_; }
  uint64_t total_limit() const { return total_limit_; }

 private:
  absl::Status CheckLocked(const std::string& account, uint64_t bytes,
                           const std::string& what) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const uint64_t limit_;
  const uint64_t total_limit_;
  mutable absl::Mutex mu_;
  std::map<std::string, uint64_t> used_ ABSL_GUARDED_BY(mu_);  // no entry: 0
  uint64_t total_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace gradsync
