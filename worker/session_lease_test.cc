#include "worker/session_lease.h"

#include "common/clock.h"
#include "gtest/gtest.h"

namespace gradsync {
namespace {

TEST(SessionLease, ANewLeaseWasJustUsed) {
  const absl::Time before = FastNow();
  SessionLease lease;
  const absl::Time after = FastNow();
  EXPECT_GE(lease.last_used(), before);
  EXPECT_LE(lease.last_used(), after);
}

TEST(SessionLease, TouchMovesLastUsedToNow) {
  SessionLease lease;
  const absl::Time created = lease.last_used();
  // Wait (no sleep) until the clock has moved on, so the touch is visible.
  while (FastNow() <= created) {
  }
  const absl::Time before = FastNow();
  lease.Touch();
  const absl::Time after = FastNow();
  EXPECT_GT(lease.last_used(), created);
  EXPECT_GE(lease.last_used(), before);
  EXPECT_LE(lease.last_used(), after);
}

}  // namespace
}  // namespace gradsync
