#include "ipc/fd_registration.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstddef>
#include <cstring>

#include "absl/strings/match.h"
#include "absl/strings/strip.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"

namespace gradsync::ipc {
namespace {

absl::Status WaitFor(int sock, short events, absl::Time deadline, const char* what) {
  while (true) {
    struct pollfd p = {sock, events, 0};
    const int timeout = PollTimeoutMs(deadline);
    const int n = ::poll(&p, 1, timeout);
    if (n > 0) return absl::OkStatus();
    if (n < 0 && errno != EINTR) {
      return absl::UnavailableError(absl::StrCat("poll while ", what, ": ", ErrnoString(errno)));
    }
    if (n == 0 && absl::Now() >= deadline) {
      return absl::DeadlineExceededError(absl::StrCat("timed out ", what));
    }
  }
}

// Checks the common head of a request (magic, version, session id length)
// and returns the session id that follows it.
template <typename Wire>
absl::StatusOr<std::string> DecodeHead(absl::string_view bytes, uint32_t magic, const char* what,
                                       Wire* w) {
  if (bytes.size() < sizeof(Wire)) {
    return absl::InvalidArgumentError(absl::StrCat(what, " of ", bytes.size(),
                                                   " bytes; at least ", sizeof(Wire), " expected"));
  }
  std::memcpy(w, bytes.data(), sizeof(Wire));
  if (w->magic != magic) {
    return absl::InvalidArgumentError(absl::StrCat(what, " with bad magic 0x", absl::Hex(w->magic)));
  }
  if (w->version != kFdProtocolVersion) {
    return absl::InvalidArgumentError(absl::StrCat(what, " of protocol version ", w->version,
                                                   "; this daemon speaks ", kFdProtocolVersion));
  }
  if (w->session_id_len == 0 || w->session_id_len > kMaxSessionIdBytes ||
      bytes.size() != sizeof(Wire) + w->session_id_len) {
    return absl::InvalidArgumentError(absl::StrCat(
        what, " announces a ", w->session_id_len, "-byte session id (1 to ", kMaxSessionIdBytes,
        ") in a message of ", bytes.size(), " bytes"));
  }
  return std::string(bytes.substr(sizeof(Wire)));
}

template <typename Wire>
std::string EncodeHead(Wire* w, uint32_t magic, const std::string& session_id,
                       const std::string& token) {
  w->magic = magic;
  w->version = kFdProtocolVersion;
  w->session_id_len = static_cast<uint16_t>(std::min(session_id.size(), kMaxSessionIdBytes));
  std::memcpy(w->token, token.data(), std::min(token.size(), kRegistrationTokenBytes));
  std::string out(reinterpret_cast<const char*>(w), sizeof(Wire));
  out.append(session_id, 0, w->session_id_len);
  return out;
}

// One request and its answer on a fresh connection to the fd socket: sends
// `bytes` with `send_fd` (-1: none) and takes a descriptor from the answer
// into *received (null: none expected).
absl::StatusOr<RegisterResponse> Exchange(const std::string& fd_socket, const std::string& bytes,
                                          int send_fd, UniqueFd* received, absl::Time deadline) {
  absl::StatusOr<UnixAddress> address = ParseUnixAddress(fd_socket);
  if (!address.ok()) return address.status();
  absl::StatusOr<UniqueFd> sock = ConnectSeqpacket(*address, deadline);
  if (!sock.ok()) {
    return absl::Status(sock.status().code(),
                        absl::StrCat("gradsyncd's fd socket: ", sock.status().message()));
  }
  if (absl::Status s = SendMessage(sock->get(), bytes, send_fd, deadline); !s.ok()) {
    return absl::Status(s.code(), absl::StrCat("sending to ", fd_socket, ": ", s.message()));
  }
  absl::StatusOr<std::string> reply = ReceiveMessage(
      sock->get(), sizeof(RegisterResponseWire) + kMaxResponseMessageBytes, received, deadline);
  if (!reply.ok()) {
    return absl::Status(reply.status().code(),
                        absl::StrCat("no answer from ", fd_socket, ": ", reply.status().message()));
  }
  return DecodeResponse(*reply);
}

}  // namespace

uint32_t RequestMagic(absl::string_view bytes) {
  uint32_t magic = 0;
  if (bytes.size() >= sizeof(magic)) std::memcpy(&magic, bytes.data(), sizeof(magic));
  return magic;
}

std::string EncodeRequest(const RegisterRequest& r) {
  RegisterRequestWire w{};
  w.offset = r.offset;
  w.size = r.size;
  return EncodeHead(&w, kRegisterRequestMagic, r.session_id, r.token);
}

absl::StatusOr<RegisterRequest> DecodeRequest(absl::string_view bytes) {
  RegisterRequestWire w;
  absl::StatusOr<std::string> session =
      DecodeHead(bytes, kRegisterRequestMagic, "registration request", &w);
  if (!session.ok()) return session.status();
  RegisterRequest r;
  r.session_id = *std::move(session);
  r.token.assign(reinterpret_cast<const char*>(w.token), kRegistrationTokenBytes);
  r.offset = w.offset;
  r.size = w.size;
  return r;
}

std::string EncodeFetchRequest(const FetchRequest& r) {
  FetchRequestWire w{};
  w.kind = static_cast<uint32_t>(r.kind);
  w.id = r.id;
  return EncodeHead(&w, kFetchRequestMagic, r.session_id, r.token);
}

absl::StatusOr<FetchRequest> DecodeFetchRequest(absl::string_view bytes) {
  FetchRequestWire w;
  absl::StatusOr<std::string> session = DecodeHead(bytes, kFetchRequestMagic, "fetch request", &w);
  if (!session.ok()) return session.status();
  if (w.reserved != 0) {
    return absl::InvalidArgumentError("fetch request with non-zero reserved bytes");
  }
  if (w.kind != static_cast<uint32_t>(SegmentKind::kBuffer) &&
      w.kind != static_cast<uint32_t>(SegmentKind::kOpQueue)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "fetch request for segment kind ", w.kind, " (1: buffer, 2: op queue)"));
  }
  FetchRequest r;
  r.session_id = *std::move(session);
  r.token.assign(reinterpret_cast<const char*>(w.token), kRegistrationTokenBytes);
  r.kind = static_cast<SegmentKind>(w.kind);
  r.id = w.id;
  return r;
}

