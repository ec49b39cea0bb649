// The collective algorithms, their names, and which collective each implements.
// (How an op runs, including the paths that are not one algorithm among all
// ranks, is the planner's: collective/planner.h.)
//
// The table in Implements() is the single source of truth: RunCollective
// (collectives.h) refuses other pairs, and the cost model (cost_model.h) never
// predicts or chooses them.
#ifndef GRADSYNC_COLLECTIVE_ALGORITHM_H_
#define GRADSYNC_COLLECTIVE_ALGORITHM_H_

#include <cstddef>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "common/types.h"

namespace gradsync {

// In an op signature's plan fields: no plan forced (collective/planner.h
// codes the others).
inline constexpr uint8_t kAutoCode = 0xff;

enum class Algorithm : uint8_t {
  kRing = 0,                      // "ring"
  kRecursiveHalvingDoubling = 1,  // "rhd" (Rabenseifner)
  kRecursiveDoubling = 2,         // "rd"
  kBinomialTree = 3,              // "tree"
  kPairwise = 4,                  // "pairwise"
  kOneShot = 5,                   // "oneshot"
};
inline constexpr int kAlgorithmCount = 6;
inline constexpr Algorithm kAllAlgorithms[] = {
    Algorithm::kRing, Algorithm::kRecursiveHalvingDoubling, Algorithm::kRecursiveDoubling,
    Algorithm::kBinomialTree, Algorithm::kPairwise, Algorithm::kOneShot};

// oneshot sends a rank's whole buffer to every peer in one round (for
// allreduce: then reduces the n contributions locally, in rank order). In the
// daemon its data rides on the op's signature exchange, so the op costs one
// round trip in all. The buffer per rank is capped so a peer's message always
// fits the receive posted for it: larger ops are refused with InvalidArgument
// and the cost model never picks it above the cap.
inline constexpr size_t kOneShotMaxBytes = 64 << 10;

// How every op's signature round (collective/op_signature.h) travels.
// All-to-all: one round, n-1 messages each way per rank. Recursive
// doubling: log2 n rounds of one message each way (a world that is not a
// power of two folds its extra ranks into the first ones and back out: two
// rounds more); each message carries every signature its sender knows.
// oneshot's data ride in the same messages. Few rounds win where a round
// trip is dear, few messages where each message costs CPU: 56 messages per
// op against 24 at 8 ranks, 4032 against 384 at 64.
enum class SignaturePattern : uint8_t { kAllToAll = 0, kRecursiveDoubling = 1 };
// "all-to-all", "recursive doubling".
const char* SignaturePatternName(SignaturePattern p);
// The pattern a job of `world` ranks uses (every rank alike, so the streams
// stay in step whatever the ops are); `one_host`: every rank's data endpoint
// is on one machine (AllOnOneHost in common/net.h), so every send runs the
// receiver's TCP stack on a CPU the ranks share and a message costs about
// as much as a round.
//   - One host: recursive doubling from 3 ranks (at 2 the patterns are the
//     same single exchange). Measured on loopback (medians of interleaved
//     runs): an 8-byte allreduce took 20% less at 4 ranks (85 against
//     106 us), 17% at 5 and 20% at 6, level at 3 and at 64 KiB.
//   - Several hosts: recursive doubling from 8 ranks. A wire's round trip
//     costs several messages' CPU, and log2 n rounds against one pay for
//     themselves only once the n-1 messages per rank add up (not measured
//     here: no second machine).
// Timing both when a job forms was tried and misled: before the ranks'
// clients start polling, the CPU is idle and the extra rounds dominate.
inline SignaturePattern DefaultSignaturePattern(int world, bool one_host) {
  return world >= (one_host ? 3 : 8) ? SignaturePattern::kRecursiveDoubling
                                     : SignaturePattern::kAllToAll;
}

// "ring", "rhd", "rd", "tree", "pairwise", "oneshot".
const char* AlgorithmName(Algorithm a);
// Parses the names above (case-insensitive); InvalidArgument lists the choices.
absl::StatusOr<Algorithm> ParseAlgorithm(absl::string_view name);

// Which algorithm implements which collective:
//
//   collective       ring  rhd  rd  tree  pairwise  oneshot
//   allreduce         x     x    x   x               x (<= kOneShotMaxBytes)
//   reduce_scatter    x     x
//   allgather         x     x    x
//   broadcast         x              x
//   reduce            x              x
//   alltoall                             x
//   gather                               x   (linear: every rank to the root)
//   scatter                              x   (linear: the root to every rank)
//   barrier                      x   x      x          x
bool Implements(Algorithm a, CollectiveKind k);

// e.g. "ring, rhd, rd, tree" (for error messages).
std::string ImplementingAlgorithms(CollectiveKind k);

}  // namespace gradsync

#endif  // GRADSYNC_COLLECTIVE_ALGORITHM_H_
