#include "worker/device_staging.h"

#include "absl/strings/str_cat.h"
#include "common/logging.h"
#include "common/status_macros.h"
#include "cuda/cuda_memory.h"
#include "worker/device_memory.h"
#include "worker/session.h"

namespace gradsync {

CollectiveCall FlatCallOf(const QueuedOp& lead, int world, const RingOptions& ring, char* data,
                          transport::MemKind kind) {
  CollectiveCall call;
  call.kind = lead.sig.kind;
  call.buffer = transport::Buffer{
      data, CollectiveBufferBytes(lead.sig.kind, lead.sig.count, lead.sig.dtype, world), kind};
  call.count = lead.sig.count;
  call.dtype = lead.sig.dtype;
  call.op = lead.sig.op;
  call.root = lead.sig.root;
  call.seq = lead.seq;
  call.deadline = lead.deadline;
  call.ring = ring;
  return call;
}

DeviceStaging::DeviceStaging(std::string job_id, const JobPlacement& placement, RingOptions ring,
                             transport::Context* node_ctx, bool node_moves_device_memory,
                             Gpus gpus)
    : job_id_(std::move(job_id)),
      place_(placement),
      local_(placement.local_ranks()),
      ring_(ring),
      node_ctx_(node_ctx),
      direct_(node_moves_device_memory),
      gpus_(std::move(gpus)) {
  if (!gpus_.make_path) {
    gpus_.make_path = [this](int gpu) { return DevicePath::Create(gpu, node_ctx_, direct_); };
  }
  if (!gpus_.enable_peer_access) gpus_.enable_peer_access = cuda::EnablePeerAccess;
}

DeviceStaging::~DeviceStaging() = default;

DevicePath* DeviceStaging::PathFor(const std::vector<QueuedOp*>& ops) {
  std::vector<int> gpus;
  for (const QueuedOp* op : ops) {
    if (op->device == nullptr) return nullptr;  // host buffers among them: host twins
    gpus.push_back(op->device->device());
  }
  return PathForGpus(gpus);
}

DevicePath* DeviceStaging::PathForGpus(const std::vector<int>& gpus) {
  if (gpus.empty()) return nullptr;
  const int gpu = gpus[0];
  if (failed_.count(gpu) != 0) return nullptr;
  // Co-located ranks on other GPUs: the kernels on this one read their
  // memory directly (peer access), or the op runs on host twins.
  for (const int other : gpus) {
    if (other == gpu || peer_access_.count(other) != 0) continue;
    if (absl::Status s = gpus_.enable_peer_access(gpu, other); !s.ok()) {
      GS_LOG(WARNING) << "job '" << job_id_ << "': ranks on GPUs " << gpu << " and " << other
                      << " run on host twins: " << s.message();
      return nullptr;
    }
    peer_access_.insert(other);
  }
  auto it = paths_.find(gpu);
  if (it != paths_.end()) return it->second.get();
  absl::StatusOr<std::unique_ptr<DevicePath>> made = gpus_.make_path(gpu);
  if (!made.ok()) {
    GS_LOG(WARNING) << "job '" << job_id_ << "': device buffers on GPU " << gpu
                    << " run on host twins: " << made.status().message();
    failed_.insert(gpu);
    return nullptr;
  }
  GS_LOG(INFO) << "job '" << job_id_ << "': device buffers on GPU " << gpu << " run in place, "
               << (node_ctx_ == nullptr ? "every rank on this daemon"
                   : direct_            ? "sent straight from GPU memory (GPUDirect)"
                                        : "staged through page-locked host blocks");
  return (paths_[gpu] = std::move(*made)).get();
}

absl::Status DeviceStaging::StageIn(const std::vector<QueuedOp*>& ops, size_t bytes) {
  return Stage(ops, bytes, /*in=*/true);
}

absl::Status DeviceStaging::StageOut(const std::vector<QueuedOp*>& ops, size_t bytes) {
  return Stage(ops, bytes, /*in=*/false);
}

absl::Status DeviceStaging::Stage(const std::vector<QueuedOp*>& ops, size_t bytes, bool in) {
  for (size_t i = 0; i < ops.size(); ++i) {
    DeviceMemory* d = ops[i]->device.get();
    if (d == nullptr) continue;
    absl::Status s = in ? d->StageIn(ops[i]->offset, bytes) : d->StageOut(ops[i]->offset, bytes);
    if (!s.ok()) return absl::Status(s.code(), absl::StrCat("rank ", local_[i], ": ", s.message()));
  }
  return absl::OkStatus();
}

absl::Status DeviceStaging::Local(DevicePath& path, const std::vector<QueuedOp*>& ops,
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

absl::Status DeviceStaging::Result(DevicePath& path, absl::Status s) {
  absl::Status reduced = path.reducer().TakeError();
  if (s.ok() && !reduced.ok()) {
    s = absl::Status(reduced.code(),
                     absl::StrCat("on GPU ", path.device(), ": ", reduced.message()));
  }
  return s;
}

absl::Status DeviceStaging::RunInMemory(DevicePath& path, const std::vector<QueuedOp*>& ops) {
  const QueuedOp& lead = *ops[0];
  LocalCollective c{lead.sig.kind, lead.sig.dtype, lead.sig.op, lead.sig.count, lead.sig.root, {}};
  RETURN_IF_ERROR(Local(path, ops, &c));
  return Result(path, gradsync::RunInMemory(place_, c, &path.scratch()));
}

absl::Status DeviceStaging::RunFlat(DevicePath& path, const QueuedOp& lead, Algorithm algorithm,
                                    CodecId codec, const HostGroups* two_level) {
  const transport::MemKind kind = transport::MemKind::Cuda(path.device());
  const DeviceMemory& memory = *lead.device;
  CollectiveCall call =
      FlatCallOf(lead, place_.world, ring_, memory.device_data() + lead.offset, kind);
  // The whole device buffer, registered once on the path's context.
  ASSIGN_OR_RETURN(call.region,
                   registrations_.Get(*path.context(),
                                      transport::Buffer{memory.device_data(), memory.size(), kind},
                                      std::weak_ptr<const void>(lead.device)));
  call.reducer = &path.reducer();
  call.codec = codec;  // encoded and decoded by the path's CUDA kernels
  if (two_level != nullptr) {
    return Result(path, RunTwoLevelAllreduce(*path.context(), *two_level, call, algorithm,
                                             &path.algo_scratch()));
  }
  return Result(path, RunCollective(*path.context(), call, algorithm, &path.algo_scratch()));
}

}  // namespace gradsync
