// JobExecutor's device buffers: in place on their GPU (the device path,
// worker/device_path.h) or on their host twins (StageDeviceBuffers).
#include "absl/strings/str_cat.h"
#include "collective/collectives.h"
#include "common/logging.h"
#include "worker/device_memory.h"
#include "worker/job_executor.h"
#include "worker/session.h"

namespace gradsync {

DevicePath* JobExecutor::DevicePathFor(const std::vector<QueuedOp*>& ops) {
  const QueuedOp& lead = *ops[0];
  if (lead.device == nullptr || !options_.device_ops_in_place || !one_rank_per_daemon_ ||
      node_ctx_ == nullptr) {
    return nullptr;
  }
  const int gpu = lead.device->device();
  if (device_path_failed_.count(gpu) != 0) return nullptr;
  auto it = device_paths_.find(gpu);
  if (it != device_paths_.end()) return it->second.get();
  absl::StatusOr<std::unique_ptr<DevicePath>> made =
      DevicePath::Create(gpu, *node_ctx_, options_.node_moves_device_memory);
  if (!made.ok()) {
    GS_LOG(WARNING) << "job '" << options_.job_id << "': device buffers on GPU " << gpu
                    << " run on host twins: " << made.status().message();
    device_path_failed_.insert(gpu);
    return nullptr;
  }
  GS_LOG(INFO) << "job '" << options_.job_id << "': device buffers on GPU " << gpu
               << " run in place, "
               << (options_.node_moves_device_memory ? "sent straight from GPU memory (GPUDirect)"
                                                     : "staged through page-locked host blocks");
  return (device_paths_[gpu] = std::move(*made)).get();
}

absl::Status JobExecutor::RunOnDevice(DevicePath& path, const QueuedOp& lead,
                                      Algorithm algorithm) {
  const JobPlacement& place = options_.placement;
  const transport::MemKind kind = transport::MemKind::Cuda(path.device());
  const DeviceMemory& memory = *lead.device;
  CollectiveCall call;
  call.kind = lead.sig.kind;
  call.buffer = transport::Buffer{memory.device_data() + lead.offset,
                                  CollectiveBufferBytes(lead.sig.kind, lead.sig.count,
                                                        lead.sig.dtype, place.world),
                                  kind};
  // The whole device buffer, registered once on the path's context.
  absl::StatusOr<const transport::MemoryRegion*> region = registrations_.Get(
      path.context(), transport::Buffer{memory.device_data(), memory.size(), kind},
      std::weak_ptr<const void>(lead.device));
  if (!region.ok()) return region.status();
  call.region = *region;
  call.count = lead.sig.count;
  call.dtype = lead.sig.dtype;
  call.op = lead.sig.op;
  call.root = lead.sig.root;
  call.seq = lead.seq;
  call.deadline = lead.deadline;
  call.ring = options_.ring;
  call.reducer = &path.reducer();
  absl::Status s = RunCollective(path.context(), call, algorithm, &path.scratch());
  absl::Status reduced = path.reducer().TakeError();
  if (s.ok() && !reduced.ok()) {
    s = absl::Status(reduced.code(), absl::StrCat("on GPU ", path.device(), ": ",
                                                  reduced.message()));
  }
  return s;
}

absl::Status JobExecutor::StageDeviceBuffers(const std::vector<QueuedOp*>& ops, size_t bytes,
                                             bool in) {
  for (size_t i = 0; i < ops.size(); ++i) {
    DeviceMemory* d = ops[i]->device.get();
    if (d == nullptr) continue;
    absl::Status s = in ? d->StageIn(ops[i]->offset, bytes) : d->StageOut(ops[i]->offset, bytes);
    if (!s.ok()) return absl::Status(s.code(), absl::StrCat("rank ", local_[i], ": ", s.message()));
  }
  return absl::OkStatus();
}

}  // namespace gradsync
