// The node path's driver (worker/local_driver.h) with real sessions in one
// process: every rank of the job on one "daemon", submissions over the
// sessions' Submit (the gRPC path; the shared-memory queue path is covered
// by tests/allreduce_integration_test and tests/op_queue_integration_test).
#include "worker/local_driver.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "collective/test_cluster.h"
#include "gtest/gtest.h"
#include "ipc/shared_memory.h"
#include "worker/daemon_observer.h"
#include "worker/job_group.h"
#include "worker/session.h"

namespace gradsync {
namespace {

constexpr int kWorld = 4;

// Counts what the driver reports (OnLocalDriverOp / OnLocalDriverHandoff).
class CountingObserver : public DaemonObserver {
 public:
  void OnLocalDriverOp(int ranks) override {
    absl::MutexLock l(&mu_);
    ops_ += ranks;
  }
  void OnLocalDriverHandoff(const char* reason) override {
    absl::MutexLock l(&mu_);
    ++handoffs_[reason];
  }
  int ops() const {
    absl::MutexLock l(&mu_);
    return ops_;
  }
  int handoffs(const std::string& reason) const {
    absl::MutexLock l(&mu_);
    auto it = handoffs_.find(reason);
    return it == handoffs_.end() ? 0 : it->second;
  }

 private:
  mutable absl::Mutex mu_;
  int ops_ ABSL_GUARDED_BY(mu_) = 0;
  std::map<std::string, int> handoffs_ ABSL_GUARDED_BY(mu_);
};

// Four sessions of one job on one daemon, sharing a JobGroup and a driver.
class LocalDriverTest : public ::testing::Test {
 protected:
  void SetUp() override { Open(/*with_driver=*/true); }
  void TearDown() override {
    for (auto& s : sessions_) {
      if (s != nullptr) s->Close();
    }
    sessions_.clear();
    driver_.reset();
  }

  void Open(bool with_driver) {
    cluster_ = testing::MakeCluster(kWorld, "driver-job");
    ASSERT_EQ(cluster_.size(), kWorld);
    GroupLayout layout;
    layout.world_size = kWorld;
    layout.nodes = 1;
    for (int r = 0; r < kWorld; ++r) layout.local_ranks.push_back(r);
    group_ = std::make_shared<JobGroup>(layout, nullptr, LinkParams{}, RingOptions{});
    if (with_driver) {
      driver_ = std::make_shared<LocalDriver>("driver-job", kWorld, absl::Microseconds(50),
                                              &observer_);
    }
    for (int r = 0; r < kWorld; ++r) {
      SessionInfo info;
      info.session_id = absl::StrCat("s", r);
      info.job_id = "driver-job";
      info.rank = r;
      info.world_size = kWorld;
      info.epoch = 1;
      info.default_op_timeout = absl::Seconds(20);
      sessions_.push_back(std::make_shared<Session>(info, std::move(cluster_.contexts[r]),
                                                    RingOptions{}, group_, nullptr, driver_));
    }
  }

  // A buffer of `bytes` on every rank, mapped here too.
  struct Buffers {
    std::vector<uint64_t> ids;
    std::vector<std::unique_ptr<ipc::SharedMemory>> maps;
    float* f32(int r) const { return static_cast<float*>(maps[r]->data()); }
  };
  Buffers Allocate(size_t bytes) {
    Buffers b;
    for (int r = 0; r < kWorld; ++r) {
      auto info = sessions_[r]->AllocateBuffer(bytes);
      EXPECT_TRUE(info.ok()) << info.status();
      if (!info.ok()) return b;
      auto map = ipc::SharedMemory::Open(info->shm_name, bytes);
      EXPECT_TRUE(map.ok()) << map.status();
      if (!map.ok()) return b;
      b.ids.push_back(info->id);
      b.maps.push_back(std::move(*map));
    }
    return b;
  }

  // `name` must outlive the Submit (SubmitArgs holds views).
  static SubmitArgs Allreduce(absl::string_view name, uint64_t buffer, uint64_t count,
                              ReduceOp op = ReduceOp::kSum) {
    SubmitArgs a;
    a.kind = CollectiveKind::kAllreduce;
    a.name = name;
    a.dtype = DType::kF32;
    a.op = op;
    a.count = count;
    a.buffer_id = buffer;
    return a;
  }

