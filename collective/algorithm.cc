#include "collective/algorithm.h"

#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace gradsync {

const char* AlgorithmCodeName(uint8_t code) {
  static const char* const kNames[] = {"ring", "rhd", "rd", "tree", "pairwise", "oneshot"};
  static_assert(sizeof(kNames) / sizeof(kNames[0]) == kAlgorithmCount, "a name per algorithm");
  if (code < kAlgorithmCount) return kNames[code];
  if (code == kHierarchicalCode) return "hier";
  if (code == kParameterServerCode) return "ps";
  return "?";
}

const char* AlgorithmName(Algorithm a) {
  return AlgorithmCodeName(static_cast<uint8_t>(a));
}

const char* SignaturePatternName(SignaturePattern p) {
  return p == SignaturePattern::kRecursiveDoubling ? "recursive doubling" : "all-to-all";
}

absl::StatusOr<Algorithm> ParseAlgorithm(absl::string_view name) {
  const std::string lower = absl::AsciiStrToLower(name);
  std::vector<std::string> names;
  for (Algorithm a : kAllAlgorithms) {
    if (lower == AlgorithmName(a)) return a;
    names.push_back(AlgorithmName(a));
  }
  return absl::InvalidArgumentError(absl::StrCat("unknown algorithm '", name, "' (choose one of ",
                                                 absl::StrJoin(names, ", "), ")"));
}

bool Implements(Algorithm a, CollectiveKind k) {
  switch (k) {
    case CollectiveKind::kAllreduce:
      return a == Algorithm::kRing || a == Algorithm::kRecursiveHalvingDoubling ||
             a == Algorithm::kRecursiveDoubling || a == Algorithm::kBinomialTree ||
             a == Algorithm::kOneShot;
    case CollectiveKind::kReduceScatter:
      return a == Algorithm::kRing || a == Algorithm::kRecursiveHalvingDoubling;
    case CollectiveKind::kAllgather:
      return a == Algorithm::kRing || a == Algorithm::kRecursiveHalvingDoubling ||
             a == Algorithm::kRecursiveDoubling;
    case CollectiveKind::kBroadcast:
    case CollectiveKind::kReduce: return a == Algorithm::kRing || a == Algorithm::kBinomialTree;
    case CollectiveKind::kAlltoall: return a == Algorithm::kPairwise;
    case CollectiveKind::kBarrier:
      return a == Algorithm::kRecursiveDoubling || a == Algorithm::kBinomialTree ||
             a == Algorithm::kPairwise || a == Algorithm::kOneShot;
  }
  return false;
}

absl::StatusOr<uint8_t> RequestedAlgorithmCode(absl::string_view name, CollectiveKind kind,
                                               uint64_t bytes) {
  if (name.empty() || name == "auto") return kAutoCode;
  if (name == "ps" || name == "hier") {
    if (kind != CollectiveKind::kAllreduce) {
      return absl::InvalidArgumentError(absl::StrCat(
          "algorithm '", name, "' does not implement ", CollectiveName(kind),
          name == "ps" ? " (parameter server: allreduce only)" : " (hierarchical: allreduce only)"));
    }
    return name == "ps" ? kParameterServerCode : kHierarchicalCode;
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

std::string ImplementingAlgorithms(CollectiveKind k) {
  std::vector<std::string> names;
  for (Algorithm a : kAllAlgorithms) {
    if (Implements(a, k)) names.push_back(AlgorithmName(a));
  }
  return absl::StrJoin(names, ", ");
}

}  // namespace gradsync
