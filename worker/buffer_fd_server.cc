#include "worker/buffer_fd_server.h"

#include <errno.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/logging.h"
#include "worker/socket_group.h"

namespace gradsync {

std::string BufferFdServer::DefaultAddress(const std::string& listen) {
  if (absl::StartsWith(listen, "unix:") || absl::StartsWith(listen, "unix-abstract:")) {
    return listen + ".fd";
  }
  return "";
}

absl::StatusOr<std::unique_ptr<BufferFdServer>> BufferFdServer::Start(const std::string& address,
                                                                       const std::string& group,
                                                                       Handler handler,
                                                                       FetchHandler fetch,
                                                                       DaemonObserver* observer) {
  absl::StatusOr<ipc::UnixAddress> parsed = ipc::ParseUnixAddress(address);
  if (!parsed.ok()) return parsed.status();
  if (absl::Status s = CheckSocketGroup(*parsed, group, "the fd socket"); !s.ok()) return s;
  absl::StatusOr<UniqueFd> listener = ipc::ListenSeqpacket(*parsed, 0660);
  if (!listener.ok()) return listener.status();
  if (absl::Status s = ApplySocketGroup(*parsed, group, "the fd socket"); !s.ok()) return s;
  UniqueFd wake(::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK));
  if (!wake.valid()) return absl::InternalError(absl::StrCat("eventfd: ", ErrnoString(errno)));
  return std::unique_ptr<BufferFdServer>(new BufferFdServer(
      std::move(*parsed), std::move(*listener), std::move(wake), std::move(handler),
      std::move(fetch), observer));
}

BufferFdServer::BufferFdServer(ipc::UnixAddress address, UniqueFd listener, UniqueFd wake,
                               Handler handler, FetchHandler fetch, DaemonObserver* observer)
    : address_(std::move(address)),
      listener_(std::move(listener)),
      wake_(std::move(wake)),
      handler_(std::move(handler)),
      fetch_(std::move(fetch)),
      observer_(observer),
      thread_([this] { Loop(); }) {
  struct stat st;
  if (!address_.abstract && ::stat(address_.path.c_str(), &st) == 0) inode_ = st.st_ino;
}

BufferFdServer::~BufferFdServer() {
  const uint64_t one = 1;
  if (::write(wake_.get(), &one, sizeof(one)) < 0) GS_LOG(WARNING) << "fd socket: cannot wake";
  thread_.join();
  // Only the socket file this server made: a daemon started on the same
  // path after this one began to stop has its own.
  struct stat st;
  if (!address_.abstract && ::stat(address_.path.c_str(), &st) == 0 && st.st_ino == inode_) {
    ::unlink(address_.path.c_str());
  }
}

void BufferFdServer::Loop() {
  std::vector<Pending> pending;
  std::vector<pollfd> polled;
  while (true) {
    polled.assign({{listener_.get(), POLLIN, 0}, {wake_.get(), POLLIN, 0}});
    absl::Time next = absl::InfiniteFuture();
    for (const Pending& p : pending) {
      polled.push_back({p.conn.get(), POLLIN, 0});
      next = std::min(next, p.deadline);
    }
    const int timeout_ms =
        next == absl::InfiniteFuture()
            ? -1
            : static_cast<int>(std::max<int64_t>(
                  0, absl::ToInt64Milliseconds(next - absl::Now() + absl::Milliseconds(1))));
    if (::poll(polled.data(), polled.size(), timeout_ms) < 0) {
      if (errno == EINTR) continue;
      GS_LOG(ERROR) << "fd socket " << address_.text << ": poll: " << ErrnoString(errno);
      return;
    }
    if (polled[1].revents != 0) return;
    // Serve what arrived and what timed out; keep the rest.
    const absl::Time now = absl::Now();
    std::vector<Pending> waiting;
    for (size_t i = 0; i < pending.size(); ++i) {
      Pending& p = pending[i];
      if (polled[i + 2].revents == 0 && p.deadline > now) {
        waiting.push_back(std::move(p));
        continue;
      }
      Serve(p.conn.get(), p.peer, p.deadline);
      limits_.Release(absl::StrCat(p.peer.uid));
    }
    pending = std::move(waiting);
    if (polled[0].revents != 0) Accept(&pending);
  }
}

void BufferFdServer::Accept(std::vector<Pending>* pending) {
  while (true) {
    UniqueFd conn(::accept4(listener_.get(), nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK));
    if (!conn.valid()) {
      if (errno != EAGAIN && errno != EINTR && errno != ECONNABORTED) {
        GS_LOG(WARNING) << "fd socket " << address_.text << ": accept: " << ErrnoString(errno);
        ::usleep(10000);  // e.g. out of descriptors: do not spin
      }
      if (errno == EINTR || errno == ECONNABORTED) continue;
      return;
    }
    ucred peer{};
    socklen_t len = sizeof(peer);
    if (::getsockopt(conn.get(), SOL_SOCKET, SO_PEERCRED, &peer, &len) != 0) {
      GS_LOG(WARNING) << "fd socket: SO_PEERCRED: " << ErrnoString(errno);
      continue;
    }
    // At a limit, first serve the held connections whose request has
    // arrived: a burst of one uid's clients (8 ranks fetching their segments
    // at once while this thread was descheduled) is served in full; only
    // connections that stay silent hold slots.
    if (!limits_.Acquire(absl::StrCat(peer.uid)) &&
        (ServeArrived(pending) == 0 || !limits_.Acquire(absl::StrCat(peer.uid)))) {
      GS_LOG(WARNING) << "fd socket: closed a connection from pid " << peer.pid << " uid "
                      << peer.uid << ": " << limits_.held(absl::StrCat(peer.uid))
                      << " of its connections (at most " << kMaxConnectionsPerUid << " per uid, "
                      << kMaxConnections << " in all) have not sent their request yet";
      continue;
    }
    pending->push_back({std::move(conn), peer, absl::Now() + kRequestTimeout});
  }
}

