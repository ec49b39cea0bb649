// What a process opens for --transport auto|rdma (gradsyncd, gradsync-ps):
// the RDMA device on libibverbs, or on the linked verbs emulation of a
// fabric of test processes, and the port description peers must match.
#ifndef GRADSYNC_TRANSPORT_RDMA_ENDPOINT_H_
#define GRADSYNC_TRANSPORT_RDMA_ENDPOINT_H_

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "rdma/verbs_emulation.h"
#include "transport/rdma_device.h"

namespace gradsync::transport {

struct RdmaEndpoint {
  std::unique_ptr<rdma::VerbsEmulation> emulation;  // declared first: outlives the device
  std::unique_ptr<RdmaDevice> device;
  // What peers compare (Endpoint.rdma): "ib" or "roce", plus
  // " emulated:FABRIC" on the emulation.
  std::string advertised;
};

// `emulation_fabric` non-empty: the verbs emulation linked on that fabric
// (tests), instead of libibverbs. Errors say why there is no usable port.
absl::StatusOr<RdmaEndpoint> OpenRdmaEndpoint(RdmaDeviceOptions options,
                                              const std::string& emulation_fabric);

}  // namespace gradsync::transport

#endif  // GRADSYNC_TRANSPORT_RDMA_ENDPOINT_H_
