// A reusable thread barrier for the rank threads of demo and bench.
#ifndef GRADSYNC_CLI_BARRIER_H_
#define GRADSYNC_CLI_BARRIER_H_

#include <condition_variable>
#include <cstdint>
#include <mutex>

namespace gradsync {

class Barrier {
 public:
  explicit Barrier(int n) : n_(n) {}
  void Wait() {
    std::unique_lock<std::mutex> l(mu_);
    const uint64_t gen = gen_;
    if (++waiting_ == n_) {
      waiting_ = 0;
      ++gen_;
      cv_.notify_all();
    } else {
      cv_.wait(l, [&] { return gen_ != gen; });
    }
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  const int n_;
  int waiting_ = 0;
  uint64_t gen_ = 0;
};

}  // namespace gradsync

#endif  // GRADSYNC_CLI_BARRIER_H_
