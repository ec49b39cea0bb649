// MetricsServer: a small HTTP/1.x server for /metrics on one poll(2) thread.
//
// Why not prometheus-cpp's Exposer: civetweb serves one connection per
// thread, so N connections that send nothing delay every scrape by about
// N / threads x request timeout (226 idle connections timed a scrape out),
// and it has no per-source bound. Here a connection is a few hundred bytes of
// state in one loop; the only work done on the loop's thread is reading
// requests, one registry Collect() per scrape and non-blocking writes.
//
// A connection goes kReading (until the blank line ending the headers, within
// the request timeout from accept) -> kWriting (the whole reply, within the
// reply timeout) -> kDraining (write side shut down; read and discard until
// the peer closes, at most kLinger, so close() does not reset a reply the
// peer has not read yet) -> closed.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstring>
#include <exception>
#include <thread>
#include <utility>
#include <vector>

#include <prometheus/text_serializer.h>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "common/connection_limits.h"
#include "common/logging.h"
#include "common/metrics.h"
#include "common/net.h"
#include "common/process.h"

namespace gradsync {
namespace {

constexpr char kContentType[] = "text/plain; version=0.0.4; charset=utf-8";
// How long a replied connection may take to close its side.
constexpr absl::Duration kLinger = absl::Seconds(1);
// How long accepting pauses when the process is out of descriptors.
constexpr absl::Duration kAcceptBackoff = absl::Milliseconds(100);
constexpr int kBacklog = 512;

// "host:port" with an IP literal host: the host to bind (no brackets) and
// the port, and the host as address() shows it.
absl::Status ParseListenAddress(absl::string_view address, HostPort* bind,
                                std::string* host_out) {
  auto bad = [&](absl::string_view why) {
    return absl::InvalidArgumentError(absl::StrCat("metrics listen address '", address, "': ",
                                                   why, " (expected IPv4:port or [IPv6]:port, "
                                                   "e.g. 0.0.0.0:9470 or 127.0.0.1:0)"));
  };
  std::string host;
  absl::string_view port;
  bool v6 = false;
  if (absl::StartsWith(address, "[")) {
    const size_t close = address.find(']');
    if (close == absl::string_view::npos || close + 1 >= address.size() ||
        address[close + 1] != ':') {
      return bad("unterminated '[' or no port");
    }
    host = std::string(address.substr(1, close - 1));
    port = address.substr(close + 2);
    v6 = true;
  } else {
    const size_t colon = address.rfind(':');
    if (colon == absl::string_view::npos) return bad("no port");
    host = std::string(address.substr(0, colon));
    port = address.substr(colon + 1);
  }
  if (port.empty() || port.size() > 5 ||
      port.find_first_not_of("0123456789") != absl::string_view::npos) {
    return bad("the port must be a number 0..65535");
  }
  int port_number = 0;
  if (!absl::SimpleAtoi(port, &port_number) || port_number > 65535) {
    return bad("the port must be a number 0..65535");
  }
  unsigned char buf[sizeof(struct in6_addr)];
  if (inet_pton(v6 ? AF_INET6 : AF_INET, host.c_str(), buf) != 1) {
    return bad(v6 ? "not an IPv6 address" : "the host must be an IPv4 address or [IPv6]");
  }
  *bind = HostPort{host, port_number};
  *host_out = v6 ? absl::StrCat("[", host, "]") : host;
  return absl::OkStatus();
}

// The key a connection is counted under: its IPv4 address (also when it
// arrives as an IPv4-mapped IPv6 address), or the /64 of an IPv6 address
// (one host commonly holds a whole /64).
std::string SourceKey(const sockaddr_storage& ss) {
  char text[INET6_ADDRSTRLEN] = "";
  if (ss.ss_family == AF_INET) {
    inet_ntop(AF_INET, &reinterpret_cast<const sockaddr_in*>(&ss)->sin_addr, text, sizeof(text));
    return text;
  }
  if (ss.ss_family == AF_INET6) {
    in6_addr a = reinterpret_cast<const sockaddr_in6*>(&ss)->sin6_addr;
    if (IN6_IS_ADDR_V4MAPPED(&a)) {
      inet_ntop(AF_INET, &a.s6_addr[12], text, sizeof(text));
      return text;
    }
    std::memset(&a.s6_addr[8], 0, 8);
    inet_ntop(AF_INET6, &a, text, sizeof(text));
    return absl::StrCat(text, "/64");
  }
  return "other";
}

std::string Reply(int code, absl::string_view reason, absl::string_view content_type,
                  absl::string_view body, bool with_body, absl::string_view extra_headers = "") {
  std::string out = absl::StrCat("HTTP/1.1 ", code, " ", reason, "\r\nContent-Type: ",
                                 content_type, "\r\nContent-Length: ", body.size(),
                                 "\r\nConnection: close\r\n", extra_headers, "\r\n");
  if (with_body) out.append(body.data(), body.size());
  return out;
}

std::string ErrorReply(int code, absl::string_view reason, absl::string_view extra = "") {
  return Reply(code, reason, "text/plain; charset=utf-8", absl::StrCat(code, " ", reason, "\n"),
               /*with_body=*/true, extra);
}

}  // namespace

// ---------------------------------------------------------------------------

class MetricsServer::Loop {
 public:
  Loop(UniqueFd listener, UniqueFd wake, std::weak_ptr<prometheus::Collectable> registry,
       const Options& options)
      : listener_(std::move(listener)),
        wake_(std::move(wake)),
        registry_(std::move(registry)),
        options_(options),
        limits_(options.max_connections_per_source, options.max_connections) {}

