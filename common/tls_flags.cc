#include "common/tls_flags.h"

#include <string>

#include "absl/flags/flag.h"
#include "absl/strings/str_cat.h"
#include "common/logging.h"

ABSL_FLAG(std::string, tls_cert, "",
          "PEM certificate of this process for mutual TLS on its TCP gRPC services and calls "
          "(with --tls_key and --tls_ca; re-read when the file changes). Without them the "
          "servers start only with --insecure");
ABSL_FLAG(std::string, tls_key, "", "PEM private key of --tls_cert");
ABSL_FLAG(std::string, tls_ca, "",
          "PEM CA bundle that peers' certificates must be signed by; peers must present one");
ABSL_FLAG(std::string, tls_crl_dir, "",
          "directory of hashed CRLs (HASH.rN; `gradsync certs --revoke` writes them): peers "
          "whose certificate is listed are refused; read at every handshake");
ABSL_FLAG(bool, insecure, false,
          "run the gRPC control plane plaintext and unauthenticated (without --tls_*): anyone "
          "who reaches the ports can act for any job; logged, and 1 in the *_insecure metric");

namespace gradsync {

TlsConfig TlsConfigFromFlags() {
  TlsConfig c;
  c.cert = absl::GetFlag(FLAGS_tls_cert);
  c.key = absl::GetFlag(FLAGS_tls_key);
  c.ca = absl::GetFlag(FLAGS_tls_ca);
  c.crl_dir = absl::GetFlag(FLAGS_tls_crl_dir);
  return c;
}

absl::StatusOr<TlsConfig> ServerTlsConfigFromFlags(absl::string_view binary) {
  TlsConfig c = TlsConfigFromFlags();
  const bool insecure = absl::GetFlag(FLAGS_insecure);
  if (!c.enabled() && !c.crl_dir.empty()) {
    return absl::InvalidArgumentError("--tls_crl_dir needs --tls_cert, --tls_key and --tls_ca");
  }
  if (c.enabled() && insecure) {
    return absl::InvalidArgumentError("--insecure and --tls_* exclude each other");
  }
  if (c.enabled()) {
    if (absl::Status s = c.Validate(); !s.ok()) return s;
    return c;
  }
  if (!insecure) {
    return absl::InvalidArgumentError(absl::StrCat(
        binary, " needs --tls_cert, --tls_key and --tls_ca (mutual TLS; `gradsync certs` makes "
        "lab ones), or --insecure to run its control plane plaintext and unauthenticated"));
  }
  GS_LOG(WARNING) << "--insecure: the gRPC control plane is plaintext and unauthenticated; anyone "
                     "who reaches the ports can create, read, join and leave jobs";
  return c;
}

}  // namespace gradsync
