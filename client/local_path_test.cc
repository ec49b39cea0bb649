// LocalPath: n ranks in one process, each with its own mapping of one arena
// segment, and a fake channel standing in for the daemon.
#include "client/local_path.h"

#include <unistd.h>

#include <atomic>
#include <condition_variable>
#include <cstring>
#include <functional>
#include <map>
#include <mutex>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "client/op_path_testing.h"
#include "collective/algorithm.h"
#include "collective/op_signature.h"
#include "collective/reference.h"
#include "gtest/gtest.h"
#include "ipc/arena.h"
#include "ipc/shared_memory.h"

namespace gradsync {
namespace client {
namespace internal {
namespace {

using FakeChannel = FakeOpChannel;

std::atomic<int> g_segments{0};

// One arena segment; rank r's LocalPath maps it on its own.
struct Job {
  Job(int n, uint32_t frames = 8, uint64_t data_bytes = 4096,
      absl::Duration op_timeout = absl::Seconds(20)) {
    ipc::ArenaGeometry g{static_cast<uint32_t>(n), frames, data_bytes};
    // pids repeat across the test sandboxes that share /dev/shm: a random part too.
    std::random_device rd;
    const std::string name = absl::StrCat("/gradsync-test.", ::getpid(), ".", rd(), ".lp",
                                          ++g_segments);
    auto bytes = ipc::ArenaBytes(g);
    EXPECT_TRUE(bytes.ok());
    auto mem = ipc::SharedMemory::Create(name, *bytes);
    EXPECT_TRUE(mem.ok()) << mem.status();
    daemon_mem = std::move(*mem);
    auto v = ipc::ArenaView::Format(daemon_mem->data(), daemon_mem->size(), g, 1, 1);
    EXPECT_TRUE(v.ok());
    view = std::make_unique<ipc::ArenaView>(*v);
    channels.resize(n);
    for (int r = 0; r < n; ++r) {
      channels[r] = std::make_unique<FakeChannel>();
      auto m = ipc::SharedMemory::Open(name, *bytes);
      EXPECT_TRUE(m.ok()) << m.status();
      LocalPathOptions o;
      o.default_op_timeout = op_timeout;
      auto p = LocalPath::Open(std::move(*m), r, n, channels[r].get(), absl::StrCat("s", r), o);
      EXPECT_TRUE(p.ok()) << p.status();
      paths.push_back(std::move(*p));
    }
  }
  std::unique_ptr<ipc::SharedMemory> daemon_mem;
  std::unique_ptr<ipc::ArenaView> view;  // the daemon's view
  std::vector<std::unique_ptr<FakeChannel>> channels;
  std::vector<std::unique_ptr<LocalPath>> paths;
};

// Random floats: a reduction in any other order than rank order gives other
// bits, so this checks the order as well as the data movement (the kernels
// themselves are checked against scalar code in kernels/cpu_reduce_test).
TEST(LocalPath, AllreduceGivesEveryRankTheRankOrderResultBitForBit) {
  for (int n : {1, 2, 3, 4, 5, 8}) {
    Job job(n);
    uint32_t seed = 1;
    for (DType t : kAllDTypes) {
      for (ReduceOp op : kAllReduceOps) {
        for (size_t count : {size_t{0}, size_t{1}, size_t{7}, size_t{1000}}) {
          if (count * DTypeSize(t) > 4096) continue;
          std::vector<std::vector<char>> in(n), out(n);
          for (int r = 0; r < n; ++r) in[r] = testing::RandomData(t, count, r, seed);
          ++seed;
          const std::vector<char> want = testing::RingOrderReduce(in, t, op, 0, count, 0);
          std::vector<std::string> errors(n);
          OnEveryRank(n, [&](int r) {
            out[r] = in[r];
            out[r].resize(std::max<size_t>(1, out[r].size()));
            auto res = RunOp(*job.paths[r], Allreduce(out[r], count, t, op, "g"));
            if (!res.ok()) return void(errors[r] = res.status().ToString());
            if (res->algorithm != "local") errors[r] = "algorithm " + res->algorithm;
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
  }
}

TEST(LocalPath, ABarrierReturnsOnlyOnceEveryRankReachedIt) {
  Job job(4);
  std::vector<absl::Duration> took(4);
  const absl::Time start = absl::Now();
  OnEveryRank(4, [&](int r) {
    if (r == 3) absl::SleepFor(absl::Milliseconds(100));
    PathOp b;
    b.args.kind = CollectiveKind::kBarrier;
    b.args.name = "step";
    b.forced = kAutoCode;
    b.local = true;
    auto res = RunOp(*job.paths[r], b);
    ASSERT_TRUE(res.ok()) << res.status();
    took[r] = absl::Now() - start;
  });
  for (int r = 0; r < 3; ++r) EXPECT_GE(took[r], absl::Milliseconds(95)) << r;
}

TEST(LocalPath, AMismatchIsTheSameInvalidArgumentOnEveryRankAndTheJobGoesOn) {
  Job job(3);
  std::vector<absl::Status> st(3);
  std::vector<std::vector<char>> bufs(3, std::vector<char>(256));
  OnEveryRank(3, [&](int r) {
    st[r] = RunOp(*job.paths[r], Allreduce(bufs[r], r == 1 ? 60 : 64, DType::kF32, ReduceOp::kSum, "w"))
                .status();
  });
  for (int r = 0; r < 3; ++r) {
    EXPECT_TRUE(absl::IsInvalidArgument(st[r])) << st[r];
    EXPECT_EQ(st[r].message(),
              "op 1 does not match across ranks: rank 1 submitted allreduce 'w' f32[60] sum, "
              "ranks 0,2 submitted allreduce 'w' f32[64] sum");
  }
  EXPECT_FALSE(job.view->has_failed());
  OnEveryRank(3, [&](int r) {
    float* x = reinterpret_cast<float*>(bufs[r].data());
    x[0] = static_cast<float>(r + 1);
    ASSERT_TRUE(RunOp(*job.paths[r], Allreduce(bufs[r], 1, DType::kF32, ReduceOp::kSum, "w")).ok());
    EXPECT_EQ(x[0], 6.0f);
  });
}

// One rank runs it locally, another sends it to the daemon (other counts,
// so other sizes): both read the same signatures, both refuse it alike.
TEST(LocalPath, ALocalOpAgainstADaemonOpIsAMismatchToo) {
  Job job(2);
  std::vector<std::vector<char>> bufs(2, std::vector<char>(8192));
  std::vector<absl::Status> st(2);
  OnEveryRank(2, [&](int r) {
    PathOp op = Allreduce(bufs[r], r == 0 ? 4 : 2000, DType::kF32, ReduceOp::kSum, "g", 1, 0,
                          /*local=*/r == 0);
    auto t = job.paths[r]->Submit(op);
    ASSERT_TRUE(t.ok()) << t.status();
    if (r == 1) {
      // The daemon's check, as worker/job_arena.cc does it: every frame, then compare.
      const absl::Time end = absl::Now() + absl::Seconds(10);
      while (!(job.view->Published(0, 1) && job.view->Published(1, 1)) && absl::Now() < end) {
        absl::SleepFor(absl::Milliseconds(1));
      }
      std::vector<std::string> sigs;
      for (int p = 0; p < 2; ++p) sigs.emplace_back(job.view->Read(p, 1)->signature);
      job.channels[1]->Complete(1, CompareSignatures(1, sigs));
    }
    st[r] = job.paths[r]->Wait(t->op_id, absl::Now() + absl::Seconds(10)).status();
  });
  EXPECT_EQ(st[0], st[1]);
  EXPECT_TRUE(absl::IsInvalidArgument(st[0])) << st[0];
  EXPECT_NE(st[0].message().find("rank 1 submitted allreduce 'g' f32[2000] sum"), std::string::npos)
      << st[0];
  EXPECT_EQ(job.channels[1]->sent(), (std::vector<uint64_t>{1}));
  EXPECT_TRUE(job.channels[0]->sent().empty());
}

TEST(LocalPath, AMissingRankTimesOutNamingItAndEndsTheJob) {
  Job job(3, 8, 4096, /*op_timeout=*/absl::Milliseconds(300));
  std::vector<std::vector<char>> bufs(3, std::vector<char>(64));
  std::vector<absl::Status> st(2);
  OnEveryRank(2, [&](int r) {
    st[r] = RunOp(*job.paths[r], Allreduce(bufs[r], 4, DType::kF32, ReduceOp::kSum, "x")).status();
  });
  // The first rank to time out says why; the other may see that failure first.
  int timed_out = 0;
  for (int r = 0; r < 2; ++r) {
    ASSERT_FALSE(st[r].ok());
    const std::string want = absl::StrCat("allreduce 'x' f32[4] sum (op 1) failed at rank ", r,
                                          ": timed out at rank ", r,
                                          " waiting for rank(s) 2 to submit op 1 (allreduce 'x' "
                                          "f32[4] sum)");
    if (st[r].message() == want) {
      EXPECT_TRUE(absl::IsDeadlineExceeded(st[r])) << st[r];
      ++timed_out;
    } else {
      EXPECT_NE(st[r].message().find("waiting for rank(s) 2 to submit op 1"), std::string::npos)
          << st[r];
    }
  }
  EXPECT_GE(timed_out, 1);
  ASSERT_TRUE(job.view->has_failed());
  EXPECT_NE(job.view->failure().message().find("waiting for rank(s) 2"), std::string::npos);
  // The stream is out of step: nobody may go on, the late rank included.
  for (int r = 0; r < 3; ++r) {
    auto t = job.paths[r]->Submit(Allreduce(bufs[r], 4, DType::kF32, ReduceOp::kSum, "y"));
    EXPECT_TRUE(absl::IsFailedPrecondition(t.status())) << t.status();
    EXPECT_NE(t.status().message().find("no longer usable"), std::string::npos) << t.status();
  }
}

TEST(LocalPath, AFailureWakesAWaiterAtOnce) {
  Job job(2);
  std::vector<char> buf(64);
  auto t = job.paths[0]->Submit(Allreduce(buf, 4, DType::kF32, ReduceOp::kSum, "x"));
  ASSERT_TRUE(t.ok());
  std::thread failer([&] {
    absl::SleepFor(absl::Milliseconds(100));
    job.view->Fail(absl::CancelledError("rank 1 closed its session"));
  });
  const absl::Time start = absl::Now();
  auto res = job.paths[0]->Wait(t->op_id, absl::Now() + absl::Seconds(20));
  failer.join();
  EXPECT_LT(absl::Now() - start, absl::Seconds(2));
  EXPECT_TRUE(absl::IsCancelled(res.status())) << res.status();
  EXPECT_EQ(res.status().message(),
            "allreduce 'x' f32[4] sum (op 1) failed at rank 0: rank 1 closed its session");
}

// An op whose frames are all there completes even after a failure: the data
// is all present and cannot change, so the result is right.
TEST(LocalPath, AnOpWhoseFramesAreAllThereCompletesAfterAFailure) {
  Job job(2);
  std::vector<std::vector<char>> bufs(2, std::vector<char>(64));
  std::vector<uint64_t> ids(2);
  for (int r = 0; r < 2; ++r) {
    reinterpret_cast<float*>(bufs[r].data())[0] = 1.5f * (r + 1);
    auto t = job.paths[r]->Submit(Allreduce(bufs[r], 1, DType::kF32, ReduceOp::kSum, "x"));
    ASSERT_TRUE(t.ok());
    ids[r] = t->op_id;
  }
  job.view->Fail(absl::CancelledError("rank 1 closed its session"));
  for (int r = 0; r < 2; ++r) {
    auto res = job.paths[r]->Wait(ids[r], absl::Now() + absl::Seconds(5));
    ASSERT_TRUE(res.ok()) << res.status();
    EXPECT_EQ(reinterpret_cast<float*>(bufs[r].data())[0], 4.5f);
  }
}

// Four frames per rank: a rank may run at most four ops ahead of one that
// does not call in; its fifth Submit waits until that rank catches up.
TEST(LocalPath, ARankWaitsForFramesOnlyWhenAnotherIsAFullArenaBehind) {
  Job job(2, /*frames=*/4);
  std::vector<std::vector<char>> bufs(2, std::vector<char>(64 * 8));
  std::vector<uint64_t> ids0;
  for (int k = 0; k < 4; ++k) {  // rank 0: ops 1-4, not waited for yet
    auto t = job.paths[0]->Submit(
        Allreduce(bufs[0], 1, DType::kI32, ReduceOp::kSum, "p", 1, 64 * k));
    ASSERT_TRUE(t.ok());
    ids0.push_back(t->op_id);
  }
  absl::Notification fifth_submitted;
  std::thread r0([&] {
    auto t = job.paths[0]->Submit(Allreduce(bufs[0], 1, DType::kI32, ReduceOp::kSum, "p", 1, 256));
    ASSERT_TRUE(t.ok()) << t.status();
    fifth_submitted.Notify();
    ids0.push_back(t->op_id);
  });
  EXPECT_FALSE(fifth_submitted.WaitForNotificationWithTimeout(absl::Milliseconds(200)));
  // Rank 1 catches up: its ops 1-4, and op 1 done frees frame 1.
  for (int k = 0; k < 4; ++k) {
    reinterpret_cast<int32_t*>(bufs[1].data() + 64 * k)[0] = 10;
    ASSERT_TRUE(RunOp(*job.paths[1], Allreduce(bufs[1], 1, DType::kI32, ReduceOp::kSum, "p", 1, 64 * k)).ok());
  }
  EXPECT_TRUE(fifth_submitted.WaitForNotificationWithTimeout(absl::Seconds(10)));
  r0.join();
  ASSERT_TRUE(RunOp(*job.paths[1], Allreduce(bufs[1], 1, DType::kI32, ReduceOp::kSum, "p", 1, 256)).ok());
  for (uint64_t id : ids0) {
    EXPECT_TRUE(job.paths[0]->Wait(id, absl::Now() + absl::Seconds(5)).ok()) << id;
  }
  EXPECT_EQ(reinterpret_cast<int32_t*>(bufs[0].data())[0], 10);
  EXPECT_GE(job.view->consumed(0), 5u);
}

// Order on shared bytes: a daemon op after a local one on the same range is
// sent only once the local one is done (it must see its result), and a local
// op after a daemon one publishes the daemon's result, not the input.
TEST(LocalPath, OpsOnOverlappingBytesKeepSubmissionOrderAcrossPaths) {
  Job job(1);
  LocalPath& p = *job.paths[0];
  FakeChannel& daemon = *job.channels[0];
  std::vector<char> buf(64);
  int32_t* x = reinterpret_cast<int32_t*>(buf.data());
  x[0] = 7;
  // 1: a daemon op on [0, 16); 2: a local one on [0, 4): held until 1 is done.
  auto d1 = p.Submit(Allreduce(buf, 4, DType::kI32, ReduceOp::kSum, "d1", 1, 0, /*local=*/false));
  ASSERT_TRUE(d1.ok());
  auto l2 = p.Submit(Allreduce(buf, 1, DType::kI32, ReduceOp::kSum, "l2"));
  ASSERT_TRUE(l2.ok());
  EXPECT_FALSE(job.view->Published(0, 2));  // held
  // 3: a daemon op on [0, 4) waits behind the held local op 2.
  auto d3 = p.Submit(Allreduce(buf, 1, DType::kI32, ReduceOp::kSum, "d3", 1, 0, /*local=*/false));
  ASSERT_TRUE(d3.ok());
  EXPECT_EQ(daemon.sent(), (std::vector<uint64_t>{1}));
  // 4: a local op on other bytes runs at once, ahead of all of them.
  auto l4 = p.Submit(Allreduce(buf, 1, DType::kI32, ReduceOp::kSum, "l4", 1, 32));
  ASSERT_TRUE(l4.ok());
  ASSERT_TRUE(p.Wait(l4->op_id, absl::Now() + absl::Seconds(5)).ok());
  // The daemon finishes op 1, writing its result.
  x[0] = 42;
  daemon.Complete(1);
  ASSERT_TRUE(p.Wait(d1->op_id, absl::Now() + absl::Seconds(5)).ok());
  ASSERT_TRUE(p.Wait(l2->op_id, absl::Now() + absl::Seconds(5)).ok());
  auto f = job.view->Read(0, 2);
  ASSERT_TRUE(f.ok());
  int32_t published;
  std::memcpy(&published, f->data, 4);
  EXPECT_EQ(published, 42);  // op 2 took op 1's result
  EXPECT_EQ(daemon.sent(), (std::vector<uint64_t>{1, 3}));  // op 3 only after op 2
  daemon.Complete(3);
  ASSERT_TRUE(p.Wait(d3->op_id, absl::Now() + absl::Seconds(5)).ok());
  EXPECT_EQ(job.view->consumed(0), 4u);
}

// Ops of the daemon carry their place in the session's stream (the gaps are
// the local ones), and the signature of each is in the arena first.
TEST(LocalPath, DaemonOpsCarryTheirSequenceAndPublishTheirSignature) {
  Job job(1);
  LocalPath& p = *job.paths[0];
  std::vector<char> buf(8192);
  ASSERT_TRUE(RunOp(p, Allreduce(buf, 1, DType::kF32, ReduceOp::kSum, "a")).ok());
  auto d = p.Submit(Allreduce(buf, 2000, DType::kF32, ReduceOp::kSum, "big", 1, 0, false));
  ASSERT_TRUE(d.ok());
  EXPECT_EQ(d->op_id, 2u);
  EXPECT_EQ(d->sequence, 2u);
  ASSERT_TRUE(job.view->Published(0, 2));
  auto f = job.view->Read(0, 2);
  EXPECT_EQ(f->data_len, 0u);  // the daemon reads the buffer itself
  OpSignature want;
  want.seq = 2;
  want.count = 2000;
  want.name = "big";
  EXPECT_EQ(f->signature, want.Encode());
  job.channels[0]->Complete(2);
  auto res = p.Wait(d->op_id, absl::Now() + absl::Seconds(5));
  ASSERT_TRUE(res.ok());
  EXPECT_EQ(res->algorithm, "hier");
  EXPECT_EQ(job.channels[0]->sent(), (std::vector<uint64_t>{2}));
}

TEST(LocalPath, ADaemonThatRefusesAnOpFailsTheJobRatherThanStallIt) {
  Job job(2);
  std::vector<char> buf(8192);
  job.channels[0]->Refuse(absl::UnavailableError("gradsyncd at unix:x stopped answering"));
  auto d = job.paths[0]->Submit(Allreduce(buf, 2000, DType::kF32, ReduceOp::kSum, "big", 1, 0, false));
  ASSERT_TRUE(d.ok());  // the refusal is the op's outcome, as on the queue
  auto res = job.paths[0]->Wait(d->op_id, absl::Now() + absl::Seconds(5));
  EXPECT_TRUE(absl::IsUnavailable(res.status())) << res.status();
  ASSERT_TRUE(job.view->has_failed());
  EXPECT_NE(job.view->failure().message().find("(op 1) failed at rank 0: gradsyncd at unix:x"),
            std::string::npos)
      << job.view->failure();
}

TEST(LocalPath, CountersTellTheDaemonWhatRanLocally) {
  Job job(2);
  std::vector<std::vector<char>> bufs(2, std::vector<char>(64));
  OnEveryRank(2, [&](int r) {
    for (int i = 0; i < 3; ++i) {
      ASSERT_TRUE(RunOp(*job.paths[r], Allreduce(bufs[r], 4, DType::kF32, ReduceOp::kSum, "c")).ok());
    }
    EXPECT_FALSE(RunOp(*job.paths[r], Allreduce(bufs[r], r == 0 ? 4 : 3, DType::kF32, ReduceOp::kSum, "c")).ok());
  });
  for (int r = 0; r < 2; ++r) {
    const ipc::ArenaCounters& c = job.view->counters(r, ipc::kArenaCounterAllreduce);
    EXPECT_EQ(c.ok.load(), 3u);
    EXPECT_EQ(c.bytes.load(), 3u * 16);
    EXPECT_GT(c.run_ns.load(), 0u);
    EXPECT_EQ(c.failed[static_cast<int>(absl::StatusCode::kInvalidArgument)].load(), 1u);
    EXPECT_EQ(job.view->counters(r, ipc::kArenaCounterBarrier).ok.load(), 0u);
  }
}

TEST(LocalPath, AnUnknownOpAndTheArenaOfAnotherWorldAreRefused) {
  Job job(2);
  EXPECT_TRUE(absl::IsNotFound(job.paths[0]->Wait(99, absl::Now()).status()));
  auto m = ipc::SharedMemory::Anonymous(4096);
  ASSERT_TRUE(m.ok());
  FakeChannel ch;
  EXPECT_FALSE(LocalPath::Open(std::move(*m), 0, 2, &ch, "s", {}).ok());  // not an arena
  const ipc::ArenaGeometry g{3, 4, 64};
  auto m3 = ipc::SharedMemory::Anonymous(*ipc::ArenaBytes(g));
  ASSERT_TRUE(ipc::ArenaView::Format((*m3)->data(), (*m3)->size(), g, 1, 1).ok());
  auto wrong = LocalPath::Open(std::move(*m3), 0, 2, &ch, "s", {});
  ASSERT_FALSE(wrong.ok());
  EXPECT_NE(wrong.status().message().find("the job's arena has 3 ranks; this session is rank 0 of 2"),
            std::string::npos);
}

// A daemon op held behind a local one holds back the daemon ops after it,
// even on other bytes: the daemon takes a session's ops in sequence order.
TEST(LocalPath, DaemonOpsGoToTheDaemonInSequenceOrder) {
  Job job(2);
  std::vector<std::vector<char>> a(2, std::vector<char>(8192)), b(2, std::vector<char>(8192));
  // Rank 1 publishes op 1 late, so rank 0's op 1 stays unfinished a while.
  auto l1 = job.paths[0]->Submit(Allreduce(a[0], 4, DType::kF32, ReduceOp::kSum, "l1"));
  ASSERT_TRUE(l1.ok());
  auto d2 = job.paths[0]->Submit(Allreduce(a[0], 2000, DType::kF32, ReduceOp::kSum, "d2", 1, 0, false));
  ASSERT_TRUE(d2.ok());
  auto d3 = job.paths[0]->Submit(Allreduce(b[0], 2000, DType::kF32, ReduceOp::kSum, "d3", 2, 0, false));
  ASSERT_TRUE(d3.ok());
  EXPECT_TRUE(job.channels[0]->sent().empty());  // 2 waits for 1, 3 for 2
  ASSERT_TRUE(RunOp(*job.paths[1], Allreduce(a[1], 4, DType::kF32, ReduceOp::kSum, "l1")).ok());
  ASSERT_TRUE(job.paths[0]->Wait(l1->op_id, absl::Now() + absl::Seconds(5)).ok());
  EXPECT_EQ(job.channels[0]->sent(), (std::vector<uint64_t>{2, 3}));
  job.channels[0]->Complete(2);
  job.channels[0]->Complete(3);
  EXPECT_TRUE(job.paths[0]->Wait(d2->op_id, absl::Now() + absl::Seconds(5)).ok());
  EXPECT_TRUE(job.paths[0]->Wait(d3->op_id, absl::Now() + absl::Seconds(5)).ok());
}

// A barrier is ordered against every earlier op of its session, and every
// later op against it, whatever the bytes.
TEST(LocalPath, ABarrierWaitsForTheOpsBeforeItAndHoldsTheOnesAfterIt) {
  Job job(1);
  std::vector<char> buf(8192);
  auto d1 = job.paths[0]->Submit(Allreduce(buf, 2000, DType::kF32, ReduceOp::kSum, "d1", 1, 0, false));
  ASSERT_TRUE(d1.ok());
  PathOp barrier;
  barrier.args.kind = CollectiveKind::kBarrier;
  barrier.args.name = "b";
  barrier.forced = kAutoCode;
  barrier.local = true;
  auto b2 = job.paths[0]->Submit(barrier);
  ASSERT_TRUE(b2.ok());
  auto l3 = job.paths[0]->Submit(Allreduce(buf, 1, DType::kF32, ReduceOp::kSum, "l3", 1, 4096));
  ASSERT_TRUE(l3.ok());
  auto w = job.paths[0]->Wait(b2->op_id, absl::Now() + absl::Milliseconds(100));
  ASSERT_TRUE(w.ok());
  EXPECT_FALSE(w->done);  // behind op 1
  EXPECT_FALSE(job.view->Published(0, 2));
  EXPECT_FALSE(job.view->Published(0, 3));  // behind the barrier, though on other bytes
  job.channels[0]->Complete(1);
  EXPECT_TRUE(job.paths[0]->Wait(b2->op_id, absl::Now() + absl::Seconds(5)).ok());
  EXPECT_TRUE(job.paths[0]->Wait(l3->op_id, absl::Now() + absl::Seconds(5)).ok());
  EXPECT_TRUE(job.paths[0]->Wait(d1->op_id, absl::Now() + absl::Seconds(5)).ok());
}

// A rank whose session closes (the daemon marks it left) published op 1 but
// not op 2: the others still complete op 1 and fail op 2 at once.
TEST(LocalPath, ARankThatLeftFailsOnlyTheOpsItNeverPublished) {
  Job job(3, 8, 4096, /*op_timeout=*/absl::Seconds(60));
  std::vector<std::vector<char>> bufs(3, std::vector<char>(64));
  std::vector<uint64_t> ids(3);
  for (int r = 0; r < 3; ++r) {
    reinterpret_cast<int32_t*>(bufs[r].data())[0] = r + 1;
    auto t = job.paths[r]->Submit(Allreduce(bufs[r], 1, DType::kI32, ReduceOp::kSum, "one"));
    ASSERT_TRUE(t.ok());
    ids[r] = t->op_id;
  }
  job.view->Leave(2);  // rank 2 leaves without waiting for op 1
  uint64_t done = 99;
  EXPECT_TRUE(job.view->Left(2, &done));
  EXPECT_EQ(done, 1u);  // the last to publish op 1, it finished it at once
  EXPECT_FALSE(job.view->Left(0));
  for (int r = 0; r < 2; ++r) {
    ASSERT_TRUE(job.paths[r]->Wait(ids[r], absl::Now() + absl::Seconds(5)).ok());
    EXPECT_EQ(reinterpret_cast<int32_t*>(bufs[r].data())[0], 6);
    const absl::Time start = absl::Now();
    auto res = RunOp(*job.paths[r], Allreduce(bufs[r], 1, DType::kI32, ReduceOp::kSum, "two"));
    EXPECT_LT(absl::Now() - start, absl::Seconds(5));  // not the 60 s op timeout
    EXPECT_TRUE(absl::IsCancelled(res.status())) << res.status();
    EXPECT_EQ(res.status().message(),
              absl::StrCat("allreduce 'two' i32[1] sum (op 2) failed at rank ", r,
                           ": rank 2 closed its session after op 1 and will not submit op 2"));
  }
  EXPECT_FALSE(job.view->has_failed());
}

// Two threads of one rank submit at once while the arena is full: every op
// still gets its own number and frame (each result is checked against the
// other rank's contribution for that number).
TEST(LocalPath, ConcurrentSubmittersOfOneRankNeverShareAnOpNumber) {
  Job job(2, /*frames=*/2);
  constexpr int kPerThread = 200;
  std::vector<std::string> errors(2);
  std::thread other([&] {  // rank 1: op k carries k
    std::vector<char> buf(64);
    for (int k = 1; k <= 2 * kPerThread; ++k) {
      reinterpret_cast<int64_t*>(buf.data())[0] = k;
      auto res = RunOp(*job.paths[1], Allreduce(buf, 1, DType::kI64, ReduceOp::kSum, "x"));
      if (!res.ok()) return void(errors[1] = res.status().ToString());
    }
  });
  auto submitter = [&](int t) {  // rank 0: two threads, own buffers, 1000 * t + i
    std::vector<char> buf(64);
    for (int i = 0; i < kPerThread; ++i) {
      const int64_t mine = 1000 * (t + 1) + i;
      reinterpret_cast<int64_t*>(buf.data())[0] = mine;
      auto h = job.paths[0]->Submit(
          Allreduce(buf, 1, DType::kI64, ReduceOp::kSum, "x", /*buffer_id=*/10 + t));
      if (!h.ok()) return void(errors[0] = h.status().ToString());
      auto res = job.paths[0]->Wait(h->op_id, absl::Now() + absl::Seconds(20));
      if (!res.ok()) return void(errors[0] = res.status().ToString());
      const int64_t got = reinterpret_cast<int64_t*>(buf.data())[0];
      if (got != mine + static_cast<int64_t>(h->op_id)) {
        return void(errors[0] = absl::StrCat("op ", h->op_id, ": ", got, " != ", mine, " + ", h->op_id));
      }
    }
  };
  std::thread t0(submitter, 0), t1(submitter, 1);
  t0.join();
  t1.join();
  other.join();
  EXPECT_EQ(errors[0], "");
  EXPECT_EQ(errors[1], "");
  EXPECT_EQ(job.view->consumed(0), 2u * kPerThread);
}

// A local op never reaches the daemon; a daemon that stopped answering (or
// a session it closed) still refuses it at submission, as it would any op.
TEST(LocalPath, ALocalOpIsRefusedWhenTheDaemonIsGone) {
  Job job(2);
  std::vector<char> buf(64);
  job.channels[0]->SetHealth(absl::UnavailableError("gradsyncd at unix:x stopped answering"));
  auto t = job.paths[0]->Submit(Allreduce(buf, 1, DType::kF32, ReduceOp::kSum, "x"));
  EXPECT_TRUE(absl::IsUnavailable(t.status())) << t.status();
  EXPECT_FALSE(job.view->Published(0, 1));  // nothing published
  // The other rank would wait for this rank's op 1; the dead daemon cannot
  // tell it, so this rank does.
  ASSERT_TRUE(job.view->has_failed());
  EXPECT_EQ(job.view->failure().message(), "rank 0: gradsyncd at unix:x stopped answering");
  auto other = RunOp(*job.paths[1], Allreduce(buf, 1, DType::kF32, ReduceOp::kSum, "x"));
  EXPECT_TRUE(absl::IsFailedPrecondition(other.status())) << other.status();
}

}  // namespace
}  // namespace internal
}  // namespace client
}  // namespace gradsync
