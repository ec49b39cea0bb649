// Certificates for a lab or a test cluster (`gradsync certs`, LocalCluster
// with TLS): a CA, and certificates it signs for each role (OU "node", "ps",
// "operator"; common_tls.h reads the role back). ECDSA P-256 keys, SHA-256,
// made with OpenSSL's libcrypto. Production clusters use their own PKI; what
// matters to gradsync is the CA bundle, the OU and the host names.
#ifndef GRADSYNC_COMMON_CERTS_H_
#define GRADSYNC_COMMON_CERTS_H_

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/tls.h"

namespace gradsync {

struct LabCerts {
  std::string dir;
  std::string ca;  // DIR/ca.pem (its key: DIR/ca.key)
  TlsConfig coordinator;  // DIR/coordinator.{pem,key}: gradsync-coordinator
  TlsConfig node;      // DIR/node.{pem,key}: gradsyncd
  TlsConfig ps;        // DIR/ps.{pem,key}: gradsync-ps
  TlsConfig operator_;  // DIR/operator.{pem,key}: the CLI, people
};

// Writes a new CA and one certificate per role into `dir` (created if
// missing; keys mode 0600), valid for `days`. Every certificate names
// `hosts` (DNS names or IP addresses; "localhost" and 127.0.0.1 are always
// added) so servers can be reached by those names, and may act as TLS
// server and client.
absl::StatusOr<LabCerts> MakeLabCerts(const std::string& dir, std::vector<std::string> hosts,
                                      int days = 365);

// One more certificate from the CA in `dir` (ca.pem, ca.key of MakeLabCerts):
// DIR/NAME.{pem,key} with OU `role` and CN `name` (e.g. a second node).
absl::StatusOr<TlsConfig> AddLabCert(const std::string& dir, const std::string& role,
                                     const std::string& name, std::vector<std::string> hosts,
                                     int days = 365);

// Revokes `cert_path` (a certificate the CA in `dir` issued): writes the
// CA's CRL, every certificate revoked so far plus this one, signed by the CA,
// as a new file DIR/crl/HASH.rN (the hashed layout `--tls_crl_dir` reads;
// HASH is the CA's subject hash, N one more than the last). Returns its path.
// The CRL has no nextUpdate, so it never expires.
absl::StatusOr<std::string> RevokeLabCert(const std::string& dir, const std::string& cert_path);

}  // namespace gradsync

#endif  // GRADSYNC_COMMON_CERTS_H_
