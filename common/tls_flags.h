// --tls_cert, --tls_key and --tls_ca, shared by every binary that serves or
// calls gRPC over TCP (common/tls.h).
#ifndef GRADSYNC_COMMON_TLS_FLAGS_H_
#define GRADSYNC_COMMON_TLS_FLAGS_H_

#include "common/tls.h"

namespace gradsync {

// The files the flags name (all empty: plaintext).
TlsConfig TlsConfigFromFlags();

}  // namespace gradsync

#endif  // GRADSYNC_COMMON_TLS_FLAGS_H_
