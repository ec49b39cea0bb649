#include "transport/rdma_endpoint.h"

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"

namespace gradsync::transport {

absl::StatusOr<RdmaEndpoint> OpenRdmaEndpoint(RdmaDeviceOptions options,
                                              const std::string& emulation_fabric) {
  RdmaEndpoint e;
  if (!emulation_fabric.empty()) {
    rdma::EmulationOptions eo;
    eo.fabric = emulation_fabric;
    ASSIGN_OR_RETURN(e.emulation, rdma::VerbsEmulation::Open(eo));
    options.verbs = &e.emulation->verbs();
  }
  ASSIGN_OR_RETURN(e.device, RdmaDevice::Open(options));
  e.advertised = e.device->link_layer() == rdma::LinkLayer::kEthernet ? "roce" : "ib";
  if (e.emulation != nullptr) absl::StrAppend(&e.advertised, " emulated:", emulation_fabric);
  return e;
}

}  // namespace gradsync::transport
