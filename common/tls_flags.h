// --tls_cert, --tls_key and --tls_ca, shared by every binary that serves or
// calls gRPC over TCP (common/tls.h).
#ifndef GRADSYNC_COMMON_TLS_FLAGS_H_
#define GRADSYNC_COMMON_TLS_FLAGS_H_

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "common/tls.h"

namespace gradsync {

// The files the flags name (all empty: plaintext).
TlsConfig TlsConfigFromFlags();

// For a server binary: the TLS files, or an empty config when --insecure is
// given (after logging a warning). Secure by default: neither is
// InvalidArgument naming both ways out, and both at once too.
absl::StatusOr<TlsConfig> ServerTlsConfigFromFlags(absl::string_view binary);

}  // namespace gradsync

#endif  // GRADSYNC_COMMON_TLS_FLAGS_H_
