#include "worker/socket_group.h"

#include <grp.h>
#include <unistd.h>

#include <cerrno>

#include "absl/strings/str_cat.h"
#include "common/net.h"

namespace gradsync {

absl::Status CheckSocketGroup(const ipc::UnixAddress& address, const std::string& group,
                              absl::string_view what) {
  if (group.empty() || !address.abstract) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat(
      "--socket_group '", group, "' cannot restrict ", what, " ", address.text,
      ": an abstract socket has no file permissions, so any process on the host could connect; "
      "use a unix:PATH socket, or drop --socket_group"));
}

absl::Status ApplySocketGroup(const ipc::UnixAddress& address, const std::string& group,
                              absl::string_view what) {
  if (absl::Status s = CheckSocketGroup(address, group, what); !s.ok()) return s;
  if (group.empty()) return absl::OkStatus();
  struct group* g = ::getgrnam(group.c_str());
  if (g == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat("--socket_group: no group '", group, "'"));
  }
  if (::chown(address.path.c_str(), static_cast<uid_t>(-1), g->gr_gid) != 0) {
    return absl::PermissionDeniedError(absl::StrCat("chown ", address.path, " (", what,
                                                    ") to group '", group,
                                                    "': ", ErrnoString(errno)));
  }
  return absl::OkStatus();
}

}  // namespace gradsync
