#include "common/digest.h"

#include <openssl/evp.h>
#include <openssl/hmac.h>

namespace gradsync {

std::string Sha256(absl::string_view data) {
  unsigned char digest[EVP_MAX_MD_SIZE];
  unsigned int length = 0;
  if (EVP_Digest(data.data(), data.size(), digest, &length, EVP_sha256(), nullptr) != 1) {
    return "";  // cannot happen for SHA-256 in a working libcrypto
  }
  return std::string(reinterpret_cast<const char*>(digest), length);
}

std::string HmacSha256(absl::string_view key, absl::string_view data) {
  unsigned char out[EVP_MAX_MD_SIZE];
  unsigned int len = 0;
  static const unsigned char kEmpty = 0;
  const void* key_bytes = key.empty() ? static_cast<const void*>(&kEmpty) : key.data();
  HMAC(EVP_sha256(), key_bytes, static_cast<int>(key.size()),
       reinterpret_cast<const unsigned char*>(data.data()), data.size(), out, &len);
  return std::string(reinterpret_cast<const char*>(out), len);
}

}  // namespace gradsync
