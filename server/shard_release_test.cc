// A job's parameter-server shard assignments go when the job registry ends
// it: the epoch failed, the job deleted, all its members left. A shard's
// load (ListShards' `jobs`) then counts live jobs only.
#include <thread>
#include <vector>

#include "gtest/gtest.h"
#include "server/job_registry.h"
#include "server/job_registry_testing.h"
#include "server/shard_registry.h"

namespace gradsync {
namespace {

using job_registry_testing::FakeClock;
using job_registry_testing::HeartbeatRequest;
using job_registry_testing::JoinRequest;
using job_registry_testing::LeaveRequest;

class ShardReleaseTest : public ::testing::Test {
 protected:
  ShardReleaseTest() : registry_(Options()) {
    v1::Endpoint e;
    e.set_host("127.0.0.1");
    e.set_port(7073);
    EXPECT_TRUE(shards_.Register("ps-a", e).ok());
  }

  JobRegistry::Options Options() {
    JobRegistry::Options o;
    o.start_liveness_thread = false;
    o.now = [this] { return clock_.Now(); };
    o.observer = &release_;
    return o;
  }

  // Creates `job` of two ranks, joins members "<job>-0" and "<job>-1" and
  // assigns its epoch a shard, as the coordinator's JoinJob does.
  void StartWithShard(const std::string& job) {
    v1::CreateJobRequest c;
    c.set_job_id(job);
    c.set_world_size(2);
    c.mutable_options()->set_heartbeat_timeout_ms(1000);
    ASSERT_TRUE(registry_.CreateJob(c).ok());
    std::vector<std::thread> joins;
    for (int r = 0; r < 2; ++r) {
      joins.emplace_back([&, r] {
        auto j = registry_.JoinJob(JoinRequest(job, Member(job, r), r, 5000 + r), {});
        EXPECT_TRUE(j.ok()) << j.status();
      });
    }
    for (auto& t : joins) t.join();
    ASSERT_TRUE(shards_.AssignForJob(job, 1, 1).ok());
  }

  static std::string Member(const std::string& job, int rank) {
    return job + "-" + std::to_string(rank);
  }
  int ShardLoad() { return shards_.List().at(0).jobs(); }

  FakeClock clock_;
  ShardRegistry shards_{absl::Hours(1)};
  ShardRelease release_{&shards_};
  JobRegistry registry_;  // last: it calls release_ until destroyed
};

TEST_F(ShardReleaseTest, AJobWhoseMembersAllLeftReleasesItsShards) {
  StartWithShard("left");
  EXPECT_EQ(ShardLoad(), 1);
  ASSERT_TRUE(registry_.LeaveJob(LeaveRequest("left", 0, 1, Member("left", 0))).ok());
  // The epoch ended when rank 0 left, but rank 1's last op may still run on
  // the shard: the assignment stays until the job ends.
  EXPECT_EQ(ShardLoad(), 1);
  EXPECT_TRUE(shards_.IsAssigned("left", 1, "ps-a"));
  ASSERT_TRUE(registry_.LeaveJob(LeaveRequest("left", 1, 1, Member("left", 1))).ok());
  EXPECT_EQ(ShardLoad(), 0);
  EXPECT_FALSE(shards_.IsAssigned("left", 1, "ps-a"));
}

TEST_F(ShardReleaseTest, ADeletedJobReleasesItsShards) {
  StartWithShard("deleted");
  StartWithShard("other");
  EXPECT_EQ(ShardLoad(), 2);
  ASSERT_TRUE(registry_.DeleteJob("deleted", "deleted by a test").ok());
  EXPECT_EQ(ShardLoad(), 1);
  EXPECT_FALSE(shards_.IsAssigned("deleted", 1, "ps-a"));
  EXPECT_TRUE(shards_.IsAssigned("other", 1, "ps-a"));
}

TEST_F(ShardReleaseTest, AFailedEpochReleasesItsShardsThoughTheJobRemains) {
  StartWithShard("failed");
  clock_.Advance(absl::Seconds(2));
  // Rank 0 beats; rank 1 missed its heartbeats and is declared dead.
  ASSERT_TRUE(registry_.Heartbeat(HeartbeatRequest("failed", 0, 1, Member("failed", 0))).ok());
  registry_.CheckLiveness();
  auto st = registry_.GetJobStatus("failed");
  ASSERT_TRUE(st.ok()) << st.status();
  EXPECT_EQ(st->state(), v1::JOB_STATE_ABORTED);
  EXPECT_EQ(ShardLoad(), 0);
  EXPECT_FALSE(shards_.IsAssigned("failed", 1, "ps-a"));
}

TEST_F(ShardReleaseTest, AJobWhoseMembersAllDiedReleasesItsShards) {
  StartWithShard("dead");
  clock_.Advance(absl::Seconds(2));
  registry_.CheckLiveness();
  EXPECT_TRUE(absl::IsNotFound(registry_.GetJobStatus("dead").status()));
  EXPECT_EQ(ShardLoad(), 0);
}

}  // namespace
}  // namespace gradsync
