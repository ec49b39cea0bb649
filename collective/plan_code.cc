#include "collective/plan_code.h"

#include "absl/strings/str_cat.h"

namespace gradsync {

absl::StatusOr<uint8_t> RequestedPlanCode(absl::string_view name, CollectiveKind kind,
                                          uint64_t bytes) {
  if (name.empty() || name == "auto") return kAutoCode;
  if (name == "ps" || name == "hier") {
    if (kind != CollectiveKind::kAllreduce) {
      return absl::InvalidArgumentError(absl::StrCat(
          "algorithm '", name, "' does not implement ", CollectiveName(kind),
          name == "ps" ? " (parameter server: allreduce only)" : " (hierarchical: allreduce only)"));
    }
    return name == "ps" ? kParameterServerPlanCode : kHierarchicalPlanCode;
  }
  absl::StatusOr<Algorithm> algo = ParseAlgorithm(name);
  if (!algo.ok()) return algo.status();
  if (!Implements(*algo, kind)) {
    return absl::InvalidArgumentError(absl::StrCat("algorithm '", name, "' does not implement ",
                                                   CollectiveName(kind), " (",
                                                   ImplementingAlgorithms(kind), " do)"));
  }
  if (*algo == Algorithm::kOneShot && bytes > kOneShotMaxBytes) {
    return absl::InvalidArgumentError(absl::StrCat(
        "algorithm 'oneshot' carries at most ", kOneShotMaxBytes, " bytes per rank; this op has ",
        bytes, " (use auto, or rd/rhd/ring)"));
  }
  return static_cast<uint8_t>(*algo);
}

}  // namespace gradsync
