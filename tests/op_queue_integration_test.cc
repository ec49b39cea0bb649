// The shared-memory op queue against real processes: a gradsync-coordinator
// and gradsyncd daemons on loopback, the test being every rank's client.
// Ops travel through the queue (Worker.OpenOpQueue), not Submit/Wait RPCs.
#include <poll.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <sys/stat.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <fstream>
#include <string>
#include <vector>

#include <grpcpp/grpcpp.h>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "cli/expected.h"
#include "cli/local_cluster.h"
#include "client/c_api.h"
#include "common/metrics_testing.h"
#include "gtest/gtest.h"
#include "proto/worker.grpc.pb.h"
#include "tests/cluster_util.h"

namespace gradsync {
namespace {

using testing::OnEveryRank;
using testing::OpenJob;
using testing::StartCluster;

// Op queue segments daemon `i` still maps: its memfds named
// "gradsync-queue-<n>" in /proc/PID/maps (none once the daemon is gone).
std::vector<std::string> QueueSegments(const LocalCluster& cluster, int i) {
  std::vector<std::string> out;
  std::ifstream maps(absl::StrCat("/proc/", cluster.daemon_pid(i), "/maps"));
  std::string line;
  const std::string marker = "/memfd:gradsync-queue-";
  while (std::getline(maps, line)) {
    const size_t at = line.find(marker);
    if (at == std::string::npos) continue;
    const std::string name = line.substr(at, line.find(' ', at) - at);
    if (std::find(out.begin(), out.end(), name) == out.end()) out.push_back(name);
  }
  return out;
}

// Ops submitted to daemon `i` and not finished (gradsync_daemon_queue_depth),
// -1 if its metrics cannot be read.
double QueueDepth(const LocalCluster& cluster, int i) {
  auto text = HttpGet("127.0.0.1", cluster.daemon_metrics_port(i), "/metrics");
  if (!text.ok()) return -1;
  return FindSample(*text, "gradsync_daemon_queue_depth").value_or(-1);
}

// Whether daemon `i`'s log has a line containing `text`.
bool DaemonLogHas(const LocalCluster& cluster, int i, const std::string& text) {
  std::ifstream log(cluster.daemon_log(i));
  std::string line;
  while (std::getline(log, line)) {
    if (line.find(text) != std::string::npos) return true;
  }
  return false;
}

using OpQueueIntegration = testing::SharedClusterTest<2>;

TEST_F(OpQueueIntegration, CollectivesThroughTheQueueGiveCorrectResults) {
  auto job = OpenJob(*cluster_, "q-collectives", {0, 1});
  ASSERT_TRUE(job.ok()) << job.status();
  // Each session has its queue segment on its daemon.
  EXPECT_EQ(QueueSegments(*cluster_, 0).size(), 1u);
  EXPECT_EQ(QueueSegments(*cluster_, 1).size(), 1u);
  const CollectiveKind kinds[] = {CollectiveKind::kAllreduce, CollectiveKind::kBroadcast,
                                  CollectiveKind::kAllgather, CollectiveKind::kReduceScatter,
                                  CollectiveKind::kReduce, CollectiveKind::kBarrier,
                                  CollectiveKind::kGather, CollectiveKind::kScatter};
  for (CollectiveKind kind : kinds) {
    for (uint64_t count : {uint64_t{1}, uint64_t{1000}, uint64_t{65537}}) {
      if (kind == CollectiveKind::kBarrier && count > 1) continue;
      const uint64_t n = kind == CollectiveKind::kBarrier ? 0 : count;
      std::vector<std::string> errors(2);
      OnEveryRank(2, [&](int r) {
        auto& s = *(*job)[r].session;
        auto buf = s.AllocateBuffer(std::max<uint64_t>(1, BufferElements(kind, 2, n) * 4));
        if (!buf.ok()) return void(errors[r] = std::string(buf.status().message()));
        char* data = static_cast<char*>((*buf)->data());
        FillInput(kind, DType::kF32, r, 2, n, data);
        client::CollectiveSpec spec;
        spec.kind = kind;
        spec.buffer = buf->get();
        spec.count = n;
        spec.root = 1;
        spec.name = absl::StrCat(CollectiveName(kind), ".", n);
        auto res = s.Run(spec);
        if (!res.ok()) return void(errors[r] = std::string(res.status().message()));
        if (res->algorithm.empty()) errors[r] = "no algorithm reported";
        const uint64_t wrong = CountWrong(kind, DType::kF32, ReduceOp::kSum, 1, r, 2, n, data);
        if (wrong > 0) errors[r] = absl::StrCat(wrong, " wrong elements");
        (void)s.FreeBuffer(std::move(*buf));
      });
      for (int r = 0; r < 2; ++r) {
        EXPECT_EQ(errors[r], "") << CollectiveName(kind) << " count " << n << " rank " << r;
      }
    }
  }
  // Closing the session unlinks its queue at once.
  for (auto& r : *job) EXPECT_TRUE(r.session->Close().ok());
  EXPECT_TRUE(QueueSegments(*cluster_, 0).empty());
  EXPECT_TRUE(QueueSegments(*cluster_, 1).empty());
}

TEST_F(OpQueueIntegration, ManyAsyncOpsBeyondTheRingCapacityCompleteInOrder) {
  auto job = OpenJob(*cluster_, "q-async", {0, 1});
  ASSERT_TRUE(job.ok()) << job.status();
  constexpr int kOps = 1000;  // the rings hold 256: submissions and completions both wrap
  std::vector<std::string> errors(2);
  OnEveryRank(2, [&](int r) {
    auto& s = *(*job)[r].session;
    auto buf = s.AllocateBuffer(kOps * sizeof(int64_t));
    if (!buf.ok()) return void(errors[r] = std::string(buf.status().message()));
    int64_t* x = (*buf)->as<int64_t>();
    for (int i = 0; i < kOps; ++i) x[i] = i + r;
    std::vector<client::OpHandle> handles;
    for (int i = 0; i < kOps; ++i) {
      auto h = s.AllreduceAsync(**buf, i * sizeof(int64_t), 1, DType::kI64, ReduceOp::kSum,
                                absl::StrCat("e", i));
      if (!h.ok()) return void(errors[r] = absl::StrCat("submit ", i, ": ", h.status().message()));
      handles.push_back(*h);
    }
    // The last one first: once it is done, every earlier one must be too
    // (ops run in submission order), and their completions were kept.
    auto last = s.Wait(handles.back(), absl::Seconds(60));
    if (!last.ok()) return void(errors[r] = std::string(last.status().message()));
    for (int i = 0; i < kOps - 1; ++i) {
      auto done = s.Poll(handles[i]);
      if (!done.ok() || !*done) {
        return void(errors[r] = absl::StrCat("op ", i, " not done after op ", kOps - 1, ": ",
                                             done.ok() ? "running" : done.status().ToString()));
      }
    }
    for (int i = 0; i < kOps; ++i) {
      if (x[i] != 2 * i + 1) return void(errors[r] = absl::StrCat("element ", i, " = ", x[i]));
    }
  });
  EXPECT_EQ(errors[0], "");
  EXPECT_EQ(errors[1], "");
}

TEST_F(OpQueueIntegration, MismatchArrivesWithItsCodeAndMessageAndTheJobStaysUsable) {
  auto job = OpenJob(*cluster_, "q-mismatch", {0, 1}, /*op_timeout_ms=*/10000);
  ASSERT_TRUE(job.ok()) << job.status();
  std::vector<absl::Status> st(2);
  std::vector<absl::Status> again(2);
  OnEveryRank(2, [&](int r) {
    auto& s = *(*job)[r].session;
    auto b = s.AllocateBuffer(64 * sizeof(float));
    ASSERT_TRUE(b.ok());
    st[r] = s.Allreduce(**b, 0, r == 1 ? 60 : 64, DType::kF32, ReduceOp::kSum, "w").status();
    for (int i = 0; i < 64; ++i) (*b)->as<float>()[i] = 1.0f;
    again[r] = s.Allreduce(**b, 0, 64, DType::kF32, ReduceOp::kSum, "w").status();
    if (again[r].ok() && (*b)->as<float>()[63] != 2.0f) again[r] = absl::InternalError("wrong sum");
  });
  for (int r = 0; r < 2; ++r) {
    EXPECT_TRUE(absl::IsInvalidArgument(st[r])) << st[r];
    EXPECT_NE(st[r].message().find("op 1 does not match across ranks"), std::string::npos) << st[r];
    EXPECT_NE(st[r].message().find("rank 1 submitted allreduce 'w' f32[60] sum"), std::string::npos)
        << st[r];
    EXPECT_NE(st[r].message().find("rank 0 submitted allreduce 'w' f32[64] sum"), std::string::npos)
        << st[r];
    EXPECT_TRUE(again[r].ok()) << again[r];
  }
}

TEST_F(OpQueueIntegration, DaemonRefusalsArriveAsTheOpsError) {
  auto job = OpenJob(*cluster_, "q-refused", {0, 1});
  ASSERT_TRUE(job.ok()) << job.status();
  auto& s = *(*job)[0].session;
  auto buf = s.AllocateBuffer(64);
  ASSERT_TRUE(buf.ok());
  client::CollectiveSpec spec;
  spec.buffer = buf->get();
  spec.count = 4;
  spec.algorithm = "pairwise";  // does not implement allreduce: the daemon refuses it
  spec.name = "g";
  auto res = s.Run(spec);
  EXPECT_TRUE(absl::IsInvalidArgument(res.status())) << res.status();
  EXPECT_NE(res.status().message().find("'pairwise' does not implement allreduce"),
            std::string::npos)
      << res.status();
}

// The C API end to end: every option of a session, an allgather through
// gs_submit, its completion seen on the session's event fd (poll(2)), its
// plan in the result; over gRPC the fd is refused with the reason.
TEST_F(OpQueueIntegration, CApiSubmitsAnyCollectiveAndSignalsCompletionsOnAnEventFd) {
  std::vector<std::string> errors(2);
  OnEveryRank(2, [&](int r) {
    auto fail = [&](const std::string& what) { errors[r] = what + ": " + gs_last_error(); };
    gs_client* client = nullptr;
    if (gs_client_connect(cluster_->daemon_target(r).c_str(), 5000, &client) != GS_OK) {
      return fail("connect");
    }
    gs_session_options o;
    gs_session_options_init(&o);
    o.job_id = "q-c-api";
    o.world_size = 2;
    o.rank = r;
    o.timeout_ms = 20000;
    o.op_timeout_ms = 15000;
    o.client_name = "c api test";
    gs_session* session = nullptr;
    const int opened = gs_session_open_with(client, &o, &session);
    gs_client_free(client);
    if (opened != GS_OK) return fail("open");
    gs_buffer* buf = nullptr;
    constexpr size_t kCount = 300;
    if (gs_buffer_alloc(session, 2 * kCount * sizeof(int32_t), &buf) != GS_OK) return fail("alloc");
    auto* data = static_cast<int32_t*>(gs_buffer_data(buf));
    for (size_t i = 0; i < 2 * kCount; ++i) data[i] = -1;
    for (size_t i = 0; i < kCount; ++i) data[r * kCount + i] = static_cast<int32_t>(1000 * r + i);
    int fd = -1;
    if (gs_session_event_fd(session, &fd) != GS_OK) return fail("event fd");
    gs_collective_spec spec;
    gs_collective_spec_init(&spec);
    spec.kind = GS_ALLGATHER;
    spec.buffer = buf;
    spec.count = kCount;
    spec.dtype = GS_DTYPE_I32;
    spec.name = "blocks";
    uint64_t op = 0;
    if (gs_submit(session, &spec, &op) != GS_OK) return fail("submit");
    gs_result result;
    int rc = GS_DEADLINE_EXCEEDED;
    const absl::Time give_up = absl::Now() + absl::Seconds(20);
    while (rc == GS_DEADLINE_EXCEEDED && absl::Now() < give_up) {
      pollfd p{fd, POLLIN, 0};
      if (::poll(&p, 1, 1000) == 1) {
        uint64_t count = 0;
        (void)!::read(fd, &count, sizeof(count));
      }
      rc = gs_poll(session, op, &result);
    }
    if (rc != GS_OK) return fail("poll");
    if (std::string(result.algorithm).empty()) errors[r] = "no plan in the result";
    for (size_t b = 0; b < 2; ++b) {
      for (size_t i = 0; i < kCount; ++i) {
        if (data[b * kCount + i] != static_cast<int32_t>(1000 * b + i)) {
          errors[r] = absl::StrCat("block ", b, " element ", i, " is ", data[b * kCount + i]);
          break;
        }
      }
    }
    gs_collective_spec unset = spec;
    unset.struct_size = 0;
    if (gs_submit(session, &unset, &op) != GS_INVALID_ARGUMENT ||
        !absl::StrContains(gs_last_error(), "gs_collective_spec.struct_size is not set")) {
      errors[r] = absl::StrCat("unset struct_size: ", gs_last_error());
    }
    (void)gs_buffer_free(session, buf);
    (void)gs_session_close(session);
  });
  EXPECT_EQ(errors[0], "");
  EXPECT_EQ(errors[1], "");
}

TEST_F(OpQueueIntegration, ForcedGrpcChannelStillWorks) {
  ASSERT_EQ(::setenv("GRADSYNC_OP_CHANNEL", "grpc", 1), 0);
  auto job = OpenJob(*cluster_, "q-grpc", {0, 1});
  ::unsetenv("GRADSYNC_OP_CHANNEL");
  ASSERT_TRUE(job.ok()) << job.status();
  EXPECT_TRUE(QueueSegments(*cluster_, 0).empty());
  std::vector<std::string> errors(2);
  OnEveryRank(2, [&](int r) {
    auto& s = *(*job)[r].session;
    auto b = s.AllocateBuffer(sizeof(double));
    if (!b.ok()) return void(errors[r] = std::string(b.status().message()));
    *(*b)->as<double>() = 1.5;
    auto res = s.Allreduce(**b, 0, 1, DType::kF64, ReduceOp::kSum, "g");
    if (!res.ok()) return void(errors[r] = std::string(res.status().message()));
    if (*(*b)->as<double>() != 3.0) errors[r] = "wrong sum";
    absl::StatusOr<int> fd = s.CompletionFd();
    if (!absl::IsUnimplemented(fd.status()) ||
        !absl::StrContains(fd.status().message(), "GRADSYNC_OP_CHANNEL=grpc")) {
      errors[r] = absl::StrCat("completion fd over gRPC: ", fd.status().ToString());
    }
  });
  EXPECT_EQ(errors[0], "");
  EXPECT_EQ(errors[1], "");
}

TEST_F(OpQueueIntegration, RpcSubmitAndWaitStillWorkOnASessionWithAQueue) {
  auto job = OpenJob(*cluster_, "q-mixed", {0});
  ASSERT_TRUE(job.ok()) << job.status();
  auto& s = *(*job)[0].session;
  ASSERT_EQ(QueueSegments(*cluster_, 0).size(), 1u);
  auto buf = s.AllocateBuffer(2 * sizeof(int32_t));
  ASSERT_TRUE(buf.ok());
  (*buf)->as<int32_t>()[0] = 7;
  (*buf)->as<int32_t>()[1] = 9;
  // An op through the queue, then one through raw Worker RPCs, on one session.
  ASSERT_TRUE(s.Allreduce(**buf, 0, 1, DType::kI32, ReduceOp::kSum, "via-queue").ok());
  auto channel = grpc::CreateChannel(cluster_->daemon_target(0), grpc::InsecureChannelCredentials());
  auto stub = v1::Worker::NewStub(channel);
  v1::SubmitRequest sreq;
  sreq.set_session_id(s.id());
  sreq.set_collective(v1::COLLECTIVE_TYPE_ALLREDUCE);
  sreq.set_name("via-rpc");
  sreq.set_dtype(static_cast<v1::DataType>(DType::kI32));
  sreq.set_reduce_op(static_cast<v1::ReduceOp>(ReduceOp::kMax));
  sreq.set_count(1);
  sreq.set_buffer_id((*buf)->id());
  sreq.set_offset_bytes(sizeof(int32_t));
  v1::SubmitResponse sresp;
  grpc::ClientContext sctx;
  ASSERT_TRUE(stub->Submit(&sctx, sreq, &sresp).ok());
  EXPECT_GE(sresp.sequence(), 2u);
  v1::WaitRequest wreq;
  wreq.set_session_id(s.id());
  wreq.set_op_id(sresp.op_id());
  wreq.set_timeout_ms(10000);
  v1::WaitResponse wresp;
  grpc::ClientContext wctx;
  grpc::Status ws = stub->Wait(&wctx, wreq, &wresp);
  ASSERT_TRUE(ws.ok()) << ws.error_message();
  EXPECT_TRUE(wresp.done());
  EXPECT_EQ((*buf)->as<int32_t>()[1], 9);
  // And the queue keeps working after it.
  ASSERT_TRUE(s.Allreduce(**buf, 0, 1, DType::kI32, ReduceOp::kSum, "again").ok());
  EXPECT_EQ((*buf)->as<int32_t>()[0], 7);
}

TEST(OpQueueFailure, WaitOnADaemonThatWasKilledFailsWithUnavailableWithinSeconds) {
  auto cluster = StartCluster(2);
  ASSERT_NE(cluster, nullptr);
  auto job = OpenJob(*cluster, "q-kill", {0, 1}, /*op_timeout_ms=*/60000);
  ASSERT_TRUE(job.ok()) << job.status();
  auto& s = *(*job)[0].session;
  auto b = s.AllocateBuffer(16);
  ASSERT_TRUE(b.ok());
  // Rank 1 never submits, so rank 0's op stays pending until its daemon dies.
  auto op = s.AllreduceAsync(**b, 0, 4, DType::kF32, ReduceOp::kSum, "stuck");
  ASSERT_TRUE(op.ok()) << op.status();
  absl::Time killed_at;
  std::atomic<bool> held{false};
  std::thread killer([&] {
    // Daemon 0 holds the op (gradsync_daemon_queue_depth), waiting for rank 1.
    const absl::Time deadline = absl::Now() + absl::Seconds(20);
    while (!(held = QueueDepth(*cluster, 0) == 1) && absl::Now() < deadline) {
      absl::SleepFor(absl::Milliseconds(10));
    }
    killed_at = absl::Now();
    cluster->SignalDaemon(0, SIGKILL);
  });
  auto res = s.Wait(*op, absl::Seconds(30));
  const absl::Time failed_at = absl::Now();
  killer.join();
  EXPECT_TRUE(held) << "daemon 0 never held the op";
  EXPECT_TRUE(absl::IsUnavailable(res.status())) << res.status();
  EXPECT_EQ(res.status().message(),
            absl::StrCat("gradsyncd at ", cluster->daemon_target(0),
                         " stopped answering (no heartbeat for 3 s)"));
  EXPECT_LT(failed_at - killed_at, absl::Seconds(5));
  EXPECT_GE(failed_at - killed_at, absl::Seconds(2));
  // The killed daemon left nothing behind: its segments were memfds.
  EXPECT_TRUE(QueueSegments(*cluster, 0).empty());
}

TEST(OpQueueFailure, DaemonStoppingClosesTheQueueWithItsReasonAndUnlinksIt) {
  auto cluster = StartCluster(1);
  ASSERT_NE(cluster, nullptr);
  auto job = OpenJob(*cluster, "q-stop", {0});
  ASSERT_TRUE(job.ok()) << job.status();
  auto& s = *(*job)[0].session;
  auto b = s.AllocateBuffer(8);
  ASSERT_TRUE(b.ok());
  ASSERT_TRUE(s.Allreduce(**b, 0, 1, DType::kI64, ReduceOp::kSum, "before").ok());
  ASSERT_EQ(QueueSegments(*cluster, 0).size(), 1u);
  EXPECT_EQ(cluster->StopAll(), absl::OkStatus());  // SIGTERM: graceful
  EXPECT_TRUE(QueueSegments(*cluster, 0).empty());
  auto res = s.Allreduce(**b, 0, 1, DType::kI64, ReduceOp::kSum, "after");
  EXPECT_TRUE(absl::IsUnavailable(res.status())) << res.status();
  EXPECT_NE(res.status().message().find("daemon shutting down"), std::string::npos) << res.status();
}

TEST(OpQueueLease, QueueTrafficKeepsTheSessionAndAnIdleOneIsReaped) {
  auto cluster = StartCluster(1, {"--session_lease_ms=1000"});
  ASSERT_NE(cluster, nullptr);
  auto job = OpenJob(*cluster, "q-lease", {0});
  ASSERT_TRUE(job.ok()) << job.status();
  auto& s = *(*job)[0].session;
  auto b = s.AllocateBuffer(8);
  ASSERT_TRUE(b.ok());
  // 2.5 s of ops and no RPC at all: the queue counts as use.
  const absl::Time until = absl::Now() + absl::Milliseconds(2500);
  int ops = 0;
  while (absl::Now() < until) {
    auto res = s.Allreduce(**b, 0, 1, DType::kI64, ReduceOp::kSum, "tick");
    ASSERT_TRUE(res.ok()) << "after " << ops << " ops: " << res.status();
    ++ops;
    absl::SleepFor(absl::Milliseconds(100));
  }
  // Idle past the lease: the daemon closes the session and its queue (the
  // poller ends; its mapping goes when the next queue opens). The client
  // stays idle while the test waits for that in the daemon's log.
  const absl::Time deadline = absl::Now() + absl::Seconds(20);
  while (!DaemonLogHas(*cluster, 0, "op queue gradsync-queue-1 closed: session") &&
         absl::Now() < deadline) {
    absl::SleepFor(absl::Milliseconds(50));
  }
  EXPECT_TRUE(DaemonLogHas(*cluster, 0, "op queue gradsync-queue-1 closed: session"));
  auto res = s.Allreduce(**b, 0, 1, DType::kI64, ReduceOp::kSum, "late");
  EXPECT_TRUE(absl::IsFailedPrecondition(res.status())) << res.status();
  EXPECT_NE(res.status().message().find("was unused for 1s and closed"), std::string::npos)
      << res.status();
}

}  // namespace
}  // namespace gradsync
