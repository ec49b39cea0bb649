#include "common/port_file.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>

#include "absl/strings/str_cat.h"
#include "common/net.h"

namespace gradsync {

absl::Status WritePortFile(const std::string& path, const std::vector<int>& ports) {
  const std::string tmp = absl::StrCat(path, ".tmp.", ::getpid());
  std::string content;
  for (int p : ports) absl::StrAppend(&content, p, "\n");
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) return absl::UnavailableError(absl::StrCat("open ", tmp, ": ", ErrnoString(errno)));
  const bool written =
      ::write(fd, content.data(), content.size()) == static_cast<ssize_t>(content.size());
  const int write_errno = errno;
  if (::close(fd) != 0 || !written) {
    ::unlink(tmp.c_str());
    return absl::UnavailableError(
        absl::StrCat("write ", tmp, ": ", ErrnoString(written ? errno : write_errno)));
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    const int e = errno;
    ::unlink(tmp.c_str());
    return absl::UnavailableError(absl::StrCat("rename ", tmp, " -> ", path, ": ", ErrnoString(e)));
  }
  return absl::OkStatus();
}

}  // namespace gradsync