int BufferFdServer::ServeArrived(std::vector<Pending>* pending) {
  std::vector<pollfd> polled;
  for (const Pending& p : *pending) polled.push_back({p.conn.get(), POLLIN, 0});
  if (polled.empty() || ::poll(polled.data(), polled.size(), 0) <= 0) return 0;
  std::vector<Pending> waiting;
  int served = 0;
  for (size_t i = 0; i < pending->size(); ++i) {
    Pending& p = (*pending)[i];
    if (polled[i].revents == 0) {
      waiting.push_back(std::move(p));
      continue;
    }
    Serve(p.conn.get(), p.peer, p.deadline);
    limits_.Release(absl::StrCat(p.peer.uid));
    ++served;
  }
  *pending = std::move(waiting);
  return served;
}

namespace {

std::string Who(const ucred& peer) { return absl::StrCat("pid ", peer.pid, " uid ", peer.uid); }

void Answer(int conn, const ipc::RegisterResponse& response, int fd) {
  // Best effort: a client that went away does not need the answer.
  ipc::SendMessage(conn, ipc::EncodeResponse(response), fd,
                   absl::Now() + BufferFdServer::kRequestTimeout)
      .IgnoreError();
}

}  // namespace

void BufferFdServer::Serve(int conn, const ucred& peer, absl::Time deadline) {
  UniqueFd fd;
  absl::StatusOr<std::string> bytes = ipc::ReceiveMessage(
      conn, sizeof(ipc::RegisterRequestWire) + ipc::kMaxSessionIdBytes, &fd, deadline);
  if (bytes.ok() && ipc::RequestMagic(*bytes) == ipc::kFetchRequestMagic) {
    ServeFetch(conn, *bytes, fd.valid(), peer);
    return;
  }
  if (!bytes.ok()) {
    ipc::RegisterResponse response;
    response.status = bytes.status();
    if (observer_ != nullptr) observer_->OnFdRegistration(response.status.code());
    GS_LOG(WARNING) << "fd socket: no request from " << Who(peer) << ": " << response.status;
    if (bytes.status().code() != absl::StatusCode::kUnavailable) Answer(conn, response, -1);
    return;
  }
  ServeRegistration(conn, *bytes, std::move(fd), peer);
}

void BufferFdServer::ServeRegistration(int conn, absl::string_view bytes, UniqueFd fd,
                                       const ucred& peer) {
  ipc::RegisterResponse response;
  absl::StatusOr<ipc::RegisterRequest> request = ipc::DecodeRequest(bytes);
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
  if (response.status.ok()) {
    GS_LOG(DEBUG) << "fd socket: " << Who(peer) << " registered buffer " << response.buffer_id
                  << " (" << response.size << " bytes) in session " << request->session_id;
  } else {
    GS_LOG(WARNING) << "fd socket: refused a registration from " << Who(peer) << ": "
                    << response.status;
  }
  Answer(conn, response, -1);
}

void BufferFdServer::ServeFetch(int conn, absl::string_view bytes, bool carried_fd,
                                const ucred& peer) {
  ipc::RegisterResponse response;
  ipc::FetchedSegment segment;
  absl::StatusOr<ipc::FetchRequest> request = ipc::DecodeFetchRequest(bytes);
  if (!request.ok()) {
    response.status = request.status();
  } else if (carried_fd) {
    response.status = absl::InvalidArgumentError("a fetch request must not carry a descriptor");
  } else if (fetch_ == nullptr) {
    response.status = absl::UnimplementedError("this fd socket hands out no segments");
  } else {
    absl::StatusOr<ipc::FetchedSegment> fetched = fetch_(*request, peer);
    if (fetched.ok()) {
      segment = *std::move(fetched);
      response.buffer_id = request->id;
      response.size = segment.size;
    } else {
      response.status = fetched.status();
    }
  }
  if (observer_ != nullptr) observer_->OnFdFetch(response.status.code());
  if (response.status.ok()) {
    GS_LOG(DEBUG) << "fd socket: handed " << Who(peer) << " the "
                  << (request->kind == ipc::SegmentKind::kBuffer
                          ? absl::StrCat("buffer ", request->id)
                          : std::string("op queue"))
                  << " of session " << request->session_id;
  } else {
    GS_LOG(WARNING) << "fd socket: refused a fetch from " << Who(peer) << ": " << response.status;
  }
  Answer(conn, response, segment.fd.get());
}

}  // namespace gradsync
