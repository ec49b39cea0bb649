// gradsync-cuda-probe: prints the CUDA devices this build can use, or why none.
// Exit status: 0 when at least one device is usable, 1 otherwise (the reason is
// printed either way, so a script can show it).
#include <cstdio>
#include <string>

#include "common/build_info.h"
#include "cuda/cuda_reduce.h"

int main(int argc, char** argv) {
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--version") {
      std::printf("%s\n", gradsync::VersionLine("gradsync-cuda-probe").c_str());
      return 0;
    }
    if (a == "--help" || a == "-h" || a == "--helpfull") {
      std::printf(
          "usage: gradsync-cuda-probe [--version]\n"
          "  prints the CUDA devices this build can use, or why none.\n"
          "  Exit status: 0 when a device is usable, 1 otherwise.\n"
          "  --version  the version, the source commit and the build mode\n");
      return 0;
    }
    std::fprintf(stderr,
                 "gradsync-cuda-probe: unknown argument '%s' (it takes none; see --help)\n",
                 argv[i]);
    return 2;
  }
  using gradsync::cuda::CudaDeviceInfo;
  std::printf("built with CUDA: %s\n", gradsync::cuda::BuiltWithCuda() ? "yes" : "no");
  const absl::StatusOr<std::vector<CudaDeviceInfo>> devices = gradsync::cuda::ListCudaDevices();
  if (!devices.ok()) {
    std::printf("CUDA unavailable: %s\n", std::string(devices.status().message()).c_str());
    std::printf("reductions fall back to the CPU kernels\n");
    return 1;
  }
  std::printf("%zu CUDA device(s):\n", devices->size());
  for (const CudaDeviceInfo& d : *devices) {
    std::printf("  [%d] %s, compute capability %d.%d, %.1f GiB\n", d.index, d.name.c_str(),
                d.cc_major, d.cc_minor,
                static_cast<double>(d.total_memory) / (1024.0 * 1024.0 * 1024.0));
  }
  return 0;
}
