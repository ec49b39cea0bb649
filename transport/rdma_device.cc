#include "transport/rdma_device.h"

#include <sys/stat.h>

#include <algorithm>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "cuda/cuda_memory.h"
#include "transport/wire.h"

namespace gradsync::transport {

bool DetectPeerMemory(std::string* why) {
  struct stat st;
  for (const char* m : {"/sys/module/nvidia_peermem", "/sys/module/nv_peer_mem"}) {
    if (::stat(m, &st) == 0) {
      *why = absl::StrCat("yes (", std::strrchr(m, '/') + 1, " loaded)");
      return true;
    }
  }
  *why = "no (nvidia_peermem is not loaded)";
  return false;
}

GpuDirect DetectGpuDirect(std::string* why) {
  if (DetectPeerMemory(why)) return GpuDirect::kPeerMem;
  std::string dmabuf;
  if (cuda::DmaBufSupported(0, &dmabuf)) {
    *why = "yes (dma-buf: the CUDA driver exports GPU memory, ibv_reg_dmabuf_mr)";
    return GpuDirect::kDmaBuf;
  }
  *why = absl::StrCat("no (nvidia_peermem is not loaded; dma-buf: ", dmabuf, ")");
  return GpuDirect::kNone;
}

absl::StatusOr<std::unique_ptr<RdmaDevice>> RdmaDevice::Open(RdmaDeviceOptions options) {
  const rdma::VerbsTable& verbs = options.verbs != nullptr ? *options.verbs : rdma::RealVerbs();
  std::unique_ptr<RdmaDevice> d(new RdmaDevice());
  d->options_ = options;
  // The device: the named one, or the first with an ACTIVE port.
  std::string name = options.device_name;
  int port = options.port;
  if (name.empty()) {
    ASSIGN_OR_RETURN(std::vector<rdma::VerbsDeviceInfo> devices, rdma::ListVerbsDevices(verbs));
    for (const rdma::VerbsDeviceInfo& info : devices) {
      for (const rdma::PortInfo& p : info.ports) {
        if (name.empty() && p.state == rdma::PortState::kActive &&
            (port == 0 || p.port_num == port)) {
          name = info.name;
          port = p.port_num;
        }
      }
    }
    if (name.empty()) {
      return absl::UnavailableError(absl::StrCat(devices.size(),
                                                 " RDMA device(s), none with an ACTIVE port"));
    }
  }
  ASSIGN_OR_RETURN(d->context_, rdma::Context::Open(name, verbs));
  if (port == 0) {
    for (int p = 1; p <= d->context_->num_ports() && port == 0; ++p) {
      absl::StatusOr<rdma::PortInfo> info = d->context_->QueryPort(p);
      if (info.ok() && info->state == rdma::PortState::kActive) port = p;
    }
    if (port == 0) return absl::UnavailableError(absl::StrCat(name, " has no ACTIVE port"));
  }
  absl::StatusOr<rdma::PortInfo> info = d->context_->QueryPort(port);
  if (!info.ok()) {
    return absl::NotFoundError(absl::StrCat(name, " port ", port, ": ", info.status().message()));
  }
  if (info->state != rdma::PortState::kActive) {
    return absl::UnavailableError(absl::StrCat(name, " port ", port, " is ",
                                               rdma::PortStateName(info->state)));
  }
  int gid_index = options.gid_index;
  if (gid_index < 0) {
    gid_index = 0;
    if (info->link_layer == rdma::LinkLayer::kEthernet) {
      ASSIGN_OR_RETURN(std::vector<rdma::GidEntry> table, d->context_->GidTable(port));
      gid_index = rdma::ChooseGidIndex(table);
    }
  }
  d->port_.verbs_context = d->context_.get();
  d->port_.connect.port_num = port;
  d->port_.connect.gid_index = gid_index;
  d->port_.connect.path_mtu = info->active_mtu;
  d->link_layer_ = info->link_layer;
  const bool emulated = std::strcmp(verbs.name, "libibverbs") != 0;
  GpuDirect gpudirect = GpuDirect::kNone;
  if (options.export_dmabuf) {
    gpudirect = GpuDirect::kDmaBuf;
    d->port_.export_dmabuf = options.export_dmabuf;
    d->gpudirect_reason_ = "yes (dma-buf, the given exporter)";
  } else if (emulated) {
    d->gpudirect_reason_ = "no (emulated verbs)";
  } else {
    gpudirect = DetectGpuDirect(&d->gpudirect_reason_);
    d->port_.export_dmabuf = [](const void* ptr, size_t size) -> absl::StatusOr<DmaBuf> {
      absl::StatusOr<cuda::DmaBufExport> e = cuda::ExportDmaBuf(ptr, size);
      if (!e.ok()) return e.status();
      return DmaBuf{e->fd, e->offset};
    };
  }
  d->port_.gpudirect = gpudirect;

  d->properties_.name = "rdma";
  d->properties_.host_memory = true;
  d->properties_.cuda_memory = gpudirect != GpuDirect::kNone;
  d->properties_.link_gbps = info->speed_gbps();
  d->properties_.max_in_flight = options.max_in_flight;
  d->description_ = absl::StrCat(
      name, " port ", port, ": ", rdma::LinkLayerName(info->link_layer), ", lid 0x",
      absl::Hex(info->lid), ", mtu ", info->active_mtu, ", ", info->speed, "; GID index ",
      gid_index, "; GPUDirect RDMA: ", d->gpudirect_reason_, emulated ? "; verbs emulated" : "");
  d->bootstrap_ = std::make_unique<TcpDevice>(options.bootstrap);
  return d;
}

RdmaDevice::~RdmaDevice() = default;

namespace {
absl::Status RefuseEncryption(const std::string& job_id) {
  return absl::FailedPreconditionError(absl::StrCat(
      "job '", job_id,
      "' encrypts its data plane (data_tls), which the RDMA transport cannot; run it over TCP"));
}
}  // namespace

absl::StatusOr<std::unique_ptr<Context>> RdmaDevice::ConnectToServers(const ServerSetSpec& spec) {
  if (spec.encrypt) return RefuseEncryption(spec.job_id);
  ServerSetSpec boot = spec;
  boot.hello_stream = kRdmaBootstrapStream;
  ASSIGN_OR_RETURN(std::unique_ptr<Context> bootstrap, bootstrap_->ConnectToServers(boot));
  RdmaContextOptions o;
  o.max_in_flight = options_.max_in_flight;
  o.announce_sends = true;
  for (size_t k = 0; k < spec.servers.size(); ++k) {
    o.peer_names.push_back(k < spec.server_names.size() && !spec.server_names[k].empty()
                               ? spec.server_names[k]
                               : absl::StrCat("server ", k, " (", spec.servers[k].ToString(), ")"));
  }
  o.self_name = spec.self_name.empty() ? absl::StrCat("client rank ", spec.rank) : spec.self_name;
  ASSIGN_OR_RETURN(std::unique_ptr<RdmaContext> ctx,
                   RdmaContext::Connect(port_, std::move(bootstrap), o, spec.deadline));
  return std::unique_ptr<Context>(std::move(ctx));
}

absl::StatusOr<std::unique_ptr<Context>> RdmaDevice::AcceptClient(UniqueFd connection,
                                                                 const ClientSpec& spec) {
  if (spec.encrypt) return RefuseEncryption(spec.job_id);
  ASSIGN_OR_RETURN(std::unique_ptr<Context> bootstrap,
                   bootstrap_->AcceptClient(std::move(connection), spec));
  RdmaContextOptions o;
  o.max_in_flight = options_.max_in_flight;
  o.report_unexpected = true;
  o.peer_names = {spec.client_name};
  o.self_name = spec.self_name;
  ASSIGN_OR_RETURN(std::unique_ptr<RdmaContext> ctx,
                   RdmaContext::Connect(port_, std::move(bootstrap), o, spec.deadline));
  return std::unique_ptr<Context>(std::move(ctx));
}

absl::StatusOr<std::unique_ptr<Context>> RdmaDevice::CreateContext(const ContextSpec& spec) {
  if (spec.encrypt) return RefuseEncryption(spec.job_id);
  ContextSpec boot = spec;
  boot.lanes = 1;
  ASSIGN_OR_RETURN(std::unique_ptr<Context> bootstrap, bootstrap_->CreateContext(boot));
  RdmaContextOptions o;
  o.max_in_flight = options_.max_in_flight;
  ASSIGN_OR_RETURN(std::unique_ptr<RdmaContext> ctx,
                   RdmaContext::Connect(port_, std::move(bootstrap), o, spec.deadline));
  return std::unique_ptr<Context>(std::move(ctx));
}

}  // namespace gradsync::transport