std::string EncodeResponse(const RegisterResponse& r) {
  RegisterResponseWire w{};
  w.magic = kRegisterResponseMagic;
  w.code = static_cast<uint16_t>(r.status.code());
  const absl::string_view msg = r.status.message().substr(0, kMaxResponseMessageBytes);
  w.message_len = static_cast<uint16_t>(msg.size());
  w.buffer_id = r.buffer_id;
  w.size = r.size;
  std::string out(reinterpret_cast<const char*>(&w), sizeof(w));
  out.append(msg.data(), msg.size());
  return out;
}

absl::StatusOr<RegisterResponse> DecodeResponse(absl::string_view bytes) {
  RegisterResponseWire w;
  if (bytes.size() < sizeof(w)) {
    return absl::DataLossError(absl::StrCat("registration response of ", bytes.size(),
                                            " bytes; at least ", sizeof(w), " expected"));
  }
  std::memcpy(&w, bytes.data(), sizeof(w));
  if (w.magic != kRegisterResponseMagic || w.message_len > kMaxResponseMessageBytes ||
      bytes.size() != sizeof(w) + w.message_len) {
    return absl::DataLossError(absl::StrCat("malformed registration response (magic 0x",
                                            absl::Hex(w.magic), ", ", bytes.size(), " bytes)"));
  }
  RegisterResponse r;
  const absl::StatusCode code =
      w.code > static_cast<uint16_t>(absl::StatusCode::kUnauthenticated)
          ? absl::StatusCode::kUnknown
          : static_cast<absl::StatusCode>(w.code);
  if (code != absl::StatusCode::kOk) r.status = absl::Status(code, bytes.substr(sizeof(w)));
  r.buffer_id = w.buffer_id;
  r.size = w.size;
  return r;
}

