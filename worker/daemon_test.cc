// Unit tests of Daemon (worker/daemon.h) in one process: a real coordinator
// (server/coordinator_service.h) on 127.0.0.1 port 0, plaintext as in
// server/coordinator_service_test.cc, and one or two daemons whose data
// planes listen on loopback. The tests drive the daemon's C++ API directly,
// the way worker/worker_service.cc does, and map its buffers as a client
// would (the sealed memfd of AllocateBuffer(by_descriptor)). No sleeps:
// every wait is on a condition with a deadline.
#include "worker/daemon.h"

#include <sys/mman.h>

#include <cstring>
#include <functional>
#include <future>
#include <memory>
#include <string>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "ipc/shared_memory.h"
#include "server/coordinator_service.h"
#include "worker/daemon_testing.h"

namespace gradsync {
namespace {

using ::testing::AllOf;
using ::testing::AnyOf;
using ::testing::HasSubstr;
using ::testing::StartsWith;

using testing_daemon::Allreduce;
using testing_daemon::DaemonTest;
using testing_daemon::Eventually;
using testing_daemon::MappedBuffer;
using testing_daemon::RunToEnd;

TEST_F(DaemonTest, OpensAOneRankJobAndNamesItsRankEpochAndSession) {
  std::unique_ptr<Daemon> d = StartDaemon("node-a");
  ASSERT_NE(d, nullptr);
  EXPECT_GT(d->data_port(), 0);
  EXPECT_EQ(d->coordinator(), coordinator_->address());
  EXPECT_EQ(d->node_id(), "node-a");
  EXPECT_EQ(d->advertise_host(), "127.0.0.1");

  auto s = d->OpenSession(Args("solo", 1, -1));
  ASSERT_TRUE(s.ok()) << s.status();
  const SessionInfo& info = (*s)->info();
  EXPECT_THAT(info.session_id, StartsWith("node-a-"));
  EXPECT_EQ(info.job_id, "solo");
  EXPECT_EQ(info.rank, 0);
  EXPECT_EQ(info.world_size, 1);
  EXPECT_GE(info.epoch, 1);
  EXPECT_FALSE(info.job_key.empty());
  EXPECT_FALSE(info.registration_token.empty());
  EXPECT_THAT(info.transport, StartsWith("local"));
  EXPECT_TRUE((*s)->health().ok()) << (*s)->health();

  EXPECT_EQ(d->session_count(), 1u);
  auto found = d->FindSession(info.session_id);
  ASSERT_TRUE(found.ok()) << found.status();
  EXPECT_EQ(found->get(), s->get());
  std::vector<SessionStatus> status = d->Status();
  ASSERT_EQ(status.size(), 1u);
  EXPECT_EQ(status[0].info.session_id, info.session_id);
  EXPECT_TRUE(status[0].health.ok());

  // A one-rank allreduce runs and leaves the data as it was.
  auto buf = MappedBuffer::Allocate(**s, 64 * sizeof(float));
  ASSERT_TRUE(buf.ok()) << buf.status();
  for (int k = 0; k < 64; ++k) (*buf)->as<float>()[k] = 0.25f * static_cast<float>(k);
  auto id = (*s)->Submit(Allreduce(**buf, 64, "solo-g"));
  ASSERT_TRUE(id.ok()) << id.status();
  EXPECT_EQ(*id, 1u);
  EXPECT_TRUE(RunToEnd(**s, *id).ok());
  for (int k = 0; k < 64; ++k) ASSERT_EQ((*buf)->as<float>()[k], 0.25f * static_cast<float>(k));

  EXPECT_TRUE(d->CloseSession(info.session_id).ok());
  EXPECT_EQ(d->session_count(), 0u);
  EXPECT_TRUE((*s)->closed());
  auto gone = d->FindSession(info.session_id);
  EXPECT_EQ(gone.status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(gone.status().message(), absl::StrCat("no session '", info.session_id, "' on this daemon"));
  EXPECT_EQ(d->CloseSession(info.session_id).code(), absl::StatusCode::kNotFound);
}

TEST_F(DaemonTest, TwoDaemonsFormAJobAndTheirAllreduceIsBitExact) {
  std::unique_ptr<Daemon> a = StartDaemon("node-a");
  std::unique_ptr<Daemon> b = StartDaemon("node-b");
  ASSERT_NE(a, nullptr);
  ASSERT_NE(b, nullptr);
  std::vector<std::shared_ptr<Session>> s = OpenJob({a.get(), b.get()}, "pair");
  ASSERT_EQ(s.size(), 2u);
  for (int r = 0; r < 2; ++r) {
    const SessionInfo& info = s[r]->info();
    EXPECT_EQ(info.rank, r);
    EXPECT_EQ(info.world_size, 2);
    EXPECT_EQ(info.epoch, s[0]->info().epoch);
    EXPECT_EQ(info.job_key, s[0]->info().job_key);
    EXPECT_THAT(info.transport, StartsWith("tcp")) << "rank " << r;
  }
  EXPECT_THAT(s[0]->info().session_id, StartsWith("node-a-"));
  EXPECT_THAT(s[1]->info().session_id, StartsWith("node-b-"));

  // An odd count, so the ring's chunks are uneven; values whose sums are
  // exact in f32, and a reference computed with the same float addition.
  constexpr uint64_t kCount = 4099;
  std::vector<std::unique_ptr<MappedBuffer>> bufs;
  for (int r = 0; r < 2; ++r) {
    auto buf = MappedBuffer::Allocate(*s[r], kCount * sizeof(float));
    ASSERT_TRUE(buf.ok()) << buf.status();
    bufs.push_back(*std::move(buf));
  }
  std::vector<float> want(kCount);
  for (uint64_t k = 0; k < kCount; ++k) {
    const float x0 = 0.5f * static_cast<float>(k % 977) - 100.0f;
    const float x1 = 0.125f * static_cast<float>(k % 31) + 3.0f;
    bufs[0]->as<float>()[k] = x0;
    bufs[1]->as<float>()[k] = x1;
    want[k] = x0 + x1;
  }
  std::vector<uint64_t> ids(2);
  for (int r = 0; r < 2; ++r) {
    auto id = s[r]->Submit(Allreduce(*bufs[r], kCount, "g"));
    ASSERT_TRUE(id.ok()) << "rank " << r << ": " << id.status();
    ids[r] = *id;
  }
  for (int r = 0; r < 2; ++r) {
    absl::StatusOr<OpOutcome> out = s[r]->Wait(ids[r], absl::Seconds(5));
    ASSERT_TRUE(out.ok()) << out.status();
    ASSERT_TRUE(out->done) << "rank " << r;
    EXPECT_TRUE(out->status.ok()) << "rank " << r << ": " << out->status;
    EXPECT_FALSE(out->algorithm.empty());
    EXPECT_EQ(std::memcmp(bufs[r]->as<float>(), want.data(), kCount * sizeof(float)), 0)
        << "rank " << r;
  }
  // The next op on the same epoch too (i32 this time).
  for (int r = 0; r < 2; ++r) {
    for (uint64_t k = 0; k < kCount; ++k) {
      bufs[r]->as<int32_t>()[k] = static_cast<int32_t>((r + 1) * (k + 7));
    }
  }
  for (int r = 0; r < 2; ++r) {
    auto id = s[r]->Submit(Allreduce(*bufs[r], kCount, "g-i32", DType::kI32));
    ASSERT_TRUE(id.ok()) << id.status();
    ids[r] = *id;
  }
  for (int r = 0; r < 2; ++r) {
    ASSERT_TRUE(RunToEnd(*s[r], ids[r]).ok()) << "rank " << r;
    for (uint64_t k = 0; k < kCount; ++k) {
      ASSERT_EQ(bufs[r]->as<int32_t>()[k], static_cast<int32_t>(3 * (k + 7)))
          << "rank " << r << " element " << k;
    }
  }
}

// Four daemons on two "hosts" (127.0.0.1 and 127.0.0.2, two each): a large
// allreduce runs in two levels over real TCP ("2level": within each host,
// then across), bit-exact; a small one runs flat.
TEST_F(DaemonTest, DaemonsOnTwoHostsAllreduceInTwoLevelsOverTcp) {
  std::vector<std::unique_ptr<Daemon>> d;
  for (int i = 0; i < 4; ++i) {
    d.push_back(StartDaemon(absl::StrCat("node-", i), absl::Minutes(2), nullptr,
                            i < 2 ? "127.0.0.1" : "127.0.0.2"));
    ASSERT_NE(d.back(), nullptr);
  }
  std::vector<std::shared_ptr<Session>> s =
      OpenJob({d[0].get(), d[1].get(), d[2].get(), d[3].get()}, "two-hosts");
  ASSERT_EQ(s.size(), 4u);
  constexpr uint64_t kCount = (1 << 20) / sizeof(int32_t) + 5;  // above the 1 MiB threshold
  for (uint64_t count : {kCount, uint64_t{1000}}) {
    std::vector<std::unique_ptr<MappedBuffer>> bufs;
    for (int r = 0; r < 4; ++r) {
      auto buf = MappedBuffer::Allocate(*s[r], count * sizeof(int32_t));
      ASSERT_TRUE(buf.ok()) << buf.status();
      for (uint64_t k = 0; k < count; ++k) {
        (*buf)->as<int32_t>()[k] = static_cast<int32_t>((r + 1) * (k % 1009) - 7 * r);
      }
      bufs.push_back(*std::move(buf));
    }
    std::vector<uint64_t> ids(4);
    for (int r = 0; r < 4; ++r) {
      auto id = s[r]->Submit(Allreduce(*bufs[r], count, absl::StrCat("g", count), DType::kI32));
      ASSERT_TRUE(id.ok()) << id.status();
      ids[r] = *id;
    }
    for (int r = 0; r < 4; ++r) {
      absl::StatusOr<OpOutcome> out = s[r]->Wait(ids[r], absl::Seconds(20));
      ASSERT_TRUE(out.ok()) << out.status();
      ASSERT_TRUE(out->done && out->status.ok()) << "rank " << r << ": " << out->status;
      EXPECT_EQ(out->algorithm == "2level", count == kCount) << "ran " << out->algorithm;
      for (uint64_t k = 0; k < count; ++k) {
        ASSERT_EQ(bufs[r]->as<int32_t>()[k], static_cast<int32_t>(10 * (k % 1009) - 42))
            << "rank " << r << " element " << k;
      }
    }
  }
}

TEST_F(DaemonTest, RefusesASessionOfABadShapeNamingTheCause) {
  std::unique_ptr<Daemon> d = StartDaemon("node-a");
  ASSERT_NE(d, nullptr);
  auto zero = d->OpenSession(Args("bad", 0, 0));
  EXPECT_EQ(zero.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(zero.status().message(), "world_size 0 out of range [1, 4096]");

  auto huge = d->OpenSession(Args("bad", 4097, 0));
  EXPECT_EQ(huge.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(huge.status().message(), "world_size 4097 out of range [1, 4096]");

  auto rank = d->OpenSession(Args("bad", 2, 2));
  EXPECT_EQ(rank.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(rank.status().message(), "rank 2 out of range for world size 2 (-1 = any)");

  auto negative = d->OpenSession(Args("bad", 2, -2));
  EXPECT_EQ(negative.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(negative.status().message(), "rank -2 out of range for world size 2 (-1 = any)");

  OpenSessionArgs streams = Args("bad", 1, 0);
  streams.tcp_streams = 17;
  auto many = d->OpenSession(streams);
  EXPECT_EQ(many.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(many.status().message(), "tcp_streams 17 out of range [0, 16]");

  OpenSessionArgs elsewhere = Args("bad", 1, 0);
  elsewhere.expected_coordinator = "127.0.0.1:1";
  auto other = d->OpenSession(elsewhere);
  EXPECT_EQ(other.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(other.status().message()),
              HasSubstr(absl::StrCat("joins jobs at coordinator '", coordinator_->address(),
                                     "', not at '127.0.0.1:1'")));
  EXPECT_EQ(d->session_count(), 0u);
}

TEST_F(DaemonTest, ClosingASessionFailsTheOtherDaemonsPendingOpNamingTheRank) {
  std::unique_ptr<Daemon> a = StartDaemon("node-a");
  std::unique_ptr<Daemon> b = StartDaemon("node-b");
  ASSERT_NE(a, nullptr);
  ASSERT_NE(b, nullptr);
  std::vector<std::shared_ptr<Session>> s = OpenJob({a.get(), b.get()}, "orphan");
  ASSERT_EQ(s.size(), 2u);
  auto buf = MappedBuffer::Allocate(*s[1], 16 * sizeof(float));
  ASSERT_TRUE(buf.ok()) << buf.status();
  auto id = s[1]->Submit(Allreduce(**buf, 16, "pending"));
  ASSERT_TRUE(id.ok()) << id.status();
  // Rank 1's executor took the op and waits for rank 0, which never submits.
  ASSERT_TRUE(Eventually([&] {
    std::vector<SessionStatus> st = b->Status();
    return st.size() == 1 && st[0].has_current && st[0].current_seq == *id;
  }));
  std::vector<SessionStatus> st = b->Status();
  ASSERT_EQ(st.size(), 1u);
  EXPECT_EQ(st[0].phase, "negotiating");
  EXPECT_EQ(st[0].missing, std::vector<int>{0});

  ASSERT_TRUE(a->CloseSession(s[0]->info().session_id).ok());
  EXPECT_EQ(a->session_count(), 0u);
  // Its client lets go of it too (as the gRPC edge does): that was daemon
  // a's last session of the job, so its executor and connections go.
  s[0].reset();
  // Well before the op's timeout (the job's default, 60 s). A closing
  // session sends no ABORT of its own (JobExecutor::Detach): daemon b learns
  // of it when daemon a's executor, and its connections, go.
  const absl::Status failed = RunToEnd(*s[1], *id);
  EXPECT_FALSE(failed.ok());
  EXPECT_THAT(std::string(failed.message()),
              AllOf(HasSubstr("allreduce 'pending' f32[16] sum (op 1) failed at rank 1"),
                    AnyOf(HasSubstr("connection to rank 0 lost"),
                          HasSubstr("rank 0 closed its session"))))
      << failed;
  // The epoch is broken: the next op is refused, naming why.
  auto next = s[1]->Submit(Allreduce(**buf, 16, "next"));
  EXPECT_EQ(next.status().code(), absl::StatusCode::kFailedPrecondition) << next.status();
  EXPECT_THAT(std::string(next.status().message()), HasSubstr("open a new session"));
  EXPECT_FALSE(s[1]->health().ok());
}

TEST_F(DaemonTest, AnUnusedSessionIsClosedAtItsLeaseAndTheListenerHearsWhy) {
  std::unique_ptr<Daemon> d = StartDaemon("node-a", /*session_lease=*/absl::Milliseconds(100));
  ASSERT_NE(d, nullptr);
  absl::Mutex mu;
  std::vector<std::pair<std::string, absl::Status>> closed;
  d->SetSessionClosedListener([&](const std::string& id, const absl::Status& why) {
    absl::MutexLock l(&mu);
    closed.emplace_back(id, why);
  });
  auto s = d->OpenSession(Args("idle", 1, 0));
  ASSERT_TRUE(s.ok()) << s.status();
  const std::string id = (*s)->info().session_id;
  // The listener hears of it last (after the session left the daemon's
  // table and closed).
  ASSERT_TRUE(Eventually([&] {
    absl::MutexLock l(&mu);
    return !closed.empty();
  }));
  EXPECT_EQ(d->session_count(), 0u);
  EXPECT_TRUE((*s)->closed());
  {
    absl::MutexLock l(&mu);
    ASSERT_EQ(closed.size(), 1u);
    EXPECT_EQ(closed[0].first, id);
    EXPECT_EQ(closed[0].second.code(), absl::StatusCode::kFailedPrecondition);
    EXPECT_EQ(closed[0].second.message(),
              absl::StrCat("session ", id, " was unused for 100ms and closed"));
  }
  d->SetSessionClosedListener(nullptr);
  EXPECT_EQ(d->FindSession(id).status().code(), absl::StatusCode::kNotFound);
}

TEST_F(DaemonTest, DrainRefusesNewWorkAndWaitsForTheRunningOp) {
  std::unique_ptr<Daemon> a = StartDaemon("node-a");
  std::unique_ptr<Daemon> b = StartDaemon("node-b");
  ASSERT_NE(a, nullptr);
  ASSERT_NE(b, nullptr);
  std::vector<std::shared_ptr<Session>> s = OpenJob({a.get(), b.get()}, "drain");
  ASSERT_EQ(s.size(), 2u);
  std::vector<std::unique_ptr<MappedBuffer>> bufs;
  for (int r = 0; r < 2; ++r) {
    auto buf = MappedBuffer::Allocate(*s[r], 8 * sizeof(int32_t));
    ASSERT_TRUE(buf.ok()) << buf.status();
    for (int k = 0; k < 8; ++k) (*buf)->as<int32_t>()[k] = (r + 1) * k;
    bufs.push_back(*std::move(buf));
  }
  auto id1 = s[1]->Submit(Allreduce(*bufs[1], 8, "last", DType::kI32));
  ASSERT_TRUE(id1.ok()) << id1.status();

  // Daemon b drains while its rank's op waits for rank 0.
  std::future<int> pending =
      std::async(std::launch::async, [&] { return b->Drain(absl::Seconds(10)); });
  ASSERT_TRUE(Eventually([&] { return absl::IsUnavailable(s[1]->Refusal()); }));
  auto refused = s[1]->Submit(Allreduce(*bufs[1], 8, "after", DType::kI32));
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(std::string(refused.status().message()), HasSubstr("draining for shutdown"));
  auto opened = b->OpenSession(Args("drain-new", 1, 0));
  EXPECT_EQ(opened.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(opened.status().message(), "gradsyncd is draining for shutdown (SIGTERM)");
  EXPECT_EQ(pending.wait_for(std::chrono::seconds(0)), std::future_status::timeout)
      << "Drain returned while rank 1's op was pending";

  // Rank 0 (on the daemon that does not drain) submits: the op runs, and the
  // drain ends with nothing pending.
  auto id0 = s[0]->Submit(Allreduce(*bufs[0], 8, "last", DType::kI32));
  ASSERT_TRUE(id0.ok()) << id0.status();
  EXPECT_TRUE(RunToEnd(*s[0], *id0).ok());
  EXPECT_TRUE(RunToEnd(*s[1], *id1).ok());
  EXPECT_EQ(pending.get(), 0);
  for (int r = 0; r < 2; ++r) {
    for (int k = 0; k < 8; ++k) ASSERT_EQ(bufs[r]->as<int32_t>()[k], 3 * k) << "rank " << r;
  }
}

TEST_F(DaemonTest, DrainGivesUpAtItsDeadlineCountingThePendingOps) {
  std::unique_ptr<Daemon> a = StartDaemon("node-a");
  std::unique_ptr<Daemon> b = StartDaemon("node-b");
  ASSERT_NE(a, nullptr);
  ASSERT_NE(b, nullptr);
  std::vector<std::shared_ptr<Session>> s = OpenJob({a.get(), b.get()}, "stuck");
  ASSERT_EQ(s.size(), 2u);
  auto buf = MappedBuffer::Allocate(*s[1], 64);
  ASSERT_TRUE(buf.ok()) << buf.status();
  ASSERT_TRUE(s[1]->Submit(Allreduce(**buf, 16, "stuck")).ok());
  const absl::Time t0 = absl::Now();
  EXPECT_EQ(b->Drain(absl::Milliseconds(100)), 1);
  EXPECT_GE(absl::Now() - t0, absl::Milliseconds(100));
}

TEST_F(DaemonTest, ShutdownFailsPendingOpsWithItsReasonAndRefusesNewSessions) {
  std::unique_ptr<Daemon> a = StartDaemon("node-a");
  std::unique_ptr<Daemon> b = StartDaemon("node-b");
  ASSERT_NE(a, nullptr);
  ASSERT_NE(b, nullptr);
  std::vector<std::shared_ptr<Session>> s = OpenJob({a.get(), b.get()}, "stop");
  ASSERT_EQ(s.size(), 2u);
  std::vector<std::unique_ptr<MappedBuffer>> bufs;
  for (int r = 0; r < 2; ++r) {
    auto buf = MappedBuffer::Allocate(*s[r], 64);
    ASSERT_TRUE(buf.ok()) << buf.status();
    bufs.push_back(*std::move(buf));
  }
  // Rank 1's op waits for rank 0, which has not submitted.
  auto id1 = s[1]->Submit(Allreduce(*bufs[1], 16, "first"));
  ASSERT_TRUE(id1.ok()) << id1.status();
  ASSERT_TRUE(Eventually([&] {
    std::vector<SessionStatus> st = b->Status();
    return st.size() == 1 && st[0].has_current;
  }));

  b->Shutdown(absl::UnavailableError("daemon_test stops node-b"));
  EXPECT_EQ(b->session_count(), 0u);
  EXPECT_TRUE(s[1]->closed());
  const absl::Status failed = RunToEnd(*s[1], *id1);
  EXPECT_EQ(failed.code(), absl::StatusCode::kUnavailable) << failed;
  EXPECT_THAT(std::string(failed.message()), HasSubstr("daemon_test stops node-b"));
  auto late = b->OpenSession(Args("stop-new", 1, 0));
  EXPECT_EQ(late.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(late.status().message(), "daemon is shutting down");
  b->Shutdown();  // idempotent

  // Rank 0, on the daemon that still runs, learns its epoch is over: its op
  // fails instead of waiting for its timeout.
  // Which of the two comes first is a race: daemon b's ABORT (or its
  // connections closing) fails the op, or the coordinator's word that rank 1
  // left (a heartbeat) ends the epoch before the op is queued.
  auto id0 = s[0]->Submit(Allreduce(*bufs[0], 16, "first"));
  if (id0.ok()) {
    const absl::Status lost = RunToEnd(*s[0], *id0);
    EXPECT_FALSE(lost.ok());
    EXPECT_THAT(std::string(lost.message()), HasSubstr("rank 1")) << lost;
  } else {
    EXPECT_EQ(id0.status().code(), absl::StatusCode::kFailedPrecondition) << id0.status();
    EXPECT_THAT(std::string(id0.status().message()), HasSubstr("rank 1")) << id0.status();
  }
  EXPECT_TRUE(Eventually([&] { return !s[0]->health().ok(); }));
}

}  // namespace
}  // namespace gradsync
