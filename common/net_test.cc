#include "common/net.h"

#include <vector>

#include "gtest/gtest.h"

namespace gradsync {
namespace {

TEST(AllOnOneHost, SameAddressEverywhere) {
  EXPECT_TRUE(AllOnOneHost({{"10.0.0.7", 7000}, {"10.0.0.7", 7001}, {"10.0.0.7", 7002}}));
  EXPECT_TRUE(AllOnOneHost({{"node-a", 7000}}));
  EXPECT_TRUE(AllOnOneHost({}));
}

TEST(AllOnOneHost, EveryLoopbackAddressIsThisHost) {
  EXPECT_TRUE(AllOnOneHost({{"127.0.0.1", 7000}, {"127.0.0.2", 7001}, {"::1", 7002},
                            {"localhost", 7003}}));
}

TEST(AllOnOneHost, DifferentAddressesAreDifferentHosts) {
  EXPECT_FALSE(AllOnOneHost({{"10.0.0.7", 7000}, {"10.0.0.8", 7000}}));
  // One rank elsewhere is enough.
  EXPECT_FALSE(AllOnOneHost({{"127.0.0.1", 7000}, {"127.0.0.1", 7001}, {"10.0.0.8", 7000}}));
  // A name and an address are not resolved: taken as different hosts.
  EXPECT_FALSE(AllOnOneHost({{"node-a", 7000}, {"10.0.0.7", 7001}}));
}

TEST(SameGrpcTarget, SpellingsOfOneServerMatch) {
  EXPECT_TRUE(SameGrpcTarget("127.0.0.1:7070", "127.0.0.1:7070"));
  EXPECT_TRUE(SameGrpcTarget("localhost:7070", "127.0.0.1:7070"));
  EXPECT_TRUE(SameGrpcTarget("dns:///localhost:7070", "ipv4:127.0.0.1:7070"));
  EXPECT_TRUE(SameGrpcTarget("unix:/run/x.sock", "unix:/run/x.sock"));
}

TEST(SameGrpcTarget, OtherPortsHostsAndUnresolvableNamesDoNot) {
  EXPECT_FALSE(SameGrpcTarget("127.0.0.1:7070", "127.0.0.1:7071"));
  EXPECT_FALSE(SameGrpcTarget("127.0.0.1:7070", "127.0.0.2:7070"));
  EXPECT_FALSE(SameGrpcTarget("no-such-host.invalid:7070", "127.0.0.1:7070"));
  EXPECT_FALSE(SameGrpcTarget("unix:/run/x.sock", "unix:/run/y.sock"));
  EXPECT_FALSE(SameGrpcTarget("not a target", "127.0.0.1:7070"));
}

}  // namespace
}  // namespace gradsync
