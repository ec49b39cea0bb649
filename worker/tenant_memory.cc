#include "worker/tenant_memory.h"

#include "absl/strings/str_cat.h"

namespace gradsync {

std::string MemoryAccount(const std::string& tenant, int64_t owner_uid) {
  if (!tenant.empty()) return absl::StrCat("tenant '", tenant, "'");
  return owner_uid < 0 ? std::string("uid unknown") : absl::StrCat("uid ", owner_uid);
}

absl::Status TenantMemory::CheckLocked(const std::string& account, uint64_t bytes,
                                       const std::string& what) const {
  if (limit_ != 0) {
    auto it = used_.find(account);
    const uint64_t used = it == used_.end() ? 0 : it->second;
    if (bytes > limit_ || used > limit_ - bytes) {
      return absl::ResourceExhaustedError(absl::StrCat(
          what, " a buffer of ", bytes, " bytes would exceed ", account,
          "'s buffer quota on this daemon of ", limit_, " bytes (", used,
          " held by its sessions; gradsyncd --tenant_memory_limit_mb)"));
    }
  }
  if (total_limit_ != 0 && (bytes > total_limit_ || total_ > total_limit_ - bytes)) {
    return absl::ResourceExhaustedError(absl::StrCat(
        what, " a buffer of ", bytes, " bytes would exceed this daemon's buffer memory of ",
        total_limit_, " bytes (", total_,
        " held by all sessions; gradsyncd --buffer_memory_limit_mb)"));
  }
  return absl::OkStatus();
}

absl::Status TenantMemory::Check(const std::string& account, uint64_t bytes,
                                 const std::string& what) const {
  absl::MutexLock l(&mu_);
  return CheckLocked(account, bytes, what);
}

absl::Status TenantMemory::Charge(const std::string& account, uint64_t bytes,
                                  const std::string& what) {
  absl::MutexLock l(&mu_);
  if (absl::Status s = CheckLocked(account, bytes, what); !s.ok()) return s;
  used_[account] += bytes;
  total_ += bytes;
  return absl::OkStatus();
}

void TenantMemory::Release(const std::string& account, uint64_t bytes) {
  absl::MutexLock l(&mu_);
  auto it = used_.find(account);
  if (it == used_.end()) return;
  const uint64_t freed = bytes >= it->second ? it->second : bytes;
  it->second -= freed;
  total_ -= freed;
  if (it->second == 0) used_.erase(it);
}

uint64_t TenantMemory::used(const std::string& account) const {
  absl::MutexLock l(&mu_);
  auto it = used_.find(account);
  return it == used_.end() ? 0 : it->second;
}

uint64_t TenantMemory::total_used() const {
  absl::MutexLock l(&mu_);
  return total_;
}

}  // namespace gradsync
