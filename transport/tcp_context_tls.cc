// TcpContext over TLS (TcpContextOptions::tls): the connections' TLS
// handshakes after the job-key handshake (Connect, ConnectToServers, Adopt), and the reads and writes of
// the send, receive and abort paths through OpenSSL.
#include <openssl/err.h>
#include <poll.h>

#include "absl/strings/str_cat.h"
#include "common/clock.h"
#include "common/status_macros.h"
#include "transport/tcp_context.h"

namespace gradsync::transport {

absl::Status TcpContext::SecurePeers(const TcpContextOptions& options) {
  // Between daemons the lower rank dialed: it is the TLS client. A PS
  // worker (rank -1 of a client context) is the client of every shard, which
  // must present a shard's certificate; a shard (server_) is the server.
  const bool to_servers = rank_ < 0 && !server_;
  std::vector<TlsConnection> connections;
  for (size_t c = 0; c < peers_.size(); ++c) {
    Peer& p = peers_[c];
    if (p.rank == rank_ || !p.fd.valid()) continue;
    const bool client = to_servers || (!server_ && rank_ < p.rank);
    absl::StatusOr<SslPtr> ssl = options.tls->NewSession(p.fd.get(), client);
    if (!ssl.ok()) return ssl.status();
    p.ssl = std::move(*ssl);
    TlsConnection tc{p.ssl.get(), p.fd.get(), PeerName(p.rank), options.job_key};
    if (to_servers) {
      tc.key = c < options.server_keys.size() ? options.server_keys[c] : "";
      tc.peer_role = "ps";
    } else if (!server_) {
      absl::StrAppend(&tc.peer_name, " (stream ", c % streams_, ")");
    }
    connections.push_back(std::move(tc));
  }
  absl::Status s = SecureConnections(connections, options.deadline);
  if (!s.ok()) {
    return absl::Status(s.code(), absl::StrCat("job '", options.job_id, "' epoch ", options.epoch,
                                               ": ", self_name_, ": ", s.message()));
  }
  return absl::OkStatus();
}

namespace {

// What a failed SSL_read means for the connection: "" for the peer's close.
std::string TlsReadFailure(int err) {
  if (err == SSL_ERROR_ZERO_RETURN) return "";
  return absl::StrCat("TLS: ", SslErrors(err == SSL_ERROR_SYSCALL ? ErrnoString(errno)
                                                                  : "protocol error"));
}

// After a failed blocking-style TLS call: waits for the socket the call wants
// (or the deadline); an error for anything but WANT_READ/WANT_WRITE.
absl::Status AwaitTls(SSL* ssl, int fd, int r, const char* what, absl::Time deadline) {
  const int err = SSL_get_error(ssl, r);
  if (err != SSL_ERROR_WANT_READ && err != SSL_ERROR_WANT_WRITE) {
    return absl::UnavailableError(SslErrors(absl::StrCat("TLS ", what, " failed")));
  }
  if (FastNow() >= deadline) return absl::DeadlineExceededError(absl::StrCat("TLS ", what, " timed out"));
  pollfd pfd{fd, static_cast<short>(err == SSL_ERROR_WANT_READ ? POLLIN : POLLOUT), 0};
  (void)::poll(&pfd, 1, PollTimeoutMs(deadline, 100));
  return absl::OkStatus();
}

}  // namespace

ssize_t TcpContext::TlsReadSome(Peer& p, char* dst, size_t n, const char* where, bool eof_ok) {
  // A record is at most 16 KiB: take records until `n` bytes or the socket
  // has no more, as one recv() of a plain connection would. A failure after
  // some data is kept for the next call (OpenSSL does not repeat it).
  size_t total = 0;
  int r = 1, err = SSL_ERROR_NONE;
  std::string failure;
  if (!p.tls_error.empty() || p.tls_eof) {
    failure = p.tls_error;
    err = p.tls_eof ? SSL_ERROR_ZERO_RETURN : SSL_ERROR_SSL;
  }
  while (err == SSL_ERROR_NONE && total < n) {
    ERR_clear_error();
    size_t got = 0;
    r = SSL_read_ex(p.ssl.get(), dst + total, n - total, &got);
    if (r != 1) {
      err = SSL_get_error(p.ssl.get(), r);
      break;
    }
    total += got;
  }
  if (total > 0) {
    p.maybe_more = total == n || SSL_has_pending(p.ssl.get()) == 1;
    p.received += total;
    bytes_received_ += total;
    if (err != SSL_ERROR_NONE && err != SSL_ERROR_WANT_READ && err != SSL_ERROR_WANT_WRITE) {
      p.tls_error = TlsReadFailure(err);
      p.tls_eof = p.tls_error.empty();
      p.maybe_more = true;  // the next read reports it without waiting for poll
    }
    return static_cast<ssize_t>(total);
  }
  if (err == SSL_ERROR_WANT_READ || err == SSL_ERROR_WANT_WRITE) {
    p.maybe_more = false;
    return kWouldBlock;
  }
  if (err == SSL_ERROR_ZERO_RETURN && eof_ok) return kClosed;
  if (failure.empty() && err != SSL_ERROR_ZERO_RETURN) failure = TlsReadFailure(err);
  const std::string cause = err == SSL_ERROR_ZERO_RETURN ? std::string("closed by peer") : failure;
  FailBy(PeerFault{PeerFault::kLost, p.rank, false, cause},
         absl::UnavailableError(absl::StrCat(self_name_, ": connection to ", PeerName(p.rank),
                                             " lost", where, ": ", cause)));
  return kLost;
}

ssize_t TcpContext::TlsWriteSome(Peer& p, const char* src, size_t n) {
  ERR_clear_error();
  size_t w = 0;
  const int r = SSL_write_ex(p.ssl.get(), src, n, &w);
  if (r == 1) return static_cast<ssize_t>(w);
  const int err = SSL_get_error(p.ssl.get(), r);
  if (err == SSL_ERROR_WANT_WRITE || err == SSL_ERROR_WANT_READ) return 0;
  const std::string cause = absl::StrCat(
      "TLS: ", SslErrors(err == SSL_ERROR_SYSCALL ? ErrnoString(errno) : "protocol error"));
  FailBy(PeerFault{PeerFault::kLost, p.rank, true, cause},
         absl::UnavailableError(absl::StrCat(self_name_, ": connection to ", PeerName(p.rank),
                                             " lost while sending: ", cause)));
  return -1;
}

absl::Status TcpContext::PeerReadFull(Peer& p, char* dst, size_t n, absl::Time deadline) {
  if (p.ssl == nullptr) return ReadFull(p.fd.get(), dst, n, deadline);
  while (n > 0) {
    ERR_clear_error();
    size_t got = 0;
    const int r = SSL_read_ex(p.ssl.get(), dst, n, &got);
    if (r == 1) {
      dst += got;
      n -= got;
      continue;
    }
    RETURN_IF_ERROR(AwaitTls(p.ssl.get(), p.fd.get(), r, "read", deadline));
  }
  return absl::OkStatus();
}

absl::Status TcpContext::PeerWriteFull(Peer& p, const void* src, size_t n, absl::Time deadline) {
  if (p.ssl == nullptr) return WriteFull(p.fd.get(), src, n, deadline);
  const char* at = static_cast<const char*>(src);
  while (n > 0) {
    ERR_clear_error();
    size_t w = 0;
    const int r = SSL_write_ex(p.ssl.get(), at, n, &w);
    if (r == 1) {
      at += w;
      n -= w;
      continue;
    }
    RETURN_IF_ERROR(AwaitTls(p.ssl.get(), p.fd.get(), r, "write", deadline));
  }
  return absl::OkStatus();
}

}  // namespace gradsync::transport
