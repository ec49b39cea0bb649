#include "server/tenants.h"

#include <sys/stat.h>

#include <fstream>
#include <set>
#include <sstream>
#include <utility>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "common/logging.h"
#include "common/tls.h"

namespace gradsync {
namespace {

constexpr absl::Duration kReloadCheckInterval = absl::Seconds(1);

bool ValidTenantName(absl::string_view name) {
  if (name.empty() || name.size() > kMaxTenantNameLength) return false;
  for (char c : name) {
    const bool ok = absl::ascii_isalnum(static_cast<unsigned char>(c)) || c == '.' || c == '_' ||
                    c == '-';
    if (!ok) return false;
  }
  return true;
}

absl::StatusOr<std::string> ReadFile(const std::string& path) {
  std::ifstream in(path);
  if (!in) return absl::NotFoundError(absl::StrCat("tenants file '", path, "' cannot be read"));
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

std::map<std::string, Tenant> ByDigest(const std::map<std::string, Tenant>& by_token) {
  std::map<std::string, Tenant> out;
  for (const auto& [token, tenant] : by_token) out[Sha256(token)] = tenant;
  return out;
}

}  // namespace

absl::StatusOr<std::map<std::string, Tenant>> ParseTenants(absl::string_view text) {
  std::map<std::string, Tenant> by_token;
  std::set<std::string> names;
  int line_no = 0;
  for (absl::string_view line : absl::StrSplit(text, '\n')) {
    ++line_no;
    if (const size_t hash = line.find('#'); hash != absl::string_view::npos) {
      line = line.substr(0, hash);
    }
    std::vector<absl::string_view> words =
        absl::StrSplit(line, absl::ByAnyChar(" \t\r"), absl::SkipEmpty());
    if (words.empty()) continue;
    auto bad = [&](absl::string_view why) {
      return absl::InvalidArgumentError(absl::StrCat("tenants file line ", line_no, ": ", why));
    };
    if (words.size() < 2) return bad("expected 'NAME TOKEN [max_forming_jobs=N] [max_jobs=N]'");
    Tenant tenant;
    tenant.name = std::string(words[0]);
    if (!ValidTenantName(tenant.name)) {
      return bad(absl::StrCat("tenant name '", absl::CHexEscape(tenant.name), "' must be 1..",
                              kMaxTenantNameLength, " letters, digits, '.', '_' or '-'"));
    }
    if (tenant.name == "ps") {
      return bad("the tenant name 'ps' is reserved (parameter-server connections use it)");
    }
    const std::string token(words[1]);
    if (token.size() < kMinTenantTokenLength || token.size() > kMaxTenantTokenLength) {
      return bad(absl::StrCat("the token of tenant '", tenant.name, "' has ", token.size(),
                              " characters; ", kMinTenantTokenLength, "..",
                              kMaxTenantTokenLength, " are allowed"));
    }
    for (size_t i = 2; i < words.size(); ++i) {
      std::pair<absl::string_view, absl::string_view> kv = absl::StrSplit(words[i], '=');
      int value = 0;
      const bool known = kv.first == "max_forming_jobs" || kv.first == "max_jobs";
      if (!known || !absl::SimpleAtoi(kv.second, &value) || value < 1 || value > 10000) {
        return bad(absl::StrCat("unknown option '", absl::CHexEscape(words[i]),
                                "' (max_forming_jobs=1..10000, max_jobs=1..10000)"));
      }
      (kv.first == "max_jobs" ? tenant.max_jobs : tenant.max_forming_jobs) = value;
    }
    if (!names.insert(tenant.name).second) {
      return bad(absl::StrCat("tenant '", tenant.name, "' appears twice"));
    }
    if (!by_token.emplace(token, std::move(tenant)).second) {
      return bad("this token is already another tenant's");
    }
  }
  return by_token;
}

absl::StatusOr<std::unique_ptr<TenantTable>> TenantTable::Load(const std::string& path) {
  absl::StatusOr<std::string> text = ReadFile(path);
  if (!text.ok()) return text.status();
  absl::StatusOr<std::map<std::string, Tenant>> parsed = ParseTenants(*text);
  if (!parsed.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": ", parsed.status().message()));
  }
  struct stat st {};
  if (::stat(path.c_str(), &st) == 0 && (st.st_mode & S_IROTH) != 0) {
    GS_LOG(WARNING) << "tenants file '" << path
                    << "' is readable by every user; its tokens let anyone create jobs "
                       "(chmod 0600 or 0640)";
  }
  std::unique_ptr<TenantTable> table(new TenantTable(path, *std::move(parsed)));
  absl::MutexLock l(&table->mu_);
  table->last_check_ = absl::Now();
  table->mtime_ns_ = static_cast<int64_t>(st.st_mtim.tv_sec) * 1000000000 + st.st_mtim.tv_nsec;
  table->size_ = st.st_size;
  return table;
}

