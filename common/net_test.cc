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

}  // namespace
}  // namespace gradsync
