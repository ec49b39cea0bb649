#include "common/net.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"

namespace gradsync {

void UniqueFd::Reset(int fd) {
  if (fd_ >= 0) ::close(fd_);
  fd_ = fd;
}

std::string HostPort::ToString() const {
  if (host.find(':') != std::string::npos) return absl::StrCat("[", host, "]:", port);
  return absl::StrCat(host, ":", port);
}

namespace {
bool IsLoopbackHost(absl::string_view host) {
  return host == "localhost" || host == "::1" || absl::StartsWith(host, "127.");
}
}  // namespace

bool AllOnOneHost(const std::vector<HostPort>& endpoints) {
  bool all_loopback = true, all_same = true;
  for (const HostPort& e : endpoints) {
    all_loopback = all_loopback && IsLoopbackHost(e.host);
    all_same = all_same && e.host == endpoints.front().host;
  }
  return all_loopback || all_same;
}

absl::StatusOr<HostPort> ParseHostPort(absl::string_view s) {
  HostPort hp;
  absl::string_view port_str;
  if (!s.empty() && s.front() == '[') {
    size_t close = s.find(']');
    if (close == absl::string_view::npos || close + 1 >= s.size() || s[close + 1] != ':') {
      return absl::InvalidArgumentError(absl::StrCat("bad address '", s, "' (expected [v6]:port)"));
    }
    hp.host = std::string(s.substr(1, close - 1));
    port_str = s.substr(close + 2);
  } else {
    size_t colon = s.rfind(':');
    if (colon == absl::string_view::npos) {
      return absl::InvalidArgumentError(absl::StrCat("bad address '", s, "' (expected host:port)"));
    }
    hp.host = std::string(s.substr(0, colon));
    port_str = s.substr(colon + 1);
  }
  if (!absl::SimpleAtoi(port_str, &hp.port) || hp.port < 0 || hp.port > 65535) {
    return absl::InvalidArgumentError(absl::StrCat("bad port in address '", s, "'"));
  }
  if (hp.host.empty()) hp.host = "0.0.0.0";
  return hp;
}

namespace {

// The resolved addresses ("ip:port") of a "host:port" gRPC target.
std::vector<std::string> ResolveTarget(absl::string_view target) {
  for (absl::string_view prefix : {"dns:///", "ipv4:", "ipv6:"}) {
    if (absl::ConsumePrefix(&target, prefix)) break;
  }
  std::vector<std::string> out;
  absl::StatusOr<HostPort> hp = ParseHostPort(target);
  if (!hp.ok()) return out;
  addrinfo hints{};
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* res = nullptr;
  if (::getaddrinfo(hp->host.c_str(), nullptr, &hints, &res) != 0) return out;
  for (addrinfo* ai = res; ai != nullptr; ai = ai->ai_next) {
    char host[NI_MAXHOST];
    if (::getnameinfo(ai->ai_addr, ai->ai_addrlen, host, sizeof(host), nullptr, 0,
                      NI_NUMERICHOST) == 0) {
      out.push_back(absl::StrCat(host, ":", hp->port));
    }
  }
  ::freeaddrinfo(res);
  return out;
}

}  // namespace

bool SameGrpcTarget(absl::string_view a, absl::string_view b) {
  if (a == b) return true;
  const std::vector<std::string> ra = ResolveTarget(a), rb = ResolveTarget(b);
  for (const std::string& x : ra) {
    if (std::find(rb.begin(), rb.end(), x) != rb.end()) return true;
  }
  return false;
}

std::string ErrnoString(int err) { return absl::StrCat(std::strerror(err), " (errno ", err, ")"); }

namespace {

absl::StatusOr<struct addrinfo*> Resolve(const HostPort& addr, bool passive) {
  struct addrinfo hints;
  std::memset(&hints, 0, sizeof(hints));
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = passive ? AI_PASSIVE : 0;
  struct addrinfo* res = nullptr;
  const std::string port = std::to_string(addr.port);
  int rc = getaddrinfo(addr.host.c_str(), port.c_str(), &hints, &res);
  if (rc != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("cannot resolve '", addr.ToString(), "': ", gai_strerror(rc)));
  }
  return res;
}

}  // namespace

