// libFuzzer target: the fd socket's request and response decoders
// (ipc/fd_registration.h), as a local client sends them.
#include <cstdint>
#include <string>

#include "ipc/fd_registration.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace gradsync::ipc;  // NOLINT(build/namespaces)
  const absl::string_view bytes(reinterpret_cast<const char*>(data), size);
  if (auto r = DecodeRequest(bytes); r.ok()) {
    // What decodes must encode back to the same bytes.
    if (EncodeRequest(*r) != bytes) __builtin_trap();
  }
  if (auto f = DecodeFetchRequest(bytes); f.ok()) {
    if (EncodeFetchRequest(*f) != bytes) __builtin_trap();
  }
  (void)DecodeResponse(bytes);
  (void)RequestMagic(bytes);
  return 0;
}
