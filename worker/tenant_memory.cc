#include "worker/tenant_memory.h"

#include "absl/strings/str_cat.h"

namespace gradsync {

absl::Status TenantMemory::CheckLocked(const std::string& tenant, uint64_t bytes,
                                       const std::string& what) const {
  if (limit_ == 0) return absl::OkStatus();
  auto it = used_.find(tenant);
  const uint64_t used = it == used_.end() ? 0 : it->second;
  if (bytes <= limit_ && used <= limit_ - bytes) return absl::OkStatus();
  return absl::ResourceExhaustedError(absl::StrCat(
      what, " a buffer of ", bytes, " bytes would exceed tenant '", tenant,
      "''s buffer quota on this daemon of ", limit_, " bytes (", used,
      " held by its sessions; gradsyncd --tenant_memory_limit_mb)"));
}

absl::Status TenantMemory::Check(const std::string& tenant, uint64_t bytes,
                                 const std::string& what) const {
  absl::MutexLock l(&mu_);
  return CheckLocked(tenant, bytes, what);
}

absl::Status TenantMemory::Charge(const std::string& tenant, uint64_t bytes,
                                  const std::string& what) {
  absl::MutexLock l(&mu_);
  if (absl::Status s = CheckLocked(tenant, bytes, what); !s.ok()) return s;
  used_[tenant] += bytes;
  return absl::OkStatus();
}

void TenantMemory::Release(const std::string& tenant, uint64_t bytes) {
  absl::MutexLock l(&mu_);
  auto it = used_.find(tenant);
  if (it == used_.end()) return;
  it->second = bytes >= it->second ? 0 : it->second - bytes;
  if (it->second == 0) used_.erase(it);
}

uint64_t TenantMemory::used(const std::string& tenant) const {
  absl::MutexLock l(&mu_);
  auto it = used_.find(tenant);
  return it == used_.end() ? 0 : it->second;
}

}  // namespace gradsync
