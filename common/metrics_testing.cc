#include "common/metrics_testing.h"

#include <poll.h>
#include <sys/socket.h>

#include <cerrno>
#include <cmath>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "common/net.h"

namespace gradsync {

absl::StatusOr<std::string> HttpGet(absl::string_view host, int port, absl::string_view path,
                                    absl::Duration timeout) {
  const absl::Time deadline = absl::Now() + timeout;
  HostPort addr{std::string(host), port};
  absl::StatusOr<UniqueFd> fd = TcpConnect(addr, deadline);
  if (!fd.ok()) return fd.status();
  const std::string request =
      absl::StrCat("GET ", path, " HTTP/1.0\r\nHost: ", host, ":", port,
                   "\r\nConnection: close\r\n\r\n");
  if (absl::Status s = WriteFull(fd->get(), request.data(), request.size(), deadline); !s.ok()) {
    return s;
  }
  std::string reply;
  char buf[4096];
  while (true) {
    struct pollfd pfd = {fd->get(), POLLIN, 0};
    const int ready = ::poll(&pfd, 1, PollTimeoutMs(deadline));
    if (ready == 0) {
      return absl::DeadlineExceededError(
          absl::StrCat("GET ", path, " from ", host, ":", port, ": no complete reply within ",
                       absl::FormatDuration(timeout), " (got '", reply, "')"));
    }
    if (ready < 0 && errno == EINTR) continue;
    const ssize_t r = ready < 0 ? -1 : ::recv(fd->get(), buf, sizeof(buf), MSG_DONTWAIT);
    if (r == 0) break;  // the server closed the connection: the reply is complete
    if (r < 0) {
      if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR) continue;
      return absl::UnavailableError(absl::StrCat("GET ", path, ": ", ErrnoString(errno)));
    }
    reply.append(buf, static_cast<size_t>(r));
  }
  const size_t end_of_headers = reply.find("\r\n\r\n");
  if (end_of_headers == std::string::npos) {
    return absl::InternalError(absl::StrCat("GET ", path, ": malformed reply '", reply, "'"));
  }
  const std::string status_line = reply.substr(0, reply.find("\r\n"));
  if (!absl::StrContains(status_line, " 200 ")) {
    return absl::InternalError(absl::StrCat("GET ", path, ": ", status_line));
  }
  return reply.substr(end_of_headers + 4);
}

absl::StatusOr<double> FindSample(absl::string_view text, absl::string_view series) {
  for (absl::string_view line : absl::StrSplit(text, '\n')) {
    if (!absl::StartsWith(line, series) || line.size() <= series.size() ||
        line[series.size()] != ' ') {
      continue;
    }
    absl::string_view rest = line.substr(series.size() + 1);
    rest = rest.substr(0, rest.find(' '));  // drop a timestamp, if any
    double value = 0;
    if (rest == "+Inf") return HUGE_VAL;
    if (!absl::SimpleAtod(rest, &value)) {
      return absl::InvalidArgumentError(absl::StrCat("bad sample line '", line, "'"));
    }
    return value;
  }
  return absl::NotFoundError(absl::StrCat("no sample '", series, "' in:\n", text));
}

}  // namespace gradsync
