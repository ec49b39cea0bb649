// Internal to //client (not part of the SDK's API).
//
// The direct path: the clients of a job with no arena (its ranks use several
// daemons) run small allreduces (up to kOneShotMaxBytes per rank) and
// barriers among themselves over TCP, with no daemon thread per op. The
// daemons still run every other op, keep the membership and the epoch, and
// count the direct ops in their metrics.
//
// Set-up. Before OpenSession the client listens on every interface
// (Listen()) and sends the port with the request; the daemon advertises it,
// with its own host, to the coordinator. When every rank's client listens
// (and no daemon turned the path off), OpenSession returns every rank's
// endpoint, and each client connects to the others (Connect(): a mesh set up
// like the daemons' data plane, with the same handshake).
//
// Ops, as the arena's LocalPath does them (client/op_path.h): the session
// numbers its ops here; small allreduces and barriers with the algorithm
// "auto" or "direct" run here (OpResult::algorithm "direct"); every other op
// goes to the daemon with its number. Every op, of either kind, first goes
// through the clients' signature exchange (collective/op_signature.h, the
// one the daemons run: the signatures are compared, and a direct op's data
// are reduced in flight, in the daemons' pattern: recursive doubling from 3
// ranks when every client is on one host, else from 8), one op at a time in
// sequence order. A direct op is then done (every rank has the same bits as
// the daemons' oneshot gives); a daemon op goes to the daemon only once the
// ranks agree on it. So a mismatch is found alike whichever way each rank's
// op would have gone (say one rank's op is over the direct path's size and
// the others' are not), no daemon ever runs an op the ranks disagree on, and
// the daemons' streams stay in step. Submit starts the next exchange (its
// first message leaves at once); see Progress for what moves it on.
//
// Order. The exchanges run in sequence order. A direct op's exchange starts
// only after every earlier daemon op on overlapping bytes of the same buffer
// is done (its data are read when it starts), a barrier's only after every
// earlier op is done; daemon ops reach the daemon in sequence order.
//
// Errors, the same as the daemons' for the same cause:
//   - a mismatch: InvalidArgument "op 5 does not match across ranks: rank 2
//     submitted ..., ranks 0,1,3 submitted ..." (the job goes on; the op
//     never reaches a daemon);
//   - a rank that does not submit: after the op's timeout, DeadlineExceeded
//     "allreduce 'g' f32[2] sum (op 5) failed at rank 0: timed out at rank 0
//     waiting for rank(s) 2 to submit op 5 (...)";
//   - a peer that closed its session or died: Unavailable naming it.
// Any error but a mismatch leaves the exchanges out of step: the path fails
// and tells the others (they fail with "aborted by rank r: ..."); ops still
// waiting for their exchange fail with the reason, and new submissions get
// FailedPrecondition (open a new session). Ops already at the daemon
// finish there. New submissions are also refused, as the daemon refuses its
// own, while it drains (Unavailable), once the job's epoch failed
// (FailedPrecondition, "open a new session") and when it stopped answering
// (looked at in each submission). The ops submitted before a drain go on (a
// draining daemon waits for them); once the epoch failed, the daemon closed
// the session or stopped answering (looked at every 100 ms while ops run),
// the path fails with the daemon's reason, unannotated, as the daemon's own
// ops fail.
//
// Progress. A caller in Wait moves the running exchange on itself (spinning,
// as the daemons' data plane does). A progress thread of the path takes
// over an exchange that no caller has looked after for a millisecond (it
// looks every millisecond while ops come, and sleeps in poll(2) in the
// exchange, handing it back to a caller that comes to wait):
// a rank that submitted an op and went on with other work still forwards
// the others' messages in the later rounds of recursive doubling, and a
// daemon op it submitted reaches the daemon once the ranks agree.
//
// Thread-safe: one mutex guards the state; one thread at a time moves the
// running exchange on, without the mutex.
#ifndef GRADSYNC_CLIENT_DIRECT_PATH_H_
#define GRADSYNC_CLIENT_DIRECT_PATH_H_

#include <cstdint>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "client/op_channel.h"
#include "client/op_path.h"
#include "collective/algorithm.h"
#include "collective/op_signature.h"
#include "common/net.h"
#include "transport/tcp_context.h"
#include "transport/tcp_listener.h"

namespace gradsync {
namespace client {
namespace internal {

struct DirectPathOptions {
  // The job and this rank's place in it (from OpenSession).
  std::string job_id;
  uint64_t epoch = 0;
  int rank = 0;
  int world_size = 1;
  std::vector<HostPort> peers;  // every rank's client listener, by rank
  // Connecting the mesh may take this long (the others connect at about the
  // same time, right after their own OpenSession).
  absl::Duration connect_timeout = absl::Seconds(60);
  // The exchange polls the connections this long (yielding the CPU) before
  // it sleeps in poll(2), as gradsyncd --spin_us.
  absl::Duration spin = absl::Milliseconds(1);
  // Op timeout when the op has none (the job's op_timeout_ms).
  absl::Duration default_op_timeout = absl::Seconds(60);
};

class DirectPath final : public OpPath {
 public:
  // Listens on every interface, on a port the kernel picks (before
  // OpenSession; the port goes in the request).
  static absl::StatusOr<std::unique_ptr<transport::TcpListener>> Listen();
  // Connects this rank to every other rank's client through `listener` (the
  // one Listen() gave). `channel` (not owned, outlives this) carries the
  // ops the daemon runs. Fails naming the peer that could not be reached by
  // the connect timeout.
  static absl::StatusOr<std::unique_ptr<DirectPath>> Connect(
      std::unique_ptr<transport::TcpListener> listener, DirectPathOptions options,
      OpChannel* channel, std::string session_id);
  ~DirectPath() override;

