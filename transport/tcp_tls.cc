#include "transport/tcp_tls.h"

#include <dirent.h>
#include <openssl/crypto.h>
#include <openssl/err.h>
#include <openssl/x509.h>
#include <openssl/x509_vfy.h>
#include <poll.h>

#include <cstring>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/net.h"

namespace gradsync::transport {
namespace {

constexpr char kExporterLabel[] = "EXPORTER-gradsync-job-binding";
constexpr size_t kBindingBytes = 32;

// Whether `dir` holds a hashed CRL (HASH.rN): only then are CRLs required,
// since OpenSSL's CRL check fails every certificate whose issuer has none.
bool HasCrl(const std::string& dir) {
  DIR* d = ::opendir(dir.c_str());
  if (d == nullptr) return false;
  bool found = false;
  while (dirent* e = ::readdir(d)) {
    if (absl::StrContains(e->d_name, ".r")) found = true;
  }
  ::closedir(d);
  return found;
}

// The binding one side sends: HMAC-SHA256 under the job key of the role and
// the TLS session's exported keying material.
std::string Binding(absl::string_view job_key, bool client, const unsigned char* ekm) {
  return DeriveKey(job_key, absl::StrCat(client ? "data-tls client " : "data-tls server ",
                                         absl::string_view(reinterpret_cast<const char*>(ekm),
                                                           kBindingBytes)));
}

std::string PeerRole(SSL* ssl) {
  X509* cert = SSL_get1_peer_certificate(ssl);
  if (cert == nullptr) return "";
  char ou[256] = {0};
  const int n = X509_NAME_get_text_by_NID(X509_get_subject_name(cert), NID_organizationalUnitName,
                                          ou, sizeof(ou));
  X509_free(cert);
  return n > 0 ? std::string(ou, static_cast<size_t>(n)) : std::string();
}

}  // namespace

std::string SslErrors(absl::string_view fallback) {
  std::string out;
  while (unsigned long e = ERR_get_error()) {
    char buf[256];
    ERR_error_string_n(e, buf, sizeof(buf));
    absl::StrAppend(&out, out.empty() ? "" : "; ", buf);
  }
  return out.empty() ? std::string(fallback) : out;
}

absl::StatusOr<std::shared_ptr<const DataTls>> DataTls::Load(const TlsConfig& config) {
  if (!config.enabled()) {
    return absl::FailedPreconditionError(
        "TLS on the data plane needs this daemon's node certificate (--tls_cert, --tls_key, "
        "--tls_ca); it runs --insecure");
  }
  ERR_clear_error();
  SSL_CTX* ctx = SSL_CTX_new(TLS_method());
  if (ctx == nullptr) return absl::InternalError(SslErrors("SSL_CTX_new failed"));
  std::shared_ptr<DataTls> tls(new DataTls(ctx));
  SSL_CTX_set_min_proto_version(ctx, TLS1_3_VERSION);
  // AES-128-GCM first: the data plane is bound by the cipher's speed (with
  // AES-NI about a third faster than AES-256-GCM), and 128-bit keys suffice.
  SSL_CTX_set_ciphersuites(ctx, "TLS_AES_128_GCM_SHA256:TLS_AES_256_GCM_SHA384:TLS_CHACHA20_POLY1305_SHA256");
  SSL_CTX_set_num_tickets(ctx, 0);  // no resumption: no tickets after the handshake
  // A peer that closes its socket at a frame boundary (it left the job) reads
  // as an orderly close, as on a plain connection; frames carry their lengths.
  SSL_CTX_set_options(ctx, SSL_OP_IGNORE_UNEXPECTED_EOF);
  // Read ahead, in large reads: one recv() takes many records (a record is
  // at most 16 KiB), instead of a header read and a body read per record.
  SSL_CTX_set_read_ahead(ctx, 1);
  SSL_CTX_set_default_read_buffer_len(ctx, 256 << 10);
  SSL_CTX_set_mode(ctx, SSL_MODE_ENABLE_PARTIAL_WRITE | SSL_MODE_ACCEPT_MOVING_WRITE_BUFFER);
  if (SSL_CTX_use_certificate_chain_file(ctx, config.cert.c_str()) != 1) {
    return absl::InvalidArgumentError(absl::StrCat("data TLS: certificate '", config.cert, "': ",
                                                   SslErrors("cannot use it")));
  }
  if (SSL_CTX_use_PrivateKey_file(ctx, config.key.c_str(), SSL_FILETYPE_PEM) != 1 ||
      SSL_CTX_check_private_key(ctx) != 1) {
    return absl::InvalidArgumentError(absl::StrCat("data TLS: key '", config.key, "': ",
                                                   SslErrors("cannot use it")));
  }
  if (SSL_CTX_load_verify_locations(ctx, config.ca.c_str(), nullptr) != 1) {
    return absl::InvalidArgumentError(absl::StrCat("data TLS: CA '", config.ca, "': ",
                                                   SslErrors("cannot use it")));
  }
  if (!config.crl_dir.empty() && HasCrl(config.crl_dir)) {
    X509_STORE* store = SSL_CTX_get_cert_store(ctx);
    X509_LOOKUP* lookup = X509_STORE_add_lookup(store, X509_LOOKUP_hash_dir());
    if (lookup == nullptr ||
        X509_LOOKUP_add_dir(lookup, config.crl_dir.c_str(), X509_FILETYPE_PEM) != 1) {
      return absl::InvalidArgumentError(absl::StrCat("data TLS: CRL directory '", config.crl_dir,
                                                     "': ", SslErrors("cannot use it")));
    }
    X509_STORE_set_flags(store, X509_V_FLAG_CRL_CHECK);
  }
  SSL_CTX_set_verify(ctx, SSL_VERIFY_PEER | SSL_VERIFY_FAIL_IF_NO_PEER_CERT, nullptr);
  return std::shared_ptr<const DataTls>(std::move(tls));
}

DataTls::~DataTls() { SSL_CTX_free(ctx_); }

absl::StatusOr<SslPtr> DataTls::NewSession(int fd, bool client) const {
  SslPtr ssl(SSL_new(ctx_));
  if (ssl == nullptr || SSL_set_fd(ssl.get(), fd) != 1) {
    return absl::InternalError(SslErrors("SSL_new failed"));
  }
  if (client) {
    SSL_set_connect_state(ssl.get());
  } else {
    SSL_set_accept_state(ssl.get());
  }
  return ssl;
}

absl::Status SecureConnections(std::vector<TlsConnection>& connections, absl::Time deadline) {
  enum Step { kHandshake, kSendBinding, kReadBinding, kDone };
  struct State {
    Step step = kHandshake;
    short events = 0;
    std::string mine, expected, got;
  };
  std::vector<State> st(connections.size());
  auto fail = [&](size_t i, const std::string& why) {
    return absl::UnauthenticatedError(
        absl::StrCat("TLS with ", connections[i].peer_name, " failed: ", why));
  };
  // The reason a failed call gives: the certificate check's, else OpenSSL's.
  auto ssl_failure = [&](size_t i, int err) {
    const long verify = SSL_get_verify_result(connections[i].ssl);
    if (verify != X509_V_OK) return std::string(X509_verify_cert_error_string(verify));
    if (err == SSL_ERROR_SYSCALL || err == SSL_ERROR_ZERO_RETURN) {
      return SslErrors("the connection closed (the peer refused our certificate, or it is not "
                       "running data TLS)");
    }
    return SslErrors("protocol error");
  };
  while (true) {
    size_t pending = 0;
    for (size_t i = 0; i < connections.size(); ++i) {
      State& s = st[i];
      SSL* ssl = connections[i].ssl;
      while (s.step != kDone) {
        ERR_clear_error();
        int r = 0;
        if (s.step == kHandshake) {
          r = SSL_do_handshake(ssl);
          if (r == 1) {
            const std::string role = PeerRole(ssl);
            if (role != connections[i].peer_role) {
              return fail(i, absl::StrCat("the peer's certificate is not a ",
                                          connections[i].peer_role == "ps" ? "PS shard" : "node",
                                          "'s (OU=", role.empty() ? "none" : role, ")"));
            }
            unsigned char ekm[kBindingBytes];
            if (SSL_export_keying_material(ssl, ekm, sizeof(ekm), kExporterLabel,
                                           sizeof(kExporterLabel) - 1, nullptr, 0, 0) != 1) {
              return fail(i, SslErrors("cannot export keying material"));
            }
            const bool client = SSL_is_server(ssl) == 0;
            s.mine = Binding(connections[i].key, client, ekm);
            s.expected = Binding(connections[i].key, !client, ekm);
            s.step = kSendBinding;
            continue;
          }
        } else if (s.step == kSendBinding) {
          size_t w = 0;
          r = SSL_write_ex(ssl, s.mine.data(), s.mine.size(), &w);
          if (r == 1) {
            s.mine.erase(0, w);
            if (s.mine.empty()) s.step = kReadBinding;
            continue;
          }
        } else {
          char buf[kBindingBytes];
          size_t got = 0;
          r = SSL_read_ex(ssl, buf, kBindingBytes - s.got.size(), &got);
          if (r == 1) {
            s.got.append(buf, got);
            if (s.got.size() < kBindingBytes) continue;
            if (CRYPTO_memcmp(s.got.data(), s.expected.data(), kBindingBytes) != 0) {
              return fail(i, "it did not bind the TLS session to the job's key");
            }
            s.step = kDone;
            continue;
          }
        }
        const int err = SSL_get_error(ssl, r);
        if (err == SSL_ERROR_WANT_READ) {
          s.events = POLLIN;
        } else if (err == SSL_ERROR_WANT_WRITE) {
          s.events = POLLOUT;
        } else {
          return fail(i, ssl_failure(i, err));
        }
        break;
      }
      if (s.step != kDone) ++pending;
    }
    if (pending == 0) return absl::OkStatus();
    std::vector<pollfd> pfds;
    for (size_t i = 0; i < connections.size(); ++i) {
      if (st[i].step != kDone) pfds.push_back({connections[i].fd, st[i].events, 0});
    }
    if (absl::Now() >= deadline) {
      for (size_t i = 0; i < connections.size(); ++i) {
        if (st[i].step != kDone) return absl::DeadlineExceededError(absl::StrCat(
            "TLS with ", connections[i].peer_name, " did not complete by the deadline"));
      }
    }
    const int n = ::poll(pfds.data(), pfds.size(), PollTimeoutMs(deadline, 1000));
    if (n < 0 && errno != EINTR) return absl::InternalError("poll: " + ErrnoString(errno));
  }
}

}  // namespace gradsync::transport
