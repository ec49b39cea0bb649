// Op runner: runs op k of this daemon's local ranks once for all of them, as
// the planner (collective/planner.h) decides. It passes the planner what it
// knows as plain data, dispatches on the Plan, and decides nothing itself.
//
// Run(ops), the ops by local index, all op k:
//   1. the local ranks' signatures are compared in memory;
//   2. the planner proposes a Plan (device buffers: a device path, from
//      DeviceStaging, is offered where Planner::WantsDevicePath; otherwise
//      their host twins are filled);
//   3. every rank here (Plan::in_memory): the op runs in memory. Otherwise
//      the daemons exchange one signature each over the node context
//      (Exchange: collective/signature_exchange.h), carrying this daemon's
//      proposal (rank 0's daemon's wins: Planner::Agree). A fused
//      (oneshot) allreduce rides on that exchange: the client's buffer with
//      one rank per daemon, else this daemon's partial result (its ranks
//      combined in rank order by collective/hierarchical's ReduceLocalShare,
//      spread back by SpreadLocalResult). When the signatures differ
//      anywhere, the daemons exchange every rank's signature
//      (CompareEverywhere), so every rank reports the same mismatch naming
//      the ranks;
//   4. RunAgreed dispatches the agreed Plan: the parameter server
//      (ps/worker_client.h), flat (the plan's algorithm among the daemons on
//      the client's buffer), hierarchical (ranks sharing daemons: combined in
//      memory, one share per daemon across), on host memory or on the device
//      path (worker/device_staging.h);
//   5. device buffers' host twins get the result back.
// Errors: InvalidArgument for a signature mismatch (only this op fails);
// anything else is the transport's or a collective's error, which breaks the
// epoch (the executor's business).
//
// Threading: the executor's thread only (the planner, scratch and caches are
// its). Blocking: up to the ops' deadlines.
#ifndef GRADSYNC_WORKER_OP_RUNNER_H_
#define GRADSYNC_WORKER_OP_RUNNER_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "collective/collectives.h"
#include "collective/cost_model.h"
#include "collective/hierarchical.h"
#include "collective/planner.h"
#include "collective/two_level.h"
#include "collective/ring_allreduce.h"
#include "collective/signature_exchange.h"
#include "collective/topology.h"
#include "common/net.h"
#include "common/slice_pool.h"
#include "ps/slicer.h"
#include "ps/worker_client.h"
#include "transport/device.h"
#include "transport/memory.h"
#include "transport/transport.h"
#include "worker/device_staging.h"
#include "worker/error_feedback_store.h"

namespace gradsync {

struct QueuedOp;

// What an epoch's ops run with on this daemon; JobExecutorOptions carries
// the same (it extends it), so the executor hands it on as one piece.
struct OpRunSettings {
  std::string job_id;
  int64_t epoch = 0;
  JobPlacement placement;
  LinkParams link;  // agreed by the daemons when the epoch formed
  PlannerSettings planner;
  RingOptions ring;
  std::vector<HostPort> ps_shards;         // the epoch's gradsync-ps shards (plan "ps")
  std::vector<std::string> ps_shard_keys;  // what each shard proves (PsShardKey)
  bool data_tls = false;  // the shard connections run TLS too (JobOptions.data_tls)
  transport::Device* device = nullptr;     // the data plane's (PS contexts); not owned
};

struct OpRunnerOptions : OpRunSettings {
  // Progress for status (may be empty): a rank (of any daemon) is known to
  // have submitted the op; the op's phase ("running <plan>").
  std::function<void(int rank)> note_arrived;
  std::function<void(const std::string& phase)> set_phase;
};

class OpRunner {
 public:
  // `node_ctx` (not owned; null: every rank is here) connects the job's
  // daemons; `staging` (not owned) holds the device paths.
  OpRunner(OpRunnerOptions options, transport::Context* node_ctx, DeviceStaging* staging);
  ~OpRunner();
  OpRunner(const OpRunner&) = delete;
  OpRunner& operator=(const OpRunner&) = delete;

  bool has_ps() const { return ps_ != nullptr; }

  // What Run reports besides its status.
  struct Outcome {
    std::string plan_name;  // the plan's shown name ("" if it did not run)
    absl::Duration exchange;  // negotiate_start to the end of the exchange
    // A compressed op: what its stage among the daemons sent over what the
    // dense ring would have sent (0: dense).
    double wire_ratio = 0;
    bool kept_state = false;  // a top-k op (or its warm-up) or a named codec op: feedback() changed
  };
  // Plans and runs the ops (op k of every local rank, by local index; the
  // executor checked that they are op k and the epoch is healthy).
  // `negotiate_start`: when the executor began the op.
  absl::Status Run(const std::vector<QueuedOp*>& ops, absl::Time negotiate_start, Outcome* out);

