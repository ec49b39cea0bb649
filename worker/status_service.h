// gradsync.v1.DaemonStatus: what this daemon's sessions are doing, read-only,
// for `gradsync status`. Served on TCP (gradsyncd --status_listen).
#ifndef GRADSYNC_WORKER_STATUS_SERVICE_H_
#define GRADSYNC_WORKER_STATUS_SERVICE_H_

#include "proto/status.grpc.pb.h"
#include "worker/daemon.h"

namespace gradsync {

class StatusService final : public v1::DaemonStatus::Service {
 public:
  // `tls`: callers are verified certificates; only operators and nodes may
  // read (common/tls.h). An operator sees every session; a node
  // certificate only the sessions of the tenant whose token the call carries
  // ("authorization: Bearer TOKEN"), none without one (nor, without tenants,
  // any). Without TLS every caller sees every session.
  explicit StatusService(Daemon* daemon, bool tls = false) : daemon_(daemon), tls_(tls) {}
  grpc::Status GetStatus(grpc::ServerContext* ctx, const v1::GetDaemonStatusRequest* req,
                         v1::DaemonStatusResponse* resp) override;

 private:
  static bool MaySee(const SessionInfo& info, bool everything, const std::string& token);

  Daemon* daemon_;
  const bool tls_;
};

}  // namespace gradsync

#endif  // GRADSYNC_WORKER_STATUS_SERVICE_H_
