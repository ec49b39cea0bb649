// The RDMA device: contexts of RdmaContext (rdma_context.h) on one port of
// one verbs device, bootstrapped over the TCP data plane. Opened once per
// daemon; Open says why when there is no usable port, and the daemon falls
// back to TCP (--transport auto) or refuses to start (--transport rdma).
#ifndef GRADSYNC_TRANSPORT_RDMA_DEVICE_H_
#define GRADSYNC_TRANSPORT_RDMA_DEVICE_H_

#include <memory>
#include <string>

#include "rdma/verbs.h"
#include "rdma/verbs_table.h"
#include "transport/device.h"
#include "transport/rdma_context.h"
#include "transport/tcp_device.h"

namespace gradsync::transport {

struct RdmaDeviceOptions {
  const rdma::VerbsTable* verbs = nullptr;  // null: libibverbs
  std::string device_name;  // empty: the first device with an ACTIVE port
  int port = 0;             // 0: the device's first ACTIVE port
  // RoCE: the GID table index; -1 chooses (rdma::ChooseGidIndex).
  int gid_index = -1;
  int max_in_flight = 32;
  // The bootstrap connections' device options (the data-plane listener).
  TcpDeviceOptions bootstrap;
  // GPUDirect RDMA by dma-buf: what exports device memory. Null: the CUDA
  // driver's (cuda::ExportDmaBuf), used when GPU 0 can export dma-bufs and
  // nvidia_peermem is not loaded. Tests give their own to run the
  // registration path against the emulation.
  DmaBufExporter export_dmabuf;
};

class RdmaDevice final : public Device {
 public:
  // Unavailable (no RDMA device, no ACTIVE port) or NotFound (the named
  // device or port), each saying why.
  static absl::StatusOr<std::unique_ptr<RdmaDevice>> Open(RdmaDeviceOptions options);
  ~RdmaDevice() override;

  const DeviceProperties& properties() const override { return properties_; }
  // Bootstraps over TCP (one connection per peer, the job key proven), then
  // connects one RC queue pair per peer. Jobs that encrypt their data plane
  // are refused (RDMA traffic is not encrypted).
  absl::StatusOr<std::unique_ptr<Context>> CreateContext(const ContextSpec& spec) override;
  // A client's contexts toward servers (PS shards) and a server's toward one
  // client, bootstrapped over TCP the same way; the client's Hello carries
  // kRdmaBootstrapStream, so the server knows to answer here (a server with
  // no RDMA refuses it). Sends of a client are announced (RTS) so the
  // server can Probe them.
  absl::StatusOr<std::unique_ptr<Context>> ConnectToServers(const ServerSetSpec& spec) override;
  absl::StatusOr<std::unique_ptr<Context>> AcceptClient(UniqueFd connection,
                                                        const ClientSpec& spec) override;

  // "emu_ib0 port 1: InfiniBand, lid 0x1, mtu 4096, 4x HDR (200 Gb/s); GID
  // index 0; GPUDirect RDMA: no (<why>)".
  const std::string& description() const { return description_; }
  rdma::LinkLayer link_layer() const { return link_layer_; }
  // Whether device memory registers directly, how, and why not.
  bool gpudirect() const { return properties_.cuda_memory; }
  GpuDirect gpudirect_mode() const { return port_.gpudirect; }
  const std::string& gpudirect_reason() const { return gpudirect_reason_; }

 private:
  RdmaDevice() = default;
  RdmaDeviceOptions options_;
  std::unique_ptr<rdma::Context> context_;
  RdmaPort port_;
  DeviceProperties properties_;
  std::string description_;
  std::string gpudirect_reason_;
  rdma::LinkLayer link_layer_ = rdma::LinkLayer::kUnspecified;
  std::unique_ptr<TcpDevice> bootstrap_;
};

// GPUDirect RDMA on this host: whether the NVIDIA peer-memory module is
// loaded (then ibv_reg_mr takes device pointers), with the reason either way.
bool DetectPeerMemory(std::string* why);
// How device memory would register here, with the reason: peer memory, else
// dma-buf when the CUDA driver can export GPU 0's memory, else none.
GpuDirect DetectGpuDirect(std::string* why);

}  // namespace gradsync::transport

#endif  // GRADSYNC_TRANSPORT_RDMA_DEVICE_H_
