// libFuzzer target: the op signature decoder (collective/op_signature.h), as
// a peer daemon sends it in the signature exchange.
#include <cstdint>
#include <string>

#include "collective/op_signature.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string bytes(reinterpret_cast<const char*>(data), size);
  auto sig = gradsync::OpSignature::Decode(bytes);
  if (sig.ok()) {
    (void)sig->Describe();
    // What decodes must decode again to the same signature from its encoding.
    auto again = gradsync::OpSignature::Decode(sig->Encode());
    if (!again.ok() || !(*again == *sig)) __builtin_trap();
  }
  return 0;
}
