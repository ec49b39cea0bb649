// A few threads that work on the slices of one large in-memory op together
// (the job's executor reduces and copies the buffers of the ranks on this
// daemon; one thread alone is bound by one core's memory bandwidth).
// The helpers sleep between ops; Run returns when every slice is done.
#ifndef GRADSYNC_COMMON_SLICE_POOL_H_
#define GRADSYNC_COMMON_SLICE_POOL_H_

#include <cstddef>
#include <functional>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"

namespace gradsync {

class SlicePool {
 public:
  // `width` threads in all: the caller of Run and width - 1 helpers.
  explicit SlicePool(int width);
  ~SlicePool();
  SlicePool(const SlicePool&) = delete;
  SlicePool& operator=(const SlicePool&) = delete;

  int width() const { return static_cast<int>(helpers_.size()) + 1; }
  // fn(i) for every i in [0, n), on the caller and the helpers. One Run at a time.
  void Run(int n, const std::function<void(int)>& fn);

  // Splits `count` elements of `elem_bytes` into slices of at least
  // `min_bytes` (at most width() of them) and runs fn(begin, end) on each.
  void ForRanges(size_t count, size_t elem_bytes, size_t min_bytes,
                 const std::function<void(size_t begin, size_t end)>& fn);

 private:
  void Help();
  // Takes and runs slices until none is left (mu_ held on entry and exit).
  void Drain() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  absl::Mutex mu_;
  const std::function<void(int)>* fn_ ABSL_GUARDED_BY(mu_) = nullptr;
  int n_ ABSL_GUARDED_BY(mu_) = 0;
  int next_ ABSL_GUARDED_BY(mu_) = 0;
  int done_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t generation_ ABSL_GUARDED_BY(mu_) = 0;
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  std::vector<std::thread> helpers_;
};

}  // namespace gradsync

#endif  // GRADSYNC_COMMON_SLICE_POOL_H_
