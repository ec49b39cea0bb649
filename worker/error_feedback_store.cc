#include "worker/error_feedback_store.h"

#include <cmath>

#include "absl/strings/str_cat.h"
#include "common/logging.h"

namespace gradsync {

ErrorFeedbackStore::~ErrorFeedbackStore() {
  if (!entries_.empty()) {
    GS_LOG(INFO) << "job '" << job_id_ << "' epoch " << epoch_ << " ended: the error feedback of "
                 << entries_.size() << " op name(s) dropped (" << bytes()
                 << " bytes, residual norm " << ResidualNorm() << ")";
  }
  for (auto& [name, e] : entries_) Release(e);
}

void ErrorFeedbackStore::Release(Entry& e) {
  if (e.quota != nullptr && e.charged > 0) e.quota->ReleaseState(e.charged);
  e.charged = 0;
  e.quota.reset();
}

uint64_t ErrorFeedbackStore::OpsSoFar(const std::string& name, size_t count,
                                      const SparseSpec& spec) const {
  auto it = entries_.find(name);
  if (it == entries_.end() || it->second.count != count || it->second.spec != spec.Code()) return 0;
  return it->second.state.ops;
}

ErrorFeedbackStore::Entry& ErrorFeedbackStore::EntryFor(const std::string& name, size_t count,
                                                        const SparseSpec& spec) {
  auto [it, made] = entries_.try_emplace(name);
  Entry& e = it->second;
  if (!made && (e.count != count || e.spec != spec.Code())) {
    GS_LOG(INFO) << "job '" << job_id_ << "': op '" << name << "' changed its layout ("
                 << e.count << " elements, " << SparseSpec::FromCode(e.spec).ToString() << " -> "
                 << count << ", " << spec.ToString() << "): its error feedback starts afresh"
                 << " (residual norm " << e.state.ResidualNorm() << " dropped)";
    Release(e);
    e = Entry{};
  }
  e.count = count;
  e.spec = spec.Code();
  return e;
}

void ErrorFeedbackStore::CountOp(const std::string& name, size_t count, const SparseSpec& spec) {
  ++EntryFor(name, count, spec).state.ops;
}

ErrorFeedback* ErrorFeedbackStore::StateFor(const std::string& name, size_t count,
                                            const SparseSpec& spec,
                                            const std::shared_ptr<SessionBuffers>& quota) {
  Entry& e = EntryFor(name, count, spec);
  const uint64_t need = uint64_t{count} * sizeof(float) * (spec.momentum_milli != 0 ? 2 : 1);
  if (e.charged < need) {
    if (quota != nullptr) {
      const absl::Status s = quota->ChargeState(
          need - e.charged, absl::StrCat("error feedback of op '", name, "'"));
      if (!s.ok()) {
        ++refusals_;
        GS_LOG(WARNING) << "job '" << job_id_ << "': op '" << name
                        << "' runs topk without error feedback (what it does not send is lost): "
                        << s.message();
        return nullptr;
      }
      if (e.quota == nullptr) e.quota = quota;
    }
    e.charged = need;
  }
  return &e.state;
}

uint64_t ErrorFeedbackStore::bytes() const {
  uint64_t total = 0;
  for (const auto& [name, e] : entries_) total += e.state.bytes();
  return total;
}

double ErrorFeedbackStore::ResidualNorm() const {
  double sum = 0;
  for (const auto& [name, e] : entries_) {
    const double n = e.state.ResidualNorm();
    sum += n * n;
  }
  return std::sqrt(sum);
}

}  // namespace gradsync