absl::StatusOr<UnixAddress> ParseUnixAddress(absl::string_view text) {
  UnixAddress a;
  a.text = std::string(text);
  a.addr.sun_family = AF_UNIX;
  absl::string_view name;
  if (absl::ConsumePrefix(&text, "unix-abstract:")) {
    a.abstract = true;
    name = text;
  } else if (absl::ConsumePrefix(&text, "unix:")) {
    absl::ConsumePrefix(&text, "//");
    name = text;
    a.path = std::string(text);
  } else {
    return absl::InvalidArgumentError(absl::StrCat(
        "'", a.text, "' is not a unix socket address (unix:PATH or unix-abstract:NAME)"));
  }
  // Abstract names take the leading NUL byte of sun_path.
  const size_t room = sizeof(a.addr.sun_path) - 1;
  if (name.empty() || name.size() > room) {
    return absl::InvalidArgumentError(absl::StrCat("unix socket name '", name, "' has ",
                                                   name.size(), " bytes; 1 to ", room,
                                                   " are allowed"));
  }
  std::memcpy(a.addr.sun_path + (a.abstract ? 1 : 0), name.data(), name.size());
  // A path counts its terminating NUL; an abstract name its leading one.
  a.len = static_cast<socklen_t>(offsetof(struct sockaddr_un, sun_path) + 1 + name.size());
  return a;
}

absl::StatusOr<UniqueFd> ListenSeqpacket(const UnixAddress& address, mode_t mode) {
  return ListenUnix(address, SOCK_SEQPACKET, mode, "the fd socket");
}

absl::StatusOr<UniqueFd> ListenUnix(const UnixAddress& address, int type, mode_t mode,
                                    absl::string_view what) {
  UniqueFd fd(::socket(AF_UNIX, type | SOCK_CLOEXEC | SOCK_NONBLOCK, 0));
  if (!fd.valid()) return absl::InternalError(absl::StrCat("socket: ", ErrnoString(errno)));
  if (!address.abstract) {
    // A socket file left by an earlier run is removed; one a live process
    // still serves is not taken over.
    UniqueFd probe(::socket(AF_UNIX, type | SOCK_CLOEXEC, 0));
    if (probe.valid() && ::connect(probe.get(), reinterpret_cast<const sockaddr*>(&address.addr),
                                   address.len) == 0) {
      return absl::AlreadyExistsError(absl::StrCat("another process serves ", what, " ",
                                                   address.text, " (a second gradsyncd?)"));
    }
    ::unlink(address.path.c_str());
  }
  if (::bind(fd.get(), reinterpret_cast<const sockaddr*>(&address.addr), address.len) != 0) {
    return absl::UnavailableError(
        absl::StrCat("cannot bind ", what, " ", address.text, ": ", ErrnoString(errno)));
  }
  if (!address.abstract && ::chmod(address.path.c_str(), mode) != 0) {
    return absl::InternalError(absl::StrCat("chmod ", address.path, ": ", ErrnoString(errno)));
  }
  if (::listen(fd.get(), 64) != 0) {
    return absl::InternalError(absl::StrCat("listen on ", address.text, ": ", ErrnoString(errno)));
  }
  return fd;
}

absl::StatusOr<UniqueFd> ConnectSeqpacket(const UnixAddress& address, absl::Time deadline) {
  UniqueFd fd(::socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC | SOCK_NONBLOCK, 0));
  if (!fd.valid()) return absl::InternalError(absl::StrCat("socket: ", ErrnoString(errno)));
  if (::connect(fd.get(), reinterpret_cast<const sockaddr*>(&address.addr), address.len) != 0) {
    if (errno != EINPROGRESS && errno != EAGAIN) {
      return absl::UnavailableError(
          absl::StrCat("cannot connect to ", address.text, ": ", ErrnoString(errno)));
    }
    absl::Status s = WaitFor(fd.get(), POLLOUT, deadline, "connecting");
    if (!s.ok()) return s;
  }
  return fd;
}

