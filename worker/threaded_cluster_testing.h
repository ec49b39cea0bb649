// Daemons as threads: several gradsyncd "daemons" of one job in one test
// process, each a JobExecutor (worker/job_executor.h) with its local ranks as
// Sessions (worker/session.h), the daemons connected by the in-process
// transport (transport/inproc.h). A fake coordinator hands out what the real
// one does when an epoch forms (SessionInfo: rank, world, epoch, job key;
// JobPlacement; LinkParams) and re-forms the job at epoch + 1 with new
// executors. So the executor's and the session's behaviour (results,
// ordering, mismatches, late ranks, drain, abort, epoch change) is tested in
// milliseconds, without processes, sockets, gRPC or shared-memory op queues.
//
// Ranks submit through the public Session API only (AllocateBuffer and
// TakeBufferFd, Submit, Wait), as the daemon's gRPC and op-queue paths do;
// Session::Submit is non-blocking, so one test thread can play every rank.
// The one call that builds Submit's argument is SubmitOp (the argument type
// changes with the common op description).
//
// What it cannot show: anything of the daemon around them (the coordinator's
// rendezvous and heartbeats, gRPC, the op queue, TCP or RDMA links, the link
// probe: LinkParams are given, not measured).
//
// Thread-safety: a ThreadedCluster is used from the test's thread; Session and
// JobExecutor calls are thread-safe as documented in their headers.
#ifndef GRADSYNC_WORKER_THREADED_CLUSTER_TESTING_H_
#define GRADSYNC_WORKER_THREADED_CLUSTER_TESTING_H_

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "collective/cost_model.h"
#include "collective/planner.h"
#include "collective/topology.h"
#include "common/op_desc.h"
#include "common/types.h"
#include "ipc/shared_memory.h"
#include "transport/inproc.h"
#include "worker/job_executor.h"
#include "worker/session.h"

namespace gradsync::testing {

// The job the fake coordinator forms.
struct ClusterSpec {
  std::string job_id = "harness-job";
  // Which daemon hosts each rank, by rank. Daemons are numbered in order of
  // first appearance (rank 0's daemon is daemon 0), as the daemon numbers
  // them from the coordinator's member list.
  std::vector<int> node_of_rank = {0};
  std::string job_algorithm;  // SessionInfo::job_algorithm ("" = the cost model)
  std::string job_codec;      // SessionInfo::job_codec ("" = none)
  absl::Duration op_timeout = absl::Seconds(30);  // SessionInfo::default_op_timeout
  LinkParams link;            // what the link probe would have agreed
  PlannerSettings planner;
  RingOptions ring;
  // Faults of each epoch's node contexts (their ranks are daemon indices).
  transport::InProcFaults faults;
  // The host each daemon says it is on (JobPlacement::node_names become
  // "host:port"); empty: every daemon a host of its own.
  std::vector<std::string> host_of_node;

  // `daemons` daemons with `ranks_per_daemon` consecutive ranks each.
  static ClusterSpec Blocks(int daemons, int ranks_per_daemon);
  int world() const { return static_cast<int>(node_of_rank.size()); }
};

// An op as a rank submits it (owns its strings). The harness turns it into
// Session::Submit's argument in SubmitOp only.
// The op a rank submits: the daemon's own op description (common/op_desc.h).
using OpSpec = OpDesc;

// Session::Submit with `op`.
absl::StatusOr<uint64_t> SubmitOp(Session& session, const OpSpec& op);

// A rank's buffer: allocated through Session::AllocateBuffer by descriptor,
// its descriptor fetched (TakeBufferFd) and mapped here, as a client does.
struct RankBuffer {
  uint64_t id = 0;
  char* data = nullptr;
  size_t size = 0;
};

// One epoch of the job: every daemon's executor and every rank's session.
// Destroying it closes the sessions (which breaks the epoch) and then stops
// the executors.
class ThreadedCluster {
 public:
  ~ThreadedCluster();
  ThreadedCluster(const ThreadedCluster&) = delete;
  ThreadedCluster& operator=(const ThreadedCluster&) = delete;

