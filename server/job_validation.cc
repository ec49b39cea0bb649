// Limits of what a CreateJob may ask for, and tenants' job-id namespaces.
#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "server/job_registry.h"

namespace gradsync {
namespace {

// Letters, digits, '.', '_', '-': the characters of job ids and tenant names.
absl::Status CheckIdCharacters(absl::string_view what, absl::string_view id) {
  for (char c : id) {
    const bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
                    c == '.' || c == '_' || c == '-';
    if (!ok) {
      return absl::InvalidArgumentError(
          absl::StrCat(what, " '", absl::CHexEscape(id), "' contains '",
                       absl::CHexEscape(absl::string_view(&c, 1)),
                       "'; allowed are letters, digits, '.', '_' and '-'"));
    }
  }
  return absl::OkStatus();
}

}  // namespace

std::string ScopedJobId(absl::string_view tenant, absl::string_view job_id) {
  if (tenant.empty()) return std::string(job_id);
  return absl::StrCat(tenant, "/", job_id);
}

absl::string_view JobNamespace(absl::string_view scoped_id) {
  const size_t slash = scoped_id.find('/');
  return slash == absl::string_view::npos ? absl::string_view() : scoped_id.substr(0, slash);
}

absl::string_view UnscopedJobId(absl::string_view scoped_id) {
  const size_t slash = scoped_id.find('/');
  return slash == absl::string_view::npos ? scoped_id : scoped_id.substr(slash + 1);
}

absl::Status ValidateJobId(absl::string_view job_id) {
  if (const size_t slash = job_id.find('/'); slash != absl::string_view::npos) {
    const absl::string_view ns = job_id.substr(0, slash);
    if (ns.empty() || ns.size() > kMaxJobNamespaceLength) {
      return absl::InvalidArgumentError(absl::StrCat("the tenant of job id '",
                                                     absl::CHexEscape(job_id), "' must be 1..",
                                                     kMaxJobNamespaceLength, " characters"));
    }
    if (absl::Status s = CheckIdCharacters("tenant", ns); !s.ok()) return s;
    job_id = job_id.substr(slash + 1);
  }
  if (job_id.empty()) return absl::InvalidArgumentError("job id must not be empty");
  if (job_id.size() > kMaxJobIdLength) {
    return absl::InvalidArgumentError(absl::StrCat("job id '", job_id.substr(0, 32), "...' is ",
                                                   job_id.size(), " characters long; the limit is ",
                                                   kMaxJobIdLength));
  }
  return CheckIdCharacters("job id", job_id);
}

absl::Status ValidateJobOptions(absl::string_view job_id, const v1::JobOptions& o) {
  auto bad = [&](absl::string_view field, int64_t value, int64_t lo, int64_t hi) {
    return absl::InvalidArgumentError(absl::StrCat("job '", job_id, "': ", field, " ", value,
                                                   " is out of range (", lo, "..", hi,
                                                   ", or 0 for the default)"));
  };
  if (o.heartbeat_timeout_ms() != 0 && (o.heartbeat_timeout_ms() < kMinHeartbeatTimeoutMs ||
                                        o.heartbeat_timeout_ms() > kMaxHeartbeatTimeoutMs)) {
    return bad("heartbeat_timeout_ms", o.heartbeat_timeout_ms(), kMinHeartbeatTimeoutMs,
               kMaxHeartbeatTimeoutMs);
  }
  if (o.op_timeout_ms() < 0 || o.op_timeout_ms() > kMaxOpTimeoutMs) {
    return bad("op_timeout_ms", o.op_timeout_ms(), 1, kMaxOpTimeoutMs);
  }
  if (o.tcp_streams() < 0 || o.tcp_streams() > kMaxJobTcpStreams) {
    return bad("tcp_streams", o.tcp_streams(), 1, kMaxJobTcpStreams);
  }
  if (o.ps_shards() < 0 || o.ps_shards() > kMaxJobPsShards) {
    return bad("ps_shards", o.ps_shards(), 1, kMaxJobPsShards);
  }
  if (o.algorithm().size() > kMaxAlgorithmNameLength) {
    return absl::InvalidArgumentError(absl::StrCat("job '", job_id, "': algorithm name of ",
                                                   o.algorithm().size(), " characters; at most ",
                                                   kMaxAlgorithmNameLength));
  }
  if (o.codec().size() > kMaxAlgorithmNameLength) {
    return absl::InvalidArgumentError(absl::StrCat("job '", job_id, "': codec of ",
                                                   o.codec().size(), " characters; at most ",
                                                   kMaxAlgorithmNameLength));
  }
  return absl::OkStatus();
}

}  // namespace gradsync
