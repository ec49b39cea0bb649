#include "server/shard_registry.h"

#include "absl/strings/str_cat.h"
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
  // ps-a stops renewing: dead once 50 ms pass.
  const absl::Time deadline = absl::Now() + absl::Seconds(10);
  while (r.List()[0].alive() && absl::Now() < deadline) absl::SleepFor(absl::Milliseconds(1));
  EXPECT_FALSE(r.List()[0].alive());
  EXPECT_TRUE(absl::IsFailedPrecondition(r.AssignForJob("j", 2, 1).status()));
  EXPECT_TRUE(absl::IsInvalidArgument(r.Register("", Ep(1))));
  EXPECT_TRUE(absl::IsInvalidArgument(r.Register("x", Ep(0))));
}

TEST(ShardRegistry, AnIdBelongsToTheCertificateThatRegisteredIt) {
  ShardRegistry r(absl::Seconds(5));
  ASSERT_TRUE(r.Register("shard0", Ep(1), "ps-a").ok());
  ASSERT_TRUE(r.Register("shard0", Ep(2), "ps-a").ok());  // renewal, new endpoint
  const absl::Status taken = r.Register("shard0", Ep(9), "ps-b");
  EXPECT_TRUE(absl::IsPermissionDenied(taken)) << taken;
  EXPECT_EQ(taken.message(),
            "shard 'shard0' is registered by certificate 'ps-a'; certificate 'ps-b' may not "
            "register it (give each shard its own id)");
  EXPECT_TRUE(r.IsRegisteredBy("shard0", "ps-a"));
  EXPECT_FALSE(r.IsRegisteredBy("shard0", "ps-b"));
  EXPECT_FALSE(r.IsRegisteredBy("shard1", "ps-a"));
  auto list = r.List();
  ASSERT_EQ(list.size(), 1u);
  EXPECT_EQ(list[0].endpoint().port(), 2);  // the intruder's endpoint never got in
  EXPECT_EQ(list[0].identity(), "ps-a");
}

TEST(ShardRegistry, AnIdentityHoldsABoundedNumberOfIds) {
  ShardRegistry r(absl::Seconds(5));
  for (int i = 0; i < ShardRegistry::kMaxShardsPerIdentity; ++i) {
    ASSERT_TRUE(r.Register(absl::StrCat("s", i), Ep(1), "ps-a").ok()) << i;
  }
  const absl::Status over = r.Register("one-more", Ep(1), "ps-a");
  EXPECT_TRUE(absl::IsResourceExhausted(over)) << over;
  EXPECT_EQ(over.message(), absl::StrCat("certificate 'ps-a' already registered ",
                                         ShardRegistry::kMaxShardsPerIdentity,
                                         " shards (at most ", ShardRegistry::kMaxShardsPerIdentity,
                                         "); shard 'one-more' is refused"));
  EXPECT_TRUE(r.Register("one-more", Ep(1), "ps-b").ok());  // another identity has its own share
}

TEST(ShardRegistry, ADeadShardServingNoJobIsForgottenAndItsIdFreed) {
  ShardRegistry r(absl::Milliseconds(10), /*forget_after=*/absl::Milliseconds(20));
  ASSERT_TRUE(r.Register("a", Ep(1), "ps-a").ok());
  ASSERT_TRUE(r.Register("b", Ep(2), "ps-a").ok());
  ASSERT_TRUE(r.AssignForJob("j", 1, 2).ok());
  absl::SleepFor(absl::Milliseconds(40));  // both dead for longer than forget_after
  r.ForgetJob("j");                       // 'a' and 'b' serve nothing now
  ASSERT_TRUE(r.Register("b", Ep(2), "ps-a").ok());  // 'b' comes back; 'a' does not
  EXPECT_TRUE(r.Register("a", Ep(3), "ps-c").ok());  // the dead 'a' was forgotten
  EXPECT_TRUE(r.IsRegisteredBy("a", "ps-c"));
  EXPECT_TRUE(r.IsRegisteredBy("b", "ps-a"));
}

}  // namespace
}  // namespace gradsync
