#include "common/slice_pool.h"

#include <algorithm>

#include "common/process.h"

namespace gradsync {

SlicePool::SlicePool(int width) {
  for (int i = 1; i < width; ++i) {
    helpers_.emplace_back([this] { Help(); });
    NameThread(helpers_.back(), "gs-slices");
  }
}

SlicePool::~SlicePool() {
  {
    absl::MutexLock l(&mu_);
    stop_ = true;
  }
  for (std::thread& t : helpers_) t.join();
}

void SlicePool::Drain() {
  while (fn_ != nullptr && next_ < n_) {
    const int i = next_++;
    const std::function<void(int)>* fn = fn_;
    mu_.Unlock();
    (*fn)(i);
    mu_.Lock();
    ++done_;
  }
}

void SlicePool::Help() {
  absl::MutexLock l(&mu_);
  uint64_t seen = generation_;
  while (true) {
    auto work = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return stop_ || generation_ != seen; };
    mu_.Await(absl::Condition(&work));
    if (stop_) return;
    seen = generation_;
    Drain();
  }
}

void SlicePool::Run(int n, const std::function<void(int)>& fn) {
  if (n <= 1 || helpers_.empty()) {
    for (int i = 0; i < n; ++i) fn(i);
    return;
  }
  absl::MutexLock l(&mu_);
  fn_ = &fn;
  n_ = n;
  next_ = 0;
  done_ = 0;
  ++generation_;
  Drain();
  auto all_done = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return done_ == n_; };
  mu_.Await(absl::Condition(&all_done));  // the helpers' slices are short memory passes
  fn_ = nullptr;
}

void SlicePool::ForRanges(size_t count, size_t elem_bytes, size_t min_bytes,
                          const std::function<void(size_t, size_t)>& fn) {
  const size_t bytes = count * elem_bytes;
  size_t slices = min_bytes == 0 ? 1 : bytes / min_bytes;
  slices = std::max<size_t>(1, std::min<size_t>(slices, static_cast<size_t>(width())));
  const size_t per = (count + slices - 1) / slices;
  Run(static_cast<int>(slices), [&](int i) {
    const size_t begin = std::min(count, static_cast<size_t>(i) * per);
    const size_t end = std::min(count, begin + per);
    if (begin < end) fn(begin, end);
  });
}

}  // namespace gradsync
