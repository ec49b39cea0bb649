#include "worker/timeline.h"

#include "common/json_escape.h"

#include <errno.h>

#include <filesystem>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/net.h"

namespace gradsync {


absl::StatusOr<std::unique_ptr<Timeline>> Timeline::Open(const std::string& path, int rank,
                                                         const std::string& process_name) {
  std::error_code ec;
  std::filesystem::create_directories(std::filesystem::path(path).parent_path(), ec);
  std::FILE* f = std::fopen(path.c_str(), "w");
  if (f == nullptr) {
    return absl::UnavailableError(absl::StrCat("cannot write timeline ", path, ": ", ErrnoString(errno)));
  }
  std::unique_ptr<Timeline> t(new Timeline(path, f, rank));
  absl::MutexLock l(&t->mu_);
  std::fputs("[\n", f);
  t->Write(absl::StrFormat(
      R"({"name":"process_name","ph":"M","pid":%d,"tid":0,"args":{"name":"%s"}})", rank,
      JsonEscape(process_name)));
  return t;
}

Timeline::~Timeline() {
  absl::MutexLock l(&mu_);
  std::fputs("\n]\n", f_);
  std::fclose(f_);
}

void Timeline::Write(const std::string& json) {
  if (!first_) std::fputs(",\n", f_);
  first_ = false;
  std::fputs(json.c_str(), f_);
}

void Timeline::SetOp(uint64_t seq, const std::string& description) {
  absl::MutexLock l(&mu_);
  seq_ = seq;
  desc_ = JsonEscape(description);
}

void Timeline::Event(const std::string& name, const char* cat, absl::Time start, absl::Time end) {
  absl::MutexLock l(&mu_);
  Write(absl::StrFormat(
      R"({"name":"%s","cat":"%s","ph":"X","ts":%d,"dur":%d,"pid":%d,"tid":0,"args":{"op":%d,"desc":"%s"}})",
      JsonEscape(name), cat, absl::ToUnixMicros(start), absl::ToInt64Microseconds(end - start),
      rank_, seq_, desc_));
}

void Timeline::Instant(const std::string& name, absl::Time at) {
  absl::MutexLock l(&mu_);
  Write(absl::StrFormat(
      R"({"name":"%s","cat":"op","ph":"i","s":"t","ts":%d,"pid":%d,"tid":0,"args":{"op":%d,"desc":"%s"}})",
      JsonEscape(name), absl::ToUnixMicros(at), rank_, seq_, desc_));
}

}  // namespace gradsync
