// MallocMappingOf: glibc's large allocations are found with their own pages;
// heap allocations, stack memory and ranges beyond an allocation are refused
// saying why; what /proc/self/maps says about the memory is checked.
#include "client/malloc_mapping.h"

#include <sys/mman.h>
#include <unistd.h>

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <string>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace gradsync {
namespace client {
namespace {

using ::testing::HasSubstr;

const uintptr_t kPage = static_cast<uintptr_t>(::sysconf(_SC_PAGESIZE));

// Under a sanitizer malloc is the sanitizer's: every lookup is refused
// saying so (checked here), and the glibc cases cannot run.
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
constexpr bool kSanitizedMalloc = true;
#else
constexpr bool kSanitizedMalloc = false;
#endif

#define SKIP_UNLESS_GLIBC_MALLOC()                                                       \
  if (kSanitizedMalloc) {                                                                \
    void* p = ::malloc(size_t{40} << 20);                                                \
    EXPECT_THAT(MallocMappingOf(p, 64).status().message(),                               \
                HasSubstr("malloc in this process is not glibc's"));                     \
    ::free(p);                                                                           \
    GTEST_SKIP() << "malloc is the sanitizer's: only its refusal is checked";            \
  }

TEST(MallocMapping, LargeAllocationsHaveTheirOwnPages) {
  SKIP_UNLESS_GLIBC_MALLOC();
  for (size_t bytes : {size_t{40} << 20, (size_t{33} << 20) + 5}) {
    void* p = nullptr;
    ASSERT_EQ(::posix_memalign(&p, 64, bytes), 0);
    absl::StatusOr<MallocMapping> m = MallocMappingOf(p, bytes);
    ASSERT_TRUE(m.ok()) << m.status();
    const uintptr_t start = reinterpret_cast<uintptr_t>(m->start);
    EXPECT_EQ(start % kPage, 0u);
    EXPECT_EQ(m->length % kPage, 0u);
    EXPECT_LE(start, reinterpret_cast<uintptr_t>(p));
    EXPECT_GE(start + m->length, reinterpret_cast<uintptr_t>(p) + bytes);
    EXPECT_LT(m->length, bytes + 2 * kPage);  // the allocation, and no one else's pages
    // Part of it, from its start, is fine; past its end is not.
    EXPECT_TRUE(MallocMappingOf(p, 1).ok());
    absl::StatusOr<MallocMapping> beyond = MallocMappingOf(p, m->length + 1);
    EXPECT_EQ(beyond.status().code(), absl::StatusCode::kFailedPrecondition);
    EXPECT_THAT(beyond.status().message(), HasSubstr("the range ends beyond its allocation of"));
    ::free(p);
  }
}

TEST(MallocMapping, HeapStackAndForeignMemoryAreRefusedSayingWhy) {
  SKIP_UNLESS_GLIBC_MALLOC();
  void* small = ::malloc(256);
  absl::StatusOr<MallocMapping> heap = MallocMappingOf(small, 256);
  EXPECT_EQ(heap.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(heap.status().message(), HasSubstr("cannot be shared in place:"));
  ::free(small);
  alignas(64) char on_stack[256];
  std::memset(on_stack, 0, sizeof(on_stack));
  absl::StatusOr<MallocMapping> stack = MallocMappingOf(on_stack + 64, 64);
  EXPECT_THAT(stack.status().message(), HasSubstr("it lies in [stack]"));
  // Memory mapped directly (not from malloc): nothing before it is its header.
  void* raw = ::mmap(nullptr, 4 * kPage, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  ASSERT_NE(raw, MAP_FAILED);
  ASSERT_EQ(::munmap(raw, kPage), 0);  // keep the page before it unmapped
  char* mem = static_cast<char*>(raw) + kPage;
  EXPECT_THAT(MallocMappingOf(mem, 64).status().message(),
              HasSubstr("not a pointer malloc returned"));
  EXPECT_THAT(MallocMappingOf(nullptr, 64).status().message(), HasSubstr("no memory"));
  EXPECT_THAT(MallocMappingOf(mem + 8, 64).status().message(), HasSubstr("misaligned"));
  ::munmap(mem, 3 * kPage);
}

// What the maps say is what counts: the same allocation is refused when its
// pages are said to be a file's or the heap.
TEST(MallocMapping, ThePagesMustBePrivateAnonymousMemory) {
  SKIP_UNLESS_GLIBC_MALLOC();
  void* p = nullptr;
  ASSERT_EQ(::posix_memalign(&p, 64, size_t{40} << 20), 0);
  absl::StatusOr<MallocMapping> m = MallocMappingOf(p, 64);
  ASSERT_TRUE(m.ok()) << m.status();
  const uintptr_t lo = reinterpret_cast<uintptr_t>(m->start), hi = lo + m->length;
  auto line = [&](const std::string& perms, const std::string& path) {
    return absl::StrCat(absl::Hex(lo), "-", absl::Hex(hi), " ", perms, " 00000000 00:00 0 ",
                        path, "\n");
  };
  EXPECT_TRUE(MallocMappingOf(p, 64, line("rw-p", "")).ok());
  EXPECT_THAT(MallocMappingOf(p, 64, line("rw-p", "[heap]")).status().message(),
              HasSubstr("it lies in [heap]"));
  EXPECT_THAT(MallocMappingOf(p, 64, line("rw-s", "")).status().message(),
              HasSubstr("not a pointer malloc returned"));
  // The allocation's last pages said to be a file's.
  const uintptr_t mid = lo + kPage * 2;
  const std::string split = absl::StrCat(absl::Hex(lo), "-", absl::Hex(mid),
                                         " rw-p 00000000 00:00 0\n", absl::Hex(mid), "-",
                                         absl::Hex(hi), " rw-p 00000000 08:01 42 /tmp/f\n");
  EXPECT_THAT(MallocMappingOf(p, 64, split).status().message(),
              HasSubstr("its pages are not all private anonymous read-write memory"));
  ::free(p);
}

}  // namespace
}  // namespace client
}  // namespace gradsync
