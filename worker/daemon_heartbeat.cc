// gradsyncd's heartbeats: one per member every --heartbeat_interval_ms, for
// members still setting up and for open sessions; what each answer means for
// the session (the job deleted, an epoch ended or aborted), expiry of idle
// sessions, and the epoch's end when the coordinator stops answering.
#include "absl/strings/str_cat.h"
#include "common/logging.h"
#include "worker/coordinator_rpc.h"
#include "worker/daemon.h"

namespace gradsync {

grpc::Status Daemon::Beat(const SessionInfo& info, v1::HeartbeatResponse* response) {
  v1::HeartbeatRequest req;
  req.set_job_id(info.job_id);
  req.set_rank(info.rank);
  req.set_epoch(info.epoch);
  req.set_member_id(info.member_id);
  req.set_member_key(info.member_key);
  auto rpc = CoordinatorRpcContext(options_.heartbeat_interval * 2, info.tenant_token);
  return coordinator_->Heartbeat(rpc.get(), req, response);
}

void Daemon::HeartbeatLoop() {
  // Per member: when the coordinator last answered its heartbeat (from the
  // first round that saw it). Only this thread uses it.
  std::map<std::string, absl::Time> last_ack;
  while (!stop_.WaitForNotificationWithTimeout(options_.heartbeat_interval)) {
    std::vector<std::shared_ptr<Session>> sessions, expired;
    std::vector<SessionInfo> setup;
    {
      absl::MutexLock l(&mu_);
      for (const auto& [id, info] : setting_up_) setup.push_back(info);
      const absl::Time now = absl::Now();
      for (auto it = sessions_.begin(); it != sessions_.end();) {
        if (now - it->second->last_used() > options_.session_lease &&
            !it->second->has_pending_ops()) {
          expired.push_back(it->second);
          it = sessions_.erase(it);
        } else {
          sessions.push_back(it->second);
          ++it;
        }
      }
    }
    for (auto& s : expired) {
      const std::string& id = s->info().session_id;
      GS_LOG(WARNING) << "session " << id << " unused for "
                      << absl::FormatDuration(options_.session_lease) << ": closing it";
      if (client_watch_ != nullptr) client_watch_->Unwatch(id);
      s->Close();
      NotifyClosed(id, absl::FailedPreconditionError(absl::StrCat(
                           "session ", id, " was unused for ",
                           absl::FormatDuration(options_.session_lease), " and closed")));
      LeaveJob(s->info());
    }
    for (const SessionInfo& info : setup) {
      v1::HeartbeatResponse resp;
      grpc::Status st = Beat(info, &resp);
      if (!st.ok()) {
        if (options_.observer != nullptr) options_.observer->OnHeartbeatFailed();
        GS_LOG(WARNING) << "heartbeat for job '" << info.job_id << "' rank " << info.rank
                        << " (setting up): " << st.error_message();
      }
    }
    std::map<std::string, absl::Time> acks;
    for (auto& s : sessions) {
      const SessionInfo& info = s->info();
      auto known = last_ack.find(info.member_id);
      absl::Time& acked = acks[info.member_id];
      acked = known != last_ack.end() ? known->second : absl::Now();
      if (!s->health().ok()) continue;
      v1::HeartbeatResponse resp;
      grpc::Status st = Beat(info, &resp);
      if (st.ok()) acked = absl::Now();
      // Only silence counts (the coordinator unreachable or not answering in
      // time), past the timeout plus the heartbeat's own RPC deadline.
      const bool silent = st.error_code() == grpc::StatusCode::UNAVAILABLE ||
                          st.error_code() == grpc::StatusCode::DEADLINE_EXCEEDED;
      if (silent &&
          absl::Now() - acked > info.heartbeat_timeout + 2 * options_.heartbeat_interval) {
        // Cut off from the coordinator (a partition, or it is down): it has
        // declared this member dead by now, so the epoch is over here too,
        // whatever the data plane still does. Say so rather than let ops
        // run into their deadlines blaming a healthy peer.
        if (options_.observer != nullptr) options_.observer->OnHeartbeatFailed();
        s->AbortEpoch(absl::UnavailableError(absl::StrCat(
            "job '", info.job_id, "' epoch ", info.epoch, ": no heartbeat answer from coordinator ",
            options_.coordinator, " for ",
            absl::FormatDuration(absl::Trunc(absl::Now() - acked, absl::Milliseconds(100))),
            " (the job's heartbeat timeout is ", absl::FormatDuration(info.heartbeat_timeout),
            "): this node is cut off from the coordinator (a network partition, or the coordinator "
            "is down), which has declared rank ", info.rank, " dead; last error: ",
            st.error_message())));
        continue;
      }
      if (st.error_code() == grpc::StatusCode::NOT_FOUND) {
        s->AbortEpoch(absl::AbortedError(
            absl::StrCat("job '", info.job_id, "' no longer exists at the coordinator: ",
                         st.error_message())));
      } else if (!st.ok()) {
        if (options_.observer != nullptr) options_.observer->OnHeartbeatFailed();
        GS_LOG(WARNING) << "heartbeat for job '" << info.job_id << "' rank " << info.rank << ": "
                        << st.error_message();
      } else if (resp.state() == v1::JOB_STATE_ABORTED && resp.epoch() == info.epoch &&
                 resp.dead_ranks().empty()) {
        // A member left gracefully (e.g. it finished): don't interrupt an op
        // that may still complete without it; refuse the next ones.
        s->EndEpoch(absl::FailedPreconditionError(absl::StrCat(
            "job '", info.job_id, "' epoch ", info.epoch, " ended: ", resp.abort_reason())));
      } else if (resp.state() == v1::JOB_STATE_ABORTED || resp.epoch() != info.epoch) {
        s->AbortEpoch(absl::AbortedError(absl::StrCat(
            "job '", info.job_id, "' epoch ", info.epoch, " aborted by the coordinator: ",
            resp.abort_reason().empty() ? "a newer epoch started" : resp.abort_reason())));
      }
    }
    last_ack.swap(acks);
  }
}

}  // namespace gradsync
