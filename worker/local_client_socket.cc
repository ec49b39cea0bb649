#include "worker/local_client_socket.h"

#include <poll.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <cerrno>

#include <grpcpp/server_posix.h>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "common/logging.h"
#include "ipc/fd_registration.h"
#include "worker/socket_group.h"

namespace gradsync {

absl::StatusOr<std::unique_ptr<LocalClientSocket>> LocalClientSocket::Listen(
    const std::string& address, const std::string& group, grpc::Server* server) {
  absl::StatusOr<ipc::UnixAddress> parsed = ipc::ParseUnixAddress(address);
  if (!parsed.ok()) return parsed.status();
  if (absl::Status s = CheckSocketGroup(*parsed, group, "the client socket"); !s.ok()) return s;
  absl::StatusOr<UniqueFd> fd = ipc::ListenUnix(*parsed, SOCK_STREAM, 0660, "the client socket");
  if (!fd.ok()) return fd.status();
  if (absl::Status s = ApplySocketGroup(*parsed, group, "the client socket"); !s.ok()) return s;
  std::unique_ptr<LocalClientSocket> s(new LocalClientSocket(*std::move(fd), server));
  s->path_ = parsed->path;
  if (!s->stop_.valid()) return absl::InternalError("eventfd: " + ErrnoString(errno));
  return s;
}

void LocalClientSocket::StartAccepting() {
  thread_ = std::thread([this] { AcceptLoop(); });
}

LocalClientSocket::LocalClientSocket(UniqueFd listener, grpc::Server* server)
    : listener_(std::move(listener)),
      stop_(::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK)),
      server_(server) {}

void LocalClientSocket::StopAccepting() {
  const uint64_t one = 1;
  (void)!::write(stop_.get(), &one, sizeof(one));
  if (thread_.joinable()) thread_.join();
}

LocalClientSocket::~LocalClientSocket() {
  StopAccepting();
  if (!path_.empty()) ::unlink(path_.c_str());
}

void LocalClientSocket::AcceptLoop() {
  while (true) {
    struct pollfd p[2] = {{listener_.get(), POLLIN, 0}, {stop_.get(), POLLIN, 0}};
    if (::poll(p, 2, -1) < 0) {
      if (errno == EINTR) continue;
      GS_LOG(ERROR) << "client socket: poll: " << ErrnoString(errno);
      return;
    }
    if (p[1].revents != 0) return;
    const int fd = ::accept4(listener_.get(), nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK);
    if (fd < 0) {
      if (errno != EAGAIN && errno != EINTR && errno != ECONNABORTED) {
        GS_LOG(WARNING) << "client socket: accept: " << ErrnoString(errno);
        ::usleep(10000);  // e.g. EMFILE: do not spin
      }
      continue;
    }
    ucred cred{};
    socklen_t len = sizeof(cred);
    if (::getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &len) != 0) {
      GS_LOG(WARNING) << "client socket: SO_PEERCRED: " << ErrnoString(errno);
      ::close(fd);
      continue;
    }
    {
      // A descriptor number is reused only after gRPC closed the previous
      // connection on it, so the entry is replaced, never mixed.
      absl::MutexLock l(&mu_);
      peers_[fd] = cred;
    }
    grpc::AddInsecureChannelFromFd(server_, fd);  // gRPC owns the descriptor now
  }
}

std::optional<ucred> LocalClientSocket::PeerOf(const std::string& peer) const {
  absl::string_view rest = peer;
  int fd = -1;
  if (!absl::ConsumePrefix(&rest, "fd:") || !absl::SimpleAtoi(rest, &fd)) return std::nullopt;
  absl::MutexLock l(&mu_);
  auto it = peers_.find(fd);
  if (it == peers_.end()) return std::nullopt;
  return it->second;
}

}  // namespace gradsync