  int64_t epoch() const { return epoch_; }
  int world() const { return static_cast<int>(sessions_.size()); }
  int daemons() const { return static_cast<int>(executors_.size()); }
  int daemon_of(int rank) const { return spec_.node_of_rank[rank]; }
  const ClusterSpec& spec() const { return spec_; }
  // The ranks of daemon `d`, ascending.
  const std::vector<int>& ranks_of(int d) const { return placements_[d].local_ranks(); }
  const JobPlacement& placement(int d) const { return placements_[d]; }

  Session& session(int rank) { return *sessions_[rank]; }
  JobExecutor& executor(int d) { return *executors_[d]; }

  // A zero-filled buffer of `bytes` (> 0) for `rank`.
  absl::StatusOr<RankBuffer> Allocate(int rank, size_t bytes);
  // The same, in the client's own memory: a sealed memfd of `rank`'s
  // registered with its session (Session::RegisterBuffer), as the SDK
  // registers a tensor's storage it adopts.
  absl::StatusOr<RankBuffer> Register(int rank, size_t bytes);
  // SubmitOp on `rank`'s session.
  absl::StatusOr<uint64_t> Submit(int rank, const OpSpec& op);
  // Waits up to `timeout` for op `id` of `rank` to finish; its outcome, or
  // DeadlineExceeded naming the rank and op if it did not finish in time
  // (the Wait of the session; never a sleep).
  absl::StatusOr<OpOutcome> Wait(int rank, uint64_t id, absl::Duration timeout = absl::Seconds(60));
  // Submits `op` on every rank (each its own buffer_id from `buffer_ids`, by
  // rank; empty: op's own) and waits for all; each rank's final status: the
  // refusal of Submit, or the op's outcome.
  std::vector<absl::Status> RunOnAll(const OpSpec& op, const std::vector<uint64_t>& buffer_ids = {},
                                     std::vector<OpOutcome>* outcomes = nullptr);

  // Closes `rank`'s session (Session::Close: the client went away).
  void CloseSession(int rank) { sessions_[rank]->Close(); }

 private:
  friend class FakeCoordinator;
  ThreadedCluster(ClusterSpec spec, int64_t epoch);

  const ClusterSpec spec_;
  const int64_t epoch_;
  std::vector<JobPlacement> placements_;  // by daemon
  std::unique_ptr<transport::InProcDevice> device_;  // the epoch's fabric; null with one daemon
  std::vector<std::shared_ptr<JobExecutor>> executors_;  // by daemon
  std::vector<std::shared_ptr<Session>> sessions_;       // by rank
  std::vector<std::unique_ptr<ipc::SharedMemory>> mappings_;  // the buffers as clients map them
};

// Whatever hands out the epochs of one job: SessionInfo (rank, world, epoch,
// job key, job algorithm, op timeout, link), JobPlacement and LinkParams, as
// the coordinator's JoinJob answer and the daemon's set-up do.
class FakeCoordinator {
 public:
  explicit FakeCoordinator(ClusterSpec spec) : spec_(std::move(spec)) {}

  // The next epoch (1, 2, ...): a fresh in-process fabric, one executor per
  // daemon, one session per rank attached to its daemon's executor.
  // InvalidArgument for a placement whose daemons are not numbered by first
  // appearance.
  absl::StatusOr<std::unique_ptr<ThreadedCluster>> Form();
  // As the coordinator aborting `old`'s epoch: every session of it hears
  // AbortEpoch(`reason`) (which aborts its executor), then the next epoch
  // forms. `old` stays alive (its sessions usable for the test to look at).
  absl::StatusOr<std::unique_ptr<ThreadedCluster>> Reform(ThreadedCluster& old,
                                                         const absl::Status& reason);

  // What a member of `rank` learns when epoch `epoch` forms.
  SessionInfo InfoFor(int rank, int64_t epoch) const;
  // What daemon `d` builds from the member list.
  JobPlacement PlacementFor(int d) const;

  ClusterSpec& spec() { return spec_; }
  int64_t epoch() const { return epoch_; }

 private:
  ClusterSpec spec_;
  int64_t epoch_ = 0;
};

// Polls `pred` (every 200 us) until it holds or `timeout` passes; whether it
// held. For conditions no callback announces (an executor's progress).
bool WaitUntil(const std::function<bool()>& pred, absl::Duration timeout = absl::Seconds(20));

}  // namespace gradsync::testing

#endif  // GRADSYNC_WORKER_THREADED_CLUSTER_TESTING_H_
