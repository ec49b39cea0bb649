// gradsync-rdma-probe: prints the RDMA (ibverbs) devices and their ports, or why
// there are none. Exit status: 0 when at least one device is listed, 1 otherwise
// (the reason is printed either way, so a script can show it).
#include <cinttypes>
#include <cstdio>
#include <string>

#include "common/build_info.h"
#include "rdma/verbs.h"

int main(int argc, char** argv) {
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--version") {
      std::printf("%s\n", gradsync::VersionLine("gradsync-rdma-probe").c_str());
      return 0;
    }
    if (a == "--help" || a == "-h" || a == "--helpfull") {
      std::printf(
          "usage: gradsync-rdma-probe [--version]\n"
          "  prints the RDMA (ibverbs) devices and their ports, or why none.\n"
          "  Exit status: 0 when a device is listed, 1 otherwise.\n"
          "  --version  the version, the source commit and the build mode\n");
      return 0;
    }
    std::fprintf(stderr,
                 "gradsync-rdma-probe: unknown argument '%s' (it takes none; see --help)\n",
                 argv[i]);
    return 2;
  }
  using gradsync::rdma::VerbsDeviceInfo;
  const absl::StatusOr<std::vector<VerbsDeviceInfo>> devices = gradsync::rdma::ListVerbsDevices();
  if (!devices.ok()) {
    std::printf("RDMA unavailable: %s\n", std::string(devices.status().message()).c_str());
    std::printf("transports fall back to TCP\n");
    return 1;
  }
  std::printf("%zu RDMA device(s):\n", devices->size());
  for (const VerbsDeviceInfo& d : *devices) {
    std::printf("  %s  guid %016" PRIx64 "  %d port(s)\n", d.name.c_str(), d.guid, d.num_ports);
    if (!d.error.empty()) std::printf("    error: %s\n", d.error.c_str());
    for (const gradsync::rdma::PortInfo& p : d.ports) {
      std::printf("    port %d: %s, %s, lid 0x%x, mtu %d, %s\n", p.port_num,
                  gradsync::rdma::PortStateName(p.state),
                  gradsync::rdma::LinkLayerName(p.link_layer), p.lid, p.active_mtu,
                  p.speed.c_str());
    }
  }
  return 0;
}
