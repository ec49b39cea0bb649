// libFuzzer target: the PS step header decoder (ps/protocol.h), as a worker
// connection sends it to a shard.
#include <cstdint>
#include <string>

#include "ps/protocol.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const absl::string_view payload(reinterpret_cast<const char*>(data), size);
  auto h = gradsync::ps::DecodeStepHeader(1, payload);
  if (h.ok()) (void)gradsync::ps::SameStep(*h, *h);
  return 0;
}
