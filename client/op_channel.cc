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

// The gRPC edge of an op: OpDesc to Worker.Submit's request (the inverse of
// the daemon's OpDescFromRequest, worker/submit_validation.h).
v1::SubmitRequest SubmitRequestOf(const std::string& session_id, const OpDesc& op) {
  v1::SubmitRequest req;
  req.set_session_id(session_id);
  // common/types.h values match the proto enums numerically.
  req.set_collective(static_cast<v1::CollectiveType>(static_cast<int>(op.kind)));
  req.set_dtype(static_cast<v1::DataType>(static_cast<int>(op.dtype)));
  req.set_reduce_op(static_cast<v1::ReduceOp>(static_cast<int>(op.op)));
  req.set_root(op.root);
  req.set_tag(op.tag);
  if (op.op == ReduceOp::kPremulSum) req.set_premul_factor(op.premul_factor);
  req.set_count(op.count);
  req.set_buffer_id(op.buffer_id);
  req.set_offset_bytes(op.offset_bytes);
  req.set_name(op.name);
  req.set_algorithm(op.algorithm);
  req.set_codec(op.codec);
  req.set_timeout_ms(TimeoutMillis(op.timeout));
  return req;
}

// ... and a done Worker.Wait's answer to the op's result.
OpResult ResultOf(const v1::WaitResponse& resp) {
  OpResult r;
  r.algorithm = resp.algorithm();
  r.queued_time = absl::Microseconds(resp.queued_us());
  r.run_time = absl::Microseconds(resp.run_us());
  r.source = resp.source();
  return r;
}

class GrpcOpChannel final : public OpChannel {
 public:
  GrpcOpChannel(std::shared_ptr<WorkerConnection> conn, std::string session_id)
      : conn_(std::move(conn)), session_id_(std::move(session_id)) {}

  absl::StatusOr<SubmitTicket> Submit(const OpDesc& op) override {
    const v1::SubmitRequest req = SubmitRequestOf(session_id_, op);
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
      if (resp.done()) return WaitOutcome{ResultOf(resp), /*done=*/true};
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
