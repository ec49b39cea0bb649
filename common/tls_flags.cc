#include "common/tls_flags.h"

#include <string>

#include "absl/flags/flag.h"

ABSL_FLAG(std::string, tls_cert, "",
          "PEM certificate of this process for mutual TLS on its TCP gRPC services and calls "
          "(with --tls_key and --tls_ca; re-read when the file changes). Empty: plaintext");
ABSL_FLAG(std::string, tls_key, "", "PEM private key of --tls_cert");
ABSL_FLAG(std::string, tls_ca, "",
          "PEM CA bundle that peers' certificates must be signed by; peers must present one");

namespace gradsync {

TlsConfig TlsConfigFromFlags() {
  TlsConfig c;
  c.cert = absl::GetFlag(FLAGS_tls_cert);
  c.key = absl::GetFlag(FLAGS_tls_key);
  c.ca = absl::GetFlag(FLAGS_tls_ca);
  return c;
}

}  // namespace gradsync
