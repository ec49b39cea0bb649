// Internal to //client (not part of the SDK's API).
//
// The shared-memory OpChannel: ops travel through the session's op queue
// (ipc/op_queue.h) that gradsyncd creates on Worker.OpenOpQueue, instead of
// Worker.Submit / Worker.Wait RPCs.
//
// Submit writes one entry into the submission ring and rings the doorbell;
// it returns at once with op_id = the entry's token (1, 2, 3, ... per
// session) and sequence 0 (the daemon's sequence is not known yet). If the
// ring is full it waits for room, up to the op's timeout (or the session's
// default op timeout), reading completions meanwhile.
//
// Wait takes completions from the ring into a local map keyed by token, so
// several threads can wait on different ops: one at a time sleeps on the
// completion doorbell (after spinning up to 100 us; then futex, slices of at
// most 50 ms) and drains, the
// others wait on a condition variable; completions of ops nobody waits for
// yet are kept until waited for (at most kMaxUnreportedOps submitted and
// unreported ops, as the daemon allows). Every slice also checks:
//   - the daemon's heartbeat: unchanged for heartbeat_timeout (3 s) =>
//     Unavailable "gradsyncd at T stopped answering (no heartbeat for 3 s)";
//   - the queue's closed flag (session closed, daemon stopping) => the
//     daemon's reason, e.g. FailedPrecondition "session s was closed ...";
//   - impossible ring indices => DataLoss.
// These errors are sticky. An op's own error comes back with its code and
// message as the daemon wrote them (messages over 1 KiB end with
// " ... [truncated from N bytes]").
#ifndef GRADSYNC_CLIENT_SHM_OP_CHANNEL_H_
#define GRADSYNC_CLIENT_SHM_OP_CHANNEL_H_

#include <cstddef>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "client/op_channel.h"
#include "ipc/shared_memory.h"

namespace gradsync {
namespace client {
namespace internal {

// Ops submitted and not yet reported by Wait, per session (as gradsyncd).
inline constexpr size_t kMaxUnreportedOps = 4096;

struct ShmOpChannelOptions {
  // The daemon is declared dead when its heartbeat does not move for this long.
  absl::Duration heartbeat_timeout = absl::Seconds(3);
  // Longest single futex sleep (liveness is checked between sleeps).
  absl::Duration max_sleep = absl::Milliseconds(50);
  // A Wait first polls the completion ring this long (yielding the CPU)
  // before it sleeps on the futex: a tiny op then completes without a
  // wake-up, which costs tens of microseconds on a virtual CPU. 0 = off.
  absl::Duration spin = absl::Microseconds(100);
  // Bounds the wait for room in a full submission ring when the op has no
  // timeout of its own.
  absl::Duration default_op_timeout = absl::Seconds(60);
};

// An OpChannel over a mapped op queue segment. `target` and `session_id`
// name the daemon and session in errors. FailedPrecondition if the segment
// is not a queue this client understands.
absl::StatusOr<std::unique_ptr<OpChannel>> NewShmOpChannel(std::unique_ptr<ipc::SharedMemory> mem,
                                                           std::string target,
                                                           std::string session_id,
                                                           ShmOpChannelOptions options = {});

// How long a wait polls before it sleeps: GRADSYNC_WAIT_SPIN_US if set to a
// number >= 0, else `fallback` (the one place the variable is read).
absl::Duration WaitSpin(absl::Duration fallback);

// The per-op path of a newly opened session: asks the daemon for an op queue
// (Worker.OpenOpQueue) and returns the shared-memory channel, or the gRPC
// channel if the daemon answers UNIMPLEMENTED (an older gradsyncd; logged once
// per process) or the queue cannot be set up (logged). The environment
// variable GRADSYNC_OP_CHANNEL=grpc forces the gRPC channel.
// `default_op_timeout` (zero = unknown) is the session's op timeout. A queue
// handed out by descriptor is fetched on `fd_socket` with the session's
// registration `token` (OpenSessionResponse).
std::unique_ptr<OpChannel> NewSessionOpChannel(const std::shared_ptr<WorkerConnection>& conn,
                                               const std::string& session_id,
                                               absl::Duration default_op_timeout,
                                               const std::string& fd_socket,
                                               const std::string& token);

}  // namespace internal
}  // namespace client
}  // namespace gradsync

#endif  // GRADSYNC_CLIENT_SHM_OP_CHANNEL_H_
