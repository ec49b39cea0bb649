// Mutual TLS for gradsync's TCP gRPC services (the coordinator, gradsyncd's
// status service) and their clients (gradsyncd, gradsync-ps, the CLI), with
// gRPC's own TLS stack: certificates are read from files and re-read when the
// files change (gRPC's FileWatcherCertificateProvider), and a server
// requires and verifies a client certificate signed by the CA.
//
// A peer's role comes from its certificate's organizational unit (OU):
// "node" (gradsyncd), "ps" (gradsync-ps), "operator" (people and the CLI).
// `gradsync certs` (common/certs.h) makes such certificates for a lab.
#ifndef GRADSYNC_COMMON_TLS_H_
#define GRADSYNC_COMMON_TLS_H_

#include <memory>
#include <string>

#include <grpcpp/security/credentials.h>
#include <grpcpp/security/server_credentials.h>
#include <grpcpp/server_context.h>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "common/digest.h"  // Sha256

namespace gradsync {

struct TlsConfig {
  std::string cert;  // PEM certificate (chain) of this process
  std::string key;   // its PEM private key
  std::string ca;    // PEM CA bundle that peers' certificates must chain to
  // Optional: a directory of hashed CRLs (HASH.rN, `gradsync certs --revoke`
  // writes them); a peer whose certificate one lists fails the handshake.
  // Read at each handshake, so a new CRL file applies to new connections.
  std::string crl_dir;
  // All three empty: plaintext. Set only some: InvalidArgument.
  bool enabled() const { return !cert.empty() || !key.empty() || !ca.empty(); }
  // InvalidArgument naming the missing or unreadable file.
  absl::Status Validate() const;
};

// Credentials for a server: TLS requiring a verified client certificate, or
// insecure for a config that is not enabled. Errors from Validate.
absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> MakeServerCredentials(
    const TlsConfig& config);
// Credentials for a client channel: TLS that presents `config`'s certificate
// and verifies the server's (chain and host name), or insecure.
absl::StatusOr<std::shared_ptr<grpc::ChannelCredentials>> MakeChannelCredentials(
    const TlsConfig& config);

// Who called: the verified certificate's common name and OU. Empty for a
// plaintext call.
struct PeerIdentity {
  std::string name;  // CN
  std::string role;  // OU
  bool authenticated() const { return !name.empty(); }
  std::string ToString() const;  // "operator 'alice'"
};
PeerIdentity IdentityOf(const grpc::ServerContextBase& ctx);
// The OU= value of an X.509 subject as gRPC prints it ("CN=a,OU=node,O=x").
std::string SubjectField(absl::string_view subject, absl::string_view field);

// HMAC-SHA256 of `label` under `key`: a key for one purpose derived from another.
std::string DeriveKey(absl::string_view key, absl::string_view label);
// The key a job's workers and PS shard `shard_id` prove to each other:
// derived from the job key, so a shard never holds the job key itself.
std::string PsShardKey(absl::string_view job_key, absl::string_view shard_id);

// A secret a caller presents (a member key), bound to the caller's verified
// identity: SHA-256 over the certificate's common name and the secret, so
// the same secret from another certificate does not match. Unchanged for an
// unauthenticated caller.
std::string BindToIdentity(const PeerIdentity& id, const std::string& secret);

// OK when `ctx` is a TLS call whose peer has one of `roles` (comma-separated,
// e.g. "node,operator"), or when `tls` is false; PERMISSION_DENIED naming the
// caller, the call and the roles allowed otherwise.
grpc::Status RequireRole(const grpc::ServerContextBase& ctx, bool tls, absl::string_view roles,
                         absl::string_view call);

}  // namespace gradsync

#endif  // GRADSYNC_COMMON_TLS_H_
