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

uint64_t FeedbackLayout::StateBytes() const {
  return uint64_t{count} * sizeof(float) * (topk.on() && topk.momentum_milli != 0 ? 2 : 1);
}

std::string FeedbackLayout::ToString() const {
  return absl::StrCat(count, " elements, ", topk.on() ? topk.ToString() : "quantized");
}

uint64_t ErrorFeedbackStore::OpsSoFar(const std::string& name,
                                      const FeedbackLayout& layout) const {
  auto it = entries_.find(name);
  if (it == entries_.end() || !(it->second.layout == layout)) return 0;
  return it->second.state.ops;
}

void ErrorFeedbackStore::DropOrphans() {
  for (auto it = entries_.begin(); it != entries_.end();) {
    if (!it->second.owned || !it->second.owner.expired()) {
      ++it;
      continue;
    }
    GS_LOG(INFO) << "job '" << job_id_ << "': op '" << it->first
                 << "': its memory was freed; its error feedback is dropped (residual norm "
                 << it->second.state.ResidualNorm() << ")";
    Release(it->second);
    it = entries_.erase(it);
  }
}

ErrorFeedbackStore::Entry& ErrorFeedbackStore::EntryFor(const Key& key,
                                                        const FeedbackLayout& layout) {
  DropOrphans();
  const std::string& name = key.name;
  auto [it, made] = entries_.try_emplace(name);
  Entry& e = it->second;
  if (!made && !(e.layout == layout)) {
    GS_LOG(INFO) << "job '" << job_id_ << "': op '" << name << "' changed its layout ("
                 << e.layout.ToString() << " -> " << layout.ToString()
                 << "): its error feedback starts afresh (residual norm "
                 << e.state.ResidualNorm() << " dropped)";
    Release(e);
    e = Entry{};
  }
  e.layout = layout;
  e.owner = key.owner;
  e.owned = !key.owner.expired();
  return e;
}

void ErrorFeedbackStore::CountOp(const Key& key, const FeedbackLayout& layout) {
  ++EntryFor(key, layout).state.ops;
}

void ErrorFeedbackStore::Drop(const std::string& name, const std::string& why) {
  auto it = entries_.find(name);
  if (it == entries_.end()) return;
  GS_LOG(INFO) << "job '" << job_id_ << "': op '" << name << "': its error feedback starts afresh ("
               << why << "; residual norm " << it->second.state.ResidualNorm() << " dropped)";
  Release(it->second);
  entries_.erase(it);
}

std::vector<float> ErrorFeedbackStore::TakeResidual(const std::string& name,
                                                    const FeedbackLayout& layout) {
  DropOrphans();
  auto it = entries_.find(name);
  if (it == entries_.end() || !(it->second.layout == layout)) return {};
  std::vector<float> owed = std::move(it->second.state.residual);
  Release(it->second);
  entries_.erase(it);
  return owed;
}

ErrorFeedback* ErrorFeedbackStore::StateFor(const Key& key, const FeedbackLayout& layout,
                                            const std::shared_ptr<SessionBuffers>& quota) {
  Entry& e = EntryFor(key, layout);
  const std::string& name = key.name;
  const uint64_t need = layout.StateBytes();
  if (e.charged < need) {
    if (quota != nullptr) {
      const absl::Status s = quota->ChargeState(
          need - e.charged, absl::StrCat("error feedback of op '", name, "'"));
      if (!s.ok()) {
        ++refusals_;
        GS_LOG(WARNING) << "job '" << job_id_ << "': op '" << name
                        << "' runs " << (layout.topk.on() ? "topk" : "its codec")
                        << " without error feedback (what it does not deliver is lost): "
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
