// libFuzzer target: the data-plane handshake and frame header checks
// (transport/wire.h) on arbitrary bytes, as a peer on the data port sends them.
#include <cstdint>
#include <cstring>

#include "transport/wire.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace gradsync::transport;  // NOLINT(build/namespaces)
  if (size >= sizeof(Hello)) {
    Hello h;
    std::memcpy(&h, data, sizeof(h));
    if (ValidateHello(h).ok()) {
      // A valid Hello must describe a sane connection.
      if (h.job_id_len == 0 || h.job_id_len > kMaxJobIdBytes || h.src_rank == h.dst_rank) {
        __builtin_trap();
      }
    }
  }
  if (size >= sizeof(FrameHeader)) {
    FrameHeader f;
    std::memcpy(&f, data, sizeof(f));
    if (ValidateFrameHeader(f).ok() && f.length > kMaxFrameBytes) __builtin_trap();
  }
  return 0;
}
