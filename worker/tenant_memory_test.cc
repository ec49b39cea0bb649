#include "worker/tenant_memory.h"

#include <string>

#include "gtest/gtest.h"

namespace gradsync {
namespace {

TEST(TenantMemory, ChargesEachTenantApartAndNamesTheQuota) {
  TenantMemory m(1000);
  EXPECT_TRUE(m.Charge("a", 600, "session s1: allocating").ok());
  EXPECT_TRUE(m.Charge("b", 1000, "session s2: allocating").ok());
  absl::Status over = m.Charge("a", 401, "session s3: allocating");
  EXPECT_EQ(over.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(over.message(),
            "session s3: allocating a buffer of 401 bytes would exceed tenant 'a''s buffer quota "
            "on this daemon of 1000 bytes (600 held by its sessions; gradsyncd "
            "--tenant_memory_limit_mb)");
  EXPECT_EQ(m.used("a"), 600u);  // a refused charge takes nothing
  EXPECT_TRUE(m.Check("a", 400, "x").ok());
  EXPECT_TRUE(m.Charge("a", 400, "x").ok());
  m.Release("a", 600);
  EXPECT_EQ(m.used("a"), 400u);
  m.Release("a", 5000);  // never below zero
  EXPECT_EQ(m.used("a"), 0u);
  // An overflowing request is refused, not wrapped.
  EXPECT_FALSE(m.Charge("a", ~uint64_t{0}, "x").ok());
}

TEST(TenantMemory, ZeroIsUnlimited) {
  TenantMemory m(0);
  EXPECT_TRUE(m.Charge("", uint64_t{1} << 50, "x").ok());
  EXPECT_EQ(m.used(""), uint64_t{1} << 50);
}

}  // namespace
}  // namespace gradsync
