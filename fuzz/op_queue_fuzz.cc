// libFuzzer target: the op-queue entry decoders (ipc/op_queue.h): a
// submission slot as a hostile client writes it, a completion slot as a
// broken daemon would.
#include <cstdint>
#include <cstring>

#include "ipc/op_queue.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace gradsync::ipc;  // NOLINT(build/namespaces)
  SubmissionEntry s;
  std::memset(&s, 0, sizeof(s));
  std::memcpy(&s, data, size < sizeof(s) ? size : sizeof(s));
  gradsync::OpDesc op;
  if (DecodeSubmission(s, &op).ok()) {
    // Decoded strings come from their fields only.
    if (op.name.size() > kMaxOpNameChars || op.algorithm.size() > kMaxAlgorithmChars) {
      __builtin_trap();
    }
  }
  CompletionEntry c;
  std::memset(&c, 0, sizeof(c));
  std::memcpy(&c, data, size < sizeof(c) ? size : sizeof(c));
  (void)DecodeCompletion(c);
  return 0;
}
