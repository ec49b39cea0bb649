// Point-to-point: send and recv between two ranks of a job epoch (torch's
// send/recv/isend/irecv/batch_isend_irecv, MPI's tagged messages), beside
// the executor's collective sequence: only the two ranks take part, so these
// ops are not numbered with the collectives and never wait for them.
//
// One engine per job epoch on each daemon (JobExecutor owns it), on a thread
// of its own ("gs-p2p"):
//   * Matching is at the receiving rank's daemon. A message is (source rank,
//     destination rank, tag, dtype, bytes); a recv takes the first message
//     from its peer (or from any rank, peer -1) with its tag, in the order
//     they came; messages from one rank to another with one tag are received
//     in the order they were sent (torch's promise). A message must have the
//     recv's dtype and size: otherwise the recv fails naming both ranks, both
//     sizes and the tag (and so does a local sender), and the job goes on.
//   * Ranks on this daemon: a send waits for its recv (rendezvous), then one
//     memcpy from the sender's buffer into the receiver's.
//   * Ranks on other daemons: the message goes at once over the epoch's
//     point-to-point context (TCP, one connection per pair of daemons,
//     created with the executor's; ContextSpec::announce_arrivals), in
//     chunks of at most kMaxMessageBytes, each framed with MessageTag
//     {op_seq = source << 32 | tag, slot = destination, dtype, offset = the
//     message's bytes}. The receiving daemon sees each header (Probe) before
//     it posts a receive for it: into the matching recv's buffer (no copy),
//     or, while no recv matches, into memory of its own (up to
//     max_unexpected_bytes held at once; past it the message waits in the
//     socket, holding back what follows it from that daemon) from which a
//     recv posted later copies it.
//   * Deadlines: an op not yet under way (a recv nothing matched, a send
//     queued or waiting for its recv here) fails at its deadline, alone
//     (DeadlineExceeded naming both ranks and the tag; the epoch goes on).
//     One whose bytes are moving finishes only when the engine no longer
//     touches its buffer: past its deadline the point-to-point context is
//     failed (so every later cross-daemon send and recv fails too).
//   * Failures of the context (a peer daemon lost, its ABORT) fail every
//     cross-daemon op pending and later; Break fails everything pending and
//     later (the epoch failed).
// An op is finished (Session::FinishPointToPoint) only on the engine's
// thread, never on the submitting one.
//
// Threading: Submit, Detach, Break are thread-safe. Detach returns once the
// engine no longer uses the rank's session.
#ifndef GRADSYNC_WORKER_POINT_TO_POINT_H_
#define GRADSYNC_WORKER_POINT_TO_POINT_H_

#include <cstdint>
#include <deque>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "collective/topology.h"
#include "transport/transport.h"
#include "worker/daemon_observer.h"

namespace gradsync {

class Session;
struct QueuedOp;

struct PointToPointOptions {
  std::string job_id;  // for logs
  int64_t epoch = 0;
  JobPlacement placement;
  // Bytes of messages from other daemons held before their recv is posted.
  uint64_t max_unexpected_bytes = uint64_t{64} << 20;
  DaemonObserver* observer = nullptr;  // hears of every finished op; not owned; may be null
};

class PointToPoint {
 public:
  // `ctx` connects the epoch's daemons (null: every rank is on this daemon,
  // or the device has none: a cross-daemon op then fails saying so).
  PointToPoint(PointToPointOptions options, std::unique_ptr<transport::Context> ctx);
  // Fails what is pending (Cancelled) and stops the thread.
  ~PointToPoint();
  PointToPoint(const PointToPoint&) = delete;
  PointToPoint& operator=(const PointToPoint&) = delete;

  // A send or recv of `session`'s rank (validated; op->sig.root is the peer,
  // op->sig.tag the tag).
  void Submit(Session* session, std::shared_ptr<QueuedOp> op);
  // The rank's pending ops fail with `why`; returns once the engine no
  // longer uses its session (at most 30 s, which only a bug reaches).
  void Detach(int rank, const absl::Status& why);
  // The epoch failed: everything pending and later fails with `why`.
  void Break(const absl::Status& why);

  struct Pending;  // one op the engine holds (point_to_point.cc)
  struct Arrival;  // a message here before its recv
  struct Inbound;  // the message coming from one daemon
  struct Outbound; // a send to another daemon being posted

 private:
  void Run();
  // The engine's steps (its thread only).
  void TakeSubmissions();
  void Accept(std::shared_ptr<Pending> p);
  void PostRecv(std::shared_ptr<Pending> recv);
  void SendLocal(std::shared_ptr<Pending> send);
  bool MatchArrival(int dst, Arrival arrival);
  void PostSends();
  void LookAtArrivals();
  void StartInbound(int node, const transport::Incoming& in);
  void ContinueInbound(int node, const transport::Incoming& in);
  bool Reap();  // finishes what completed; whether anything did
  void Expire(absl::Time now);
  // Fails ctx_ (telling the other daemons) and the cross-daemon ops; logs
  // why unless `quiet`.
  void FailContext(const absl::Status& why, bool quiet = false);
  void FailAll(const absl::Status& why, bool remote_only);
  void Finish(Pending& p, const absl::Status& s, int source);
  void FinishDetaches();
  absl::Time NextDeadline() const;
  // Calls f(const std::shared_ptr<Pending>&) for every op held (some null:
  // an arrival from another daemon, an inbound message with no recv).
  template <typename F>
  void ForEachPending(F&& f) const;
  int LocalIndex(int rank) const;
  std::string Describe(const Pending& p) const;

  const PointToPointOptions options_;
  const std::unique_ptr<transport::Context> ctx_;
  std::vector<int> local_index_;  // by rank: index among this daemon's ranks, -1 elsewhere

  // Engine thread only.
  std::vector<std::deque<std::shared_ptr<Pending>>> recvs_;  // posted, unmatched, by local index
  std::vector<std::deque<Arrival>> arrivals_;                 // unmatched messages, by local index
  std::vector<std::deque<std::shared_ptr<Pending>>> outbox_;  // sends by daemon, not yet posted
  std::vector<std::deque<Outbound>> outbound_;                // sends by daemon, posted
  std::vector<Inbound> inbound_;                              // by daemon
  uint64_t unexpected_bytes_ = 0;
  absl::Status ctx_failed_;  // OK while ctx_ carries messages
  absl::Status broken_;      // Break's reason, once seen

  absl::Mutex mu_;
  absl::CondVar cv_;
  std::vector<std::pair<Session*, std::shared_ptr<QueuedOp>>> submitted_ ABSL_GUARDED_BY(mu_);
  std::vector<std::pair<int, absl::Status>> detaching_ ABSL_GUARDED_BY(mu_);
  uint64_t detach_requests_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t detaches_done_ ABSL_GUARDED_BY(mu_) = 0;
  absl::Status break_ ABSL_GUARDED_BY(mu_);
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  std::thread thread_;
};

}  // namespace gradsync

#endif  // GRADSYNC_WORKER_POINT_TO_POINT_H_
