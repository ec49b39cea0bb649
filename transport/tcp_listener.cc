#include "transport/tcp_listener.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>

#include <algorithm>
#include <map>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/logging.h"
#include "transport/wire.h"

namespace gradsync::transport {
namespace {

std::string PeerName(const struct sockaddr_storage& ss) {
  char buf[INET6_ADDRSTRLEN] = "?";
  int port = 0;
  if (ss.ss_family == AF_INET) {
    auto* a = reinterpret_cast<const struct sockaddr_in*>(&ss);
    inet_ntop(AF_INET, &a->sin_addr, buf, sizeof(buf));
    port = ntohs(a->sin_port);
  } else if (ss.ss_family == AF_INET6) {
    auto* a = reinterpret_cast<const struct sockaddr_in6*>(&ss);
    inet_ntop(AF_INET6, &a->sin6_addr, buf, sizeof(buf));
    port = ntohs(a->sin6_port);
  }
  return absl::StrCat(buf, ":", port);
}

// The hello checks that come before reading the job id: magic, version, job
// id length (ValidateHello on a copy whose ranks are known to be fine).
absl::Status ValidateHelloFraming(const Hello& h) {
  Hello framing = h;
  framing.world_size = 2;
  framing.src_rank = 0;
  framing.dst_rank = 1;
  return ValidateHello(framing);
}

// The rank checks of a routed hello: dst_rank names something outside the
// job (e.g. a parameter-server shard), so it is only bounded.
absl::Status ValidateRoutedRanks(const Hello& h) {
  if (h.world_size < 1 || h.world_size > kMaxWorldSize) {
    return absl::InvalidArgumentError(absl::StrCat("bad world size ", h.world_size));
  }
  if (h.src_rank < 0 || h.src_rank >= h.world_size || h.dst_rank < 0 ||
      h.dst_rank >= kMaxWorldSize) {
    return absl::InvalidArgumentError(absl::StrCat(
        "bad ranks src=", h.src_rank, " dst=", h.dst_rank, " for world size ", h.world_size));
  }
  return absl::OkStatus();
}

// Tells a connection refused before its handshake why (best effort, never
// blocking): the connector reads it as a HelloAck refusal.
void Refuse(int fd, const std::string& why) {
  HelloAck ack{kHelloMagic, static_cast<uint16_t>(absl::StatusCode::kResourceExhausted),
               static_cast<uint16_t>(why.size())};
  std::string msg(reinterpret_cast<const char*>(&ack), sizeof(ack));
  msg += why;
  (void)::send(fd, msg.data(), msg.size(), MSG_DONTWAIT | MSG_NOSIGNAL);
}

}  // namespace

absl::StatusOr<std::unique_ptr<TcpListener>> TcpListener::Start(const ListenerOptions& options) {
  auto fd = TcpListen(options.listen);
  if (!fd.ok()) return fd.status();
  auto port = LocalPort(fd->get());
  if (!port.ok()) return port.status();
  auto status = SetNonBlocking(fd->get(), true);
  if (!status.ok()) return status;
  std::unique_ptr<TcpListener> l(new TcpListener(options, std::move(*fd), *port));
  l->accept_thread_ = std::thread([p = l.get()] { p->AcceptLoop(); });
  return l;
}

TcpListener::TcpListener(const ListenerOptions& options, UniqueFd fd, int port)
    : options_(options), listen_fd_(std::move(fd)), port_(port) {}

TcpListener::~TcpListener() {
  stop_ = true;
  if (accept_thread_.joinable()) accept_thread_.join();
  std::list<std::unique_ptr<Handshake>> hs;
  {
    absl::MutexLock l(&mu_);
    hs.swap(handshakes_);
  }
  for (auto& h : hs) h->thread.join();  // each is bounded by handshake_timeout
  absl::MutexLock l(&mu_);
  parked_.clear();
}

void TcpListener::AcceptLoop() {
  while (!stop_) {
    struct pollfd p = {listen_fd_.get(), POLLIN, 0};
    int n = ::poll(&p, 1, 100);
    {
      absl::MutexLock l(&mu_);
      ReapLocked();
    }
    if (n <= 0) continue;
    struct sockaddr_storage ss;
    socklen_t len = sizeof(ss);
    UniqueFd fd(::accept4(listen_fd_.get(), reinterpret_cast<struct sockaddr*>(&ss), &len,
                          SOCK_CLOEXEC));
    if (!fd.valid()) continue;
    std::string peer = PeerName(ss);
    std::string source = peer.substr(0, peer.rfind(':'));
    absl::MutexLock l(&mu_);
    int from_source = 0;
    for (const auto& h : handshakes_) from_source += !h->done && h->source == source ? 1 : 0;
    if (from_source >= options_.max_handshakes_per_source) {
      ++stats_.rejected;
      GS_LOG(WARNING) << "data plane: " << from_source << " handshakes from " << source
                      << " in progress, refusing " << peer;
      Refuse(fd.get(), absl::StrCat(from_source, " handshakes from ", source, " in progress"));
      continue;  // fd closes
    }
    if (static_cast<int>(handshakes_.size()) >= options_.max_pending_handshakes &&
        !EvictForLocked(source, from_source)) {
      ++stats_.rejected;
      GS_LOG(WARNING) << "data plane: too many pending handshakes, refusing " << peer;
      Refuse(fd.get(), absl::StrCat(handshakes_.size(), " handshakes in progress"));
      continue;  // fd closes
    }
    ++stats_.accepted;
    auto h = std::make_unique<Handshake>();
    h->source = std::move(source);
    h->fd = fd.get();
    h->started = absl::Now();
    Handshake* raw = h.get();
    handshakes_.push_back(std::move(h));
    raw->thread = std::thread(
        [this, f = fd.Release(), peer, raw]() mutable { DoHandshake(UniqueFd(f), peer, raw); });
  }
}

bool TcpListener::EvictForLocked(const std::string& source, int from_source) {
  // The source holding the most handshakes that still wait for their Hello.
  std::map<std::string, int> waiting;
  for (const auto& h : handshakes_) {
    if (!h->done && h->fd >= 0) ++waiting[h->source];
  }
  const std::string* heaviest = nullptr;
  for (const auto& [src, n] : waiting) {
    if (heaviest == nullptr || n > waiting[*heaviest]) heaviest = &src;
  }
  if (heaviest == nullptr || *heaviest == source || waiting[*heaviest] <= from_source + 1) {
    return false;  // the newcomer's source already has its share
  }
  Handshake* oldest = nullptr;
  for (const auto& h : handshakes_) {
    if (!h->done && h->fd >= 0 && h->source == *heaviest &&
        (oldest == nullptr || h->started < oldest->started)) {
      oldest = h.get();
    }
  }
  // Its thread is still reading the Hello from this fd (it sets fd = -1
  // under mu_ before anything else happens to it): the read fails at once.
  GS_LOG(WARNING) << "data plane: handshake slots are full; dropping the oldest silent "
                     "connection of "
                  << *heaviest << " (" << waiting[*heaviest] << " waiting) for one from "
                  << source;
  ::shutdown(oldest->fd, SHUT_RDWR);
  oldest->fd = -1;
  ++stats_.evicted;
  return true;
}

void TcpListener::ReapLocked() {
  for (auto it = handshakes_.begin(); it != handshakes_.end();) {
    if ((*it)->done) {
      (*it)->thread.join();
      it = handshakes_.erase(it);
    } else {
      ++it;
    }
  }
  const absl::Time now = absl::Now();
  for (auto it = parked_.begin(); it != parked_.end();) {
    if (now - it->second.arrived > options_.park_timeout) {
      GS_LOG(WARNING) << "data plane: closing unclaimed connection for job '"
                      << std::get<0>(it->first) << "' epoch " << std::get<1>(it->first)
                      << " rank " << std::get<2>(it->first) << " -> " << std::get<3>(it->first);
      ++stats_.expired;
      it = parked_.erase(it);
    } else {
      ++it;
    }
  }
}

void TcpListener::DoHandshake(UniqueFd fd, std::string peer, Handshake* self) {
  const absl::Time deadline = absl::Now() + options_.handshake_timeout;
  const bool routing = !options_.route_prefix.empty() && options_.route != nullptr;
  Hello hello{};
  absl::Status s = ReadFull(fd.get(), &hello, sizeof(hello), deadline);
  std::string job_id;
  // Without routing the whole hello is checked before the job id is read (as
  // always); with routing the rank checks depend on the job id.
  if (s.ok()) s = routing ? ValidateHelloFraming(hello) : ValidateHello(hello);
  if (s.ok()) {
    job_id.resize(hello.job_id_len);
    s = ReadFull(fd.get(), job_id.data(), job_id.size(), deadline);
  }
  {
    absl::MutexLock l(&mu_);  // from here on the connection cannot be evicted
    if (self->fd < 0 && s.ok()) s = absl::UnavailableError("evicted for a fair share");
    self->fd = -1;
  }
  const bool routed = routing && s.ok() && absl::StartsWith(job_id, options_.route_prefix);
  if (routing && s.ok()) s = routed ? ValidateRoutedRanks(hello) : ValidateHello(hello);
  if (!s.ok()) {
    GS_LOG(WARNING) << "data plane: rejected connection from " << peer << ": " << s.message();
    if (hello.magic == kHelloMagic) {  // a real peer speaking another version: tell it why
      std::string msg(s.message());
      HelloAck ack{kHelloMagic, static_cast<uint16_t>(s.code()),
                   static_cast<uint16_t>(msg.size())};
      (void)WriteFull(fd.get(), &ack, sizeof(ack), deadline);
      (void)WriteFull(fd.get(), msg.data(), msg.size(), deadline);
    }
    absl::MutexLock l(&mu_);
    ++stats_.rejected;
    self->done = true;
    return;
  }
  GS_LOG(DEBUG) << "data plane: " << peer << " is job '" << job_id << "' epoch " << hello.epoch
                << " rank " << hello.src_rank << " -> " << hello.dst_rank;
  if (routed) {
    {
      absl::MutexLock l(&mu_);
      ++stats_.routed;
    }
    options_.route(RoutedConnection{std::move(fd), hello, std::move(job_id), std::move(peer)});
    absl::MutexLock l(&mu_);
    self->done = true;
    return;
  }
  absl::MutexLock l(&mu_);
  absl::Status parked = ParkLocked(Key{job_id, hello.epoch, hello.src_rank, hello.dst_rank,
                                       hello.stream},
                                   std::move(fd), self->source);
  if (!parked.ok()) {
    ++stats_.rejected;
    GS_LOG(WARNING) << "data plane: refused " << peer << ": " << parked.message();
  }
  self->done = true;
}

absl::Status TcpListener::ParkLocked(Key key, UniqueFd fd, const std::string& source) {
  // Connections with the same Hello queue up (first come, first claimed):
  // a later one never replaces one that is still open, and the claimer takes
  // the next when one cannot prove the job key. Closed ones leave the queue.
  int same_key = 0;
  for (auto it = parked_.lower_bound(key); it != parked_.end() && it->first == key;) {
    struct pollfd p = {it->second.fd.get(), POLLIN | POLLRDHUP, 0};
    if (::poll(&p, 1, 0) > 0 && (p.revents & (POLLHUP | POLLRDHUP | POLLERR)) != 0) {
      it = parked_.erase(it);
      ++stats_.replaced;
    } else {
      ++same_key;
      ++it;
    }
  }
  if (same_key >= options_.max_parked_per_hello) {
    // A full queue: the source holding the most of it gives up its oldest,
    // unless that is the newcomer's source or it holds no more than one
    // more than the newcomer's (so one host cannot keep another's Hello out).
    std::map<std::string, int> held;
    for (auto it = parked_.lower_bound(key); it != parked_.end() && it->first == key; ++it) {
      ++held[it->second.source];
    }
    auto heaviest = std::max_element(held.begin(), held.end(), [](const auto& a, const auto& b) {
      return a.second < b.second;
    });
    if (heaviest->first != source && heaviest->second > held[source] + 1) {
      for (auto it = parked_.lower_bound(key); it != parked_.end() && it->first == key; ++it) {
        if (it->second.source != heaviest->first) continue;
        GS_LOG(WARNING) << "data plane: dropping the oldest of " << heaviest->second
                        << " connections from " << heaviest->first << " waiting for job '"
                        << std::get<0>(key) << "' epoch " << std::get<1>(key) << " rank "
                        << std::get<2>(key) << " -> " << std::get<3>(key) << " for one from "
                        << source;
        parked_.erase(it);
        ++stats_.evicted;
        --same_key;
        break;
      }
    }
  }
  if (same_key >= options_.max_parked_per_hello) {
    return absl::ResourceExhaustedError(absl::StrCat(
        same_key, " connections for job '", std::get<0>(key), "' epoch ", std::get<1>(key),
        " rank ", std::get<2>(key), " -> ", std::get<3>(key), " stream ", std::get<4>(key),
        " are waiting already"));
  }
  int from_source = 0;
  for (const auto& [k, v] : parked_) from_source += v.source == source ? 1 : 0;
  if (from_source >= options_.max_parked_per_source) {
    return absl::ResourceExhaustedError(absl::StrCat(from_source, " unclaimed connections from ",
                                                     source, " are waiting already"));
  }
  parked_.emplace(std::move(key), Parked{std::move(fd), absl::Now(), source});
  return absl::OkStatus();
}

absl::StatusOr<UniqueFd> TcpListener::Claim(const std::string& job_id, uint64_t epoch,
                                            int src_rank, int dst_rank, uint32_t stream,
                                            absl::Time deadline) {
  const Key key{job_id, epoch, src_rank, dst_rank, stream};
  absl::MutexLock l(&mu_);
  auto arrived = [&]() { return parked_.count(key) > 0; };
  while (!arrived()) {
    if (mu_.AwaitWithDeadline(absl::Condition(&arrived), deadline)) break;
    if (absl::Now() >= deadline) {
      return absl::DeadlineExceededError(
          absl::StrCat("job '", job_id, "' epoch ", epoch, ": rank ", src_rank,
                       " did not connect to rank ", dst_rank, " in time"));
    }
  }
  auto first = parked_.lower_bound(key);  // the earliest of its queue
  UniqueFd fd = std::move(first->second.fd);
  parked_.erase(first);
  return fd;
}

ListenerStats TcpListener::stats() const {
  absl::MutexLock l(&mu_);
  ListenerStats out = stats_;
  out.parked = parked_.size();
  return out;
}

}  // namespace gradsync::transport
