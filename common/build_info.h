// What a binary says about itself: version, source commit and build mode
// (`--version`, `gradsync version`, logs), and its `--help`.
#ifndef GRADSYNC_COMMON_BUILD_INFO_H_
#define GRADSYNC_COMMON_BUILD_INFO_H_

#include <string>

#include "absl/strings/string_view.h"

namespace gradsync {

inline constexpr char kGradsyncVersion[] = "0.1.0";

// The git commit the binary was built from ("1a2b3c4d5e6f", "…-dirty" with
// uncommitted changes), as scripts/bazel.sh recorded it; "unknown" when built
// without it.
absl::string_view BuildCommit();
// "optimized (-O2), assertions on"-style description of the compiler settings.
std::string BuildMode();
// "gradsync-ps 0.1.0 (commit 1a2b3c4d5e6f, optimized, assertions on)".
std::string VersionLine(absl::string_view program);

// Sets the usage message `--help` prints, makes `--help` list the flags
// defined in `main_file` (pass __FILE__ from main; absl matches flags to the
// program's name otherwise, and finds none for gradsync-ps or gradsyncd), and
// makes `--version` print VersionLine(program). Call before ParseCommandLine.
void InitFlagsUsage(absl::string_view program, absl::string_view usage, const char* main_file);

}  // namespace gradsync

#endif  // GRADSYNC_COMMON_BUILD_INFO_H_
