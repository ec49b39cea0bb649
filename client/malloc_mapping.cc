#include "client/malloc_mapping.h"

#include <dlfcn.h>
#include <sys/auxv.h>
#include <unistd.h>

#include <cstdint>
#include <cstring>
#include <fstream>
#include <sstream>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"

namespace gradsync {
namespace client {
namespace {

// One line of /proc/self/maps.
struct Vma {
  uintptr_t lo = 0, hi = 0;
  std::string perms;  // e.g. "rw-p"
  std::string path;   // "" for anonymous memory, "[heap]", "[stack]", a file
  bool anonymous_rw() const { return perms == "rw-p" && path.empty(); }
};

std::vector<Vma> ParseMaps(absl::string_view text) {
  std::vector<Vma> out;
  for (absl::string_view line : absl::StrSplit(text, '\n', absl::SkipEmpty())) {
    std::vector<absl::string_view> f = absl::StrSplit(line, ' ', absl::SkipEmpty());
    if (f.size() < 5) continue;
    std::pair<absl::string_view, absl::string_view> range = absl::StrSplit(f[0], '-');
    Vma v;
    uint64_t lo = 0, hi = 0;
    if (!absl::SimpleHexAtoi(range.first, &lo) || !absl::SimpleHexAtoi(range.second, &hi)) continue;
    v.lo = lo;
    v.hi = hi;
    v.perms = std::string(f[1]);
    if (f.size() >= 6) v.path = std::string(f[5]);
    out.push_back(std::move(v));
  }
  return out;
}

const Vma* Containing(const std::vector<Vma>& vmas, uintptr_t a) {
  for (const Vma& v : vmas) {
    if (v.lo <= a && a < v.hi) return &v;
  }
  return nullptr;
}

// glibc's chunk header (malloc/malloc.c): the word before the size holds,
// for an mmapped chunk, the distance from the mapping's start to the chunk;
// the size's low bits are flags.
constexpr size_t kHeaderBytes = 2 * sizeof(size_t);
constexpr size_t kIsMmapped = 0x2;
constexpr size_t kNonMainArena = 0x4;
constexpr size_t kFlagBits = 0x7;

// Whether `addr` lies in the main program (not in a shared library).
bool InMainProgram(const void* addr) {
  const void* phdr = reinterpret_cast<const void*>(::getauxval(AT_PHDR));
  Dl_info at{}, program{};
  return phdr != nullptr && ::dladdr(addr, &at) != 0 && ::dladdr(phdr, &program) != 0 &&
         at.dli_fbase == program.dli_fbase;
}

// Whether malloc is glibc's own: another allocator (jemalloc, tcmalloc, a
// sanitizer's) lays out no glibc header to read. The process's malloc must
// be libc's, or lie in the main program: a program linked without -pie (such
// as Debian's python3) makes its PLT entry the function's address, which
// dlsym returns. An allocator linked into the program or preloaded announces
// itself by its other entry points.
bool MallocIsGlibcs() {
  static const bool glibc = [] {
    void* libc = ::dlopen("libc.so.6", RTLD_NOW | RTLD_NOLOAD);
    if (libc == nullptr) return false;
    bool ok = true;
    for (const char* fn : {"malloc", "posix_memalign", "free"}) {
      void* mine = ::dlsym(RTLD_DEFAULT, fn);
      ok = ok && mine != nullptr && (mine == ::dlsym(libc, fn) || InMainProgram(mine));
    }
    for (const char* other : {"__asan_init", "__tsan_init", "__msan_init", "__hwasan_init",
                              "mallocx", "je_malloc", "tc_malloc", "mi_malloc", "rpmalloc",
                              "scalable_malloc"}) {
      ok = ok && ::dlsym(RTLD_DEFAULT, other) == nullptr;
    }
    ::dlclose(libc);
    return ok;
  }();
  return glibc;
}

}  // namespace

absl::StatusOr<MallocMapping> MallocMappingOf(const void* ptr, size_t bytes,
                                              absl::string_view proc_maps) {
  const uintptr_t p = reinterpret_cast<uintptr_t>(ptr);
  auto refuse = [&](absl::string_view why) {
    return absl::FailedPreconditionError(
        absl::StrCat("memory at 0x", absl::Hex(p), " (", bytes, " bytes) cannot be shared in "
                     "place: ", why));
  };
  if (ptr == nullptr || bytes == 0) return refuse("no memory");
  if (!MallocIsGlibcs()) {
    return refuse("malloc in this process is not glibc's (another allocator or a sanitizer's "
                  "is linked in)");
  }
  if (p % alignof(std::max_align_t) != 0 || p < kHeaderBytes) {
    return refuse("not a pointer malloc returned (misaligned)");
  }
  const std::vector<Vma> vmas = ParseMaps(proc_maps);
  const uintptr_t header = p - kHeaderBytes;
  const Vma* at = Containing(vmas, header);
  if (at == nullptr || Containing(vmas, p) != at || !at->anonymous_rw()) {
    return refuse(at != nullptr && !at->path.empty()
                      ? absl::StrCat("it lies in ", at->path, ", not in a mapping of its own")
                      : "not a pointer malloc returned (no anonymous read-write memory before it)");
  }
  size_t prev = 0, size = 0;
  std::memcpy(&prev, reinterpret_cast<const void*>(header), sizeof(prev));
  std::memcpy(&size, reinterpret_cast<const void*>(header + sizeof(size_t)), sizeof(size));
  if ((size & kIsMmapped) == 0 || (size & kNonMainArena) != 0) {
    return refuse("malloc placed it among other allocations (below its mmap threshold)");
  }
  const uintptr_t page = static_cast<uintptr_t>(::sysconf(_SC_PAGESIZE));
  const size_t length = prev + (size & ~kFlagBits);
  if (prev > header || (header - prev) % page != 0 || length % page != 0 || length < prev) {
    return refuse("not a pointer malloc returned (its header is not a mapping's)");
  }
  const uintptr_t start = header - prev;
  if (p + bytes < p || p + bytes > start + length) {
    return refuse(absl::StrCat("the range ends beyond its allocation of ", length - (p - start),
                               " bytes"));
  }
  // Every page of the allocation: private anonymous read-write memory (one
  // mapping, or adjacent ones the kernel keeps apart).
  for (uintptr_t a = start; a < start + length;) {
    const Vma* v = Containing(vmas, a);
    if (v == nullptr || !v->anonymous_rw()) {
      return refuse("its pages are not all private anonymous read-write memory");
    }
    a = v->hi;
  }
  return MallocMapping{reinterpret_cast<char*>(start), length};
}

absl::StatusOr<MallocMapping> MallocMappingOf(const void* ptr, size_t bytes) {
  std::ifstream in("/proc/self/maps");
  if (!in.is_open()) return absl::InternalError("cannot read /proc/self/maps");
  std::stringstream text;
  text << in.rdbuf();
  return MallocMappingOf(ptr, bytes, text.str());
}

}  // namespace client
}  // namespace gradsync
