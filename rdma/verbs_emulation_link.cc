#include "rdma/verbs_emulation_link.h"

#include <poll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/logging.h"

namespace gradsync::rdma {
namespace {

socklen_t AbstractAddress(const std::string& name, sockaddr_un* a) {
  std::memset(a, 0, sizeof(*a));
  a->sun_family = AF_UNIX;
  const size_t n = std::min(name.size(), sizeof(a->sun_path) - 1);
  std::memcpy(a->sun_path + 1, name.data(), n);  // sun_path[0] = 0: abstract
  return static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + 1 + n);
}

std::string Frame(std::string body) {
  const uint32_t n = static_cast<uint32_t>(body.size());
  std::string f(reinterpret_cast<const char*>(&n), sizeof(n));
  f += body;
  return f;
}

}  // namespace

std::string EmulationSocketName(absl::string_view fabric, int node) {
  return absl::StrCat("gradsync-verbs-emulation/", fabric, "/", node);
}

absl::StatusOr<std::unique_ptr<EmulationLink>> EmulationLink::Open(const std::string& fabric) {
  if (fabric.empty() || fabric.size() > 64 || fabric.find('/') != std::string::npos) {
    return absl::InvalidArgumentError(absl::StrCat(
        "verbs emulation fabric name '", fabric, "': 1 to 64 characters, no '/'"));
  }
  for (int node = 1; node <= kMaxNodes; ++node) {
    UniqueFd fd(::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0));
    if (!fd.valid()) return absl::InternalError(absl::StrCat("socket: ", ErrnoString(errno)));
    sockaddr_un a;
    const socklen_t len = AbstractAddress(EmulationSocketName(fabric, node), &a);
    if (::bind(fd.get(), reinterpret_cast<sockaddr*>(&a), len) != 0) {
      if (errno == EADDRINUSE) continue;
      return absl::InternalError(absl::StrCat("bind verbs emulation socket: ", ErrnoString(errno)));
    }
    if (::listen(fd.get(), 64) != 0) {
      return absl::InternalError(absl::StrCat("listen: ", ErrnoString(errno)));
    }
    return std::unique_ptr<EmulationLink>(new EmulationLink(fabric, node, std::move(fd)));
  }
  return absl::ResourceExhaustedError(
      absl::StrCat("verbs emulation fabric '", fabric, "' has ", kMaxNodes, " nodes already"));
}

EmulationLink::EmulationLink(std::string fabric, int node, UniqueFd listener)
    : fabric_(std::move(fabric)),
      node_(node),
      listener_(std::move(listener)),
      wake_(::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK)) {}

void EmulationLink::Start(Handler* handler) {
  handler_ = handler;
  thread_ = std::thread([this] { Loop(); });
}

EmulationLink::~EmulationLink() {
  {
    std::lock_guard<std::mutex> l(mu_);
    stop_ = true;
  }
  Wake();
  if (thread_.joinable()) thread_.join();
  FlushQueued(absl::Now() + absl::Seconds(2));
}

// A NIC acknowledges what it received whatever its process does next: the
// answers this node owes (a write's status, which its sender waits for) go out
// before the link closes, as far as the peer reads them within the deadline.
void EmulationLink::FlushQueued(absl::Time deadline) {
  for (auto& [id, c] : conns_) {
    while (!c->out.empty()) {
      const int64_t left_ms = absl::ToInt64Milliseconds(deadline - absl::Now());
      if (left_ms <= 0) return;
      pollfd p{c->fd.get(), POLLOUT, 0};
      if (::poll(&p, 1, static_cast<int>(left_ms)) <= 0 || (p.revents & (POLLERR | POLLHUP))) break;
      std::string why;
      if (!WriteQueued(*c, &why)) break;
    }
  }
}

void EmulationLink::Wake() {
  const uint64_t one = 1;
  if (::write(wake_.get(), &one, sizeof(one)) != sizeof(one)) {
    // The counter is saturated: the thread is awake anyway.
  }
}

void EmulationLink::Queue(Conn& c, std::string body) { c.out.push_back(Frame(std::move(body))); }

void EmulationLink::Send(int node, std::string body) {
  {
    std::lock_guard<std::mutex> l(mu_);
    auto it = dialed_.find(node);
    if (it != dialed_.end()) {
      Queue(*conns_[it->second], std::move(body));
    } else {
      to_dial_[node].push_back(std::move(body));
    }
  }
  Wake();
}

void EmulationLink::Reply(uint64_t conn, std::string body) {
  {
    std::lock_guard<std::mutex> l(mu_);
    auto it = conns_.find(conn);
    if (it == conns_.end()) return;  // the asker went away
    Queue(*it->second, std::move(body));
  }
  Wake();
}

bool EmulationLink::ReadFrames(uint64_t id, Conn& c, std::string* why) {
  // A peer that answers and exits at once leaves its last frames and the end
  // of the stream in one read: the whole frames are delivered before the end
  // is reported, as a NIC delivers what reached it before the link went down.
  char buf[1 << 16];
  bool ended = false;
  while (!ended) {
    const ssize_t n = ::read(c.fd.get(), buf, sizeof(buf));
    if (n == 0) {
      *why = "connection closed";
      ended = true;
    } else if (n < 0) {
      if (errno == EINTR) continue;
      if (errno == EAGAIN) break;
      *why = ErrnoString(errno);
      ended = true;
    } else {
      c.in.append(buf, static_cast<size_t>(n));
    }
  }
  size_t at = 0;
  while (c.in.size() - at >= sizeof(uint32_t)) {
    uint32_t len;
    std::memcpy(&len, c.in.data() + at, sizeof(len));
    if (len > kMaxFrame) {
      *why = absl::StrCat("frame of ", len, " bytes");
      return false;
    }
    if (c.in.size() - at - sizeof(len) < len) break;
    const absl::string_view body(c.in.data() + at + sizeof(len), len);
    if (c.node != 0) {
      handler_->OnReply(c.node, body);
    } else {
      handler_->OnRequest(id, body);
    }
    at += sizeof(len) + len;
  }
  c.in.erase(0, at);
  return !ended;
}