absl::StatusOr<UniqueFd> TcpListen(const HostPort& addr, int backlog) {
  auto res = Resolve(addr, true);
  if (!res.ok()) return res.status();
  std::string last_error = "no address";
  for (struct addrinfo* ai = *res; ai != nullptr; ai = ai->ai_next) {
    UniqueFd fd(::socket(ai->ai_family, ai->ai_socktype | SOCK_CLOEXEC, ai->ai_protocol));
    if (!fd.valid()) {
      last_error = ErrnoString(errno);
      continue;
    }
    int one = 1;
    setsockopt(fd.get(), SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    if (::bind(fd.get(), ai->ai_addr, ai->ai_addrlen) != 0 || ::listen(fd.get(), backlog) != 0) {
      last_error = ErrnoString(errno);
      continue;
    }
    freeaddrinfo(*res);
    return fd;
  }
  freeaddrinfo(*res);
  return absl::UnavailableError(absl::StrCat("cannot listen on ", addr.ToString(), ": ", last_error));
}

absl::StatusOr<int> LocalPort(int fd) {
  struct sockaddr_storage ss;
  socklen_t len = sizeof(ss);
  if (getsockname(fd, reinterpret_cast<struct sockaddr*>(&ss), &len) != 0) {
    return absl::InternalError(absl::StrCat("getsockname: ", ErrnoString(errno)));
  }
  if (ss.ss_family == AF_INET) return ntohs(reinterpret_cast<struct sockaddr_in*>(&ss)->sin_port);
  return ntohs(reinterpret_cast<struct sockaddr_in6*>(&ss)->sin6_port);
}

absl::Status SetNonBlocking(int fd, bool on) {
  int flags = fcntl(fd, F_GETFL, 0);
  if (flags < 0) return absl::InternalError(absl::StrCat("fcntl: ", ErrnoString(errno)));
  flags = on ? (flags | O_NONBLOCK) : (flags & ~O_NONBLOCK);
  if (fcntl(fd, F_SETFL, flags) != 0) {
    return absl::InternalError(absl::StrCat("fcntl: ", ErrnoString(errno)));
  }
  return absl::OkStatus();
}

int PollTimeoutMs(absl::Time deadline, int max_ms) {
  absl::Duration left = deadline - absl::Now();
  if (left <= absl::ZeroDuration()) return 0;
  int64_t ms = absl::ToInt64Milliseconds(absl::Ceil(left, absl::Milliseconds(1)));
  return static_cast<int>(ms > max_ms ? max_ms : ms);
}

absl::StatusOr<UniqueFd> TcpConnect(const HostPort& addr, absl::Time deadline, bool retry_refused) {
  std::string last_error;
  while (true) {
    auto res = Resolve(addr, false);
    if (!res.ok()) return res.status();
    for (struct addrinfo* ai = *res; ai != nullptr; ai = ai->ai_next) {
      UniqueFd fd(::socket(ai->ai_family, ai->ai_socktype | SOCK_CLOEXEC | SOCK_NONBLOCK,
                           ai->ai_protocol));
      if (!fd.valid()) {
        last_error = ErrnoString(errno);
        continue;
      }
      int rc = ::connect(fd.get(), ai->ai_addr, ai->ai_addrlen);
      if (rc != 0 && errno != EINPROGRESS) {
        last_error = ErrnoString(errno);
        continue;
      }
      if (rc != 0) {
        struct pollfd p = {fd.get(), POLLOUT, 0};
        int n;
        do {
          n = ::poll(&p, 1, PollTimeoutMs(deadline));
        } while (n < 0 && errno == EINTR);
        if (n == 0) {
          last_error = "timed out";
          continue;
        }
        int err = 0;
        socklen_t len = sizeof(err);
        getsockopt(fd.get(), SOL_SOCKET, SO_ERROR, &err, &len);
        if (err != 0) {
          last_error = ErrnoString(err);
          continue;
        }
      }
      freeaddrinfo(*res);
      return fd;
    }
    freeaddrinfo(*res);
    if (!retry_refused || absl::Now() + absl::Milliseconds(50) >= deadline ||
        last_error.find("refused") == std::string::npos) {
      break;
    }
    absl::SleepFor(absl::Milliseconds(50));
  }
  if (absl::Now() >= deadline) {
    return absl::DeadlineExceededError(
        absl::StrCat("connect to ", addr.ToString(), " timed out: ", last_error));
  }
  return absl::UnavailableError(absl::StrCat("connect to ", addr.ToString(), ": ", last_error));
}

absl::Status TuneDataSocket(int fd, int buffer_bytes) {
  int one = 1;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
  if (buffer_bytes > 0) {
    setsockopt(fd, SOL_SOCKET, SO_SNDBUF, &buffer_bytes, sizeof(buffer_bytes));
    setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &buffer_bytes, sizeof(buffer_bytes));
  }
  return SetNonBlocking(fd, true);
}

namespace {
absl::Status WaitFd(int fd, short events, absl::Time deadline, absl::string_view what) {
  struct pollfd p = {fd, events, 0};
  while (true) {
    int n = ::poll(&p, 1, PollTimeoutMs(deadline));
    if (n > 0) return absl::OkStatus();
    if (n == 0) return absl::DeadlineExceededError(absl::StrCat(what, " timed out"));
    if (errno != EINTR) return absl::InternalError(absl::StrCat("poll: ", ErrnoString(errno)));
  }
}
}  // namespace

absl::Status ReadFull(int fd, void* buf, size_t n, absl::Time deadline) {
  char* p = static_cast<char*>(buf);
  size_t got = 0;
  while (got < n) {
    ssize_t r = ::recv(fd, p + got, n - got, MSG_DONTWAIT);
    if (r > 0) {
      got += static_cast<size_t>(r);
    } else if (r == 0) {
      return absl::UnavailableError(absl::StrCat("connection closed by peer after ", got, " of ",
                                                 n, " bytes"));
    } else if (errno == EAGAIN || errno == EWOULDBLOCK) {
      absl::Status s = WaitFd(fd, POLLIN, deadline, "read");
      if (!s.ok()) return s;
    } else if (errno != EINTR) {
      return absl::UnavailableError(absl::StrCat("read: ", ErrnoString(errno)));
    }
  }
  return absl::OkStatus();
}

absl::Status WriteFull(int fd, const void* buf, size_t n, absl::Time deadline) {
  const char* p = static_cast<const char*>(buf);
  size_t put = 0;
  while (put < n) {
    ssize_t r = ::send(fd, p + put, n - put, MSG_DONTWAIT | MSG_NOSIGNAL);
    if (r >= 0) {
      put += static_cast<size_t>(r);
    } else if (errno == EAGAIN || errno == EWOULDBLOCK) {
      absl::Status s = WaitFd(fd, POLLOUT, deadline, "write");
      if (!s.ok()) return s;
    } else if (errno != EINTR) {
      return absl::UnavailableError(absl::StrCat("write: ", ErrnoString(errno)));
    }
  }
  return absl::OkStatus();
}

}  // namespace gradsync
