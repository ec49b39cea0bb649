#include "common/config_file.h"

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <map>
#include <utility>

#include "absl/flags/commandlineflag.h"
#include "absl/flags/reflection.h"
#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"

namespace gradsync {
namespace {

constexpr size_t kMaxConfigBytes = 1 << 20;

bool IsCommandLineOnly(absl::string_view key) {
  for (absl::string_view k : {"config", "flagfile", "fromenv", "tryfromenv", "undefok", "version",
                              "only_check_args"}) {
    if (key == k) return true;
  }
  return absl::StartsWith(key, "help");
}

bool ValidKey(absl::string_view key) {
  if (key.empty()) return false;
  for (char c : key) {
    if (!absl::ascii_isalnum(static_cast<unsigned char>(c)) && c != '_') return false;
  }
  return true;
}

}  // namespace

absl::StatusOr<std::vector<ConfigSetting>> ParseConfigText(absl::string_view text,
                                                           absl::string_view source) {
  std::vector<ConfigSetting> out;
  std::map<std::string, int, std::less<>> seen;  // key -> line
  int line_no = 0;
  for (absl::string_view line : absl::StrSplit(text, '\n')) {
    ++line_no;
    auto error = [&](absl::string_view what) {
      return absl::InvalidArgumentError(absl::StrCat(source, ":", line_no, ": ", what));
    };
    if (absl::EndsWith(line, "\r")) line.remove_suffix(1);
    const absl::string_view stripped = absl::StripAsciiWhitespace(line);
    if (stripped.empty() || stripped.front() == '#') continue;
    const size_t eq = stripped.find('=');
    if (eq == absl::string_view::npos) {
      return error(absl::StrCat("expected 'key = value', got '", stripped, "'"));
    }
    const absl::string_view key = absl::StripAsciiWhitespace(stripped.substr(0, eq));
    absl::string_view value = absl::StripAsciiWhitespace(stripped.substr(eq + 1));
    if (!ValidKey(key)) {
      return error(absl::StrCat("bad key '", key,
                                "' (keys are flag names without dashes: letters, digits, '_')"));
    }
    if (absl::StartsWith(value, "\"")) {
      if (value.size() < 2 || !absl::EndsWith(value, "\"")) {
        return error(absl::StrCat("unterminated quote in the value of '", key, "'"));
      }
      value = value.substr(1, value.size() - 2);
    }
    if (auto it = seen.find(key); it != seen.end()) {
      return error(absl::StrCat("'", key, "' is already set on line ", it->second));
    }
    seen.emplace(std::string(key), line_no);
    out.push_back(ConfigSetting{std::string(key), std::string(value), line_no});
  }
  return out;
}

std::set<std::string> FlagsOnCommandLine(int argc, const char* const* argv) {
  std::set<std::string> names;
  for (int i = 1; i < argc; ++i) {
    absl::string_view arg = argv[i] == nullptr ? "" : argv[i];
    if (arg == "--") break;
    if (arg.size() < 2 || arg[0] != '-') continue;  // positional
    arg.remove_prefix(arg[1] == '-' ? 2 : 1);
    const size_t eq = arg.find('=');
    const absl::string_view name = arg.substr(0, eq);
    if (const absl::CommandLineFlag* flag = absl::FindCommandLineFlag(name)) {
      names.emplace(name);
      // "--name value": the next argument is the value (never for bools).
      if (eq == absl::string_view::npos && !flag->IsOfType<bool>()) ++i;
    } else if (absl::StartsWith(name, "no") && eq == absl::string_view::npos) {
      const absl::CommandLineFlag* negated = absl::FindCommandLineFlag(name.substr(2));
      if (negated != nullptr && negated->IsOfType<bool>()) names.emplace(name.substr(2));
    }
  }
  return names;
}

absl::StatusOr<int> ApplyConfigSettings(const std::vector<ConfigSetting>& settings,
                                        const std::set<std::string>& skip,
                                        absl::string_view source) {
  // Check every key first.
  std::vector<std::pair<absl::CommandLineFlag*, const ConfigSetting*>> todo;
  for (const ConfigSetting& s : settings) {
    auto error = [&](absl::string_view what) {
      return absl::InvalidArgumentError(absl::StrCat(source, ":", s.line, ": ", what));
    };
    if (IsCommandLineOnly(s.key)) {
      return error(absl::StrCat("'", s.key, "' can only be given on the command line"));
    }
    absl::CommandLineFlag* flag = absl::FindCommandLineFlag(s.key);
    if (flag == nullptr || flag->IsRetired()) {
      return error(absl::StrCat("unknown key '", s.key,
                                "': not a flag of this program (see --helpfull)"));
    }
    if (skip.count(s.key) == 0) todo.emplace_back(flag, &s);
  }
  // Then set them, restoring the old values if one does not parse.
  std::vector<std::pair<absl::CommandLineFlag*, std::string>> applied;
  for (const auto& [flag, s] : todo) {
    std::string old = flag->CurrentValue();
    std::string error;
    if (!flag->ParseFrom(s->value, &error)) {
      for (auto& [done, value] : applied) {
        std::string ignored;
        done->ParseFrom(value, &ignored);
      }
      return absl::InvalidArgumentError(absl::StrCat(source, ":", s->line, ": invalid value '",
                                                     s->value, "' for '", s->key, "': ", error));
    }
    applied.emplace_back(flag, std::move(old));
  }
  return static_cast<int>(applied.size());
}

absl::Status ApplyConfigFile(absl::string_view path, int argc, const char* const* argv) {
  const std::string p(path);
  std::FILE* f = std::fopen(p.c_str(), "rb");
  if (f == nullptr) {
    const int e = errno;
    const std::string what = absl::StrCat("cannot read config file '", p, "': ", std::strerror(e));
    if (e == ENOENT) return absl::NotFoundError(what);
    if (e == EACCES || e == EPERM) return absl::PermissionDeniedError(what);
    return absl::FailedPreconditionError(what);
  }
  std::string text;
  char buf[8192];
  size_t n;
  while ((n = std::fread(buf, 1, sizeof(buf), f)) > 0 && text.size() <= kMaxConfigBytes) {
    text.append(buf, n);
  }
  const bool read_error = std::ferror(f) != 0;
  std::fclose(f);
  if (read_error) {
    return absl::FailedPreconditionError(absl::StrCat("cannot read config file '", p, "'"));
  }
  if (text.size() > kMaxConfigBytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("config file '", p, "' is larger than ", kMaxConfigBytes, " bytes"));
  }
  absl::StatusOr<std::vector<ConfigSetting>> settings = ParseConfigText(text, p);
  if (!settings.ok()) return settings.status();
  absl::StatusOr<int> applied = ApplyConfigSettings(*settings, FlagsOnCommandLine(argc, argv), p);
  return applied.status();
}

}  // namespace gradsync
