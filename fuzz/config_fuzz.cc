// libFuzzer target: the config file parser (common/config_file.h).
#include <cstdint>
#include <string>

#include "common/config_file.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const absl::string_view text(reinterpret_cast<const char*>(data), size);
  auto settings = gradsync::ParseConfigText(text, "fuzz.conf");
  if (settings.ok()) {
    for (const auto& s : *settings) {
      if (s.key.empty() || s.line < 1) __builtin_trap();
    }
  }
  return 0;
}
