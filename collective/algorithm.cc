#include "collective/algorithm.h"

#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace gradsync {

const char* AlgorithmName(Algorithm a) {
  static const char* const kNames[] = {"ring", "rhd", "rd", "tree", "pairwise", "oneshot"};
  static_assert(sizeof(kNames) / sizeof(kNames[0]) == kAlgorithmCount, "a name per algorithm");
  const auto i = static_cast<size_t>(a);
  return i < static_cast<size_t>(kAlgorithmCount) ? kNames[i] : "?";
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
    case CollectiveKind::kAlltoall:
    case CollectiveKind::kGather:
    case CollectiveKind::kScatter: return a == Algorithm::kPairwise;
    case CollectiveKind::kBarrier:
      return a == Algorithm::kRecursiveDoubling || a == Algorithm::kBinomialTree ||
             a == Algorithm::kPairwise || a == Algorithm::kOneShot;
    case CollectiveKind::kSend:
    case CollectiveKind::kRecv: return false;  // point-to-point: no algorithm
  }
  return false;
}

std::string ImplementingAlgorithms(CollectiveKind k) {
  std::vector<std::string> names;
  for (Algorithm a : kAllAlgorithms) {
    if (Implements(a, k)) names.push_back(AlgorithmName(a));
  }
  return absl::StrJoin(names, ", ");
}

}  // namespace gradsync