absl::Status SendMessage(int sock, absl::string_view bytes, int fd, absl::Time deadline) {
  struct iovec iov = {const_cast<char*>(bytes.data()), bytes.size()};
  alignas(struct cmsghdr) char control[CMSG_SPACE(sizeof(int))] = {};
  struct msghdr msg {};
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  if (fd >= 0) {
    msg.msg_control = control;
    msg.msg_controllen = sizeof(control);
    struct cmsghdr* c = CMSG_FIRSTHDR(&msg);
    c->cmsg_level = SOL_SOCKET;
    c->cmsg_type = SCM_RIGHTS;
    c->cmsg_len = CMSG_LEN(sizeof(int));
    std::memcpy(CMSG_DATA(c), &fd, sizeof(int));
  }
  while (true) {
    const ssize_t n = ::sendmsg(sock, &msg, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (n == static_cast<ssize_t>(bytes.size())) return absl::OkStatus();
    if (n >= 0) return absl::InternalError("short write of a seqpacket message");
    if (errno == EINTR) continue;
    if (errno != EAGAIN) {
      return absl::UnavailableError(absl::StrCat("sendmsg: ", ErrnoString(errno)));
    }
    absl::Status s = WaitFor(sock, POLLOUT, deadline, "sending");
    if (!s.ok()) return s;
  }
}

absl::StatusOr<std::string> ReceiveMessage(int sock, size_t max_bytes, UniqueFd* fd,
                                           absl::Time deadline) {
  std::string buf(max_bytes + 1, '\0');  // one spare byte tells a longer message
  alignas(struct cmsghdr) char control[CMSG_SPACE(4 * sizeof(int))];
  while (true) {
    struct iovec iov = {buf.data(), buf.size()};
    struct msghdr msg {};
    msg.msg_iov = &iov;
    msg.msg_iovlen = 1;
    msg.msg_control = control;
    msg.msg_controllen = sizeof(control);
    const ssize_t n = ::recvmsg(sock, &msg, MSG_DONTWAIT | MSG_CMSG_CLOEXEC);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && errno == EAGAIN) {
      absl::Status s = WaitFor(sock, POLLIN, deadline, "waiting for a message");
      if (!s.ok()) return s;
      continue;
    }
    if (n < 0) return absl::UnavailableError(absl::StrCat("recvmsg: ", ErrnoString(errno)));
    int fds_seen = 0;
    for (struct cmsghdr* c = CMSG_FIRSTHDR(&msg); c != nullptr; c = CMSG_NXTHDR(&msg, c)) {
      if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS) continue;
      const size_t count = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
      for (size_t i = 0; i < count; ++i) {
        int received;
        std::memcpy(&received, CMSG_DATA(c) + i * sizeof(int), sizeof(int));
        if (fds_seen++ == 0 && fd != nullptr) {
          fd->Reset(received);
        } else {
          ::close(received);
        }
      }
    }
    if (n == 0) return absl::UnavailableError("the peer closed the connection");
    if (fds_seen > 1 || (msg.msg_flags & MSG_CTRUNC) != 0) {
      if (fd != nullptr) fd->Reset();
      return absl::InvalidArgumentError(
          absl::StrCat("a message carried ", fds_seen, " or more descriptors; one is allowed"));
    }
    if (static_cast<size_t>(n) > max_bytes || (msg.msg_flags & MSG_TRUNC) != 0) {
      if (fd != nullptr) fd->Reset();
      return absl::InvalidArgumentError(
          absl::StrCat("a message longer than ", max_bytes, " bytes"));
    }
    buf.resize(static_cast<size_t>(n));
    return buf;
  }
}

absl::StatusOr<RegisterResponse> RegisterFd(const std::string& fd_socket,
                                            const RegisterRequest& request, int fd,
                                            absl::Time deadline) {
  return Exchange(fd_socket, EncodeRequest(request), fd, nullptr, deadline);
}

absl::StatusOr<FetchedSegment> FetchSegment(const std::string& fd_socket,
                                            const FetchRequest& request, absl::Time deadline) {
  FetchedSegment out;
  absl::StatusOr<RegisterResponse> response =
      Exchange(fd_socket, EncodeFetchRequest(request), -1, &out.fd, deadline);
  if (!response.ok()) return response.status();
  if (!response->status.ok()) return response->status;
  if (!out.fd.valid()) {
    return absl::DataLossError(
        absl::StrCat(fd_socket, " answered a fetch without a descriptor"));
  }
  out.size = response->size;
  return out;
}

absl::StatusOr<std::string> RandomBytes(size_t n) {
  std::string out(n, '\0');
  size_t got = 0;
  while (got < n) {
    const ssize_t r = ::getrandom(out.data() + got, n - got, 0);
    if (r < 0 && errno == EINTR) continue;
    if (r < 0) return absl::InternalError(absl::StrCat("getrandom: ", ErrnoString(errno)));
    got += static_cast<size_t>(r);
  }
  return out;
}

}  // namespace gradsync::ipc
