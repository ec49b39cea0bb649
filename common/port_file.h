// Port files: how a server started with port 0 tells tests and scripts which
// ports it bound ("<port>\n" per port, written atomically: temp + rename).
#ifndef GRADSYNC_COMMON_PORT_FILE_H_
#define GRADSYNC_COMMON_PORT_FILE_H_

#include <string>
#include <vector>

#include "absl/status/status.h"

namespace gradsync {

// Writes one port per line to `path`; readers never see a partial file.
absl::Status WritePortFile(const std::string& path, const std::vector<int>& ports);

}  // namespace gradsync

#endif  // GRADSYNC_COMMON_PORT_FILE_H_