  // Registers the server's own series (before the thread starts).
  absl::Status Init() {
    auto scrapes = own_.AddCounter("gradsync_metrics_scrapes_total",
                                   "GET /metrics requests answered by this endpoint.");
    if (!scrapes.ok()) return scrapes.status();
    scrapes_ = *scrapes;
    auto open = own_.AddGauge("gradsync_metrics_connections",
                              "Connections the metrics endpoint holds open.");
    if (!open.ok()) return open.status();
    open_gauge_ = *open;
    for (int r = 0; r < kDropReasons; ++r) {
      auto c = own_.AddCounter("gradsync_metrics_connections_dropped_total",
                               "Connections the metrics endpoint closed without a reply to a "
                               "complete request, by reason.",
                               {{"reason", kDropReasonNames[r]}});
      if (!c.ok()) return c.status();
      dropped_[r] = *c;
    }
    return absl::OkStatus();
  }

  void StartThread() {
    thread_ = std::thread([this] { Run(); });
    NameThread(thread_, "gs-metrics");
  }

  ~Loop() {
    if (thread_.joinable()) {
      const uint64_t one = 1;
      while (::write(wake_.get(), &one, sizeof(one)) < 0 && errno == EINTR) {
      }
      thread_.join();
    }
  }

  int open() const { return open_.load(std::memory_order_relaxed); }

 private:
  enum class State { kReading, kWriting, kDraining };
  // Why a connection was closed early (the `reason` label).
  enum DropReason { kSourceLimit, kFull, kEvicted, kTimeout, kTooLarge, kDropReasons };
  static constexpr const char* kDropReasonNames[kDropReasons] = {
      "source_limit", "full", "evicted", "timeout", "too_large"};

  struct Conn {
    UniqueFd fd;
    std::string source;
    State state = State::kReading;
    absl::Time deadline;  // of the current state
    std::string in;       // the request so far
    std::string out;      // the reply
    size_t sent = 0;
  };

