#include "worker/coordinator_watch.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "common/logging.h"
#include "common/process.h"

namespace gradsync {
namespace {

// grpc.health.v1.HealthCheckResponse{status: SERVING} is field 1, varint 1.
bool IsServing(const grpc::ByteBuffer& response) {
  std::vector<grpc::Slice> slices;
  if (!response.Dump(&slices).ok()) return false;
  std::string bytes;
  for (const grpc::Slice& s : slices) bytes.append(reinterpret_cast<const char*>(s.begin()), s.size());
  return bytes == std::string("\x08\x01", 2);
}

}  // namespace

CoordinatorWatch::CoordinatorWatch(std::shared_ptr<grpc::Channel> channel,
                                   CoordinatorWatchOptions options)
    : channel_(std::move(channel)), options_(std::move(options)), stub_(channel_) {
  thread_ = std::thread([this] { Loop(); });
  NameThread(thread_, "gs-coord-watch");
}

CoordinatorWatch::~CoordinatorWatch() {
  stop_.Notify();
  {
    absl::MutexLock l(&mu_);
    stopping_ = true;
    if (inflight_ != nullptr) inflight_->TryCancel();  // do not wait out its deadline
  }
  thread_.join();
}

bool CoordinatorWatch::reachable() const {
  absl::MutexLock l(&mu_);
  return reachable_;
}

std::string CoordinatorWatch::Describe() const {
  absl::MutexLock l(&mu_);
  if (reachable_) return "";
  return absl::StrCat("coordinator ", options_.target, " unreachable for ",
                      absl::FormatDuration(absl::Trunc(absl::Now() - down_since_, absl::Seconds(1))),
                      ": ", error_);
}

std::string CoordinatorWatch::Check() {
  grpc::ClientContext ctx;
  ctx.set_deadline(absl::ToChronoTime(absl::Now() + options_.rpc_timeout));
  grpc::ByteBuffer request;  // HealthCheckRequest{service: ""}: the server as a whole
  {
    grpc::Slice empty("");
    request = grpc::ByteBuffer(&empty, 1);
  }
  grpc::ByteBuffer response;
  absl::Notification done;
  grpc::Status status;
  {
    absl::MutexLock l(&mu_);
    if (stopping_) return "stopping";
    inflight_ = &ctx;
  }
  stub_.UnaryCall(&ctx, "/grpc.health.v1.Health/Check", grpc::StubOptions(), &request, &response,
                  [&](grpc::Status s) {
                    status = std::move(s);
                    done.Notify();
                  });
  done.WaitForNotification();  // the call's own deadline bounds it
  {
    absl::MutexLock l(&mu_);
    inflight_ = nullptr;
  }
  if (!status.ok()) {
    return absl::StrCat(status.error_message(), " (", static_cast<int>(status.error_code()), ")");
  }
  return IsServing(response) ? "" : "its health service answers NOT_SERVING (shutting down?)";
}

void CoordinatorWatch::Loop() {
  absl::Duration backoff = options_.first_backoff;
  absl::Time last_log;
  while (true) {
    const std::string error = Check();
    if (stop_.HasBeenNotified()) return;  // a cancelled check says nothing
    bool changed = false, first = false;
    absl::Duration was_down;
    {
      absl::MutexLock l(&mu_);
      first = !checked_;
      checked_ = true;
      if (error.empty()) {
        changed = !reachable_ || first;
        if (!reachable_) was_down = absl::Now() - down_since_;
        reachable_ = true;
        error_.clear();
      } else {
        changed = reachable_ || first;
        if (reachable_ || first) down_since_ = absl::Now();
        reachable_ = false;
        error_ = error;
      }
    }
    if (error.empty()) {
      backoff = options_.first_backoff;
      if (changed) {
        if (first) {
          GS_LOG(INFO) << "coordinator " << options_.target << " reachable";
        } else {
          GS_LOG(INFO) << "coordinator " << options_.target << " reachable again after "
                       << absl::FormatDuration(absl::Trunc(was_down, absl::Milliseconds(100)));
        }
      }
    } else {
      // Every change is logged, then at most once a minute while it lasts.
      if (changed || absl::Now() - last_log >= absl::Minutes(1)) {
        GS_LOG(WARNING) << "coordinator " << options_.target << " unreachable: " << error
                        << "; sessions cannot open until it answers (retrying, back-off up to "
                        << absl::FormatDuration(options_.max_backoff) << ")";
        last_log = absl::Now();
      }
    }
    if (options_.observer != nullptr) options_.observer->OnCoordinatorCheck(error.empty());
    if (changed && options_.on_change) options_.on_change(error.empty(), error);
    const absl::Duration wait = error.empty() ? options_.check_interval : backoff;
    if (!error.empty()) backoff = std::min(backoff * 2, options_.max_backoff);
    if (stop_.WaitForNotificationWithTimeout(wait)) return;
  }
}

}  // namespace gradsync