  // The steps of Run, for tests.
  // `mine`: this daemon's proposal (fused: the data ride on the exchange).
  // Sets rank 0's plan code and stream count.
  absl::Status Exchange(const std::vector<QueuedOp*>& ops, const Plan& mine, bool local_mismatch,
                        uint8_t* agreed_code, uint8_t* agreed_streams, uint8_t* agreed_codec);
  // Every rank's signature to every daemon; the mismatch naming the ranks
  // (InvalidArgument), or the transport's error.
  absl::Status CompareEverywhere(const std::vector<QueuedOp*>& ops);
  // Runs `plan` (Agree's, not fused); `on_device`: the device path, when
  // plan.on_device.
  // `two_level`: the allreduce runs among the daemons in two levels, by host
  // (collective/two_level.h; TwoLevel decides).
  // `sparse`: a top-k plan's parameters and state (plan.sparse);
  // `codec_feedback`: a codec plan's error feedback (null: none kept).
  absl::Status RunAgreed(const std::vector<QueuedOp*>& ops, const Plan& plan,
                         DevicePath* on_device, bool two_level = false,
                         const SparseStage* sparse = nullptr,
                         ErrorFeedback* codec_feedback = nullptr);
  // The error feedback of this epoch's compressed ops.
  const ErrorFeedbackStore& feedback() const { return feedback_; }
  // The plan name an op run in two levels reports.
  static constexpr const char* kTwoLevelPlanName = "2level";

 private:
  // Whether the agreed `plan` for `lead` (`bytes` per rank) runs in two levels
  // by host: an allreduce, one rank per daemon, no algorithm forced, large
  // enough, and daemons sharing hosts evenly (hosts_). Every daemon decides
  // alike: the inputs are the same everywhere.
  bool TwoLevel(const QueuedOp& lead, const Plan& plan, size_t bytes) const;
  // The key of `op`'s error feedback: its name; for an unnamed op on the
  // client's own memory (ShmSegment::client_memory: e.g. a DDP bucket the
  // PyTorch backend adopted), that memory and the op's offset in it, the
  // entry ending with the memory (its identity holds while it is
  // registered; a serial, never reused, names it); otherwise none (a
  // buffer the daemon allocated may be a staging buffer that carries a
  // different tensor every op). Local to this daemon: the op signature
  // compares names only.
  static ErrorFeedbackStore::Key FeedbackKeyOf(const QueuedOp& op);
  // A dense op (host memory) of a key whose codec ops still owe values
  // pays them back: the key's quantization residual joins the lead's input
  // and leaves the store (ErrorFeedbackStore::TakeResidual).
  void PayBack(const QueuedOp& lead, Outcome* out);
  // The layout of `lead`'s quantization residual (its stage among the
  // daemons' elements).
  FeedbackLayout QuantizedLayout(const QueuedOp& lead) const;
  // premul_sum's first step: each op's `bytes` of input (host memory)
  // multiplied by its rank's factor, before the algorithms sum.
  void Premultiply(const std::vector<QueuedOp*>& ops, size_t bytes);
  // The registration on node_ctx_ of the buffer `op` runs on (cached).
  absl::StatusOr<const transport::MemoryRegion*> BufferRegion(const QueuedOp& op);
  void NoteArrived(int rank) {
    if (options_.note_arrived) options_.note_arrived(rank);
  }
  void SetPhase(const std::string& phase) {
    if (options_.set_phase) options_.set_phase(phase);
  }

  const OpRunnerOptions options_;
  transport::Context* const node_ctx_;
  DeviceStaging* const staging_;
  const std::vector<int> local_;  // local ranks, ascending
  const bool one_rank_per_daemon_;
  std::unique_ptr<Planner> planner_;
  HostGroups hosts_;  // the daemons by host (TwoLevel)
  std::unique_ptr<ps::PsWorker> ps_;  // null unless the job has shards
  std::unique_ptr<SlicePool> pool_;   // with several local ranks: large in-memory passes
  ps::BalancedSlicer slicer_;
  SignatureScratch sig_scratch_;
  // Host staging for in-memory stages and for the algorithms.
  transport::Scratch scratch_, algo_scratch_;
  // The clients' buffers registered on node_ctx_, once per buffer.
  transport::RegistrationCache registrations_;
  ErrorFeedbackStore feedback_;  // this epoch's compressed ops' state, by key
  std::vector<std::string> encoded_;  // the local signatures, by local index
  // How long the last op's stage among the daemons took, where it ran one
  // (ranks sharing daemons): the planner learns the codecs' cost from it.
  absl::Duration stage_time_;
};

}  // namespace gradsync

#endif  // GRADSYNC_WORKER_OP_RUNNER_H_