  void Run() {
    std::vector<pollfd> pfds;
    while (true) {
      const absl::Time now = absl::Now();
      absl::Time next = absl::InfiniteFuture();
      pfds.clear();
      pfds.push_back({wake_.get(), POLLIN, 0});
      const bool accepting = now >= accept_paused_until_;
      pfds.push_back({accepting ? listener_.get() : -1, POLLIN, 0});
      if (!accepting) next = accept_paused_until_;
      for (const std::unique_ptr<Conn>& c : conns_) {
        const short events = c->state == State::kWriting ? POLLOUT : POLLIN;
        pfds.push_back({c->fd.get(), events, 0});
        next = std::min(next, c->deadline);
      }
      const int timeout = next == absl::InfiniteFuture() ? -1 : PollTimeoutMs(next);
      const int n = ::poll(pfds.data(), pfds.size(), timeout);
      if (n < 0 && errno != EINTR) {
        GS_LOG(ERROR) << "metrics endpoint: poll: " << ErrnoString(errno);
        break;
      }
      if (n > 0 && pfds[0].revents != 0) break;  // stopping
      const size_t before = conns_.size();        // accepting appends
      for (size_t i = 0; i < before && n > 0; ++i) {
        if (pfds[i + 2].revents != 0 && conns_[i]->fd.valid()) Serve(*conns_[i]);
      }
      if (n > 0 && pfds[1].revents != 0) Accept();
      Expire(absl::Now());
      conns_.erase(std::remove_if(conns_.begin(), conns_.end(),
                                  [](const std::unique_ptr<Conn>& c) { return !c->fd.valid(); }),
                   conns_.end());
    }
    for (const std::unique_ptr<Conn>& c : conns_) {
      if (c->fd.valid()) Close(*c);
    }
    conns_.clear();
  }

  void Accept() {
    for (int i = 0; i < 4 * kBacklog; ++i) {
      sockaddr_storage ss{};
      socklen_t len = sizeof(ss);
      UniqueFd fd(::accept4(listener_.get(), reinterpret_cast<sockaddr*>(&ss), &len,
                            SOCK_NONBLOCK | SOCK_CLOEXEC));
      if (!fd.valid()) {
        if (errno == EMFILE || errno == ENFILE || errno == ENOBUFS || errno == ENOMEM) {
          // Out of descriptors: the listener stays readable, so stop polling it
          // for a moment instead of spinning; expiring connections free some.
          const absl::Time now = absl::Now();
          if (now - last_accept_warning_ > absl::Minutes(1)) {
            GS_LOG(WARNING) << "metrics endpoint: accept: " << ErrnoString(errno)
                            << "; pausing accepts for " << absl::FormatDuration(kAcceptBackoff);
            last_accept_warning_ = now;
          }
          accept_paused_until_ = now + kAcceptBackoff;
          return;
        }
        if (errno == EINTR || errno == ECONNABORTED) continue;
        return;  // EAGAIN: nothing more to accept
      }
      std::string source = SourceKey(ss);
      if (limits_.held(source) >= limits_.per_source()) {
        dropped_[kSourceLimit]->Increment();
        continue;  // closed here
      }
      if (limits_.total() >= limits_.total_limit() && !Evict(source)) {
        dropped_[kFull]->Increment();
        continue;
      }
      if (!limits_.Acquire(source)) {  // cannot happen after the checks above
        dropped_[kFull]->Increment();
        continue;
      }
      auto c = std::make_unique<Conn>();
      c->fd = std::move(fd);
      c->source = std::move(source);
      c->deadline = absl::Now() + options_.request_timeout;
      conns_.push_back(std::move(c));
      SetOpen(open_.load(std::memory_order_relaxed) + 1);
    }
  }

  // Every slot is taken and `source` wants one: closes the oldest connection
  // still sending its request of the source holding the most connections, if
  // that source holds more than `source` does. false if there is none.
  bool Evict(const std::string& source) {
    const int mine = limits_.held(source);
    Conn* victim = nullptr;
    int victim_held = mine;
    for (const std::unique_ptr<Conn>& c : conns_) {  // oldest first
      if (!c->fd.valid() || c->state != State::kReading) continue;
      const int held = limits_.held(c->source);
      if (held > victim_held) {
        victim = c.get();
        victim_held = held;
      }
    }
    if (victim == nullptr) return false;
    dropped_[kEvicted]->Increment();
    Close(*victim);
    return true;
  }

