// Internal to //client (not part of the SDK's API).
//
// OpPath: what a session sends every op through when its client runs some
// ops itself, with the other clients of the job: the node-local arena
// (client/local_path.h) or the direct path (client/direct_path.h). It numbers
// every op (op k is the session's k-th; OpHandle::op_id = sequence = k), runs
// the small ones among the clients, and hands every other op to the daemon
// (an OpChannel) with its number, keeping the order where it matters (ops on
// overlapping bytes, barriers). Without one, a session talks to its
// OpChannel directly.
#ifndef GRADSYNC_CLIENT_OP_PATH_H_
#define GRADSYNC_CLIENT_OP_PATH_H_

#include <cstdint>
#include <optional>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "client/op_channel.h"

namespace gradsync {
namespace client {
namespace internal {

// One validated op and where its bytes are in this process.
struct PathOp {
  SubmitArgs args;        // as the daemon would get it (sequence is set by the path)
  uint8_t forced = 0xff;  // RequestedAlgorithmCode of the effective algorithm
  bool local = false;     // runs among the clients (see the path's comment)
  char* data = nullptr;   // this rank's mapping of the op's range; null: no buffer
  uint64_t bytes = 0;     // bytes of the range
};

// True if the two ops use overlapping bytes of one buffer.
bool Overlap(const PathOp& a, const PathOp& b);

// NotFound "op 5 is not pending in session s (already reported, or never
// submitted)".
absl::Status NotPendingError(uint64_t op_id, absl::string_view session_id);

// Wait's first look at op `op_id` in a path's map of submitted ops (entries
// with `status` and `outcome`; `done(entry)` says whether it is done): once
// done, its outcome, reported once (the entry leaves the map); NotFound for
// an op the map does not hold; nullopt while it runs.
template <typename Map, typename Done>
std::optional<absl::StatusOr<WaitOutcome>> TakeIfDone(Map& pending, uint64_t op_id,
                                                      absl::string_view session_id, Done done) {
  auto it = pending.find(op_id);
  if (it == pending.end()) return absl::StatusOr<WaitOutcome>(NotPendingError(op_id, session_id));
  if (!done(it->second)) return std::nullopt;
  absl::StatusOr<WaitOutcome> result =
      it->second.status.ok() ? absl::StatusOr<WaitOutcome>(it->second.outcome)
                             : absl::StatusOr<WaitOutcome>(it->second.status);
  pending.erase(it);
  return result;
}

class OpPath {
 public:
  virtual ~OpPath() = default;
  // The algorithm code of the ops it runs among the clients (kLocalCode,
  // kDirectCode), and the largest allreduce (bytes per rank) it runs so.
  virtual uint8_t code() const = 0;
  virtual uint64_t max_local_bytes() const = 0;
  // Numbers the op and starts it (a local one among the clients, any other
  // at the daemon); returns at once unless the path must wait for room.
  virtual absl::StatusOr<SubmitTicket> Submit(const PathOp& op) = 0;
  // As OpChannel::Wait, for ops of either kind; a past deadline polls.
  virtual absl::StatusOr<WaitOutcome> Wait(uint64_t op_id, absl::Time deadline) = 0;
};

}  // namespace internal
}  // namespace client
}  // namespace gradsync

#endif  // GRADSYNC_CLIENT_OP_PATH_H_
