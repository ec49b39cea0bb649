// How JobExecutor runs an agreed op, dispatching on the planner's Plan
// (collective/planner.h): the parameter-server path, one rank per daemon
// (flat) or several (combined in memory, then across daemons); on host
// memory, or a device buffer's op in place on its GPU (the device path,
// worker/device_path.h) rather than on its host twin (StageDeviceBuffers).
#include <algorithm>

#include "absl/strings/str_cat.h"
#include "collective/collectives.h"
#include "common/logging.h"
#include "common/status_macros.h"
#include "worker/device_memory.h"
#include "worker/job_executor.h"
#include "worker/session.h"

namespace gradsync {

absl::Status JobExecutor::RunAgreed(const std::vector<QueuedOp*>& ops, const Plan& plan,
                                    DevicePath* on_device) {
  const QueuedOp& lead = *ops[0];
  const JobPlacement& place = options_.placement;
  const CollectiveKind kind = lead.sig.kind;
  absl::Time deadline = lead.deadline;
  for (const QueuedOp* op : ops) deadline = std::min(deadline, op->deadline);
  LocalCollective c{kind, lead.sig.dtype, lead.sig.op, lead.sig.count, lead.sig.root, {}};
  const Slicing slicing{pool_.get(), plan.slice_min_bytes};
  if (plan.path == PlanPath::kParameterServer) {
    ps::PsMemory memory;  // the client's shared-memory buffer, registered once
    if (lead.buffer != nullptr) {
      memory.whole = transport::Buffer{lead.buffer->data(), lead.buffer->size()};
      memory.owner = lead.buffer;
    }
    const ps::PsMemory* mem = lead.buffer != nullptr ? &memory : nullptr;
    if (!plan.local_stage) {
      return ps_->PushPull(lead.seq, lead.data(), lead.sig.count, lead.sig.dtype, lead.sig.op,
                           place.world, local_[0], plan.ps_partition_bytes, slicer_,
                           lead.deadline, mem);
    }
    // This daemon's partial result is one worker's push (host memory: the
    // CPU's reducer), combined and spread as the hierarchical allreduce does.
    for (QueuedOp* op : ops) c.bufs.push_back(op->data());
    ReduceLocalShare(c, slicing);
    RETURN_IF_ERROR(ps_->PushPull(lead.seq, c.bufs[0], lead.sig.count, lead.sig.dtype,
                                  CombineOp(lead.sig.op), place.nodes(), place.node_index,
                                  plan.ps_partition_bytes, slicer_, lead.deadline, mem));
    SpreadLocalResult(c, place.world, slicing);
    return absl::OkStatus();
  }
  if (!plan.local_stage) {
    if (on_device != nullptr) return RunFlatOnDevice(*on_device, lead, plan.algorithm);
    CollectiveCall call = FlatCall(lead, lead.data(), transport::MemKind::Host());
    if (lead.buffer != nullptr) {
      absl::StatusOr<const transport::MemoryRegion*> region = BufferRegion(lead);
      if (!region.ok()) return region.status();
      call.region = *region;
    }
    return RunCollective(*node_ctx_, call, plan.algorithm, &algo_scratch_);
  }
  // Ranks share daemons: combined in memory, one share per daemon between them.
  if (on_device != nullptr) {
    RETURN_IF_ERROR(DeviceLocal(*on_device, ops, &c));
    absl::Status s = RunAcrossNodes(*on_device->context(), place, c, plan.node_algorithm,
                                    lead.seq, deadline, options_.ring, &on_device->scratch(),
                                    &on_device->algo_scratch());
    return DeviceResult(*on_device, s);
  }
  for (QueuedOp* op : ops) c.bufs.push_back(op->data());
  if (lead.buffer != nullptr) {
    absl::StatusOr<const transport::MemoryRegion*> region = BufferRegion(lead);
    if (!region.ok()) return region.status();
    c.region0 = *region;
  }
  return RunAcrossNodes(*node_ctx_, place, c, plan.node_algorithm, lead.seq, deadline,
                        options_.ring, &scratch_, &algo_scratch_, slicing);
}

absl::StatusOr<const transport::MemoryRegion*> JobExecutor::BufferRegion(const QueuedOp& op) {
  const ShmSegment& seg = *op.buffer;
  return registrations_.Get(*node_ctx_, transport::Buffer{seg.data(), seg.size()},
                            std::weak_ptr<const void>(op.buffer));
}


DevicePath* JobExecutor::DevicePathFor(const std::vector<QueuedOp*>& ops) {
  for (const QueuedOp* op : ops) {
    if (op->device == nullptr) return nullptr;  // host buffers among them: host twins
  }
  const int gpu = ops[0]->device->device();
  if (device_path_failed_.count(gpu) != 0) return nullptr;
  // Co-located ranks on other GPUs: the kernels on this one read their
  // memory directly (peer access), or the op runs on host twins.
  for (const QueuedOp* op : ops) {
    const int other = op->device->device();
    if (other == gpu || peer_access_.count(other) != 0) continue;
    if (absl::Status s = cuda::EnablePeerAccess(gpu, other); !s.ok()) {
      GS_LOG(WARNING) << "job '" << options_.job_id << "': ranks on GPUs " << gpu << " and "
                      << other << " run on host twins: " << s.message();
      return nullptr;
    }
    peer_access_.insert(other);
  }
  auto it = device_paths_.find(gpu);
  if (it != device_paths_.end()) return it->second.get();
  absl::StatusOr<std::unique_ptr<DevicePath>> made =
      DevicePath::Create(gpu, node_ctx_.get(), options_.node_moves_device_memory);
  if (!made.ok()) {
    GS_LOG(WARNING) << "job '" << options_.job_id << "': device buffers on GPU " << gpu
                    << " run on host twins: " << made.status().message();
    device_path_failed_.insert(gpu);
    return nullptr;
  }
  GS_LOG(INFO) << "job '" << options_.job_id << "': device buffers on GPU " << gpu
               << " run in place, "
               << (node_ctx_ == nullptr ? "every rank on this daemon"
                   : options_.node_moves_device_memory
                       ? "sent straight from GPU memory (GPUDirect)"
                       : "staged through page-locked host blocks");
  return (device_paths_[gpu] = std::move(*made)).get();
}

absl::Status JobExecutor::DeviceLocal(DevicePath& path, const std::vector<QueuedOp*>& ops,
                                      LocalCollective* c) {
  for (const QueuedOp* op : ops) c->bufs.push_back(op->device->device_data() + op->offset);
  c->reducer = &path.reducer();
  if (path.context() != nullptr) {
    const DeviceMemory& memory = *ops[0]->device;
    ASSIGN_OR_RETURN(c->region0,
                     registrations_.Get(*path.context(),
                                        transport::Buffer{memory.device_data(), memory.size(),
                                                          transport::MemKind::Cuda(path.device())},
                                        std::weak_ptr<const void>(ops[0]->device)));
  }
  return absl::OkStatus();
}

absl::Status JobExecutor::DeviceResult(DevicePath& path, absl::Status s) {
  absl::Status reduced = path.reducer().TakeError();
  if (s.ok() && !reduced.ok()) {
    s = absl::Status(reduced.code(), absl::StrCat("on GPU ", path.device(), ": ",
                                                  reduced.message()));
  }
  return s;
}

absl::Status JobExecutor::RunInMemoryOnDevice(DevicePath& path, const std::vector<QueuedOp*>& ops) {
  const QueuedOp& lead = *ops[0];
  LocalCollective c{lead.sig.kind, lead.sig.dtype, lead.sig.op, lead.sig.count, lead.sig.root, {}};
  RETURN_IF_ERROR(DeviceLocal(path, ops, &c));
  return DeviceResult(path, RunInMemory(options_.placement, c, &path.scratch()));
}

CollectiveCall JobExecutor::FlatCall(const QueuedOp& lead, char* data,
                                     transport::MemKind kind) const {
  CollectiveCall call;
  call.kind = lead.sig.kind;
  call.buffer = transport::Buffer{data,
                                  CollectiveBufferBytes(lead.sig.kind, lead.sig.count,
                                                        lead.sig.dtype, options_.placement.world),
                                  kind};
  call.count = lead.sig.count;
  call.dtype = lead.sig.dtype;
  call.op = lead.sig.op;
  call.root = lead.sig.root;
  call.seq = lead.seq;
  call.deadline = lead.deadline;
  call.ring = options_.ring;
  return call;
}

absl::Status JobExecutor::RunFlatOnDevice(DevicePath& path, const QueuedOp& lead,
                                          Algorithm algorithm) {
  const transport::MemKind kind = transport::MemKind::Cuda(path.device());
  const DeviceMemory& memory = *lead.device;
  CollectiveCall call = FlatCall(lead, memory.device_data() + lead.offset, kind);
  // The whole device buffer, registered once on the path's context.
  ASSIGN_OR_RETURN(call.region,
                   registrations_.Get(*path.context(),
                                      transport::Buffer{memory.device_data(), memory.size(), kind},
                                      std::weak_ptr<const void>(lead.device)));
  call.reducer = &path.reducer();
  return DeviceResult(path, RunCollective(*path.context(), call, algorithm,
                                          &path.algo_scratch()));
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