  uint8_t code() const override { return kDirectCode; }
  uint64_t max_local_bytes() const override { return kOneShotMaxBytes; }
  // Numbers the op; a direct one starts (if nothing holds it), any other goes
  // to the channel. Never waits for the other ranks.
  absl::StatusOr<SubmitTicket> Submit(const PathOp& op) override;
  absl::StatusOr<WaitOutcome> Wait(uint64_t op_id, absl::Time deadline) override;

 private:
  enum class State {
    kQueued,      // waits for its turn in the exchanges
    kExchanging,  // its exchange runs (active_)
    kAtDaemon,    // a daemon op the ranks agreed on, sent to the channel
    kDone,        // outcome known
  };
  struct Entry {
    uint64_t seq = 0;
    PathOp op;
    OpSignature sig;        // its name is what op.args.name points at
    std::string algorithm;  // what op.args.algorithm points at
    FusedAllreduce fused;  // direct allreduces: op.data
    State state = State::kQueued;
    absl::Time submitted;
    absl::Time started;  // its exchange started
    absl::Time deadline;
    bool in_channel_wait = false;  // at the daemon: a thread waits for it in channel_->Wait
    ipc::DirectOp shown;  // what the daemon's status shows of it
    absl::Status status;  // kDone
    WaitOutcome outcome;           // kDone and OK
  };

  DirectPath(std::unique_ptr<transport::TcpContext> ctx, DirectPathOptions options,
             OpChannel* channel, std::string session_id);

  // One non-blocking pass: look at the daemon's ops, move the running
  // exchange on, start the next ones.
  void ProgressLocked(absl::Time now) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The op before which `e`'s exchange may not start (see Order), or null.
  const Entry* BlockerLocked(const Entry& e) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The queued op whose exchange runs next, or null.
  Entry* NextQueuedLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void StartLocked(Entry& e, absl::Time now) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // What an Advance of the running exchange (of `e`) said, at `now`.
  void AfterAdvanceLocked(Entry& e, const absl::StatusOr<bool>& advanced, absl::Time now)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The channel's answer for a daemon op.
  void AfterChannelLocked(Entry& e, const absl::StatusOr<WaitOutcome>& w, absl::Time now)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void CompleteLocked(Entry& e, absl::Status s, absl::Time now) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The exchanges are out of step, or the daemon stopped serving the
  // session: fail the path (the peers are told) and every op still waiting
  // for its exchange, with `why` (annotated: naming the op and this rank).
  void FailLocked(const absl::Status& why, absl::Time now, bool annotate = true)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // "allreduce 'g' f32[2] sum (op 5) failed at rank 0: " + why, with why's code.
  absl::Status Annotate(const Entry& e, const absl::Status& why) const;
  absl::Status Unusable() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void ProgressLoop();

  const std::unique_ptr<transport::TcpContext> ctx_;
  const DirectPathOptions options_;
  OpChannel* const channel_;
  const std::string session_id_;
  const SignaturePattern pattern_;

  // One submitter at a time: numbering and sending an op is one step.
  absl::Mutex submit_mu_ ABSL_ACQUIRED_BEFORE(mu_);
  absl::Mutex mu_;
  absl::CondVar done_cv_;  // an op finished, or the exchange's driver let go
  uint64_t next_seq_ ABSL_GUARDED_BY(mu_) = 1;
  std::map<uint64_t, Entry> pending_ ABSL_GUARDED_BY(mu_);  // submitted, not yet reported
  std::set<uint64_t> unfinished_ ABSL_GUARDED_BY(mu_);      // not kDone
  std::set<uint64_t> at_daemon_ ABSL_GUARDED_BY(mu_);       // kAtDaemon (a few: the daemon's queue)
  absl::Status failed_ ABSL_GUARDED_BY(mu_);                // sticky: the mesh failed
  bool failed_annotate_ ABSL_GUARDED_BY(mu_) = true;        // FailLocked's `annotate`
  uint64_t in_flight_ ABSL_GUARDED_BY(mu_) = 0;  // queued or exchanging (the daemon's drain waits)
  // The op whose exchange runs (0: none). Its exchange, scratch and Entry
  // are touched without mu_ by the one thread that drives it (driving_):
  // a caller in Wait, or the progress thread.
  uint64_t active_ ABSL_GUARDED_BY(mu_) = 0;
  bool driving_ ABSL_GUARDED_BY(mu_) = false;
  bool background_driving_ ABSL_GUARDED_BY(mu_) = false;  // the progress thread drives
  int app_waiting_ ABSL_GUARDED_BY(mu_) = 0;  // callers waiting to take over from it
  absl::Time last_call_ ABSL_GUARDED_BY(mu_);  // the last Submit or Wait look
  absl::Time next_alive_check_ ABSL_GUARDED_BY(mu_);  // of the daemon (ProgressLocked)
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  bool watching_ ABSL_GUARDED_BY(mu_) = true;  // the progress thread looks every kWatch
  absl::CondVar progress_cv_;  // wakes the progress thread
  SignatureExchange exchange_;
  SignatureScratch scratch_;
  // Moves the exchanges on when no caller does (a rank that submitted and
  // went on with other work must still forward the others' messages in the
  // later rounds of recursive doubling): started with the path, stopped in
  // the destructor.
  std::thread progress_;
};

}  // namespace internal
}  // namespace client
}  // namespace gradsync

#endif  // GRADSYNC_CLIENT_DIRECT_PATH_H_
