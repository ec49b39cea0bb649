// TLS 1.3 on the data plane's TCP connections (gradsyncd --data_tls, the job
// option data_tls): OpenSSL over the non-blocking sockets TcpContext already
// handshook (Hello, nonces, job-key proofs). Each connection runs a TLS
// handshake with the daemons' node certificates (the dialing side is the TLS
// client; both present and verify certificates against the cluster's CA and
// CRLs, and the peer's must be a node's: OU=node), then both ends bind the TLS
// session to the job: each sends HMAC-SHA256(job key, the session's exported
// keying material) inside TLS and checks the other's, so the TLS peer is the
// one that proved the job key. After that every frame is encrypted and
// integrity-protected. A PS worker's connections to the shards run the same,
// bound to each shard's key of the job, the shard presenting its OU=ps
// certificate. This kernel has no kTLS, so records are made in user
// space (SSL_write/SSL_read in TcpContext's send and receive paths).
#ifndef GRADSYNC_TRANSPORT_TCP_TLS_H_
#define GRADSYNC_TRANSPORT_TCP_TLS_H_

#include <openssl/ssl.h>

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "common/tls.h"

namespace gradsync::transport {

struct SslFree {
  void operator()(SSL* ssl) const { SSL_free(ssl); }
};
using SslPtr = std::unique_ptr<SSL, SslFree>;

// The node's certificate, key, CA and CRLs as an OpenSSL context, loaded when
// made (a context per job epoch: rotated files apply to the next epoch).
class DataTls {
 public:
  // InvalidArgument naming the file that cannot be used.
  static absl::StatusOr<std::shared_ptr<const DataTls>> Load(const TlsConfig& config);
  ~DataTls();
  DataTls(const DataTls&) = delete;
  DataTls& operator=(const DataTls&) = delete;

  // A TLS session over connected socket `fd`, not yet handshaken.
  absl::StatusOr<SslPtr> NewSession(int fd, bool client) const;

 private:
  explicit DataTls(SSL_CTX* ctx) : ctx_(ctx) {}
  SSL_CTX* const ctx_;
};

// One connection to make secure.
struct TlsConnection {
  SSL* ssl = nullptr;
  int fd = -1;            // non-blocking
  std::string peer_name;  // for errors: "rank 2 (stream 1)"
  // The key both ends bind the session to: the job key between daemons, the
  // shard's key of the job between a PS worker and a shard.
  std::string key;
  // The OU the peer's certificate must have: "node" (a daemon), "ps" (a shard).
  std::string peer_role = "node";
};

// Runs every connection's handshake and key binding at once (one poll loop,
// so no order of peers can deadlock) until all are done or `deadline`.
// Errors name the connection and OpenSSL's reason (e.g. "certificate
// verify failed", "the peer's certificate is not a node's (OU=operator)",
// "it did not bind the TLS session to the job's key").
absl::Status SecureConnections(std::vector<TlsConnection>& connections, absl::Time deadline);

// OpenSSL's queued errors as text (and clears them); `fallback` if none.
std::string SslErrors(absl::string_view fallback);

}  // namespace gradsync::transport

#endif  // GRADSYNC_TRANSPORT_TCP_TLS_H_
