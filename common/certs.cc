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

#include <cerrno>
#include <cstdio>
#include <ctime>
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

namespace {

// The CA of MakeLabCerts in `dir` (ca.pem, ca.key).
absl::Status ReadCa(const std::string& dir, Cert* ca, Key* ca_key) {
  FILE* f = std::fopen((dir + "/ca.pem").c_str(), "r");
  if (f == nullptr) return absl::NotFoundError(absl::StrCat("no CA in ", dir, " (ca.pem)"));
  ca->reset(PEM_read_X509(f, nullptr, nullptr, nullptr));
  std::fclose(f);
  f = std::fopen((dir + "/ca.key").c_str(), "r");
  if (f == nullptr) return absl::NotFoundError(absl::StrCat("no CA key in ", dir, " (ca.key)"));
  ca_key->reset(PEM_read_PrivateKey(f, nullptr, nullptr, nullptr));
  std::fclose(f);
  if (*ca == nullptr || *ca_key == nullptr) {
    return OpenSslError(absl::StrCat("reading the CA in ", dir));
  }
  return absl::OkStatus();
}

struct CrlFree {
  void operator()(X509_CRL* c) const { X509_CRL_free(c); }
};
using Crl = std::unique_ptr<X509_CRL, CrlFree>;

// DIR/crl/HASH.rN for the CA: the newest N (-1: none yet) and the prefix.
int NewestCrl(const std::string& crl_dir, const std::string& prefix) {
  int newest = -1;
  for (int n = 0; n < 100000; ++n) {
    if (::access(absl::StrCat(crl_dir, "/", prefix, n).c_str(), F_OK) != 0) break;
    newest = n;
  }
  return newest;
}

// Writes the CA's next CRL: the newest one's entries plus `serial`.
absl::StatusOr<std::string> AddToCrl(const std::string& dir, X509* ca, EVP_PKEY* ca_key,
                                     const ASN1_INTEGER* serial) {
  const std::string crl_dir = dir + "/crl";
  if (::mkdir(crl_dir.c_str(), 0755) != 0 && errno != EEXIST) {
    return absl::InternalError(absl::StrCat("cannot create ", crl_dir));
  }
  char hash[16];
  std::snprintf(hash, sizeof(hash), "%08lx",
                X509_NAME_hash_ex(X509_get_subject_name(ca), nullptr, nullptr, nullptr));
  const std::string prefix = absl::StrCat(hash, ".r");
  const int newest = NewestCrl(crl_dir, prefix);
  Crl previous;
  if (newest >= 0) {
    const std::string path = absl::StrCat(crl_dir, "/", prefix, newest);
    FILE* f = std::fopen(path.c_str(), "r");
    if (f != nullptr) {
      previous.reset(PEM_read_X509_CRL(f, nullptr, nullptr, nullptr));
      std::fclose(f);
    }
    if (previous == nullptr) return OpenSslError(absl::StrCat("reading ", path));
  }
  Crl crl(X509_CRL_new());
  if (crl == nullptr) return OpenSslError("X509_CRL_new");
  X509_CRL_set_version(crl.get(), 1);  // v2
  X509_CRL_set_issuer_name(crl.get(), X509_get_subject_name(ca));
  // Dated an hour back (clock skew between hosts, as for certificates), and
  // strictly newer than the previous one: a verifier holding both uses the
  // newer, and only among CRLs already valid, so never date one ahead.
  time_t now = std::time(nullptr) - 3600;
  if (previous != nullptr) {
    struct tm tm {};
    if (ASN1_TIME_to_tm(X509_CRL_get0_lastUpdate(previous.get()), &tm) != 1) {
      return OpenSslError("reading the newest CRL's date");
    }
    const time_t previous_date = ::timegm(&tm);
    if (previous_date - now > 2) {
      return absl::FailedPreconditionError(absl::StrCat(
          "the newest CRL in ", crl_dir, " is dated ", previous_date - now,
          " s ahead of this host's clock (minus 1 h); fix the clock"));
    }
    while (now <= previous_date) {  // at most 2 s
      ::sleep(1);
      now = std::time(nullptr) - 3600;
    }
  }
  ASN1_TIME* last = ASN1_TIME_set(nullptr, now);
  X509_CRL_set1_lastUpdate(crl.get(), last);
  bool listed = false;
  if (previous != nullptr) {
    STACK_OF(X509_REVOKED)* old = X509_CRL_get_REVOKED(previous.get());
    for (int i = 0; i < sk_X509_REVOKED_num(old); ++i) {
      X509_REVOKED* r = sk_X509_REVOKED_value(old, i);
      listed = listed || ASN1_INTEGER_cmp(X509_REVOKED_get0_serialNumber(r), serial) == 0;
      X509_CRL_add0_revoked(crl.get(), X509_REVOKED_dup(r));
    }
  }
  if (!listed) {
    X509_REVOKED* r = X509_REVOKED_new();
    X509_REVOKED_set_serialNumber(r, const_cast<ASN1_INTEGER*>(serial));
    X509_REVOKED_set_revocationDate(r, last);
    X509_CRL_add0_revoked(crl.get(), r);
  }
  ASN1_TIME_free(last);
  X509_CRL_sort(crl.get());
  ASN1_INTEGER* number = ASN1_INTEGER_new();
  ASN1_INTEGER_set(number, newest + 1);
  X509_CRL_add1_ext_i2d(crl.get(), NID_crl_number, number, 0, 0);
  ASN1_INTEGER_free(number);
  if (X509_CRL_sign(crl.get(), ca_key, EVP_sha256()) == 0) return OpenSslError("X509_CRL_sign");
  const std::string path = absl::StrCat(crl_dir, "/", prefix, newest + 1);
  const std::string tmp = path + ".tmp";
  FILE* f = std::fopen(tmp.c_str(), "w");
  if (f == nullptr) return absl::InternalError(absl::StrCat("cannot write ", tmp));
  const int ok = PEM_write_X509_CRL(f, crl.get());
  if (std::fclose(f) != 0 || ok != 1 || std::rename(tmp.c_str(), path.c_str()) != 0) {
    return absl::InternalError(absl::StrCat("writing ", path));
  }
  return path;
}

}  // namespace

absl::StatusOr<TlsConfig> AddLabCert(const std::string& dir, const std::string& role,
                                     const std::string& name, std::vector<std::string> hosts,
                                     int days) {
  Cert ca;
  Key ca_key;
  if (absl::Status s = ReadCa(dir, &ca, &ca_key); !s.ok()) return s;
  return WriteSigned(dir, name, role, name, ca.get(), ca_key.get(), SanText(std::move(hosts)),
                     days);
}

absl::StatusOr<std::string> RevokeLabCert(const std::string& dir, const std::string& cert_path) {
  Cert ca;
  Key ca_key;
  if (absl::Status s = ReadCa(dir, &ca, &ca_key); !s.ok()) return s;
  FILE* f = std::fopen(cert_path.c_str(), "r");
  if (f == nullptr) return absl::NotFoundError(absl::StrCat("cannot read ", cert_path));
  Cert cert(PEM_read_X509(f, nullptr, nullptr, nullptr));
  std::fclose(f);
  if (cert == nullptr) return OpenSslError(absl::StrCat("reading ", cert_path));
  if (X509_check_issued(ca.get(), cert.get()) != X509_V_OK) {
    return absl::InvalidArgumentError(
        absl::StrCat(cert_path, " was not issued by the CA in ", dir, " (ca.pem)"));
  }
  return AddToCrl(dir, ca.get(), ca_key.get(), X509_get_serialNumber(cert.get()));
}

}  // namespace gradsync
