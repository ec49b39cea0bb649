// Whether gradsyncd can reach its coordinator, known from start-up on rather
// than from the first session: a thread calls the coordinator's standard gRPC
// health service (grpc.health.v1.Health/Check) every few seconds, and while it
// fails retries with a doubling back-off. Each change is logged (with the gRPC
// error that names the cause), reported to the observer (metrics) and to a
// callback (the daemon's health service and systemd status line).
#ifndef GRADSYNC_WORKER_COORDINATOR_WATCH_H_
#define GRADSYNC_WORKER_COORDINATOR_WATCH_H_

#include <grpcpp/generic/generic_stub.h>
#include <grpcpp/grpcpp.h>

#include <functional>
#include <memory>
#include <string>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/time.h"
#include "worker/daemon_observer.h"

namespace gradsync {

struct CoordinatorWatchOptions {
  std::string target;                                 // for messages
  absl::Duration check_interval = absl::Seconds(2);   // while reachable
  absl::Duration first_backoff = absl::Milliseconds(250);
  absl::Duration max_backoff = absl::Seconds(5);      // while unreachable
  absl::Duration rpc_timeout = absl::Seconds(2);
  DaemonObserver* observer = nullptr;
  // Called on every change (and the first result), from the watch's thread.
  std::function<void(bool reachable, const std::string& detail)> on_change;
};

class CoordinatorWatch {
 public:
  // Starts checking at once.
  CoordinatorWatch(std::shared_ptr<grpc::Channel> channel, CoordinatorWatchOptions options);
  ~CoordinatorWatch();  // stops the thread
  CoordinatorWatch(const CoordinatorWatch&) = delete;
  CoordinatorWatch& operator=(const CoordinatorWatch&) = delete;

  // True until a check failed; then false until one succeeds.
  bool reachable() const;
  // "" while reachable (or not checked yet), else "coordinator X unreachable
  // for 12s (since ...): <gRPC error>", for the errors sessions get.
  std::string Describe() const;

 private:
  void Loop();
  // One health check; "" when the coordinator answered SERVING.
  std::string Check();

  const std::shared_ptr<grpc::Channel> channel_;
  const CoordinatorWatchOptions options_;
  grpc::GenericStub stub_;
  mutable absl::Mutex mu_;
  bool checked_ ABSL_GUARDED_BY(mu_) = false;
  bool reachable_ ABSL_GUARDED_BY(mu_) = true;
  std::string error_ ABSL_GUARDED_BY(mu_);
  absl::Time down_since_ ABSL_GUARDED_BY(mu_);
  grpc::ClientContext* inflight_ ABSL_GUARDED_BY(mu_) = nullptr;  // the check running now
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  absl::Notification stop_;
  std::thread thread_;
};

}  // namespace gradsync

#endif  // GRADSYNC_WORKER_COORDINATOR_WATCH_H_
