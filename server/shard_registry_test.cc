#include "server/shard_registry.h"

#include "gtest/gtest.h"

namespace gradsync {
namespace {

v1::Endpoint Ep(int port) {
  v1::Endpoint e;
  e.set_host("127.0.0.1");
  e.set_port(port);
  return e;
}

TEST(ShardRegistry, AssignsTheLeastLoadedAliveShardsOncePerEpoch) {
  ShardRegistry r(absl::Seconds(5));
  ASSERT_TRUE(r.Register("ps-b", Ep(2)).ok());
  ASSERT_TRUE(r.Register("ps-a", Ep(1)).ok());
  ASSERT_TRUE(r.Register("ps-c", Ep(3)).ok());
  auto a = r.AssignForJob("j1", 1, 2);
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_EQ(a->ids, (std::vector<std::string>{"ps-a", "ps-b"}));
  // Same epoch: the same answer (every rank gets the same shards).
  auto again = r.AssignForJob("j1", 1, 2);
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(again->ids, a->ids);
  // Another job prefers the unloaded shard.
  auto b = r.AssignForJob("j2", 1, 1);
  ASSERT_TRUE(b.ok());
  EXPECT_EQ(b->ids, (std::vector<std::string>{"ps-c"}));
  EXPECT_EQ(b->endpoints[0].port(), 3);
  auto list = r.List();
  ASSERT_EQ(list.size(), 3u);
  EXPECT_EQ(list[0].shard_id(), "ps-a");
  EXPECT_EQ(list[0].jobs(), 1);
  EXPECT_TRUE(list[0].alive());
}

TEST(ShardRegistry, TooFewAliveShardsIsAnErrorNamingTheCounts) {
  ShardRegistry r(absl::Milliseconds(50));
  ASSERT_TRUE(r.Register("ps-a", Ep(1)).ok());
  auto a = r.AssignForJob("j", 1, 2);
  EXPECT_TRUE(absl::IsFailedPrecondition(a.status()));
  EXPECT_EQ(a.status().message(),
            "job 'j' wants 2 parameter-server shards but 1 are registered and alive (ps-a); "
            "start more gradsync-ps");
  absl::SleepFor(absl::Milliseconds(80));  // ps-a stops renewing: dead
  EXPECT_FALSE(r.List()[0].alive());
  EXPECT_TRUE(absl::IsFailedPrecondition(r.AssignForJob("j", 2, 1).status()));
  EXPECT_TRUE(absl::IsInvalidArgument(r.Register("", Ep(1))));
  EXPECT_TRUE(absl::IsInvalidArgument(r.Register("x", Ep(0))));
}

}  // namespace
}  // namespace gradsync
