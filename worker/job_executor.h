// The one thread that runs a job epoch's ops on this daemon, for every rank
// of the job that uses this daemon.
//
// Each rank's session (worker/session.h) validates and queues its client's
// ops; the executor takes op k once every local rank has submitted it (the
// sessions number ops alike, so op k is the same collective on every rank,
// which the signature check confirms), and runs it once for all of them:
//   1. the local ranks' signatures are compared in memory;
//   2. with ranks on other daemons, the daemons exchange one signature each
//      over the job's node context (one rank per daemon), carrying this
//      daemon's plan proposal (rank 0's daemon's wins, collective/planner.h);
//      a small allreduce's data ride on that exchange (oneshot), as this
//      daemon's partial result. When signatures differ anywhere, the daemons
//      exchange every rank's signature, so every rank reports the same
//      mismatch naming the ranks;
//   3. the op runs as the planner (collective/planner.h) decided, the
//      executor dispatching on the Plan: with one rank per daemon, the
//      plan's algorithm on the client's buffer among the daemons; with ranks
//      sharing daemons, the local ranks are combined in memory in rank order
//      and the node context carries each daemon's share
//      (collective/hierarchical.h); with every rank here, all of it in
//      memory; or the parameter server;
//   4. every local rank's op completes.
// A mismatch fails only that op. Any other failure (a peer lost, a deadline,
// a session closing, an abort) breaks the epoch: the node context tells the
// other daemons, the op fails on every local rank naming the cause, and every
// later op fails at once.
//
// Waiting: while local ranks are missing, the executor takes submissions
// from their op queues itself (SubmissionFeed), polls briefly after
// activity, then sleeps on the doorbell of a rank it waits for (or a
// condition variable) with a bounded timeout; Kick() wakes it. Every wait is
// bounded by the ops' deadlines: a local rank that does not submit in time
// is named ("timed out at rank(s) 0,1 waiting for rank(s) 2 to submit op 5").
#ifndef GRADSYNC_WORKER_JOB_EXECUTOR_H_
#define GRADSYNC_WORKER_JOB_EXECUTOR_H_

#include <atomic>
#include <cstdint>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "collective/collectives.h"
#include "collective/cost_model.h"
#include "collective/planner.h"
#include "collective/ring_allreduce.h"
#include "collective/signature_exchange.h"
#include "common/net.h"
#include "ps/slicer.h"
#include "ps/worker_client.h"
#include "transport/memory.h"
#include "transport/transport.h"
#include "worker/daemon_observer.h"
#include "worker/device_path.h"
#include "collective/hierarchical.h"

namespace gradsync {

class Session;
struct QueuedOp;

struct JobExecutorOptions {
  std::string job_id;
  int64_t epoch = 0;
  JobPlacement placement;
  LinkParams link;  // agreed by the daemons when the epoch formed
  PlannerSettings planner;
  RingOptions ring;
  std::vector<HostPort> ps_shards;  // the epoch's gradsync-ps shards (plan "ps")
  std::vector<std::string> ps_shard_keys;  // what each shard proves (PsShardKey)
  bool data_tls = false;  // the shard connections run TLS too (JobOptions.data_tls)
  transport::Device* device = nullptr;  // the data plane's (PS contexts); not owned
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

class JobExecutor {
 public:
  // `node_ctx` connects the job's daemons (null when every rank is here).
  // Should the last reference go away on the executor's own thread (a call
  // it made released the last session), the executor is destroyed on a
  // thread of its own, which joins it.
  static std::shared_ptr<JobExecutor> Start(JobExecutorOptions options,
                                            std::unique_ptr<transport::Context> node_ctx);
  JobExecutor(JobExecutorOptions options, std::unique_ptr<transport::Context> node_ctx);
  ~JobExecutor();  // stops and joins the thread (never call it on that thread)

  JobExecutor(const JobExecutor&) = delete;
  JobExecutor& operator=(const JobExecutor&) = delete;

  const JobPlacement& placement() const { return options_.placement; }
  const LinkParams& link() const { return options_.link; }
  const std::string& transport() const { return options_.transport; }
  const std::string& transport_detail() const { return options_.transport_detail; }
  bool has_ps() const { return ps_ != nullptr; }

  // A local rank's session joins (before its first op) or leaves. Detach
  // breaks the epoch with `why` (the other ranks' next ops cannot complete
  // without this one), fails a running op, and returns once the executor no
  // longer uses the session (which may then be destroyed). The other daemons
  // learn of it from a failing op here or when the executor's connections
  // close, not from an ABORT of its own (see Abort).
  void Attach(Session* session);
  void Detach(int rank, const absl::Status& why);
  // A session queued an op or changed its feed.
  void Kick();
  // Fails the epoch from outside (the coordinator said so, daemon stopping,
  // a local client died) and tells the other daemons at once (an ABORT with
  // `reason`, sent by the executor's thread).
  void Abort(const absl::Status& reason);

  // For status: what op `seq` is doing ("negotiating" / "running <plan>",
  // empty if it is not the current op) and the ranks known to have
  // submitted it.
  struct OpProgress {
    std::string phase;
    std::vector<int> arrived;
  };
  OpProgress Progress(uint64_t seq) const;

 private:
  void Run();
  // Takes arrived ops into slots_; true if any.
  bool TakeArrivals(const std::vector<Session*>& members);
  // Runs the op in every slot and completes it on every local rank.
  void RunCurrent(const std::vector<Session*>& members);
  // Fails the ops in the slots with `why` (already annotated) and clears them.
  void FailTaken(const std::vector<Session*>& members, const absl::Status& why);
  // The deadline of the earliest op taken, InfiniteFuture if none.
  absl::Time EarliestDeadline() const;
  // The error for a local rank that did not submit op next_seq_ in time.
  absl::Status LateRankError() const;
  // Breaks the epoch (first reason wins) and tells the other daemons.
  void Break(const absl::Status& reason);
  // Sleeps until a submission, a Kick, or a bounded timeout.
  void Idle(const std::vector<Session*>& members, absl::Time last_active);

