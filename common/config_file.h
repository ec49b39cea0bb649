// One configuration file format for every gradsync binary: `key = value`
// lines whose keys are the binary's flag names (without dashes). The file
// sets the flags that were NOT given on the command line; command-line flags
// always win. So every setting has exactly one name, one parser and one
// documentation (--help), and `--x=y` overrides the file for a one-off run.
//
//   # /etc/gradsync/gradsync-coordinator.conf
//   listen = 0.0.0.0:7070
//   metrics_listen = ""          # quotes keep spaces; "" is the empty string
//   heartbeat_timeout_ms = 3000
//
// Syntax: one setting per line; '#' starts a comment only at the beginning of
// a line (after optional blanks), so values may contain '#'; blank lines are
// ignored; blanks around key and value are trimmed; a value in double quotes
// is taken verbatim (no escapes). Keys must be flags of the binary; unknown
// keys, repeated keys, lines without '=', values the flag rejects, and the
// flags that only make sense on a command line (config, flagfile, fromenv,
// tryfromenv, undefok, help*, version, only_check_args) are errors naming
// the file and line.
//
// Use in main():
//   absl::ParseCommandLine(argc, argv);
//   if (auto path = absl::GetFlag(FLAGS_config); !path.empty()) {
//     if (absl::Status s = ApplyConfigFile(path, argc, argv); !s.ok()) { ...; return 1; }
//   }
//   ... only now read the flags ...
//
// Not thread-safe with respect to other flag access: call it in main() before
// any thread reads flags.
#ifndef GRADSYNC_COMMON_CONFIG_FILE_H_
#define GRADSYNC_COMMON_CONFIG_FILE_H_

#include <set>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace gradsync {

struct ConfigSetting {
  std::string key;
  std::string value;
  int line = 0;  // 1-based
};

// Parses the text of a config file; `source` (the path) prefixes errors:
// "<source>:<line>: ...". Checks syntax and duplicates, not the keys.
absl::StatusOr<std::vector<ConfigSetting>> ParseConfigText(absl::string_view text,
                                                           absl::string_view source);

// The names of the flags given in argv[1..argc-1], in any absl form:
// --name=v, -name=v, --name v (non-bool flags), --name, --noname (bool flags).
// Parsing stops at "--". Names that are not flags are ignored.
std::set<std::string> FlagsOnCommandLine(int argc, const char* const* argv);

// Sets every flag named in `settings` that is not in `skip`. Returns the
// number of flags set. INVALID_ARGUMENT "<source>:<line>: ..." for unknown
// keys, command-line-only flags and values the flag cannot parse; no flag is
// changed then (everything is checked first).
absl::StatusOr<int> ApplyConfigSettings(const std::vector<ConfigSetting>& settings,
                                        const std::set<std::string>& skip,
                                        absl::string_view source);

// Reads `path` (at most 1 MiB) and applies it to the flags not given in argv.
// NOT_FOUND / PERMISSION_DENIED / FAILED_PRECONDITION naming the path when it
// cannot be read; INVALID_ARGUMENT "<path>:<line>: ..." for bad content.
absl::Status ApplyConfigFile(absl::string_view path, int argc, const char* const* argv);

}  // namespace gradsync

#endif  // GRADSYNC_COMMON_CONFIG_FILE_H_
