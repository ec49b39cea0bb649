// Device staging: how the job's executor runs ops whose buffers are device
// buffers (worker/device_memory.h).
//
//   * Device paths (worker/device_path.h), one per GPU, made on first use
//     (PathFor). A GPU whose path could not be made is remembered and its
//     ops run on host twins from then on, without asking again. Co-located
//     ranks on other GPUs need peer access from the lead's GPU (enabled once
//     per GPU); where it fails, that op runs on host twins.
//   * Host twins: StageIn copies each device buffer's op range into its
//     host twin before an op runs on host memory, StageOut copies the result
//     back after it succeeded; the error names the local rank.
//   * Running on the device path, as the runner (worker/op_runner.h)
//     dispatches: Local (the LocalCollective of the ops' device memory, with
//     the path's reducer and bufs[0]'s registration on the path's context),
//     RunFlat (the flat collective in place on the GPU), RunInMemory (every
//     rank here), and Result (a CUDA kernel's error, when the collective
//     itself succeeded).
// Whether an op runs on the device path is the planner's decision
// (Planner::WantsDevicePath, Plan::on_device); this only says whether a path
// exists.
//
// Threading: the executor's thread only.
#ifndef GRADSYNC_WORKER_DEVICE_STAGING_H_
#define GRADSYNC_WORKER_DEVICE_STAGING_H_

#include <functional>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "collective/collectives.h"
#include "collective/hierarchical.h"
#include "collective/two_level.h"
#include "collective/ring_allreduce.h"
#include "collective/topology.h"
#include "transport/memory.h"
#include "transport/transport.h"
#include "worker/device_path.h"

namespace gradsync {

struct QueuedOp;

// The flat call of `lead` (a world of `world` ranks) on its buffer at `data`
// (host or device memory of `kind`).
CollectiveCall FlatCallOf(const QueuedOp& lead, int world, const RingOptions& ring, char* data,
                          transport::MemKind kind);

class DeviceStaging {
 public:
  // What a GPU is asked; tests replace it. Defaults: DevicePath::Create and
  // cuda::EnablePeerAccess.
  struct Gpus {
    std::function<absl::StatusOr<std::unique_ptr<DevicePath>>(int gpu)> make_path;
    std::function<absl::Status(int gpu, int peer)> enable_peer_access;
  };
  // `placement` (must outlive this) gives the local ranks errors name;
  // `node_ctx` (not owned; null: every rank here) is what the paths run on;
  // `node_moves_device_memory`: it sends GPU memory itself (GPUDirect).
  DeviceStaging(std::string job_id, const JobPlacement& placement, RingOptions ring,
                transport::Context* node_ctx, bool node_moves_device_memory, Gpus gpus = {});
  ~DeviceStaging();
  DeviceStaging(const DeviceStaging&) = delete;
  DeviceStaging& operator=(const DeviceStaging&) = delete;

  // The device path of an op whose buffers are all device buffers (by local
  // index), on GPUs the lead's can reach; null: none (host buffers among
  // them, or no path: the op runs on host twins).
  DevicePath* PathFor(const std::vector<QueuedOp*>& ops);
  // The same for ops on GPUs `gpus` (by local index; [0] is the lead's).
  DevicePath* PathForGpus(const std::vector<int>& gpus);
  // Whether GPU `gpu`'s path could not be made (it is not asked again).
  bool failed(int gpu) const { return failed_.count(gpu) != 0; }

  // Host twins of the ops' device buffers, [offset, offset+bytes).
  absl::Status StageIn(const std::vector<QueuedOp*>& ops, size_t bytes);
  absl::Status StageOut(const std::vector<QueuedOp*>& ops, size_t bytes);

  // c->bufs: the ops' device memory, c's reducer and bufs[0]'s registration.
  absl::Status Local(DevicePath& path, const std::vector<QueuedOp*>& ops, LocalCollective* c);
  // `s`, or the CUDA reducer's error when the op ran but a kernel failed.
  absl::Status Result(DevicePath& path, absl::Status s);
  // `codec` (not kNone): the compressed ring, encoded and decoded on the GPU.
  // `two_level`: the allreduce runs in two levels by host instead
  // (collective/two_level.h; every daemon decides alike, whatever its memory).
  absl::Status RunFlat(DevicePath& path, const QueuedOp& lead, Algorithm algorithm,
                       CodecId codec = CodecId::kNone, const HostGroups* two_level = nullptr);
  absl::Status RunInMemory(DevicePath& path, const std::vector<QueuedOp*>& ops);

 private:
  absl::Status Stage(const std::vector<QueuedOp*>& ops, size_t bytes, bool in);

  const std::string job_id_;
  const JobPlacement& place_;
  const std::vector<int> local_;
  const RingOptions ring_;
  transport::Context* const node_ctx_;
  const bool direct_;
  Gpus gpus_;
  std::map<int, std::unique_ptr<DevicePath>> paths_;  // by GPU ordinal
  std::set<int> failed_;       // GPUs whose path could not be made
  std::set<int> peer_access_;  // GPUs the paths' kernels may reach
  // The device buffers registered on the paths' contexts, once per buffer
  // (declared last: the registrations go before the paths' contexts).
  transport::RegistrationCache registrations_;
};

}  // namespace gradsync

#endif  // GRADSYNC_WORKER_DEVICE_STAGING_H_
