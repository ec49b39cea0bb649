// Tenants of a coordinator: who may create and join jobs, in which namespace.
//
// The operator keeps a tenants file (--tenants_file), one tenant per line:
//
//   # name   token                              [max_forming_jobs=N] [max_jobs=N]
//   vision   5b1c0a7e9f2d4c3b8a6e1f0d2c4b6a8e   max_forming_jobs=16
//
// A training process passes its tenant's token to its daemon, which sends it
// with every call about the job as gRPC metadata "authorization: Bearer
// TOKEN". TenantAuthProcessor (a grpc::AuthMetadataProcessor) refuses a call
// with an unknown token on TLS before any handler runs; TenantOf maps the
// token to its tenant in the handlers. A tenant's job "train" is
// "vision/train" in the registry, so one tenant never sees or reaches
// another's jobs.
//
// The file is re-read when its modification time or size changes (checked at
// most once a second), so tokens can be added and revoked without a restart;
// a file that stops parsing keeps the last good table and logs why.
#ifndef GRADSYNC_SERVER_TENANTS_H_
#define GRADSYNC_SERVER_TENANTS_H_

#include <map>
#include <memory>
#include <optional>
#include <string>

#include <grpcpp/security/auth_metadata_processor.h>
#include <grpcpp/server_context.h>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

namespace gradsync {

inline constexpr size_t kMaxTenantNameLength = 32;
inline constexpr size_t kMinTenantTokenLength = 16;
inline constexpr size_t kMaxTenantTokenLength = 256;
inline constexpr int kDefaultMaxFormingJobsPerTenant = 64;
// The metadata key (lower case, as gRPC requires).
inline constexpr char kAuthorizationMetadata[] = "authorization";

struct Tenant {
  std::string name;
  int max_forming_jobs = kDefaultMaxFormingJobsPerTenant;
  // Jobs in any state; 0: its fair share of the coordinator's table alone
  // (kMaxJobs / tenants), which also caps a value set here.
  int max_jobs = 0;
};

// Parses a tenants file's text: InvalidArgument naming the line on a bad
// name, a short token, a duplicate name or token, or an unknown option.
absl::StatusOr<std::map<std::string, Tenant>> ParseTenants(absl::string_view text);

class TenantTable {
 public:
  // Reads `path` now: an error if it cannot be read or parsed.
  static absl::StatusOr<std::unique_ptr<TenantTable>> Load(const std::string& path);
  // A fixed table (tests): token -> tenant.
  explicit TenantTable(std::map<std::string, Tenant> by_token);

  // The tenant whose token is `token`, or nullopt. Re-reads the file when it
  // changed. Tokens are compared by their SHA-256, not as strings.
  std::optional<Tenant> Lookup(absl::string_view token);
  // The tenant of an "authorization" metadata value ("Bearer TOKEN"):
  // nullopt for no value, UNAUTHENTICATED for a malformed or unknown token.
  absl::StatusOr<std::optional<Tenant>> Authenticate(std::optional<absl::string_view> header);
  // The tenant called `name` (as of the last reload), or nullopt.
  std::optional<Tenant> ByName(absl::string_view name);
  int size();

 private:
  TenantTable(std::string path, std::map<std::string, Tenant> by_token);
  void MaybeReload() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const std::string path_;  // "" for a fixed table
  absl::Mutex mu_;
  std::map<std::string, Tenant> by_digest_ ABSL_GUARDED_BY(mu_);  // SHA-256(token) -> tenant
  absl::Time last_check_ ABSL_GUARDED_BY(mu_) = absl::InfinitePast();
  int64_t mtime_ns_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t size_ ABSL_GUARDED_BY(mu_) = -1;
};

// Checks bearer tokens on TLS calls (gRPC runs it before the handler): an
// unknown or malformed token fails the call with UNAUTHENTICATED.
class TenantAuthProcessor final : public grpc::AuthMetadataProcessor {
 public:
  explicit TenantAuthProcessor(std::shared_ptr<TenantTable> table) : table_(std::move(table)) {}
  bool IsBlocking() const override { return false; }  // a map lookup
  grpc::Status Process(const InputMetadata& auth_metadata, grpc::AuthContext* context,
                       OutputMetadata* consumed_auth_metadata,
                       OutputMetadata* response_metadata) override;

 private:
  std::shared_ptr<TenantTable> table_;
};

// The caller's tenant, from the call's bearer token: nullopt when the call
// carries none; UNAUTHENTICATED for a bad one (a plaintext call, or a token
// revoked since the processor ran).
absl::StatusOr<std::optional<Tenant>> TenantOf(const grpc::ServerContextBase& ctx,
                                               TenantTable& table);

}  // namespace gradsync

#endif  // GRADSYNC_SERVER_TENANTS_H_
