// SHA-256 and HMAC-SHA256 from OpenSSL's libcrypto, for the secrets gradsync
// derives and proves (tenant tokens, member keys, job and shard keys).
#ifndef GRADSYNC_COMMON_DIGEST_H_
#define GRADSYNC_COMMON_DIGEST_H_

#include <string>

#include "absl/strings/string_view.h"

namespace gradsync {

// The 32-byte SHA-256 digest of `data`.
std::string Sha256(absl::string_view data);
// The 32-byte HMAC-SHA256 of `data` under `key` (an empty key is allowed: it
// proves nothing a peer could not compute).
std::string HmacSha256(absl::string_view key, absl::string_view data);

}  // namespace gradsync

#endif  // GRADSYNC_COMMON_DIGEST_H_
