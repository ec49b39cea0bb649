#include "common/connection_limits.h"

#include "gtest/gtest.h"

namespace gradsync {
namespace {

TEST(ConnectionLimits, OneSourceCannotTakeEverySlot) {
  ConnectionLimits limits(/*per_source=*/2, /*total=*/3);
  EXPECT_TRUE(limits.Acquire("uid 1"));
  EXPECT_TRUE(limits.Acquire("uid 1"));
  EXPECT_FALSE(limits.Acquire("uid 1"));  // at its own limit
  EXPECT_EQ(limits.held("uid 1"), 2);
  EXPECT_TRUE(limits.Acquire("uid 2"));
  EXPECT_FALSE(limits.Acquire("uid 3"));  // at the total
  EXPECT_EQ(limits.total(), 3);
  limits.Release("uid 1");
  EXPECT_EQ(limits.held("uid 1"), 1);
  EXPECT_TRUE(limits.Acquire("uid 3"));
  limits.Release("never held");  // ignored
  EXPECT_EQ(limits.total(), 3);
}

}  // namespace
}  // namespace gradsync