  void Serve(Conn& c) {
    switch (c.state) {
      case State::kReading:
        Read(c);
        break;
      case State::kWriting:
        Write(c);
        break;
      case State::kDraining: {
        char buf[4096];
        while (true) {
          const ssize_t r = ::recv(c.fd.get(), buf, sizeof(buf), 0);
          if (r > 0) continue;
          if (r < 0 && errno == EINTR) continue;
          if (r < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return;
          Close(c);  // EOF or an error: the peer is done
          return;
        }
      }
    }
  }

  void Read(Conn& c) {
    const size_t limit = static_cast<size_t>(options_.max_request_bytes);
    bool eof = false;
    while (c.in.size() <= limit) {
      char buf[4096];
      const size_t want = std::min(sizeof(buf), limit + 1 - c.in.size());
      const ssize_t r = ::recv(c.fd.get(), buf, want, 0);
      if (r > 0) {
        c.in.append(buf, static_cast<size_t>(r));
        continue;
      }
      if (r < 0 && errno == EINTR) continue;
      if (r < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) break;
      eof = true;  // EOF or an error
      break;
    }
    size_t end = c.in.find("\r\n\r\n");
    if (end == std::string::npos) end = c.in.find("\n\n");
    if (end != std::string::npos && end <= limit) {
      Respond(c, absl::string_view(c.in).substr(0, end));
      return;
    }
    if (c.in.size() > limit) {
      dropped_[kTooLarge]->Increment();
      StartReply(c, ErrorReply(431, "Request Header Fields Too Large"));
      return;
    }
    if (eof) Close(c);  // gone before completing its request
  }

  // `head` is the request line and headers, without the blank line.
  void Respond(Conn& c, absl::string_view head) {
    absl::string_view line = head.substr(0, head.find('\n'));
    line = absl::StripTrailingAsciiWhitespace(line);
    const std::vector<absl::string_view> parts = absl::StrSplit(line, ' ');
    if (parts.size() != 3 || !absl::StartsWith(parts[2], "HTTP/1.") || parts[1].empty() ||
        parts[1][0] != '/') {
      StartReply(c, ErrorReply(400, "Bad Request"));
      return;
    }
    const absl::string_view method = parts[0];
    const absl::string_view path = parts[1].substr(0, parts[1].find('?'));
    if (method != "GET" && method != "HEAD") {
      StartReply(c, ErrorReply(405, "Method Not Allowed", "Allow: GET, HEAD\r\n"));
      return;
    }
    if (path != "/metrics") {
      StartReply(c, ErrorReply(404, "Not Found"));
      return;
    }
    std::string body;
    try {
      std::vector<prometheus::MetricFamily> families;
      if (std::shared_ptr<prometheus::Collectable> registry = registry_.lock()) {
        families = registry->Collect();
      }
      scrapes_->Increment();
      std::vector<prometheus::MetricFamily> own = own_.Collect();
      families.insert(families.end(), std::make_move_iterator(own.begin()),
                      std::make_move_iterator(own.end()));
      body = prometheus::TextSerializer().Serialize(families);
    } catch (const std::exception& e) {
      GS_LOG(ERROR) << "metrics endpoint: collecting the metrics failed: " << e.what();
      StartReply(c, ErrorReply(500, "Internal Server Error"));
      return;
    }
    StartReply(c, Reply(200, "OK", kContentType, body, /*with_body=*/method == "GET"));
  }

  void StartReply(Conn& c, std::string reply) {
    c.in.clear();
    c.in.shrink_to_fit();
    c.out = std::move(reply);
    c.sent = 0;
    c.state = State::kWriting;
    c.deadline = absl::Now() + options_.reply_timeout;
    Write(c);  // usually the whole reply fits the socket buffer at once
  }

  void Write(Conn& c) {
    while (c.sent < c.out.size()) {
      const ssize_t w = ::send(c.fd.get(), c.out.data() + c.sent, c.out.size() - c.sent,
                               MSG_NOSIGNAL | MSG_DONTWAIT);
      if (w > 0) {
        c.sent += static_cast<size_t>(w);
        continue;
      }
      if (w < 0 && errno == EINTR) continue;
      if (w < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return;
      Close(c);  // the peer is gone
      return;
    }
    c.out.clear();
    c.out.shrink_to_fit();
    ::shutdown(c.fd.get(), SHUT_WR);
    c.state = State::kDraining;
    c.deadline = absl::Now() + kLinger;
  }

  void Expire(absl::Time now) {
    for (const std::unique_ptr<Conn>& c : conns_) {
      if (!c->fd.valid() || c->deadline > now) continue;
      if (c->state == State::kReading) {
        dropped_[kTimeout]->Increment();
        if (!c->in.empty()) {  // say why to a client that started a request
          const std::string reply = ErrorReply(408, "Request Timeout");
          (void)::send(c->fd.get(), reply.data(), reply.size(), MSG_NOSIGNAL | MSG_DONTWAIT);
        }
      } else if (c->state == State::kWriting) {
        dropped_[kTimeout]->Increment();
      }
      Close(*c);
    }
  }

  void Close(Conn& c) {
    c.fd.Reset();
    limits_.Release(c.source);
    SetOpen(open_.load(std::memory_order_relaxed) - 1);
  }

  void SetOpen(int n) {
    open_.store(n, std::memory_order_relaxed);
    open_gauge_->Set(n);
  }

  const UniqueFd listener_;
  const UniqueFd wake_;  // an eventfd: readable = stop
  const std::weak_ptr<prometheus::Collectable> registry_;
  const Options options_;
  MetricsRegistry own_;  // the gradsync_metrics_* series
  prometheus::Counter* scrapes_ = nullptr;
  prometheus::Gauge* open_gauge_ = nullptr;
  prometheus::Counter* dropped_[kDropReasons] = {};
  std::atomic<int> open_{0};

  // Only the loop's thread touches these.
  ConnectionLimits limits_;
  std::vector<std::unique_ptr<Conn>> conns_;  // in accept order, oldest first
  absl::Time accept_paused_until_ = absl::InfinitePast();
  absl::Time last_accept_warning_ = absl::InfinitePast();
  std::thread thread_;
};

constexpr const char* MetricsServer::Loop::kDropReasonNames[];

// ---------------------------------------------------------------------------

absl::StatusOr<std::unique_ptr<MetricsServer>> MetricsServer::Start(
    absl::string_view address, const MetricsRegistry& registry) {
  return Start(address, registry, Options());
}

absl::StatusOr<std::unique_ptr<MetricsServer>> MetricsServer::Start(
    absl::string_view address, const MetricsRegistry& registry, const Options& options) {
  HostPort bind;
  std::string host;
  if (absl::Status s = ParseListenAddress(address, &bind, &host); !s.ok()) return s;
  if (options.max_connections < 1 || options.max_connections_per_source < 1 ||
      options.max_request_bytes < 16 || options.request_timeout <= absl::ZeroDuration() ||
      options.reply_timeout <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError(
        absl::StrCat("metrics endpoint on '", address, "': limits must be positive"));
  }
  absl::StatusOr<UniqueFd> listener = TcpListen(bind, kBacklog);
  if (!listener.ok()) {
    return absl::UnavailableError(absl::StrCat("cannot serve metrics on '", address,
                                               "' (address in use or not local?): ",
                                               listener.status().message()));
  }
  if (absl::Status s = SetNonBlocking(listener->get(), true); !s.ok()) return s;
  absl::StatusOr<int> port = LocalPort(listener->get());
  if (!port.ok()) return port.status();
  UniqueFd wake(::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK));
  if (!wake.valid()) {
    return absl::InternalError(absl::StrCat("metrics endpoint: eventfd: ", ErrnoString(errno)));
  }
  std::unique_ptr<MetricsServer> server(new MetricsServer());
  server->port_ = *port;
  server->address_ = absl::StrCat(host, ":", *port);
  server->loop_ = std::make_unique<Loop>(std::move(*listener), std::move(wake),
                                         registry.collectable(), options);
  if (absl::Status s = server->loop_->Init(); !s.ok()) return s;
  server->loop_->StartThread();
  return server;
}

MetricsServer::~MetricsServer() = default;  // ~Loop stops the thread

int MetricsServer::open_connections() const { return loop_ == nullptr ? 0 : loop_->open(); }

}  // namespace gradsync