bool EmulationLink::WriteQueued(Conn& c, std::string* why) {
  while (!c.out.empty()) {
    const std::string& f = c.out.front();
    const ssize_t n = ::send(c.fd.get(), f.data() + c.out_offset, f.size() - c.out_offset,
                             MSG_NOSIGNAL);
    if (n < 0) {
      if (errno == EINTR) continue;
      if (errno == EAGAIN) return true;
      *why = ErrnoString(errno);
      return false;
    }
    c.out_offset += static_cast<size_t>(n);
    if (c.out_offset == f.size()) {
      c.out.pop_front();
      c.out_offset = 0;
    }
  }
  return true;
}

void EmulationLink::Loop() {
  std::vector<pollfd> fds;
  std::vector<uint64_t> ids;
  while (true) {
    std::vector<std::pair<int, std::string>> lost;  // (node, why), reported unlocked
    {
      std::lock_guard<std::mutex> l(mu_);
      if (stop_) return;
      // Dial the nodes frames wait for.
      for (auto& [node, frames] : to_dial_) {
        UniqueFd fd(::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0));
        sockaddr_un a;
        const socklen_t len = AbstractAddress(EmulationSocketName(fabric_, node), &a);
        if (!fd.valid() || ::connect(fd.get(), reinterpret_cast<sockaddr*>(&a), len) != 0) {
          lost.emplace_back(node, absl::StrCat("cannot reach node ", node, ": ",
                                               ErrnoString(errno)));
          continue;
        }
        (void)SetNonBlocking(fd.get(), true);
        auto c = std::make_unique<Conn>();
        c->fd = std::move(fd);
        c->node = node;
        for (std::string& f : frames) Queue(*c, std::move(f));
        const uint64_t id = next_id_++;
        dialed_[node] = id;
        conns_[id] = std::move(c);
      }
      to_dial_.clear();
      fds.clear();
      ids.clear();
      fds.push_back({wake_.get(), POLLIN, 0});
      fds.push_back({listener_.get(), POLLIN, 0});
      for (auto& [id, c] : conns_) {
        fds.push_back({c->fd.get(), static_cast<short>(POLLIN | (c->out.empty() ? 0 : POLLOUT)),
                       0});
        ids.push_back(id);
      }
    }
    for (auto& [node, why] : lost) handler_->OnNodeLost(node, why);
    if (!lost.empty()) continue;
    if (::poll(fds.data(), fds.size(), 1000) < 0 && errno != EINTR) {
      GS_LOG(ERROR) << "verbs emulation link: poll: " << ErrnoString(errno);
    }
    if (fds[0].revents != 0) {
      uint64_t v;
      while (::read(wake_.get(), &v, sizeof(v)) == sizeof(v)) {
      }
    }
    if (fds[1].revents & POLLIN) {
      while (true) {
        UniqueFd fd(::accept4(listener_.get(), nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK));
        if (!fd.valid()) break;
        ucred cred{};
        socklen_t cl = sizeof(cred);
        if (::getsockopt(fd.get(), SOL_SOCKET, SO_PEERCRED, &cred, &cl) != 0 ||
            cred.uid != ::getuid()) {
          GS_LOG(WARNING) << "verbs emulation link: refused a connection from uid " << cred.uid
                          << " (pid " << cred.pid << ")";
          continue;
        }
        auto c = std::make_unique<Conn>();
        c->fd = std::move(fd);
        std::lock_guard<std::mutex> l(mu_);
        conns_[next_id_++] = std::move(c);
      }
    }
    // Reads call the handler, which may queue replies: no lock held while
    // reading; a connection is only erased by this thread.
    for (size_t i = 2; i < fds.size(); ++i) {
      if (fds[i].revents == 0) continue;
      Conn* c;
      {
        std::lock_guard<std::mutex> l(mu_);
        c = conns_[ids[i - 2]].get();
      }
      std::string why;
      bool alive = true;
      if (fds[i].revents & (POLLIN | POLLHUP | POLLERR)) alive = ReadFrames(ids[i - 2], *c, &why);
      if (alive) {
        std::lock_guard<std::mutex> l(mu_);
        alive = WriteQueued(*c, &why);
      }
      if (!alive) {
        const int node = c->node;
        {
          std::lock_guard<std::mutex> l(mu_);
          if (node != 0) dialed_.erase(node);
          conns_.erase(ids[i - 2]);
        }
        if (node != 0) handler_->OnNodeLost(node, absl::StrCat("node ", node, ": ", why));
      }
    }
    // Frames queued while nothing was readable.
    std::lock_guard<std::mutex> l(mu_);
    for (auto it = conns_.begin(); it != conns_.end();) {
      std::string why;
      if (!it->second->out.empty() && !WriteQueued(*it->second, &why) && it->second->node == 0) {
        it = conns_.erase(it);  // an asker that went away; a dialed one is reported by poll
      } else {
        ++it;
      }
    }
  }
}

}  // namespace gradsync::rdma
