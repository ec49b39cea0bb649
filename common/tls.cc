#include "common/tls.h"

#include <sys/stat.h>
#include <unistd.h>

#include <grpc/grpc_security_constants.h>
#include <grpcpp/security/auth_context.h>
#include <grpcpp/security/tls_certificate_provider.h>
#include <grpcpp/security/tls_credentials_options.h>

#include "absl/strings/str_cat.h"
#include "common/digest.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"

namespace gradsync {
namespace {

// How often gRPC re-reads the certificate files (a rotated certificate is in
// use within this many seconds).
constexpr unsigned int kRefreshSeconds = 10;

std::shared_ptr<grpc::experimental::CertificateProviderInterface> Provider(const TlsConfig& c) {
  return std::make_shared<grpc::experimental::FileWatcherCertificateProvider>(c.key, c.cert, c.ca,
                                                                              kRefreshSeconds);
}

std::string Property(const grpc::AuthContext& auth, const char* name) {
  for (const grpc::string_ref& v : auth.FindPropertyValues(name)) {
    return std::string(v.data(), v.size());
  }
  return "";
}

}  // namespace

absl::Status TlsConfig::Validate() const {
  const std::pair<const char*, const std::string*> files[] = {
      {"--tls_cert", &cert}, {"--tls_key", &key}, {"--tls_ca", &ca}};
  for (const auto& [flag, path] : files) {
    if (path->empty()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "TLS needs --tls_cert, --tls_key and --tls_ca together; ", flag, " is missing"));
    }
  }
  for (const auto& [flag, path] : files) {
    if (::access(path->c_str(), R_OK) != 0) {
      return absl::InvalidArgumentError(
          absl::StrCat(flag, " '", *path, "' cannot be read"));
    }
  }
  if (!crl_dir.empty()) {
    struct stat st {};
    if (::stat(crl_dir.c_str(), &st) != 0 || !S_ISDIR(st.st_mode) ||
        ::access(crl_dir.c_str(), R_OK | X_OK) != 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("--tls_crl_dir '", crl_dir, "' is not a readable directory"));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> MakeServerCredentials(
    const TlsConfig& config) {
  if (!config.enabled()) return grpc::InsecureServerCredentials();
  if (absl::Status s = config.Validate(); !s.ok()) return s;
  grpc::experimental::TlsServerCredentialsOptions options(Provider(config));
  options.watch_root_certs();
  options.watch_identity_key_cert_pairs();
  options.set_cert_request_type(GRPC_SSL_REQUEST_AND_REQUIRE_CLIENT_CERTIFICATE_AND_VERIFY);
  if (!config.crl_dir.empty()) options.set_crl_directory(config.crl_dir);
  return grpc::experimental::TlsServerCredentials(options);
}

absl::StatusOr<std::shared_ptr<grpc::ChannelCredentials>> MakeChannelCredentials(
    const TlsConfig& config) {
  if (!config.enabled()) return grpc::InsecureChannelCredentials();
  if (absl::Status s = config.Validate(); !s.ok()) return s;
  grpc::experimental::TlsChannelCredentialsOptions options;
  options.set_certificate_provider(Provider(config));
  options.watch_root_certs();
  options.watch_identity_key_cert_pairs();
  options.set_verify_server_certs(true);
  if (!config.crl_dir.empty()) options.set_crl_directory(config.crl_dir);
  return grpc::experimental::TlsCredentials(options);
}

std::string PeerIdentity::ToString() const {
  if (!authenticated()) return "an unauthenticated peer";
  return absl::StrCat(role.empty() ? "peer" : role, " '", name, "'");
}

std::string SubjectField(absl::string_view subject, absl::string_view field) {
  for (absl::string_view part : absl::StrSplit(subject, ',')) {
    part = absl::StripAsciiWhitespace(part);
    if (absl::ConsumePrefix(&part, field) && absl::ConsumePrefix(&part, "=")) {
      return std::string(part);
    }
  }
  return "";
}

PeerIdentity IdentityOf(const grpc::ServerContextBase& ctx) {
  PeerIdentity id;
  std::shared_ptr<const grpc::AuthContext> auth = ctx.auth_context();
  if (auth == nullptr || !auth->IsPeerAuthenticated()) return id;
  id.name = Property(*auth, GRPC_X509_CN_PROPERTY_NAME);
  id.role = SubjectField(Property(*auth, GRPC_X509_SUBJECT_PROPERTY_NAME), "OU");
  return id;
}

std::string DeriveKey(absl::string_view key, absl::string_view label) {
  return HmacSha256(key, label);
}

std::string PsShardKey(absl::string_view job_key, absl::string_view shard_id) {
  return DeriveKey(job_key, absl::StrCat("gradsync ps shard ", shard_id));
}

std::string BindToIdentity(const PeerIdentity& id, const std::string& secret) {
  if (!id.authenticated()) return secret;
  std::string input = id.name;
  input.push_back('\0');
  input += secret;
  std::string digest = Sha256(input);
  return digest.empty() ? secret : digest;  // the secret alone still has to match
}

grpc::Status RequireRole(const grpc::ServerContextBase& ctx, bool tls, absl::string_view roles,
                         absl::string_view call) {
  if (!tls) return grpc::Status::OK;
  const PeerIdentity id = IdentityOf(ctx);
  if (id.authenticated()) {
    for (absl::string_view r : absl::StrSplit(roles, ',')) {
      if (r == id.role) return grpc::Status::OK;
    }
  }
  return grpc::Status(grpc::StatusCode::PERMISSION_DENIED,
                      absl::StrCat(call, " is not allowed for ", id.ToString(),
                                   " (allowed: certificates with OU ", roles, ")"));
}

}  // namespace gradsync
