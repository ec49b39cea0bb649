#include "cli/status.h"

#include <grpcpp/grpcpp.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <set>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "common/grpc_status.h"
#include "proto/coordinator.grpc.pb.h"
#include "proto/status.grpc.pb.h"

namespace gradsync {
namespace {

const char* StateName(v1::JobState s) {
  switch (s) {
    case v1::JOB_STATE_FORMING: return "FORMING";
    case v1::JOB_STATE_RUNNING: return "RUNNING";
    case v1::JOB_STATE_ABORTED: return "ABORTED";
    default: return "?";
  }
}

std::string Age(int64_t ms) {
  if (ms < 0) return "-";
  return absl::StrFormat("%.1f s ago", ms / 1000.0);
}

std::unique_ptr<grpc::ClientContext> Ctx(absl::Duration timeout, const std::string& token = "") {
  auto c = std::make_unique<grpc::ClientContext>();
  c->set_deadline(absl::ToChronoTime(absl::Now() + timeout));
  if (!token.empty()) c->AddMetadata("authorization", "Bearer " + token);
  return c;
}

}  // namespace

absl::StatusOr<std::unique_ptr<v1::Coordinator::Stub>> CoordinatorStub(const StatusOptions& o) {
  absl::StatusOr<std::shared_ptr<grpc::ChannelCredentials>> credentials =
      MakeChannelCredentials(o.tls);
  if (!credentials.ok()) return credentials.status();
  return v1::Coordinator::NewStub(grpc::CreateChannel(o.coordinator, *credentials));
}

std::string TenantToken(const StatusOptions& o) {
  if (!o.tenant_token.empty()) return o.tenant_token;
  const char* env = std::getenv("GRADSYNC_TENANT_TOKEN");
  return env != nullptr ? env : "";
}

absl::StatusOr<int> RunStatus(const StatusOptions& o) {
  absl::StatusOr<std::unique_ptr<v1::Coordinator::Stub>> coord = CoordinatorStub(o);
  if (!coord.ok()) return coord.status();
  const std::string token = TenantToken(o);
  absl::StatusOr<std::shared_ptr<grpc::ChannelCredentials>> credentials =
      MakeChannelCredentials(o.tls);  // toward the daemons' status services
  if (!credentials.ok()) return credentials.status();
  std::vector<v1::JobStatus> jobs;
  if (o.job.empty()) {
    v1::ListJobsResponse resp;
    auto ctx = Ctx(o.timeout, token);
    grpc::Status s = (*coord)->ListJobs(ctx.get(), v1::ListJobsRequest(), &resp);
    if (!s.ok()) {
      return absl::Status(FromGrpcStatus(s).code(),
                          absl::StrCat("coordinator ", o.coordinator, ": ", s.error_message()));
    }
    jobs.assign(resp.jobs().begin(), resp.jobs().end());
  } else {
    v1::GetJobStatusRequest req;
    req.set_job_id(o.job);
    v1::JobStatus st;
    auto ctx = Ctx(o.timeout, token);
    grpc::Status s = (*coord)->GetJobStatus(ctx.get(), req, &st);
    if (!s.ok()) {
      return absl::Status(FromGrpcStatus(s).code(),
                          absl::StrCat("coordinator ", o.coordinator, ": ", s.error_message()));
    }
    jobs.push_back(st);
  }
  if (jobs.empty()) {
    std::printf("no jobs at coordinator %s\n", o.coordinator.c_str());
    return 0;
  }
  // Ask every daemon once.
  std::map<std::string, v1::DaemonStatusResponse> daemons;
  std::map<std::string, std::string> daemon_errors;
  for (const auto& job : jobs) {
    for (const auto& m : job.members()) {
      const std::string& ep = m.status_endpoint();
      if (ep.empty() || daemons.count(ep) || daemon_errors.count(ep)) continue;
      auto stub = v1::DaemonStatus::NewStub(grpc::CreateChannel(ep, *credentials));
      v1::DaemonStatusResponse resp;
      auto ctx = Ctx(o.timeout, token);  // a node certificate sees only this tenant's sessions
      grpc::Status s = stub->GetStatus(ctx.get(), v1::GetDaemonStatusRequest(), &resp);
      if (s.ok()) {
        daemons[ep] = resp;
      } else {
        daemon_errors[ep] = s.error_message();
      }
    }
  }
  int hanging = 0;
  for (const auto& job : jobs) {
    std::printf("job '%s' epoch %lld %s, %d ranks, op timeout %lld ms%s%s\n", job.job_id().c_str(),
                static_cast<long long>(job.epoch()), StateName(job.state()), job.world_size(),
                static_cast<long long>(job.options().op_timeout_ms()),
                job.abort_reason().empty() ? "" : ": ", job.abort_reason().c_str());
    // rank -> its session on its daemon
    std::map<int, v1::SessionState> sessions;
    for (const auto& m : job.members()) {
      auto it = daemons.find(m.status_endpoint());
      if (it == daemons.end()) continue;
      for (const auto& s : it->second.sessions()) {
        // Member ids are unique session ids (job ids repeat across tenants).
        if (s.member_id() == m.member_id() && s.rank() == m.rank() && s.epoch() == job.epoch()) {
          sessions[m.rank()] = s;
        }
      }
    }
    // The ranks that have not reached op `seq` (have no current op, or an
    // earlier one): what a rank negotiating it waits for, when its daemon
    // does not name them.
    auto behind = [&](uint64_t seq) {
      std::vector<int> out;
      for (const auto& m : job.members()) {
        auto it = sessions.find(m.rank());
        if (it == sessions.end()) continue;
        if (!it->second.has_current() || it->second.current_seq() < seq) out.push_back(m.rank());
      }
      return out;
    };
    // The data plane between the job's daemons, as each rank's daemon chose it.
    std::map<std::string, std::vector<int>> transports;  // transport -> ranks
    for (const auto& [rank, s] : sessions) {
      if (!s.transport().empty()) transports[s.transport()].push_back(rank);
    }
    for (const auto& [transport, ranks] : transports) {
      std::printf("  data plane: %s%s\n", transport.c_str(),
                  transports.size() == 1 ? ""
                                         : absl::StrCat(" (ranks ", absl::StrJoin(ranks, ","), ")").c_str());
    }
    std::printf("  %-4s %-24s %-5s %-11s %-52s %s\n", "rank", "member", "alive", "heartbeat",
                "last completed op", "now");
    for (const auto& m : job.members()) {
      std::string last = "-", now = "-";
      auto it = sessions.find(m.rank());
      if (it != sessions.end()) {
        const v1::SessionState& s = it->second;
        if (s.last_completed_seq() > 0) {
          last = absl::StrCat(s.last_completed(), ", ", Age(s.last_completed_age_ms()));
        }
        if (s.has_current()) {
          now = absl::StrFormat("op %d %s for %.1f s", s.current_seq(), s.phase(),
                                s.current_age_ms() / 1000.0);
          if (!s.missing_ranks().empty()) {
            absl::StrAppend(&now, " (waiting for rank ", absl::StrJoin(s.missing_ranks(), ","), ")");
          } else if (s.phase() == "negotiating") {
            const std::vector<int> late = behind(s.current_seq());
            if (!late.empty()) absl::StrAppend(&now, " (waiting for rank ", absl::StrJoin(late, ","), ")");
          }
        } else {
          now = "idle";
        }
        if (!s.error().empty()) now = absl::StrCat("FAILED: ", s.error());
      } else if (daemon_errors.count(m.status_endpoint())) {
        now = absl::StrCat("daemon ", m.status_endpoint(), " unreachable: ",
                           daemon_errors[m.status_endpoint()]);
      } else if (m.status_endpoint().empty()) {
        now = "daemon has no status endpoint";
      }
      std::printf("  %-4d %-24s %-5s %-11s %-52s %s\n", m.rank(), m.member_id().c_str(),
                  m.alive() ? "yes" : "NO", Age(m.last_heartbeat_age_ms()).c_str(), last.c_str(),
                  now.c_str());
    }
    // Verdict: for each op some ranks wait on, who has not submitted it.
    std::map<uint64_t, std::pair<std::string, int64_t>> waiting;  // seq -> (desc, longest wait)
    for (const auto& [rank, s] : sessions) {
      if (s.has_current() && s.phase() == "negotiating") {
        auto& w = waiting[s.current_seq()];
        w.first = s.current_op();
        w.second = std::max(w.second, s.current_age_ms());
      }
    }
    for (const auto& [seq, w] : waiting) {
      std::vector<std::string> culprits;
      for (const auto& m : job.members()) {
        auto it = sessions.find(m.rank());
        std::string why;
        if (!m.alive()) {
          why = "is dead (missed heartbeats)";
        } else if (it == sessions.end()) {
          why = "did not answer the status query";
        } else if (!it->second.has_current() || it->second.current_seq() < seq) {
          const auto& s = it->second;
          why = absl::StrCat("has not submitted it (last completed op ", s.last_completed_seq(),
                             s.last_completed_seq() > 0 ? absl::StrCat(", ", Age(s.last_completed_age_ms())) : "",
                             s.has_current() ? absl::StrCat("; busy with op ", s.current_seq()) : "", ")");
        }
        if (!why.empty()) culprits.push_back(absl::StrCat("rank ", m.rank(), " ", why));
      }
      if (culprits.empty()) continue;
      std::printf("  => %s has been waiting %.1f s for: %s\n", w.first.c_str(), w.second / 1000.0,
                  absl::StrJoin(culprits, "; ").c_str());
      if (w.second >= 1000) hanging += static_cast<int>(culprits.size());
    }
  }
  return hanging;
}

}  // namespace gradsync
