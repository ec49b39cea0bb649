#include "worker/buffer_fd_server.h"

#include <errno.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/logging.h"

namespace gradsync {

std::string BufferFdServer::DefaultAddress(const std::string& listen) {
  if (absl::StartsWith(listen, "unix:") || absl::StartsWith(listen, "unix-abstract:")) {
    return listen + ".fd";
  }
  return "";
}

absl::StatusOr<std::unique_ptr<BufferFdServer>> BufferFdServer::Start(const std::string& address,
                                                                       Handler handler,
                                                                       DaemonObserver* observer) {
  absl::StatusOr<ipc::UnixAddress> parsed = ipc::ParseUnixAddress(address);
  if (!parsed.ok()) return parsed.status();
  absl::StatusOr<UniqueFd> listener = ipc::ListenSeqpacket(*parsed, 0660);
  if (!listener.ok()) return listener.status();
  UniqueFd wake(::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK));
  if (!wake.valid()) return absl::InternalError(absl::StrCat("eventfd: ", ErrnoString(errno)));
  return std::unique_ptr<BufferFdServer>(new BufferFdServer(
      std::move(*parsed), std::move(*listener), std::move(wake), std::move(handler), observer));
}

BufferFdServer::BufferFdServer(ipc::UnixAddress address, UniqueFd listener, UniqueFd wake,
                               Handler handler, DaemonObserver* observer)
    : address_(std::move(address)),
      listener_(std::move(listener)),
      wake_(std::move(wake)),
      handler_(std::move(handler)),
      observer_(observer),
      thread_([this] { Loop(); }) {}

BufferFdServer::~BufferFdServer() {
  const uint64_t one = 1;
  if (::write(wake_.get(), &one, sizeof(one)) < 0) GS_LOG(WARNING) << "fd socket: cannot wake";
  thread_.join();
  if (!address_.abstract) ::unlink(address_.path.c_str());
}

void BufferFdServer::Loop() {
  while (true) {
    struct pollfd p[2] = {{listener_.get(), POLLIN, 0}, {wake_.get(), POLLIN, 0}};
    if (::poll(p, 2, -1) < 0) {
      if (errno == EINTR) continue;
      GS_LOG(ERROR) << "fd socket " << address_.text << ": poll: " << ErrnoString(errno);
      return;
    }
    if (p[1].revents != 0) return;
    UniqueFd conn(::accept4(listener_.get(), nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK));
    if (!conn.valid()) {
      if (errno != EAGAIN && errno != EINTR && errno != ECONNABORTED) {
        GS_LOG(WARNING) << "fd socket " << address_.text << ": accept: " << ErrnoString(errno);
        ::usleep(10000);  // e.g. out of descriptors: do not spin
      }
      continue;
    }
    Serve(conn.get());
  }
}

void BufferFdServer::Serve(int conn) {
  ucred peer{};
  socklen_t len = sizeof(peer);
  if (::getsockopt(conn, SOL_SOCKET, SO_PEERCRED, &peer, &len) != 0) peer.pid = 0;
  const absl::Time deadline = absl::Now() + kRequestTimeout;
  UniqueFd fd;
  ipc::RegisterResponse response;
  absl::StatusOr<std::string> bytes = ipc::ReceiveMessage(
      conn, sizeof(ipc::RegisterRequestWire) + ipc::kMaxSessionIdBytes, &fd, deadline);
  absl::StatusOr<ipc::RegisterRequest> request =
      bytes.ok() ? ipc::DecodeRequest(*bytes) : absl::StatusOr<ipc::RegisterRequest>(bytes.status());
  if (!request.ok()) {
    response.status = request.status();
  } else if (!fd.valid()) {
    response.status = absl::InvalidArgumentError("the registration request carried no descriptor");
  } else {
    absl::StatusOr<BufferInfo> info = handler_(*request, fd.get(), peer);
    if (info.ok()) {
      response.buffer_id = info->id;
      response.size = info->size;
    } else {
      response.status = info.status();
    }
  }
  if (observer_ != nullptr) observer_->OnFdRegistration(response.status.code());
  const std::string who = absl::StrCat("pid ", peer.pid, " uid ", peer.uid);
  if (response.status.ok()) {
    GS_LOG(DEBUG) << "fd socket: " << who << " registered buffer " << response.buffer_id << " ("
                  << response.size << " bytes) in session " << request->session_id;
  } else {
    GS_LOG(WARNING) << "fd socket: refused a registration from " << who << ": "
                    << response.status;
  }
  if (bytes.ok() || bytes.status().code() != absl::StatusCode::kUnavailable) {
    // Best effort: a client that went away does not need the answer.
    ipc::SendMessage(conn, ipc::EncodeResponse(response), -1, absl::Now() + kRequestTimeout)
        .IgnoreError();
  }
}

}  // namespace gradsync
