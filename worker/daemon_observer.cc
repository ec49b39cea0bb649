#include "worker/daemon_observer.h"

namespace gradsync {

std::string EpochFailureCause(const absl::Status& s) {
  const absl::string_view m = s.message();
  if (absl::IsDeadlineExceeded(s)) return "timeout";
  if (absl::IsDataLoss(s)) return "protocol";
  if (m.find("aborted by the coordinator") != absl::string_view::npos ||
      m.find("cut off from the coordinator") != absl::string_view::npos) {
    return "coordinator";
  }
  if (m.find("aborted by rank") != absl::string_view::npos) return "peer_abort";
  if (m.find("lost") != absl::string_view::npos) return "peer_lost";
  if (absl::IsCancelled(s)) return "closed";
  return "other";
}

}  // namespace gradsync
