// DirectPath: n ranks in one process, each with its own mesh connections
// over loopback TCP, and a fake channel standing in for its daemon.
#include "client/direct_path.h"

#include <cstring>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "client/op_path_testing.h"
#include "collective/algorithm.h"
#include "collective/op_signature.h"
#include "collective/reference.h"
#include "gtest/gtest.h"

namespace gradsync {
namespace client {
namespace internal {
namespace {

// n ranks of one job, connected.
struct Mesh {
  explicit Mesh(int n, absl::Duration op_timeout = absl::Seconds(20)) : channels(n), paths(n) {
    std::vector<std::unique_ptr<transport::TcpListener>> listeners(n);
    std::vector<HostPort> peers(n);
    for (int r = 0; r < n; ++r) {
      auto l = DirectPath::Listen();
      EXPECT_TRUE(l.ok()) << l.status();
      peers[r] = {"127.0.0.1", (*l)->port()};
      listeners[r] = std::move(*l);
      channels[r] = std::make_unique<FakeOpChannel>();
    }
    OnEveryRank(n, [&](int r) {
      DirectPathOptions o;
      o.job_id = "direct-test";
      o.epoch = 1;
      o.rank = r;
      o.world_size = n;
      o.peers = peers;
      o.connect_timeout = absl::Seconds(20);
      o.default_op_timeout = op_timeout;
      auto p = DirectPath::Connect(std::move(listeners[r]), o, channels[r].get(),
                                   absl::StrCat("s", r));
      EXPECT_TRUE(p.ok()) << p.status();
      if (p.ok()) paths[r] = std::move(*p);
    });
  }
  std::vector<std::unique_ptr<FakeOpChannel>> channels;
  std::vector<std::unique_ptr<DirectPath>> paths;
};

PathOp Barrier() {
  PathOp b;
  b.args.kind = CollectiveKind::kBarrier;
  b.args.name = "step";
  b.forced = kAutoCode;
  b.local = true;
  return b;
}

// Random floats: a reduction in any other order gives other bits, so this
// checks the order (the daemons' pattern for the world size: all-to-all at
// 2 ranks, recursive doubling from 3 with every rank on one host) as well as
// the data movement.
TEST(DirectPath, AllreduceGivesEveryRankTheDaemonsPatternResultBitForBit) {
  for (int n : {2, 3, 4, 5, 8}) {
    Mesh mesh(n);
    const SignaturePattern pattern = DefaultSignaturePattern(n, /*one_host=*/true);
    uint32_t seed = 7;
    for (DType t : {DType::kF32, DType::kF64, DType::kBF16, DType::kI32}) {
      for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kAvg, ReduceOp::kMax}) {
        for (size_t count : {size_t{1}, size_t{7}, size_t{1000}}) {
          std::vector<std::vector<char>> in(n), out(n);
          for (int r = 0; r < n; ++r) in[r] = testing::RandomData(t, count, r, seed);
          ++seed;
          const std::vector<char> want =
              testing::SignaturePatternReference(pattern, in, t, op, count);
          std::vector<std::string> errors(n);
          OnEveryRank(n, [&](int r) {
            out[r] = in[r];
            auto res = RunOp(*mesh.paths[r], Allreduce(out[r], count, t, op, "g"));
            if (!res.ok()) return void(errors[r] = res.status().ToString());
            if (res->algorithm != "direct") errors[r] = "algorithm " + res->algorithm;
          });
          for (int r = 0; r < n; ++r) {
            ASSERT_EQ(errors[r], "") << n << " ranks " << DTypeName(t) << " " << ReduceOpName(op);
            ASSERT_EQ(std::memcmp(out[r].data(), want.data(), want.size()), 0)
                << "rank " << r << " of " << n << " " << DTypeName(t) << " " << ReduceOpName(op)
                << " count " << count;
          }
        }
      }
    }
    // What the daemon counts and shows of them.
    ipc::OpCounters* c = mesh.channels[0]->DirectCounters(ipc::kOpCounterAllreduce);
    EXPECT_EQ(c->ok.load(), 4u * 3 * 3);
    EXPECT_EQ(mesh.channels[0]->last().seq, 4u * 3 * 3);
    EXPECT_EQ(mesh.channels[0]->last().name, "g");
    EXPECT_EQ(mesh.channels[0]->last().code, 0);
    EXPECT_EQ(mesh.channels[0]->current().seq, 0u);
    EXPECT_EQ(mesh.channels[0]->in_flight(), 0u);
    EXPECT_TRUE(mesh.channels[0]->sent().empty());  // nothing reached the daemon
  }
}

TEST(DirectPath, ABarrierReturnsOnlyOnceEveryRankReachedIt) {
  Mesh mesh(4);
  std::vector<absl::Duration> took(4);
  const absl::Time start = absl::Now();
  OnEveryRank(4, [&](int r) {
    if (r == 3) absl::SleepFor(absl::Milliseconds(100));
    auto res = RunOp(*mesh.paths[r], Barrier());
    ASSERT_TRUE(res.ok()) << res.status();
    EXPECT_EQ(res->algorithm, "direct");
    took[r] = absl::Now() - start;
  });
  for (int r = 0; r < 3; ++r) EXPECT_GE(took[r], absl::Milliseconds(95)) << r;
  EXPECT_EQ(mesh.channels[0]->DirectCounters(ipc::kOpCounterBarrier)->ok.load(), 1u);
}

// Rank 1's op is too large for the direct path (the daemon would run it),
// the others' are not: all read the same signatures and fail alike; the op
// never reaches a daemon, and the path goes on.
TEST(DirectPath, AMismatchIsTheSameInvalidArgumentOnEveryRankAndThePathGoesOn) {
  Mesh mesh(3);
  std::vector<absl::Status> st(3);
  std::vector<std::vector<char>> bufs(3, std::vector<char>(1 << 20));
  OnEveryRank(3, [&](int r) {
    const bool big = r == 1;
    st[r] = RunOp(*mesh.paths[r], Allreduce(bufs[r], big ? 200000 : 64, DType::kF32,
                                            ReduceOp::kSum, "w", 1, 0, /*local=*/!big))
                .status();
  });
  for (int r = 0; r < 3; ++r) {
    EXPECT_TRUE(absl::IsInvalidArgument(st[r])) << st[r];
    EXPECT_EQ(st[r].message(),
              "op 1 does not match across ranks: rank 1 submitted allreduce 'w' f32[200000] sum, "
              "ranks 0,2 submitted allreduce 'w' f32[64] sum");
    EXPECT_TRUE(mesh.channels[r]->sent().empty()) << r;
    EXPECT_EQ(mesh.channels[r]->last().code, static_cast<int>(absl::StatusCode::kInvalidArgument));
  }
  // Counted for the daemon: a failed direct op on ranks 0 and 2, a daemon op
  // that failed before it reached the daemon on rank 1.
  const int invalid = static_cast<int>(absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(mesh.channels[0]->DirectCounters(ipc::kOpCounterAllreduce)->failed[invalid].load(), 1u);
  EXPECT_EQ(mesh.channels[1]->DirectCounters(ipc::kOpCounterAllreduce)->failed[invalid].load(), 0u);
  EXPECT_EQ(mesh.channels[1]->unsent(CollectiveKind::kAllreduce, absl::StatusCode::kInvalidArgument),
            1u);
  OnEveryRank(3, [&](int r) {
    float* x = reinterpret_cast<float*>(bufs[r].data());
    x[0] = static_cast<float>(r + 1);
    auto res = RunOp(*mesh.paths[r], Allreduce(bufs[r], 1, DType::kF32, ReduceOp::kSum, "w"));
    ASSERT_TRUE(res.ok()) << res.status();
    EXPECT_EQ(x[0], 6.0f);
  });
}

// A daemon op goes to the daemon only once every rank submitted a matching
// one, with its number; the daemon's answer is the op's.
TEST(DirectPath, DaemonOpsReachTheDaemonOnlyOnceEveryRankAgrees) {
  Mesh mesh(3);
  std::vector<std::vector<char>> bufs(3, std::vector<char>(1 << 20));
  std::vector<uint64_t> ids(3);
  for (int r : {0, 1}) {
    auto t = mesh.paths[r]->Submit(
        Allreduce(bufs[r], 200000, DType::kF32, ReduceOp::kSum, "big", 1, 0, /*local=*/false));
    ASSERT_TRUE(t.ok()) << t.status();
    ids[r] = t->op_id;
  }
  // Rank 2 has not submitted: nothing reaches a daemon, whoever waits.
  auto early = mesh.paths[0]->Wait(ids[0], absl::Now() + absl::Milliseconds(300));
  ASSERT_TRUE(early.ok()) << early.status();
  EXPECT_FALSE(early->done);
  for (int r = 0; r < 3; ++r) EXPECT_TRUE(mesh.channels[r]->sent().empty()) << r;
  EXPECT_EQ(mesh.channels[1]->current().seq, 1u);  // the daemon's status shows it
  auto t2 = mesh.paths[2]->Submit(
      Allreduce(bufs[2], 200000, DType::kF32, ReduceOp::kSum, "big", 1, 0, /*local=*/false));
  ASSERT_TRUE(t2.ok()) << t2.status();
  ids[2] = t2->op_id;
  OnEveryRank(3, [&](int r) {
    // The daemon runs it once it has it.
    const absl::Time end = absl::Now() + absl::Seconds(10);
    while (mesh.channels[r]->sent().empty() && absl::Now() < end) {
      (void)mesh.paths[r]->Wait(ids[r], absl::Now() + absl::Milliseconds(5));
    }
    ASSERT_EQ(mesh.channels[r]->sent(), std::vector<uint64_t>{1}) << r;
    mesh.channels[r]->Complete(1);
    auto res = mesh.paths[r]->Wait(ids[r], absl::Now() + absl::Seconds(10));
    ASSERT_TRUE(res.ok()) << res.status();
    EXPECT_TRUE(res->done);
    EXPECT_EQ(res->algorithm, "hier");  // the daemon's
    EXPECT_EQ(mesh.channels[r]->current().seq, 0u);
  });
}

// A direct op on bytes an earlier daemon op uses waits for it (its data are
// read when its exchange starts).
TEST(DirectPath, ADirectOpWaitsForAnEarlierDaemonOpOnTheSameBytes) {
  Mesh mesh(2);
  std::vector<std::vector<char>> bufs(2, std::vector<char>(1 << 20));
  std::vector<uint64_t> daemon_ids(2), direct_ids(2);
  OnEveryRank(2, [&](int r) {
    auto d = mesh.paths[r]->Submit(
        Allreduce(bufs[r], 200000, DType::kF32, ReduceOp::kSum, "big", 1, 0, /*local=*/false));
    ASSERT_TRUE(d.ok()) << d.status();
    daemon_ids[r] = d->op_id;
    auto s = mesh.paths[r]->Submit(Allreduce(bufs[r], 4, DType::kF32, ReduceOp::kSum, "small"));
    ASSERT_TRUE(s.ok()) << s.status();
    direct_ids[r] = s->op_id;
    auto w = mesh.paths[r]->Wait(direct_ids[r], absl::Now() + absl::Milliseconds(300));
    ASSERT_TRUE(w.ok()) << w.status();
    EXPECT_FALSE(w->done) << r;
    EXPECT_EQ(mesh.channels[r]->sent(), std::vector<uint64_t>{1}) << r;
  });
  OnEveryRank(2, [&](int r) {
    float* x = reinterpret_cast<float*>(bufs[r].data());
    x[0] = static_cast<float>(10 * (r + 1));  // the daemon op's "result"
    mesh.channels[r]->Complete(1);
    auto w = mesh.paths[r]->Wait(direct_ids[r], absl::Now() + absl::Seconds(10));
    ASSERT_TRUE(w.ok()) << w.status();
    EXPECT_TRUE(w->done);
    EXPECT_EQ(x[0], 30.0f);  // read after the daemon op finished
    auto d = mesh.paths[r]->Wait(daemon_ids[r], absl::Now() + absl::Seconds(10));
    ASSERT_TRUE(d.ok()) << d.status();
    EXPECT_TRUE(d->done);
  });
}

// A rank that submits and goes on with other work still forwards the
// others' messages (recursive doubling at 4 ranks needs every rank in every
// round): their ops complete while it is away.
TEST(DirectPath, ARankThatSubmitsAndGoesOnDoesNotHoldTheOthersUp) {
  Mesh mesh(4);
  std::vector<std::vector<char>> bufs(4, std::vector<char>(16));
  for (int r = 0; r < 4; ++r) reinterpret_cast<float*>(bufs[r].data())[0] = static_cast<float>(r + 1);
  auto away = mesh.paths[0]->Submit(Allreduce(bufs[0], 1, DType::kF32, ReduceOp::kSum, "g"));
  ASSERT_TRUE(away.ok()) << away.status();
  OnEveryRank(3, [&](int i) {
    const int r = i + 1;
    auto res = RunOp(*mesh.paths[r], Allreduce(bufs[r], 1, DType::kF32, ReduceOp::kSum, "g"));
    ASSERT_TRUE(res.ok()) << res.status();
    EXPECT_EQ(reinterpret_cast<float*>(bufs[r].data())[0], 10.0f);
  });
  auto res = mesh.paths[0]->Wait(away->op_id, absl::Now() + absl::Seconds(10));
  ASSERT_TRUE(res.ok()) << res.status();
  EXPECT_TRUE(res->done);
  EXPECT_EQ(reinterpret_cast<float*>(bufs[0].data())[0], 10.0f);
}

// Many ops submitted before any wait (a step's buckets): they queue behind
// each other's exchanges and all complete, each with its own sum.
TEST(DirectPath, ManyOpsSubmittedBeforeAnyWaitAllComplete) {
  constexpr int kOps = 500;
  Mesh mesh(4);
  std::vector<std::vector<char>> bufs(4, std::vector<char>(kOps * sizeof(float)));
  OnEveryRank(4, [&](int r) {
    float* x = reinterpret_cast<float*>(bufs[r].data());
    std::vector<uint64_t> ids;
    for (int i = 0; i < kOps; ++i) {
      x[i] = static_cast<float>(i * (r + 1));
      auto t = mesh.paths[r]->Submit(Allreduce(bufs[r], 1, DType::kF32, ReduceOp::kSum,
                                               "bucket", 1, i * sizeof(float)));
      ASSERT_TRUE(t.ok()) << t.status();
      ids.push_back(t->op_id);
    }
    for (int i = 0; i < kOps; ++i) {
      auto res = mesh.paths[r]->Wait(ids[i], absl::Now() + absl::Seconds(30));
      ASSERT_TRUE(res.ok()) << "op " << ids[i] << ": " << res.status();
      ASSERT_TRUE(res->done) << "op " << ids[i];
      ASSERT_EQ(x[i], static_cast<float>(i * 10)) << "op " << ids[i];
    }
  });
}

// A rank that never submits: the others' op times out naming it; the path
// is out of step then, so it fails, and so do later submissions.
TEST(DirectPath, AMissingRankTimesOutNamingItAndFailsThePath) {
  Mesh mesh(2, /*op_timeout=*/absl::Milliseconds(500));
  std::vector<char> buf(16);
  auto res = RunOp(*mesh.paths[0], Allreduce(buf, 4, DType::kF32, ReduceOp::kSum, "g"));
  EXPECT_TRUE(absl::IsDeadlineExceeded(res.status())) << res.status();
  EXPECT_EQ(res.status().message(),
            "allreduce 'g' f32[4] sum (op 1) failed at rank 0: timed out at rank 0 waiting for "
            "rank(s) 1 to submit op 1 (allreduce 'g' f32[4] sum)");
  EXPECT_EQ(mesh.channels[0]->last().code, static_cast<int>(absl::StatusCode::kDeadlineExceeded));
  auto again = mesh.paths[0]->Submit(Allreduce(buf, 4, DType::kF32, ReduceOp::kSum, "g"));
  EXPECT_TRUE(absl::IsFailedPrecondition(again.status())) << again.status();
  EXPECT_NE(again.status().message().find("the direct path failed (open a new session)"),
            std::string::npos)
      << again.status();
  // Rank 1 heard why.
  auto late = RunOp(*mesh.paths[1], Allreduce(buf, 4, DType::kF32, ReduceOp::kSum, "g"));
  EXPECT_FALSE(late.ok());
  EXPECT_NE(late.status().message().find("aborted by rank 0"), std::string::npos) << late.status();
}

// The daemon stopped answering: the ops that have not reached it fail with
// its reason, as its own do, and the peers hear it.
TEST(DirectPath, ADaemonThatStoppedFailsTheOpsInFlightWithItsReason) {
  Mesh mesh(2);
  std::vector<char> buf(16);
  auto t = mesh.paths[0]->Submit(Allreduce(buf, 4, DType::kF32, ReduceOp::kSum, "g"));
  ASSERT_TRUE(t.ok()) << t.status();
  const absl::Status gone = absl::UnavailableError("gradsyncd at unix:x stopped answering");
  mesh.channels[0]->SetAlive(gone);
  const absl::Time start = absl::Now();
  auto res = mesh.paths[0]->Wait(t->op_id, absl::Now() + absl::Seconds(10));
  EXPECT_EQ(res.status(), gone);
  EXPECT_LT(absl::Now() - start, absl::Seconds(2));
  auto peer = RunOp(*mesh.paths[1], Allreduce(buf, 4, DType::kF32, ReduceOp::kSum, "g"));
  EXPECT_FALSE(peer.ok());
  EXPECT_NE(peer.status().message().find("aborted by rank 0: gradsyncd at unix:x stopped answering"),
            std::string::npos)
      << peer.status();
}

// The job's epoch failed (a rank's daemon died, say): the daemon refuses
// the session's ops with FailedPrecondition, and the ops waiting in the
// clients' exchange fail with that reason too, without waiting for their
// deadline (here rank 1 never submits).
TEST(DirectPath, AFailedEpochFailsTheOpsInFlightWithItsReason) {
  Mesh mesh(2);
  std::vector<char> buf(16);
  auto t = mesh.paths[0]->Submit(Allreduce(buf, 4, DType::kF32, ReduceOp::kSum, "g"));
  ASSERT_TRUE(t.ok()) << t.status();
  const absl::Status failed = absl::FailedPreconditionError(
      "job 'j' epoch 1 is no longer usable (open a new session): rank 1 missed heartbeats");
  mesh.channels[0]->SetHealth(failed);
  const absl::Time start = absl::Now();
  auto res = mesh.paths[0]->Wait(t->op_id, absl::Now() + absl::Seconds(10));
  EXPECT_EQ(res.status(), failed);
  EXPECT_LT(absl::Now() - start, absl::Seconds(2));
}

// The daemon takes no new ops for the session (it drains): new submissions
// are refused with its reason, the op submitted before completes, and the
// path works again once the daemon takes ops.
TEST(DirectPath, ARefusalRefusesNewOpsAndTheOpsBeforeItGoOn) {
  Mesh mesh(2);
  std::vector<std::vector<char>> bufs(2, std::vector<char>(16));
  for (int r = 0; r < 2; ++r) reinterpret_cast<float*>(bufs[r].data())[0] = 1.0f;
  auto before = mesh.paths[0]->Submit(Allreduce(bufs[0], 1, DType::kF32, ReduceOp::kSum, "g"));
  ASSERT_TRUE(before.ok()) << before.status();
  const absl::Status draining = absl::UnavailableError("daemon draining");
  mesh.channels[0]->SetHealth(draining);
  auto refused = mesh.paths[0]->Submit(Allreduce(bufs[0], 1, DType::kF32, ReduceOp::kSum, "g"));
  EXPECT_EQ(refused.status(), draining);
  ASSERT_TRUE(RunOp(*mesh.paths[1], Allreduce(bufs[1], 1, DType::kF32, ReduceOp::kSum, "g")).ok());
  auto res = mesh.paths[0]->Wait(before->op_id, absl::Now() + absl::Seconds(10));
  ASSERT_TRUE(res.ok()) << res.status();
  EXPECT_EQ(reinterpret_cast<float*>(bufs[0].data())[0], 2.0f);
  mesh.channels[0]->SetHealth(absl::OkStatus());
  OnEveryRank(2, [&](int r) {
    ASSERT_TRUE(RunOp(*mesh.paths[r], Allreduce(bufs[r], 1, DType::kF32, ReduceOp::kSum, "g")).ok());
    EXPECT_EQ(reinterpret_cast<float*>(bufs[r].data())[0], 4.0f);
  });
}

}  // namespace
}  // namespace internal
}  // namespace client
}  // namespace gradsync