TenantTable::TenantTable(std::map<std::string, Tenant> by_token)
    : TenantTable("", std::move(by_token)) {}

TenantTable::TenantTable(std::string path, std::map<std::string, Tenant> by_token)
    : path_(std::move(path)), by_digest_(ByDigest(by_token)) {}

void TenantTable::MaybeReload() {
  if (path_.empty()) return;
  const absl::Time now = absl::Now();
  if (now - last_check_ < kReloadCheckInterval) return;
  last_check_ = now;
  struct stat st {};
  if (::stat(path_.c_str(), &st) != 0) return;  // keep the last table
  const int64_t mtime = static_cast<int64_t>(st.st_mtim.tv_sec) * 1000000000 + st.st_mtim.tv_nsec;
  if (mtime == mtime_ns_ && st.st_size == size_) return;
  mtime_ns_ = mtime;
  size_ = st.st_size;
  absl::StatusOr<std::string> text = ReadFile(path_);
  absl::StatusOr<std::map<std::string, Tenant>> parsed =
      text.ok() ? ParseTenants(*text) : absl::StatusOr<std::map<std::string, Tenant>>(text.status());
  if (!parsed.ok()) {
    GS_LOG(WARNING) << "tenants file '" << path_ << "' changed but is not usable ("
                    << parsed.status().message() << "); keeping the previous "
                    << by_digest_.size() << " tenant(s)";
    return;
  }
  by_digest_ = ByDigest(*parsed);
  GS_LOG(INFO) << "tenants file '" << path_ << "' re-read: " << by_digest_.size()
               << " tenant(s)";
}

std::optional<Tenant> TenantTable::Lookup(absl::string_view token) {
  const std::string digest = Sha256(token);
  absl::MutexLock l(&mu_);
  MaybeReload();
  auto it = by_digest_.find(digest);
  if (it == by_digest_.end()) return std::nullopt;
  return it->second;
}

absl::StatusOr<std::optional<Tenant>> TenantTable::Authenticate(
    std::optional<absl::string_view> header) {
  if (!header.has_value()) return std::optional<Tenant>();
  absl::string_view token = *header;
  if (!absl::ConsumePrefix(&token, "Bearer ") || token.empty()) {
    return absl::UnauthenticatedError(
        "the authorization metadata must be 'Bearer TOKEN' (a tenant token)");
  }
  std::optional<Tenant> tenant = Lookup(token);
  if (!tenant.has_value()) {
    return absl::UnauthenticatedError(
        "unknown tenant token (not in the coordinator's tenants file)");
  }
  return tenant;
}

std::optional<Tenant> TenantTable::ByName(absl::string_view name) {
  absl::MutexLock l(&mu_);
  for (const auto& [digest, tenant] : by_digest_) {
    if (tenant.name == name) return tenant;
  }
  return std::nullopt;
}

int TenantTable::size() {
  absl::MutexLock l(&mu_);
  MaybeReload();
  return static_cast<int>(by_digest_.size());
}

grpc::Status TenantAuthProcessor::Process(const InputMetadata& auth_metadata,
                                          grpc::AuthContext* /*context*/,
                                          OutputMetadata* /*consumed_auth_metadata*/,
                                          OutputMetadata* /*response_metadata*/) {
  auto it = auth_metadata.find(kAuthorizationMetadata);
  if (it == auth_metadata.end()) return grpc::Status::OK;
  absl::StatusOr<std::optional<Tenant>> tenant =
      table_->Authenticate(absl::string_view(it->second.data(), it->second.size()));
  if (!tenant.ok()) {
    return grpc::Status(grpc::StatusCode::UNAUTHENTICATED, std::string(tenant.status().message()));
  }
  // Not recorded in `context`: in gRPC 1.51 a call's AuthContext is its
  // connection's, so a property set here would be seen by every later call
  // on the connection (other tenants' calls through the same daemon). The
  // metadata stays, and TenantOf maps it again.
  return grpc::Status::OK;
}

absl::StatusOr<std::optional<Tenant>> TenantOf(const grpc::ServerContextBase& ctx,
                                               TenantTable& table) {
  const auto& metadata = ctx.client_metadata();
  auto it = metadata.find(kAuthorizationMetadata);
  if (it == metadata.end()) return std::optional<Tenant>();
  return table.Authenticate(absl::string_view(it->second.data(), it->second.size()));
}

}  // namespace gradsync