  // The phases of RunCurrent.
  // `mine`: this daemon's proposal (fused: the data ride on the exchange).
  // Sets rank 0's plan code and stream count.
  absl::Status Exchange(const std::vector<QueuedOp*>& ops, const Plan& mine, bool local_mismatch,
                        uint8_t* agreed_code, uint8_t* agreed_streams);
  absl::Status CompareEverywhere(const std::vector<QueuedOp*>& ops);
  // Runs `plan` (Agree's, not fused); `on_device`: the device path, when
  // plan.on_device.
  absl::Status RunAgreed(const std::vector<QueuedOp*>& ops, const Plan& plan,
                         DevicePath* on_device);
  // job_executor_run.cc. The device path of an op whose buffers are all
  // device buffers, on GPUs the lead's can reach; null: none (the planner
  // then runs the op on host twins).
  DevicePath* DevicePathFor(const std::vector<QueuedOp*>& ops);
  // c->bufs: the ops' device memory, c's reducer and bufs[0]'s registration.
  absl::Status DeviceLocal(DevicePath& path, const std::vector<QueuedOp*>& ops,
                           LocalCollective* c);
  // `s`, or the CUDA reducer's error when the op ran but a kernel failed.
  absl::Status DeviceResult(DevicePath& path, absl::Status s);
  absl::Status RunFlatOnDevice(DevicePath& path, const QueuedOp& lead, Algorithm algorithm);
  // The flat call of `lead` on its buffer at `data` (host or device memory).
  CollectiveCall FlatCall(const QueuedOp& lead, char* data, transport::MemKind kind) const;
  absl::Status RunInMemoryOnDevice(DevicePath& path, const std::vector<QueuedOp*>& ops);
  // The registration on node_ctx_ of the buffer `op` runs on (cached).
  // Copies each device buffer's op range into its host twin (`in`) or the
  // result back; the error names the local rank.
  absl::Status StageDeviceBuffers(const std::vector<QueuedOp*>& ops, size_t bytes, bool in);
  absl::StatusOr<const transport::MemoryRegion*> BufferRegion(const QueuedOp& op);
  void NoteArrived(int rank);
  void SetPhase(std::string phase);
  // Metrics for finished ops (after the clients were told).
  void FlushPeerBytes(absl::Duration op_run, absl::Time now);
  void Account(size_t bytes, absl::Duration run, absl::Time end);

  const JobExecutorOptions options_;
  const std::unique_ptr<transport::Context> node_ctx_;
  const std::vector<int> local_;  // local ranks, ascending
  const bool one_rank_per_daemon_;
  std::unique_ptr<Planner> planner_;      // executor thread only
  std::unique_ptr<ps::PsWorker> ps_;      // null unless the job has shards
  std::unique_ptr<SlicePool> pool_;       // with several local ranks: large in-memory passes
  ps::BalancedSlicer slicer_;             // executor thread only
  SignatureScratch sig_scratch_;          // executor thread only
  // Host staging for in-memory stages and for the algorithms (executor thread only).
  transport::Scratch scratch_, algo_scratch_;
  // The clients' buffers registered on node_ctx_, once per buffer (executor thread only).
  transport::RegistrationCache registrations_;
  // Device paths by GPU ordinal, made on first use; GPUs whose path could not
  // be made run on host twins (executor thread only).
  std::map<int, std::unique_ptr<DevicePath>> device_paths_;
  std::set<int> device_path_failed_;
  std::set<int> peer_access_;  // GPUs the device paths' kernels may reach
  uint64_t next_seq_ = 1;                  // executor thread only
  std::vector<std::shared_ptr<QueuedOp>> slots_;  // by local index; executor thread only
  std::vector<std::string> encoded_;       // executor thread only
  std::vector<uint64_t> peer_sent_, peer_received_, peer_retrans_;  // by node; executor thread only
  absl::Time next_peer_flush_ = absl::InfinitePast();
  absl::Time next_retrans_sample_ = absl::InfinitePast();
  bool peer_bytes_dirty_ = false;

  mutable absl::Mutex mu_;
  absl::CondVar cv_;
  std::vector<Session*> members_ ABSL_GUARDED_BY(mu_);  // by local index; not owned
  // The executor thread uses a snapshot of members_ (from `generation_`)
  // while `using_`: a detaching session waits for it to end.
  bool using_ ABSL_GUARDED_BY(mu_) = false;
  uint64_t generation_ ABSL_GUARDED_BY(mu_) = 0;
  absl::Status broken_ ABSL_GUARDED_BY(mu_);
  bool tell_peers_ ABSL_GUARDED_BY(mu_) = false;  // Abort(): send the other daemons an ABORT
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  bool sleeping_ ABSL_GUARDED_BY(mu_) = false;
  std::shared_ptr<class SubmissionFeed> sleep_feed_ ABSL_GUARDED_BY(mu_);
  std::atomic<uint64_t> kicks_{0};

  mutable absl::Mutex progress_mu_;
  uint64_t progress_seq_ ABSL_GUARDED_BY(progress_mu_) = 0;
  std::string progress_phase_ ABSL_GUARDED_BY(progress_mu_);
  std::vector<bool> progress_arrived_ ABSL_GUARDED_BY(progress_mu_);  // by rank

  std::thread thread_;
};

}  // namespace gradsync

#endif  // GRADSYNC_WORKER_JOB_EXECUTOR_H_
