#include "common/certs.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <openssl/bn.h>
#include <openssl/err.h>
#include <openssl/evp.h>
#include <openssl/pem.h>
#include <openssl/rand.h>
#include <openssl/x509.h>
#include <openssl/x509v3.h>

#include <cstdio>
#include <memory>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace gradsync {
namespace {

struct KeyFree {
  void operator()(EVP_PKEY* k) const { EVP_PKEY_free(k); }
};
struct X509Free {
  void operator()(X509* x) const { X509_free(x); }
};
using Key = std::unique_ptr<EVP_PKEY, KeyFree>;
using Cert = std::unique_ptr<X509, X509Free>;

absl::Status OpenSslError(const std::string& what) {
  char buf[256] = "unknown error";
  if (unsigned long e = ERR_get_error(); e != 0) ERR_error_string_n(e, buf, sizeof(buf));
  return absl::InternalError(absl::StrCat(what, ": ", buf));
}

bool IsIpAddress(const std::string& host) {
  if (host.find(':') != std::string::npos) return true;  // IPv6
  for (char c : host) {
    if (!absl::ascii_isdigit(static_cast<unsigned char>(c)) && c != '.') return false;
  }
  return !host.empty();
}

absl::Status AddExtension(X509* cert, X509* issuer, int nid, const std::string& value) {
  X509V3_CTX ctx;
  X509V3_set_ctx_nodb(&ctx);
  X509V3_set_ctx(&ctx, issuer, cert, nullptr, nullptr, 0);
  X509_EXTENSION* ext = X509V3_EXT_conf_nid(nullptr, &ctx, nid, value.c_str());
  if (ext == nullptr) return OpenSslError(absl::StrCat("extension ", OBJ_nid2sn(nid), "=", value));
  const int ok = X509_add_ext(cert, ext, -1);
  X509_EXTENSION_free(ext);
  return ok == 1 ? absl::OkStatus() : OpenSslError("X509_add_ext");
}

// A certificate for `key` with subject O=gradsync,OU=role,CN=name, signed by
// (issuer, issuer_key), or self-signed when issuer is null.
absl::StatusOr<Cert> MakeCert(EVP_PKEY* key, const std::string& role, const std::string& name,
                              X509* issuer, EVP_PKEY* issuer_key, const std::string& san,
                              int days) {
  Cert cert(X509_new());
  if (cert == nullptr) return OpenSslError("X509_new");
  X509_set_version(cert.get(), 2);
  unsigned char serial[16];
  if (RAND_bytes(serial, sizeof(serial)) != 1) return OpenSslError("RAND_bytes");
  serial[0] &= 0x7f;  // positive
  BIGNUM* bn = BN_bin2bn(serial, sizeof(serial), nullptr);
  BN_to_ASN1_INTEGER(bn, X509_get_serialNumber(cert.get()));
  BN_free(bn);
  X509_gmtime_adj(X509_getm_notBefore(cert.get()), -3600);  // tolerate clock skew
  X509_gmtime_adj(X509_getm_notAfter(cert.get()), static_cast<long>(days) * 86400);
  X509_set_pubkey(cert.get(), key);
  X509_NAME* subject = X509_get_subject_name(cert.get());
  const std::pair<const char*, const std::string*> fields[] = {
      {"O", nullptr}, {"OU", &role}, {"CN", &name}};
  for (const auto& [field, value] : fields) {
    const std::string v = value == nullptr ? "gradsync" : *value;
    X509_NAME_add_entry_by_txt(subject, field, MBSTRING_ASC,
                               reinterpret_cast<const unsigned char*>(v.c_str()), -1, -1, 0);
  }
  X509* signer = issuer == nullptr ? cert.get() : issuer;
  X509_set_issuer_name(cert.get(), X509_get_subject_name(signer));
  absl::Status s = AddExtension(cert.get(), signer, NID_subject_key_identifier, "hash");
  if (issuer == nullptr) {
    if (s.ok()) s = AddExtension(cert.get(), signer, NID_basic_constraints, "critical,CA:TRUE");
    if (s.ok()) s = AddExtension(cert.get(), signer, NID_key_usage, "critical,keyCertSign,cRLSign");
  } else {
    if (s.ok()) s = AddExtension(cert.get(), signer, NID_basic_constraints, "critical,CA:FALSE");
    if (s.ok()) {
      s = AddExtension(cert.get(), signer, NID_key_usage, "critical,digitalSignature");
    }
    if (s.ok()) s = AddExtension(cert.get(), signer, NID_ext_key_usage, "serverAuth,clientAuth");
    if (s.ok()) s = AddExtension(cert.get(), signer, NID_authority_key_identifier, "keyid");
    if (s.ok()) s = AddExtension(cert.get(), signer, NID_subject_alt_name, san);
  }
  if (!s.ok()) return s;
  if (X509_sign(cert.get(), issuer_key == nullptr ? key : issuer_key, EVP_sha256()) == 0) {
    return OpenSslError("X509_sign");
  }
  return cert;
}

absl::Status WritePem(const std::string& path, mode_t mode, EVP_PKEY* key, X509* cert) {
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, mode);
  if (fd < 0) return absl::InternalError(absl::StrCat("cannot write ", path));
  FILE* f = ::fdopen(fd, "w");
  if (f == nullptr) {
    ::close(fd);
    return absl::InternalError(absl::StrCat("cannot write ", path));
  }
  const int ok = key != nullptr
                     ? PEM_write_PrivateKey(f, key, nullptr, nullptr, 0, nullptr, nullptr)
                     : PEM_write_X509(f, cert);
  if (std::fclose(f) != 0 || ok != 1) return absl::InternalError(absl::StrCat("writing ", path));
  return absl::OkStatus();
}

}  // namespace

