// The plan an op asks for by name, as the one byte its signature carries: an
// Algorithm's value for a flat plan, kHierarchicalPlanCode or
// kParameterServerPlanCode for the other paths, kAutoCode (algorithm.h) for
// none. Small and pure, so the client SDK checks a requested name exactly as
// gradsyncd does without linking the planner, the collectives or the kernels.
#ifndef GRADSYNC_COLLECTIVE_PLAN_CODE_H_
#define GRADSYNC_COLLECTIVE_PLAN_CODE_H_

#include <cstdint>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "collective/algorithm.h"
#include "common/types.h"

namespace gradsync {

inline constexpr uint8_t kHierarchicalPlanCode = 100;
inline constexpr uint8_t kParameterServerPlanCode = 101;

// The code of a plan requested by name ("" or "auto": kAutoCode) for a
// `kind` op of `bytes` bytes per rank: an algorithm name, "hier" or "ps".
// Every check that depends only on the op itself, so the client SDK and
// gradsyncd refuse the same requests with the same words. InvalidArgument
// (without the op's name: callers prefix it) for an unknown name, a plan that
// does not implement `kind`, or oneshot above its size. What depends on the
// job (hier needs ranks that share a daemon, ps needs shards) is the
// caller's to check.
absl::StatusOr<uint8_t> RequestedPlanCode(absl::string_view name, CollectiveKind kind,
                                          uint64_t bytes);

}  // namespace gradsync

#endif  // GRADSYNC_COLLECTIVE_PLAN_CODE_H_
