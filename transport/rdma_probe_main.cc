// gradsync-rdma-probe: prints the RDMA (ibverbs) devices, their ports (state,
// link layer, LID, MTU, speed), each port's GID table with the index
// gradsyncd would use, and whether GPUDirect RDMA is possible here; or why
// there is no RDMA. Exit status: 0 when at least one device is listed, 1
// otherwise (the reason is printed either way, so a script can show it).
#include <cinttypes>
#include <cstdio>
#include <memory>
#include <string>

#include "common/build_info.h"
#include "rdma/verbs.h"
#include "rdma/verbs_emulation.h"
#include "transport/rdma_device.h"

namespace {

using gradsync::rdma::LinkLayer;

void PrintPorts(const gradsync::rdma::VerbsDeviceInfo& d, const gradsync::rdma::VerbsTable& verbs,
                std::string* first_usable) {
  auto ctx = gradsync::rdma::Context::Open(d.name, verbs);
  for (const gradsync::rdma::PortInfo& p : d.ports) {
    std::printf("    port %d: %s, %s, lid 0x%x, mtu %d, %s\n", p.port_num,
                gradsync::rdma::PortStateName(p.state),
                gradsync::rdma::LinkLayerName(p.link_layer), p.lid, p.active_mtu,
                p.speed.c_str());
    if (!ctx.ok()) continue;
    auto table = (*ctx)->GidTable(p.port_num);
    if (!table.ok()) {
      std::printf("      GID table: %s\n", std::string(table.status().message()).c_str());
      continue;
    }
    // gradsyncd's choice (RdmaDevice::Open): the LID routes on InfiniBand; on
    // RoCE the first RoCE v2 entry with an IPv4 address.
    const int chosen = p.link_layer == LinkLayer::kEthernet
                           ? gradsync::rdma::ChooseGidIndex(*table)
                           : 0;
    for (const gradsync::rdma::GidEntry& g : *table) {
      std::printf("      GID %d: %-40s %-8s%s\n", g.index, g.text.c_str(), g.type.c_str(),
                  g.index == chosen ? "  <- gradsyncd uses this one (--rdma_gid_index overrides)"
                                    : "");
    }
    if (first_usable->empty() && p.state == gradsync::rdma::PortState::kActive) {
      *first_usable = d.name + " port " + std::to_string(p.port_num) + " (GID index " +
                      std::to_string(chosen) + ")";
    }
  }
}

}  // namespace

int main(int argc, char** argv) {
  std::string emulation;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--version") {
      std::printf("%s\n", gradsync::VersionLine("gradsync-rdma-probe").c_str());
      return 0;
    }
    if (a == "--help" || a == "-h" || a == "--helpfull") {
      std::printf(
          "usage: gradsync-rdma-probe [--version] [--emulation=ib|roce]\n"
          "  prints the RDMA (ibverbs) devices, their ports, GID tables (with the index\n"
          "  gradsyncd uses) and GPUDirect RDMA capability, or why there is no RDMA.\n"
          "  Exit status: 0 when a device is listed, 1 otherwise.\n"
          "  --version      the version, the source commit and the build mode\n"
          "  --emulation=L  list the verbs emulation's device instead (tests; L = ib or roce)\n");
      return 0;
    }
    if (a == "--emulation=ib" || a == "--emulation=roce") {
      emulation = a.substr(12);
      continue;
    }
    std::fprintf(stderr, "gradsync-rdma-probe: unknown argument '%s' (see --help)\n", argv[i]);
    return 2;
  }
  std::unique_ptr<gradsync::rdma::VerbsEmulation> emu;
  const gradsync::rdma::VerbsTable* verbs = &gradsync::rdma::RealVerbs();
  if (!emulation.empty()) {
    gradsync::rdma::EmulationOptions o;
    o.link_layer = emulation == "roce" ? LinkLayer::kEthernet : LinkLayer::kInfiniBand;
    emu = std::make_unique<gradsync::rdma::VerbsEmulation>(o);
    verbs = &emu->verbs();
  }
  using gradsync::rdma::VerbsDeviceInfo;
  const absl::StatusOr<std::vector<VerbsDeviceInfo>> devices =
      gradsync::rdma::ListVerbsDevices(*verbs);
  if (!devices.ok()) {
    std::printf("RDMA unavailable: %s\n", std::string(devices.status().message()).c_str());
    std::printf("gradsyncd --transport=auto runs over TCP (--transport=rdma refuses to start)\n");
    return 1;
  }
  std::printf("%zu RDMA device(s)%s:\n", devices->size(), emu != nullptr ? " (emulated)" : "");
  std::string first_usable;
  for (const VerbsDeviceInfo& d : *devices) {
    std::printf("  %s  guid %016" PRIx64 "  %d port(s)\n", d.name.c_str(), d.guid, d.num_ports);
    if (!d.error.empty()) std::printf("    error: %s\n", d.error.c_str());
    PrintPorts(d, *verbs, &first_usable);
  }
  std::string why;
  if (emu != nullptr) {
    why = "no (emulated verbs)";
  } else {
    gradsync::transport::DetectGpuDirect(&why);
  }
  std::printf("GPUDirect RDMA: %s\n", why.c_str());
  if (first_usable.empty()) {
    std::printf("no ACTIVE port: gradsyncd --transport=auto runs over TCP\n");
  } else {
    std::printf("gradsyncd --transport=auto uses %s\n", first_usable.c_str());
  }
  return devices->empty() ? 1 : 0;
}