namespace {

std::string SanText(std::vector<std::string> hosts) {
  hosts.insert(hosts.begin(), {"localhost", "127.0.0.1"});
  std::vector<std::string> san;
  for (const std::string& h : hosts) {
    san.push_back(absl::StrCat(IsIpAddress(h) ? "IP:" : "DNS:", h));
  }
  return absl::StrJoin(san, ",");
}

// Writes DIR/FILE.{pem,key}: a new key and a certificate for it signed by the CA.
absl::StatusOr<TlsConfig> WriteSigned(const std::string& dir, const std::string& file,
                                      const std::string& role, const std::string& name,
                                      X509* ca, EVP_PKEY* ca_key, const std::string& san,
                                      int days) {
  Key key(EVP_EC_gen("P-256"));
  if (key == nullptr) return OpenSslError("EC key");
  absl::StatusOr<Cert> cert = MakeCert(key.get(), role, name, ca, ca_key, san, days);
  if (!cert.ok()) return cert.status();
  TlsConfig config;
  config.cert = absl::StrCat(dir, "/", file, ".pem");
  config.key = absl::StrCat(dir, "/", file, ".key");
  config.ca = dir + "/ca.pem";
  absl::Status s = WritePem(config.cert, 0644, nullptr, cert->get());
  if (s.ok()) s = WritePem(config.key, 0600, key.get(), nullptr);
  if (!s.ok()) return s;
  return config;
}

}  // namespace

absl::StatusOr<LabCerts> MakeLabCerts(const std::string& dir, std::vector<std::string> hosts,
                                      int days) {
  if (::mkdir(dir.c_str(), 0700) != 0 && errno != EEXIST) {
    return absl::InternalError(absl::StrCat("cannot create ", dir));
  }
  const std::string san = SanText(std::move(hosts));
  Key ca_key(EVP_EC_gen("P-256"));
  if (ca_key == nullptr) return OpenSslError("EC key");
  absl::StatusOr<Cert> ca = MakeCert(ca_key.get(), "ca", "gradsync lab CA", nullptr, nullptr, "",
                                     days);
  if (!ca.ok()) return ca.status();
  LabCerts out;
  out.dir = dir;
  out.ca = dir + "/ca.pem";
  absl::Status s = WritePem(out.ca, 0644, nullptr, ca->get());
  if (s.ok()) s = WritePem(dir + "/ca.key", 0600, ca_key.get(), nullptr);
  if (!s.ok()) return s;
  const std::pair<const char*, TlsConfig*> roles[] = {
      {"coordinator", &out.coordinator},
      {"node", &out.node},
      {"ps", &out.ps},
      {"operator", &out.operator_}};
  for (const auto& [role, config] : roles) {
    absl::StatusOr<TlsConfig> made = WriteSigned(dir, role, role, absl::StrCat("lab-", role),
                                                 ca->get(), ca_key.get(), san, days);
    if (!made.ok()) return made.status();
    *config = *std::move(made);
  }
  return out;
}

absl::StatusOr<TlsConfig> AddLabCert(const std::string& dir, const std::string& role,
                                     const std::string& name, std::vector<std::string> hosts,
                                     int days) {
  FILE* f = std::fopen((dir + "/ca.pem").c_str(), "r");
  if (f == nullptr) return absl::NotFoundError(absl::StrCat("no CA in ", dir, " (ca.pem)"));
  Cert ca(PEM_read_X509(f, nullptr, nullptr, nullptr));
  std::fclose(f);
  f = std::fopen((dir + "/ca.key").c_str(), "r");
  if (f == nullptr) return absl::NotFoundError(absl::StrCat("no CA key in ", dir, " (ca.key)"));
  Key ca_key(PEM_read_PrivateKey(f, nullptr, nullptr, nullptr));
  std::fclose(f);
  if (ca == nullptr || ca_key == nullptr) {
    return OpenSslError(absl::StrCat("reading the CA in ", dir));
  }
  return WriteSigned(dir, name, role, name, ca.get(), ca_key.get(), SanText(std::move(hosts)),
                     days);
}

}  // namespace gradsync
