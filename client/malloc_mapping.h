// Where glibc's malloc put a large allocation, so that its pages can be
// handed to the daemon in place (Session::AdoptMemory).
//
// glibc serves a request above its mmap threshold (128 KiB at first; at most
// 32 MiB once it raised it dynamically) with a mapping of its own, an
// "mmapped chunk": the allocation and glibc's 16-byte header before it, and
// nothing else, on whole pages that free() unmaps. torch's CPU allocator
// (posix_memalign) gets its large tensors, DDP's gradient buckets among them,
// that way. Such pages can be replaced by shared ones holding the same bytes
// without touching any other object; memory from the heap (smaller
// allocations) shares its pages with neighbours and cannot.
#ifndef GRADSYNC_CLIENT_MALLOC_MAPPING_H_
#define GRADSYNC_CLIENT_MALLOC_MAPPING_H_

#include <cstddef>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace gradsync {
namespace client {

// The pages of one allocation: [start, start + length), page-aligned.
struct MallocMapping {
  char* start = nullptr;
  size_t length = 0;
};

// The mapping of the glibc allocation that `ptr` (a pointer malloc,
// posix_memalign or aligned_alloc returned) heads (refused where malloc is
// not glibc's, e.g. jemalloc or a sanitizer's), checked against
// `proc_maps` (the text of /proc/self/maps) to cover [ptr, ptr + bytes) and
// to be private anonymous read-write memory that is neither the heap nor a
// stack. FailedPrecondition saying why otherwise (a heap allocation, memory
// not from malloc, a range beyond the allocation).
absl::StatusOr<MallocMapping> MallocMappingOf(const void* ptr, size_t bytes,
                                              absl::string_view proc_maps);
// The same against this process's /proc/self/maps.
absl::StatusOr<MallocMapping> MallocMappingOf(const void* ptr, size_t bytes);

}  // namespace client
}  // namespace gradsync

#endif  // GRADSYNC_CLIENT_MALLOC_MAPPING_H_
