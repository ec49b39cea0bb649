#include "worker/status_service.h"

#include <openssl/crypto.h>

#include <string>

#include "absl/strings/strip.h"
#include "absl/strings/string_view.h"
#include "common/metrics.h"
#include "common/tls.h"

namespace gradsync {
namespace {

// The tenant token a call carries ("authorization: Bearer TOKEN"), or "".
std::string CallTenantToken(const grpc::ServerContext& ctx) {
  const auto& metadata = ctx.client_metadata();
  auto it = metadata.find("authorization");
  if (it == metadata.end()) return "";
  absl::string_view value(it->second.data(), it->second.size());
  if (!absl::ConsumePrefix(&value, "Bearer ")) return "";
  return std::string(value);
}

bool SameToken(const std::string& a, const std::string& b) {
  return a.size() == b.size() && CRYPTO_memcmp(a.data(), b.data(), a.size()) == 0;
}

}  // namespace

bool StatusService::MaySee(const SessionInfo& info, bool everything, const std::string& token) {
  if (everything) return true;
  return !token.empty() && !info.tenant.empty() && SameToken(info.tenant_token, token);
}

grpc::Status StatusService::GetStatus(grpc::ServerContext* ctx,
                                      const v1::GetDaemonStatusRequest* req,
                                      v1::DaemonStatusResponse* resp) {
  if (grpc::Status denied = RequireRole(*ctx, tls_, "operator,node", "GetStatus"); !denied.ok()) {
    return denied;
  }
  resp->set_node_id(daemon_->node_id());
  resp->set_version(kGradsyncVersion);
  resp->set_data_port(daemon_->data_port());
  const absl::Time now = absl::Now();
  // Without TLS nobody is authenticated (an --insecure daemon serves all).
  const bool everything = !tls_ || IdentityOf(*ctx).role == "operator";
  const std::string token = CallTenantToken(*ctx);
  for (const SessionStatus& st : daemon_->Status()) {
    if (!MaySee(st.info, everything, token)) continue;
    if (!req->job_id().empty() && st.info.job_id != req->job_id() &&
        st.info.scoped_job_id() != req->job_id()) {
      continue;
    }
    v1::SessionState* s = resp->add_sessions();
    s->set_session_id(st.info.session_id);
    s->set_job_id(st.info.scoped_job_id());  // "TENANT/JOB" for a tenant's job
    s->set_rank(st.info.rank);
    s->set_world_size(st.info.world_size);
    s->set_epoch(st.info.epoch);
    s->set_member_id(st.info.member_id);
    s->set_transport(st.info.transport);
    if (!st.health.ok()) s->set_error(std::string(st.health.message()));
    s->set_queued_ops(st.queued);
    s->set_last_completed_seq(st.last_completed_seq);
    s->set_last_completed(st.last_completed);
    s->set_last_completed_age_ms(st.last_completed_seq == 0
                                     ? -1
                                     : absl::ToInt64Milliseconds(now - st.last_completed_at));
    s->set_has_current(st.has_current);
    if (st.has_current) {
      s->set_current_seq(st.current_seq);
      s->set_current_op(st.current);
      s->set_phase(st.phase);
      s->set_current_age_ms(absl::ToInt64Milliseconds(now - st.current_since));
      for (int r : st.arrived) s->add_arrived_ranks(r);
      for (int r : st.missing) s->add_missing_ranks(r);
    }
  }
  return grpc::Status::OK;
}

}  // namespace gradsync
