// Test-only stand-in for gradsyncd's local API (gradsync.v1.Worker), served
// in-process so client tests need no daemon, coordinator or peers.
//
// It does what the real daemon does at the client boundary: buffers are real
// POSIX shared-memory segments (shm_open + ftruncate, unlinked on FreeBuffer,
// CloseSession and destruction), and ops run on one executor thread in
// submission order, in place in the shared memory. Instead of reducing across
// ranks (world_size must be 1), an op applies a visible, deterministic
// transform after a configurable delay: numeric elements (f32, f64, i32, i64)
// of an allreduce are multiplied by 2, other types are left as they are; a
// gather or scatter (root 0, the only rank) leaves the buffer as it is, as
// the real daemon does at world size 1. Other collectives are refused
// (InvalidArgument). Failures can be
// injected (FailNextOp) and RPCs are counted (rpc_count), so tests can prove
// that argument errors are caught before any RPC.
//
// Thread-safe. The destructor shuts the server down, finishes the executor
// and unlinks every segment still alive.
#ifndef GRADSYNC_CLIENT_FAKE_WORKER_H_
#define GRADSYNC_CLIENT_FAKE_WORKER_H_

#include <atomic>
#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <string>
#include <thread>

#include <grpcpp/server.h>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "proto/worker.grpc.pb.h"

namespace gradsync {
namespace client {
namespace testing {

class FakeWorker final : public v1::Worker::Service {
 public:
  // Serves on `address`, e.g. "unix-abstract:gradsync-client-test-<pid>".
  static absl::StatusOr<std::unique_ptr<FakeWorker>> Start(const std::string& address);
  ~FakeWorker() override;

  const std::string& address() const { return address_; }
  // A fresh "unix-abstract:gradsync-client-test-<pid>-<nonce>-<n>" address.
  // The random nonce matters: Bazel's sandbox gives every test process its
  // own PID namespace (so the pid is often the same in concurrent runs) but
  // shares the abstract socket namespace and /dev/shm.
  static std::string NewAddress();
  // Every segment name any FakeWorker of this process creates starts with
  // this ("/gradsync-fake.<pid>-<nonce>.").
  static std::string ShmPrefix();

  // How long an op runs before it completes (default 0).
  void set_op_delay(absl::Duration delay);
  // The next submitted op completes with `status` (after the delay) instead
  // of transforming its buffer.
  void FailNextOp(absl::Status status);

  // RPCs served so far, all methods together.
  int64_t rpc_count() const { return rpc_count_.load(); }
  // Segments currently alive (created and not yet unlinked).
  int live_segments() const;
  v1::OpenSessionRequest last_open_request() const;
  v1::SubmitRequest last_submit_request() const;

  grpc::Status OpenSession(grpc::ServerContext* ctx, const v1::OpenSessionRequest* req,
                           v1::OpenSessionResponse* resp) override;
  grpc::Status AllocateBuffer(grpc::ServerContext* ctx, const v1::AllocateBufferRequest* req,
                              v1::AllocateBufferResponse* resp) override;
  grpc::Status FreeBuffer(grpc::ServerContext* ctx, const v1::FreeBufferRequest* req,
                          v1::FreeBufferResponse* resp) override;
  grpc::Status Submit(grpc::ServerContext* ctx, const v1::SubmitRequest* req,
                      v1::SubmitResponse* resp) override;
  grpc::Status Wait(grpc::ServerContext* ctx, const v1::WaitRequest* req,
                    v1::WaitResponse* resp) override;
  grpc::Status CloseSession(grpc::ServerContext* ctx, const v1::CloseSessionRequest* req,
                            v1::CloseSessionResponse* resp) override;
  // Like a daemon that predates the shared-memory op queue: UNIMPLEMENTED,
  // so clients fall back to Submit/Wait RPCs (counted in open_op_queue_calls).
  grpc::Status OpenOpQueue(grpc::ServerContext* ctx, const v1::OpenOpQueueRequest* req,
                           v1::OpenOpQueueResponse* resp) override;
  int64_t open_op_queue_calls() const { return open_op_queue_calls_.load(); }

 private:
  class Segment;
  struct Op;
  struct SessionState {
    int world_size = 1;
    uint64_t next_sequence = 1;
    std::map<uint64_t, std::shared_ptr<Segment>> buffers;
  };

  explicit FakeWorker(std::string address);
  void RunOps();
  static void Transform(const Op& op);

  const std::string address_;
  std::unique_ptr<grpc::Server> server_;
  std::thread executor_;
  std::atomic<int64_t> rpc_count_{0};
  std::atomic<int64_t> open_op_queue_calls_{0};

  mutable absl::Mutex mu_;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  absl::Duration op_delay_ ABSL_GUARDED_BY(mu_);
  absl::Status fail_next_ ABSL_GUARDED_BY(mu_);
  uint64_t next_session_ ABSL_GUARDED_BY(mu_) = 1;
  uint64_t next_buffer_ ABSL_GUARDED_BY(mu_) = 1;
  uint64_t next_op_ ABSL_GUARDED_BY(mu_) = 1;
  std::map<std::string, SessionState> sessions_ ABSL_GUARDED_BY(mu_);
  std::map<uint64_t, std::shared_ptr<Op>> ops_ ABSL_GUARDED_BY(mu_);
  std::deque<std::shared_ptr<Op>> queue_ ABSL_GUARDED_BY(mu_);
  v1::OpenSessionRequest last_open_ ABSL_GUARDED_BY(mu_);
  v1::SubmitRequest last_submit_ ABSL_GUARDED_BY(mu_);
};

}  // namespace testing
}  // namespace client
}  // namespace gradsync

#endif  // GRADSYNC_CLIENT_FAKE_WORKER_H_