  // Waits for op `id` of rank `r`.
  OpOutcome WaitFor(int r, uint64_t id, absl::Duration timeout = absl::Seconds(30)) {
    auto out = sessions_[r]->Wait(id, timeout);
    EXPECT_TRUE(out.ok()) << out.status();
    if (!out.ok()) return {};
    EXPECT_TRUE(out->done) << "rank " << r << " op " << id << " still running after " << timeout;
    return *out;
  }

  CountingObserver observer_;  // outlives the driver (declared before it)
  testing::Cluster cluster_;
  std::shared_ptr<JobGroup> group_;
  std::shared_ptr<LocalDriver> driver_;
  std::vector<std::shared_ptr<Session>> sessions_;
};

// Rank r's input element i: exactly representable, different per rank and op.
float Input(int r, int i, int op) { return static_cast<float>((r + 1) * 1000 + i * 7 + op); }

TEST_F(LocalDriverTest, SmallAllreducesRunOnTheDriverBitExact) {
  constexpr int kOps = 100;
  constexpr int kCount = 5;
  Buffers b = Allocate(kCount * sizeof(float));
  ASSERT_EQ(b.maps.size(), static_cast<size_t>(kWorld));
  for (int op = 0; op < kOps; ++op) {
    const ReduceOp redop = op % 2 == 0 ? ReduceOp::kSum : ReduceOp::kAvg;
    std::vector<uint64_t> ids(kWorld);
    for (int r = 0; r < kWorld; ++r) {
      for (int i = 0; i < kCount; ++i) b.f32(r)[i] = Input(r, i, op);
      auto id = sessions_[r]->Submit(Allreduce("small", b.ids[r], kCount, redop));
      ASSERT_TRUE(id.ok()) << id.status();
      ids[r] = *id;
    }
    for (int r = 0; r < kWorld; ++r) {
      const OpOutcome out = WaitFor(r, ids[r]);
      ASSERT_TRUE(out.status.ok()) << out.status;
      EXPECT_EQ(out.algorithm, "hier");
      for (int i = 0; i < kCount; ++i) {
        float want = Input(0, i, op);  // the same order as the reduction: rank 0, 1, 2, 3
        for (int q = 1; q < kWorld; ++q) want += Input(q, i, op);
        if (redop == ReduceOp::kAvg) want /= kWorld;
        ASSERT_EQ(b.f32(r)[i], want) << "op " << op << " rank " << r << " element " << i;
      }
    }
  }
  EXPECT_EQ(driver_->ran(), uint64_t{kOps} * kWorld);
  EXPECT_EQ(driver_->released(), 0u);  // nothing needed the executors
  EXPECT_EQ(observer_.ops(), kOps * kWorld);
  EXPECT_EQ(observer_.handoffs("other_op") + observer_.handoffs("mismatch") +
                observer_.handoffs("late_rank"),
            0);
}

TEST_F(LocalDriverTest, LargeOpsGoToTheExecutorsAndOrderHolds) {
  // Submitted back to back before any wait: small, large, small, large, ...
  constexpr uint64_t kLarge = JobGroup::kSmallBytes / sizeof(float) + 1;
  constexpr int kPairs = 6;
  Buffers b = Allocate(2 * kPairs * kLarge * sizeof(float));
  ASSERT_EQ(b.maps.size(), static_cast<size_t>(kWorld));
  std::vector<uint64_t> offsets, counts;
  uint64_t off = 0;
  for (int k = 0; k < 2 * kPairs; ++k) {
    const uint64_t count = k % 2 == 0 ? 3 : kLarge;
    offsets.push_back(off);
    counts.push_back(count);
    off += count;
  }
  for (int r = 0; r < kWorld; ++r) {
    for (uint64_t i = 0; i < off; ++i) b.f32(r)[i] = static_cast<float>(r + 1 + i % 5);
  }
  std::vector<std::vector<uint64_t>> ids(kWorld);
  for (int r = 0; r < kWorld; ++r) {
    for (int k = 0; k < 2 * kPairs; ++k) {
      const std::string name = absl::StrCat("op", k);
      SubmitArgs a = Allreduce(name, b.ids[r], counts[k]);
      a.offset_bytes = offsets[k] * sizeof(float);
      auto id = sessions_[r]->Submit(a);
      ASSERT_TRUE(id.ok()) << id.status();
      ids[r].push_back(*id);
    }
  }
  for (int r = 0; r < kWorld; ++r) {
    for (int k = 0; k < 2 * kPairs; ++k) {
      const OpOutcome out = WaitFor(r, ids[r][k]);
      EXPECT_TRUE(out.status.ok()) << "rank " << r << " op " << k << ": " << out.status;
    }
  }
  // Sum over ranks of (r + 1 + i % 5) = 10 + 4 (i % 5), for every element.
  for (int r = 0; r < kWorld; ++r) {
    for (uint64_t i = 0; i < off; ++i) {
      ASSERT_EQ(b.f32(r)[i], static_cast<float>(10 + 4 * (i % 5))) << "rank " << r << " element " << i;
    }
  }
  EXPECT_GE(driver_->released(), uint64_t{2 * kPairs});  // the last large op's seq, at least
  EXPECT_GE(driver_->ran(), uint64_t{kWorld});  // some small ones ran on the driver
  EXPECT_GE(observer_.handoffs("other_op"), 1);
  EXPECT_EQ(observer_.handoffs("mismatch"), 0);
}

TEST_F(LocalDriverTest, MismatchIsReportedAndTheJobGoesOn) {
  Buffers b = Allocate(64 * sizeof(float));
  ASSERT_EQ(b.maps.size(), static_cast<size_t>(kWorld));
  std::vector<uint64_t> ids(kWorld);
  for (int r = 0; r < kWorld; ++r) {
    auto id = sessions_[r]->Submit(Allreduce("w", b.ids[r], r == 2 ? 60 : 64));
    ASSERT_TRUE(id.ok());
    ids[r] = *id;
  }
  for (int r = 0; r < kWorld; ++r) {
    const OpOutcome out = WaitFor(r, ids[r]);
    EXPECT_TRUE(absl::IsInvalidArgument(out.status)) << out.status;
    EXPECT_EQ(out.status.message(),
              "op 1 does not match across ranks: rank 2 submitted allreduce 'w' f32[60] sum, "
              "ranks 0,1,3 submitted allreduce 'w' f32[64] sum");
  }
  // The next op runs (on the driver again).
  const uint64_t ran_before = driver_->ran();
  for (int r = 0; r < kWorld; ++r) {
    b.f32(r)[0] = static_cast<float>(r);
    auto id = sessions_[r]->Submit(Allreduce("w2", b.ids[r], 1));
    ASSERT_TRUE(id.ok());
    ids[r] = *id;
  }
  for (int r = 0; r < kWorld; ++r) {
    const OpOutcome out = WaitFor(r, ids[r]);
    EXPECT_TRUE(out.status.ok()) << out.status;
    EXPECT_EQ(b.f32(r)[0], 6.0f);
  }
  EXPECT_EQ(driver_->ran(), ran_before + kWorld);
  EXPECT_EQ(observer_.handoffs("mismatch"), 1);
}

TEST_F(LocalDriverTest, MissingRankTimesOutNamingIt) {
  Buffers b = Allocate(4 * sizeof(float));
  ASSERT_EQ(b.maps.size(), static_cast<size_t>(kWorld));
  std::vector<uint64_t> ids(kWorld);
  const absl::Time start = absl::Now();
  for (int r = 0; r < 3; ++r) {  // rank 3 never submits
    SubmitArgs a = Allreduce("late", b.ids[r], 4);
    a.timeout = absl::Milliseconds(500);
    auto id = sessions_[r]->Submit(a);
    ASSERT_TRUE(id.ok());
    ids[r] = *id;
  }
  // Handed to the executors after the grace period: status names the missing rank.
  absl::SleepFor(LocalDriver::kGrace * 5);
  const SessionStatus st = sessions_[0]->Status();
  EXPECT_TRUE(st.has_current);
  EXPECT_EQ(st.phase, "negotiating");
  EXPECT_NE(std::find(st.missing.begin(), st.missing.end(), 3), st.missing.end());
  for (int r = 0; r < 3; ++r) {
    const OpOutcome out = WaitFor(r, ids[r]);
    EXPECT_TRUE(absl::IsDeadlineExceeded(out.status)) << out.status;
    EXPECT_NE(out.status.message().find("waiting for rank(s) 3 to submit op 1"),
              std::string::npos)
        << out.status;
  }
  EXPECT_LT(absl::Now() - start, absl::Seconds(10));
  EXPECT_EQ(driver_->released(), 1u);
  EXPECT_EQ(observer_.handoffs("late_rank"), 1);
}

TEST_F(LocalDriverTest, BarrierRunsOnTheDriver) {
  for (int k = 0; k < 20; ++k) {
    std::vector<uint64_t> ids(kWorld);
    for (int r = 0; r < kWorld; ++r) {
      SubmitArgs a;
      a.kind = CollectiveKind::kBarrier;
      a.name = "step";
      auto id = sessions_[r]->Submit(a);
      ASSERT_TRUE(id.ok()) << id.status();
      ids[r] = *id;
    }
    for (int r = 0; r < kWorld; ++r) {
      const OpOutcome out = WaitFor(r, ids[r]);
      EXPECT_TRUE(out.status.ok()) << out.status;
      EXPECT_EQ(out.algorithm, "oneshot");
    }
  }
  EXPECT_EQ(driver_->ran(), 20u * kWorld);
}

TEST_F(LocalDriverTest, ClosingARankFailsTheOthersOpsInsteadOfHanging) {
  Buffers b = Allocate(4 * sizeof(float));
  ASSERT_EQ(b.maps.size(), static_cast<size_t>(kWorld));
  std::vector<uint64_t> ids(kWorld);
  for (int r = 0; r < 3; ++r) {
    auto id = sessions_[r]->Submit(Allreduce("x", b.ids[r], 4));
    ASSERT_TRUE(id.ok());
    ids[r] = *id;
  }
  sessions_[3]->Close();
  for (int r = 0; r < 3; ++r) {
    const OpOutcome out = WaitFor(r, ids[r], absl::Seconds(10));
    EXPECT_FALSE(out.status.ok());
    EXPECT_NE(out.status.message().find("rank 3 closed its session"), std::string::npos)
        << out.status;
  }
}

// Sessions come and go in any order, with ops in flight, and the driver
// handle may outlive them or not: no hang, no crash (run under TSan/ASan
// builds too).
TEST_F(LocalDriverTest, SessionsAndDriverComeAndGoInAnyOrder) {
  TearDown();
  for (int round = 0; round < 20; ++round) {
    Open(/*with_driver=*/true);
    ASSERT_EQ(sessions_.size(), static_cast<size_t>(kWorld));
    Buffers b = Allocate(sizeof(float));
    ASSERT_EQ(b.maps.size(), static_cast<size_t>(kWorld));
    std::vector<uint64_t> ids(kWorld);
    for (int r = 0; r < kWorld; ++r) {
      b.f32(r)[0] = 1.0f;
      auto id = sessions_[r]->Submit(Allreduce("x", b.ids[r], 1));
      ASSERT_TRUE(id.ok());
      ids[r] = *id;
    }
    for (int r = 0; r < kWorld; ++r) EXPECT_TRUE(WaitFor(r, ids[r]).status.ok());
    // A second op that only some ranks submit, then everyone leaves.
    for (int r = 0; r < round % kWorld; ++r) {
      ASSERT_TRUE(sessions_[r]->Submit(Allreduce("y", b.ids[r], 1)).ok());
    }
    if (round % 2 == 0) driver_.reset();  // the sessions hold the last references
    std::vector<std::thread> closers;
    for (int r = 0; r < kWorld; ++r) {
      const int who = (r + round) % kWorld;
      closers.emplace_back([s = sessions_[who]] { s->Close(); });
    }
    for (auto& t : closers) t.join();
    sessions_.clear();
    driver_.reset();
  }
}

}  // namespace
}  // namespace gradsync
