#include "client/op_channel.h"

#include <algorithm>
#include <utility>

#include <grpcpp/client_context.h>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "common/grpc_status.h"

namespace gradsync {
namespace client {
namespace internal {

absl::Status CallWhileAlive(
    OpChannel& ops, const internal::WorkerConnection& conn, absl::string_view rpc,
    const std::function<void(grpc::ClientContext*, std::function<void(grpc::Status)>)>& start) {
  grpc::ClientContext ctx;
  const absl::Time deadline = absl::Now() + kRpcTimeout;
  ctx.set_deadline(absl::ToChronoTime(deadline));
  absl::Mutex mu;
  bool done = false;
  grpc::Status status;
  start(&ctx, [&](grpc::Status s) {
    absl::MutexLock l(&mu);
    status = std::move(s);
    done = true;
  });
  absl::Status dead;
  {
    absl::MutexLock l(&mu);
    while (!mu.AwaitWithTimeout(absl::Condition(&done), absl::Milliseconds(50))) {
      mu.Unlock();
      absl::Status alive = ops.Alive();
      mu.Lock();
      if (alive.code() == absl::StatusCode::kUnavailable) {
        dead = absl::UnavailableError(absl::StrCat(rpc, ": ", alive.message()));
        ctx.TryCancel();
        mu.Await(absl::Condition(&done));  // the callback runs promptly once cancelled
        break;
      }
    }
  }
  if (!dead.ok()) return dead;
  if (!status.ok()) return RpcError(status, conn, rpc, deadline, kRpcTimeout);
  return absl::OkStatus();
}

absl::Status RpcError(const grpc::Status& status, const WorkerConnection& conn,
                      absl::string_view rpc, absl::Time rpc_deadline, absl::Duration rpc_timeout) {
  if (status.error_code() == grpc::StatusCode::DEADLINE_EXCEEDED && absl::Now() >= rpc_deadline) {
    return absl::DeadlineExceededError(absl::StrCat(
        "gradsyncd at '", conn.target, "' did not answer ", rpc, " within ",
        absl::FormatDuration(rpc_timeout), " (", status.error_message(), ")"));
  }
  return FromGrpcStatus(status);
}

namespace {

class GrpcOpChannel final : public OpChannel {
 public:
  GrpcOpChannel(std::shared_ptr<WorkerConnection> conn, std::string session_id)
      : conn_(std::move(conn)), session_id_(std::move(session_id)) {}

  absl::StatusOr<SubmitTicket> Submit(const SubmitArgs& args) override {
    v1::SubmitRequest req;
    req.set_session_id(session_id_);
    req.set_collective(static_cast<v1::CollectiveType>(static_cast<int>(args.kind)));
    req.set_root(args.root);
    req.set_algorithm(std::string(args.algorithm));
    req.set_name(std::string(args.name));
    // common/types.h values match the proto enums numerically.
    req.set_dtype(static_cast<v1::DataType>(static_cast<int>(args.dtype)));
    req.set_count(args.count);
    req.set_reduce_op(static_cast<v1::ReduceOp>(static_cast<int>(args.reduce_op)));
    req.set_buffer_id(args.buffer_id);
    req.set_offset_bytes(args.offset_bytes);
    req.set_timeout_ms(args.timeout_ms);

    grpc::ClientContext ctx;
    const absl::Time deadline = absl::Now() + kRpcTimeout;
    ctx.set_deadline(absl::ToChronoTime(deadline));
    v1::SubmitResponse resp;
    grpc::Status s = conn_->stub->Submit(&ctx, req, &resp);
    if (!s.ok()) return RpcError(s, *conn_, "Submit", deadline, kRpcTimeout);
    return SubmitTicket{resp.op_id(), resp.sequence()};
  }

  absl::StatusOr<WaitOutcome> Wait(uint64_t op_id, absl::Time deadline) override {
    v1::WaitRequest req;
    req.set_session_id(session_id_);
    req.set_op_id(op_id);
    while (true) {
      const absl::Time start = absl::Now();
      const absl::Duration left = std::max(deadline - start, absl::ZeroDuration());
      const absl::Duration slice = std::min(left, kMaxWaitSlice);
      req.set_timeout_ms(absl::ToInt64Milliseconds(slice));

      grpc::ClientContext ctx;
      const absl::Time rpc_deadline = start + slice + kRpcMargin;
      ctx.set_deadline(absl::ToChronoTime(rpc_deadline));
      v1::WaitResponse resp;
      grpc::Status s = conn_->stub->Wait(&ctx, req, &resp);
      if (!s.ok()) return RpcError(s, *conn_, "Wait", rpc_deadline, slice + kRpcMargin);
      if (resp.done()) {
        WaitOutcome out;
        out.done = true;
        out.algorithm = resp.algorithm();
        out.queued_us = resp.queued_us();
        out.run_us = resp.run_us();
        return out;
      }
      const absl::Time now = absl::Now();
      if (now >= deadline) return WaitOutcome{};
      // The slice ended (long wait) or the daemon answered early: wait again,
      // without spinning if it keeps answering at once.
      if (now - start < slice) absl::SleepFor(std::min(absl::Milliseconds(1), deadline - now));
    }
  }

 private:
  const std::shared_ptr<WorkerConnection> conn_;
  const std::string session_id_;
};

}  // namespace

std::unique_ptr<OpChannel> NewGrpcOpChannel(std::shared_ptr<WorkerConnection> conn,
                                            std::string session_id) {
  return std::make_unique<GrpcOpChannel>(std::move(conn), std::move(session_id));
}

}  // namespace internal
}  // namespace client
}  // namespace gradsync
