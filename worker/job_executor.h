// The one thread that runs a job epoch's ops on this daemon, for every rank
// of the job that uses this daemon. It composes four parts:
//   * OpIntake (worker/op_intake.h): the local ranks' sessions, taking op k
//     of every local rank (sessions number ops alike), waiting for the
//     missing ones (their op queues polled, then a doorbell sleep; Kick()
//     wakes it), and naming a rank that does not submit in time ("timed out
//     at rank(s) 0,1 waiting for rank(s) 2 to submit op 5");
//   * OpRunner (worker/op_runner.h): runs op k once for all of them as the
//     planner decides: local signature check, the signature exchange among
//     the daemons (a small allreduce's data riding on it), then the agreed
//     plan (flat, hierarchical, in memory, or the parameter server);
//   * DeviceStaging (worker/device_staging.h): device buffers' paths on
//     their GPUs and host twins;
//   * PeerTraffic (worker/peer_traffic.h): per-peer metrics;
//   * PointToPoint (worker/point_to_point.h): send and recv, on a thread and
//     connections of their own, beside the collective sequence.
// The executor completes the op on every local rank (Session::Finish). While
// it waits for a local rank to submit an op others have, it looks at its
// node context's peers before each sleep (Context::CheckPeers), so another
// daemon's ABORT or loss fails the op at once, naming the cause. A
// mismatch fails only that op. Any other failure (a peer lost, a deadline,
// a session closing, an abort) breaks the epoch: the node context tells the
// other daemons, the op fails on every local rank naming the cause, and every
// later op fails at once.
#ifndef GRADSYNC_WORKER_JOB_EXECUTOR_H_
#define GRADSYNC_WORKER_JOB_EXECUTOR_H_

#include <cstdint>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "collective/cost_model.h"
#include "collective/planner.h"
#include "collective/ring_allreduce.h"
#include "collective/topology.h"
#include "common/net.h"
#include "transport/device.h"
#include "transport/transport.h"
#include "worker/daemon_observer.h"
#include "worker/device_staging.h"
#include "worker/op_intake.h"
#include "worker/op_runner.h"
#include "worker/peer_traffic.h"
#include "worker/point_to_point.h"

namespace gradsync {

class Session;
struct QueuedOp;

// The job, its epoch, link, plan settings and shards (OpRunSettings,
// worker/op_runner.h), and what only the executor uses.
struct JobExecutorOptions : OpRunSettings {
  // The node context moves device memory itself (GPUDirect RDMA): the device
  // path sends straight from GPU memory, no staging.
  bool node_moves_device_memory = false;
  // The node context's transport ("tcp", "rdma"; "local" without one) and
  // its details, for status, metrics and logs.
  std::string transport = "local";
  std::string transport_detail;
  // How long to keep polling after activity before sleeping.
  absl::Duration spin = absl::Microseconds(50);
  DaemonObserver* observer = nullptr;  // not owned; may be null
};

class JobExecutor : public SessionExecutor {
 public:
  // `node_ctx` connects the job's daemons (null when every rank is here);
  // `p2p_ctx` too, for point-to-point messages (null: none across daemons).
  // Should the last reference go away on the executor's own thread (a call
  // it made released the last session), the executor is destroyed on a
  // thread of its own, which joins it.
  static std::shared_ptr<JobExecutor> Start(JobExecutorOptions options,
                                            std::unique_ptr<transport::Context> node_ctx,
                                            std::unique_ptr<transport::Context> p2p_ctx = nullptr);
  JobExecutor(JobExecutorOptions options, std::unique_ptr<transport::Context> node_ctx,
              std::unique_ptr<transport::Context> p2p_ctx);
  ~JobExecutor();  // stops and joins the thread (never call it on that thread)

  JobExecutor(const JobExecutor&) = delete;
  JobExecutor& operator=(const JobExecutor&) = delete;

  const JobPlacement& placement() const override { return options_.placement; }
  const LinkParams& link() const { return options_.link; }
  const std::string& transport() const { return options_.transport; }
  const std::string& transport_detail() const { return options_.transport_detail; }
  bool has_ps() const override { return runner_->has_ps(); }

  // A local rank's session joins (before its first op) or leaves. Detach
  // breaks the epoch with `why` (the other ranks' next ops cannot complete
  // without this one), fails a running op, and returns once the executor no
  // longer uses the session (which may then be destroyed). The other daemons
  // learn of it from a failing op here or when the executor's connections
  // close, not from an ABORT of its own (see Abort).
  void Attach(Session* session);
  void Detach(int rank, const absl::Status& why) override;
  // A session queued an op or changed its feed.
  void Kick() override;
  void SubmitPointToPoint(Session* session, std::shared_ptr<QueuedOp> op) override;
  // Fails the epoch from outside (the coordinator said so, daemon stopping,
  // a local client died) and tells the other daemons at once (an ABORT with
  // `reason`, sent by the executor's thread).
  void Abort(const absl::Status& reason) override;

  // For status: what op `seq` is doing ("negotiating" / "running <plan>",
  // empty if it is not the current op) and the ranks known to have
  // submitted it.
  OpProgress Progress(uint64_t seq) const override;

 private:
  void Run();
  // Runs the op in every slot and completes it on every local rank.
  void RunCurrent(const std::vector<Session*>& members);
  // Fails the ops in the slots with `why` (each annotated with its op and
  // rank), completes them and moves on. Returns the first annotated error
  // (OK if no op was taken).
  absl::Status FailTaken(const std::vector<Session*>& members, const absl::Status& why);
  // The node context's error if a peer failed it (CheckPeers: an ABORT, a
  // lost or closed connection), OK otherwise (also when this side failed it).
  absl::Status PeerFailure();
  // Breaks the epoch (first reason wins) and fails the node context with it
  // (which tells the other daemons).
  void BreakAndTell(const absl::Status& reason);

  const JobExecutorOptions options_;
  const std::unique_ptr<transport::Context> node_ctx_;
  OpIntake intake_;
  DeviceStaging staging_;            // executor thread only
  std::unique_ptr<OpRunner> runner_;  // executor thread only
  bool feedback_reported_ = false;   // OnErrorFeedback was called (executor thread, then ~)
  double feedback_norm_ = 0;         // the last residual norm computed, and when
  absl::Time feedback_norm_at_ = absl::InfinitePast();
  PeerTraffic traffic_;              // executor thread only
  PointToPoint p2p_;
  std::thread thread_;
};

}  // namespace gradsync

#endif  // GRADSYNC_WORKER_JOB_EXECUTOR_H_
