#include "worker/tenant_memory.h"

#include <sys/statvfs.h>
#include <unistd.h>

#include <string>

#include "gtest/gtest.h"
#include "worker/buffer_limits.h"

namespace gradsync {
namespace {

TEST(TenantMemory, ChargesEachAccountApartAndNamesTheQuota) {
  TenantMemory m(1000);
  const std::string a = MemoryAccount("a", 1000), b = MemoryAccount("b", 1000);
  EXPECT_EQ(a, "tenant 'a'");
  EXPECT_TRUE(m.Charge(a, 600, "session s1: allocating").ok());
  EXPECT_TRUE(m.Charge(b, 1000, "session s2: allocating").ok());
  absl::Status over = m.Charge(a, 401, "session s3: allocating");
  EXPECT_EQ(over.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(over.message(),
            "session s3: allocating a buffer of 401 bytes would exceed tenant 'a''s buffer quota "
            "on this daemon of 1000 bytes (600 held by its sessions; gradsyncd "
            "--tenant_memory_limit_mb)");
  EXPECT_EQ(m.used(a), 600u);  // a refused charge takes nothing
  EXPECT_TRUE(m.Check(a, 400, "x").ok());
  EXPECT_TRUE(m.Charge(a, 400, "x").ok());
  m.Release(a, 600);
  EXPECT_EQ(m.used(a), 400u);
  m.Release(a, 5000);  // never below zero
  EXPECT_EQ(m.used(a), 0u);
  EXPECT_EQ(m.total_used(), 1000u);  // b's
  // An overflowing request is refused, not wrapped.
  EXPECT_FALSE(m.Charge(a, ~uint64_t{0}, "x").ok());
}

// Without tenants each uid is an account of its own.
TEST(TenantMemory, WithoutTenantsEachUidHasItsOwnShare) {
  TenantMemory m(1000);
  EXPECT_EQ(MemoryAccount("", 1001), "uid 1001");
  EXPECT_EQ(MemoryAccount("", -1), "uid unknown");
  EXPECT_TRUE(m.Charge(MemoryAccount("", 1001), 1000, "x").ok());
  absl::Status over = m.Charge(MemoryAccount("", 1001), 1, "session s1: allocating");
  EXPECT_EQ(over.message(),
            "session s1: allocating a buffer of 1 bytes would exceed uid 1001's buffer quota on "
            "this daemon of 1000 bytes (1000 held by its sessions; gradsyncd "
            "--tenant_memory_limit_mb)");
  EXPECT_TRUE(m.Charge(MemoryAccount("", 1002), 1000, "x").ok());
}

TEST(TenantMemory, TheDaemonsTotalBoundsEveryAccountTogether) {
  TenantMemory m(/*account_limit_bytes=*/600, /*total_limit_bytes=*/1000);
  EXPECT_TRUE(m.Charge("uid 1", 600, "x").ok());
  absl::Status over = m.Charge("uid 2", 600, "session s2: allocating");
  EXPECT_EQ(over.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(over.message(),
            "session s2: allocating a buffer of 600 bytes would exceed this daemon's buffer "
            "memory of 1000 bytes (600 held by all sessions; gradsyncd --buffer_memory_limit_mb)");
  EXPECT_TRUE(m.Charge("uid 2", 400, "x").ok());
  m.Release("uid 1", 600);
  EXPECT_TRUE(m.Charge("uid 3", 600, "x").ok());
}

TEST(TenantMemory, ZeroIsUnlimited) {
  TenantMemory m(0);
  EXPECT_TRUE(m.Charge("", uint64_t{1} << 50, "x").ok());
  EXPECT_EQ(m.used(""), uint64_t{1} << 50);
}

TEST(BufferLimits, DefaultsAreFractionsOfWhatTheMachineCanBack) {
  const uint64_t physical = static_cast<uint64_t>(::sysconf(_SC_PHYS_PAGES)) *
                            static_cast<uint64_t>(::sysconf(_SC_PAGESIZE));
  const uint64_t machine = MachineBufferMemory();
  EXPECT_GT(machine, 0u);
  EXPECT_LE(machine, physical);
  struct statvfs shm {};
  if (::statvfs("/dev/shm", &shm) == 0 && shm.f_blocks > 0) {
    EXPECT_LE(machine, static_cast<uint64_t>(shm.f_blocks) * shm.f_frsize);
  }
  const BufferLimits l = DefaultBufferLimits(uint64_t{24} << 30);
  EXPECT_EQ(l.session, uint64_t{12} << 30);
  EXPECT_EQ(l.account, uint64_t{12} << 30);
  EXPECT_EQ(l.total, uint64_t{18} << 30);
}

}  // namespace
}  // namespace gradsync
