// GroupByHost: daemons grouped by the host of their "host:port" endpoint, in
// order of first appearance; two_level() only for >= 2 hosts of the same
// number (>= 2) of daemons. (The allreduce itself: worker/executor_cluster_test
// and worker/daemon_test, in-process and over TCP.)
#include "collective/two_level.h"

#include <string>
#include <vector>

#include "gtest/gtest.h"

namespace gradsync {
namespace {

TEST(GroupByHost, GroupsDaemonsByTheHostOfTheirEndpoint) {
  const HostGroups g = GroupByHost(
      {"10.0.0.2:7071", "10.0.0.1:7071", "10.0.0.2:7072", "10.0.0.1:7075"});
  EXPECT_EQ(g.nodes_of_host, (std::vector<std::vector<int>>{{0, 2}, {1, 3}}));
  EXPECT_EQ(g.host_of_node, (std::vector<int>{0, 1, 0, 1}));
  EXPECT_TRUE(g.two_level());
}

TEST(GroupByHost, TakesIpv6AndNamesWithoutAPort) {
  const HostGroups v6 = GroupByHost({"[::1]:7071", "[::1]:7072", "[fe80::2]:7071",
                                     "[fe80::2]:9"});
  EXPECT_EQ(v6.nodes_of_host, (std::vector<std::vector<int>>{{0, 1}, {2, 3}}));
  // A name without a port is its whole host name (kept apart from "host:port" hosts).
  const HostGroups bare = GroupByHost({"inproc-daemon-0", "inproc-daemon-0", "a:1"});
  EXPECT_EQ(bare.hosts(), 2);
  EXPECT_EQ(bare.nodes_of_host[0], (std::vector<int>{0, 1}));
}

TEST(GroupByHost, TwoLevelsOnlyForHostsOfTheSameSizeAboveOne) {
  EXPECT_FALSE(GroupByHost({"a:1", "a:2", "a:3"}).two_level());          // one host
  EXPECT_FALSE(GroupByHost({"a:1", "b:1", "c:1"}).two_level());          // a daemon per host
  EXPECT_FALSE(GroupByHost({"a:1", "a:2", "b:1"}).two_level());          // uneven
  EXPECT_TRUE(GroupByHost({"a:1", "b:1", "a:2", "b:2", "c:1", "c:2"}).two_level());
  EXPECT_FALSE(GroupByHost({}).two_level());
}

}  // namespace
}  // namespace gradsync
