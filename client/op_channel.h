// Internal to //client (not part of the SDK's API).
//
// OpChannel is the per-op path between a Session and gradsyncd: submit one
// collective, wait for its completion. Session validates arguments and turns
// outcomes into its public results; it knows nothing else about how ops
// travel. Two implementations: GrpcOpChannel (here) sends Worker.Submit /
// Worker.Wait RPCs; the shared-memory one (client/shm_op_channel.h) writes
// fixed-size op descriptors into the session's submission ring and rings a
// futex doorbell, with completions in a second ring. NewSessionOpChannel
// (shm_op_channel.h) picks one when a session opens.
#ifndef GRADSYNC_CLIENT_OP_CHANNEL_H_
#define GRADSYNC_CLIENT_OP_CHANNEL_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include <grpcpp/channel.h>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "common/op_desc.h"
#include "proto/worker.grpc.pb.h"

namespace gradsync {
namespace client {
namespace internal {

// Deadline of every RPC that has no wait of its own (everything except
// OpenSession and Wait).
inline constexpr absl::Duration kRpcTimeout = absl::Seconds(10);
// Added to the wait of OpenSession / Wait to form the RPC deadline.
inline constexpr absl::Duration kRpcMargin = absl::Seconds(5);
// Longest single Worker.Wait RPC; longer waits are split into several, so a
// dead daemon shows up as an RPC error well before a long wait ends.
inline constexpr absl::Duration kMaxWaitSlice = absl::Seconds(30);

// One gRPC connection to gradsyncd, shared by a Client and its Sessions.
struct WorkerConnection {
  std::string target;
  std::shared_ptr<grpc::Channel> channel;
  std::unique_ptr<v1::Worker::StubInterface> stub;
};

struct SubmitTicket {
  uint64_t op_id = 0;
  uint64_t sequence = 0;  // 0 = not known at submission (the queue)
};

// The op's result once done (an op that failed is Wait's error instead).
struct WaitOutcome : OpResult {
  bool done = false;  // false: still running at the deadline
};

// Thread-safe. Every call is bounded in time.
class OpChannel {
 public:
  virtual ~OpChannel() = default;

  // Queues an op that ValidateOp and CheckOpBuffer accepted. gRPC: returns
  // once the daemon has accepted it (its refusal is the error). Queue:
  // returns once the op is in the ring; a refusal by the daemon is then the
  // op's error in Wait.
  virtual absl::StatusOr<SubmitTicket> Submit(const OpDesc& op) = 0;

  // Waits until the op ends or `deadline` passes (a past deadline polls).
  // Returns done=false if it is still running then; the op's own error, as
  // the daemon reported it, if it failed.
  virtual absl::StatusOr<WaitOutcome> Wait(uint64_t op_id, absl::Time deadline) = 0;

  // OK while the daemon serves this channel and takes new ops as far as it
  // can tell without a call (the queue: not closed, heartbeat moving, not
  // draining, the job's epoch not failed); else why not. Cheap.
  virtual absl::Status Health() { return absl::OkStatus(); }
  // The first half of Health: OK while the daemon serves this channel (it
  // may refuse new ops); else why not. Cheap.
  virtual absl::Status Alive() { return absl::OkStatus(); }

  // A file descriptor (eventfd) that becomes readable whenever completions of
  // this channel's ops arrive; reading it (8 bytes) re-arms it. Owned by the
  // channel. Unimplemented where the channel cannot tell without a call.
  virtual absl::StatusOr<int> CompletionFd() {
    return absl::UnimplementedError(
        "a completion fd needs the shared-memory op queue; this session reaches gradsyncd over "
        "gRPC (GRADSYNC_OP_CHANNEL=grpc, or a daemon without the queue)");
  }
};

// The gRPC implementation: Worker.Submit and Worker.Wait on `conn`.
std::unique_ptr<OpChannel> NewGrpcOpChannel(std::shared_ptr<WorkerConnection> conn,
                                            std::string session_id);

// Converts a failed RPC to an absl::Status. The daemon's message is kept
// verbatim, except that a deadline the client itself set and that passed
// (`rpc_deadline`) becomes DeadlineExceeded "gradsyncd at T did not answer
// RPC within D".
// A unary call about a session, bounded by kRpcTimeout and, while it waits,
// by the daemon's liveness as the session's op channel sees it (the op
// queue's heartbeat): a stopped daemon fails the call within the heartbeat
// timeout (3 s) with Unavailable "stopped answering", not at the deadline.
// `start` issues the call with the context and a completion callback.
absl::Status CallWhileAlive(
    OpChannel& ops, const WorkerConnection& conn, absl::string_view rpc,
    const std::function<void(grpc::ClientContext*, std::function<void(grpc::Status)>)>& start);

absl::Status RpcError(const grpc::Status& status, const WorkerConnection& conn,
                      absl::string_view rpc, absl::Time rpc_deadline, absl::Duration rpc_timeout);

}  // namespace internal
}  // namespace client
}  // namespace gradsync

#endif  // GRADSYNC_CLIENT_OP_CHANNEL_H_
