#include "common/build_info.h"

#include "absl/flags/usage.h"
#include "absl/flags/usage_config.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"

namespace gradsync {
namespace {

#if __has_include("common/build_commit.inc")
constexpr char kCommit[] =
#include "common/build_commit.inc"
    ;
#else
constexpr char kCommit[] = "unknown";
#endif

// The main file whose flags --help lists (set once, before flags are parsed).
const char* g_main_file = nullptr;

}  // namespace

absl::string_view BuildCommit() { return kCommit; }

std::string BuildMode() {
#ifdef __OPTIMIZE__
  std::string mode = "optimized";
#else
  std::string mode = "unoptimized";
#endif
#ifdef NDEBUG
  mode += ", assertions off";
#else
  mode += ", assertions on";
#endif
  return mode;
}

std::string VersionLine(absl::string_view program) {
  return absl::StrCat(program, " ", kGradsyncVersion, " (commit ", BuildCommit(), ", ",
                      BuildMode(), ")");
}

void InitFlagsUsage(absl::string_view program, absl::string_view usage, const char* main_file) {
  g_main_file = main_file;
  absl::SetProgramUsageMessage(usage);
  absl::FlagsUsageConfig config;
  // Flags defined in the main file's directory (bench/ keeps shared flags in
  // bench_util.cc), and the TLS flags every server and the CLI share; paths
  // may be given relative or absolute.
  auto in_main = [](absl::string_view file) {
    if (absl::EndsWith(file, "common/tls_flags.cc")) return true;
    if (g_main_file == nullptr) return false;
    absl::string_view main = g_main_file;
    const size_t slash = main.rfind('/');
    const absl::string_view dir = slash == absl::string_view::npos ? "" : main.substr(0, slash + 1);
    const size_t fslash = file.rfind('/');
    const absl::string_view fdir = fslash == absl::string_view::npos ? "" : file.substr(0, fslash + 1);
    return absl::EndsWith(dir, fdir) || absl::EndsWith(fdir, dir);
  };
  config.contains_helpshort_flags = in_main;
  config.contains_help_flags = in_main;
  config.version_string = [p = std::string(program)] { return VersionLine(p) + "\n"; };
  absl::SetFlagsUsageConfig(config);
}

}  // namespace gradsync
