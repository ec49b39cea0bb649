#include "common/connection_limits.h"

namespace gradsync {

bool ConnectionLimits::Acquire(const std::string& source) {
  if (total_ >= total_limit_) return false;
  int& n = held_[source];
  if (n >= per_source_) return false;
  ++n;
  ++total_;
  return true;
}

void ConnectionLimits::Release(const std::string& source) {
  auto it = held_.find(source);
  if (it == held_.end()) return;
  --total_;
  if (--it->second == 0) held_.erase(it);
}

int ConnectionLimits::held(const std::string& source) const {
  auto it = held_.find(source);
  return it == held_.end() ? 0 : it->second;
}

}  // namespace gradsync
