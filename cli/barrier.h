// A reusable thread barrier for the rank threads of demo and bench.
//
// Waiters poll (yielding the CPU) for a short while before they sleep, so the
// ranks leave together: bench --blocking times each op from the barrier, and
// a futex wake-up per rank would skew their starts by tens of microseconds on
// a virtual CPU (MPI's barriers spin too).
#ifndef GRADSYNC_CLI_BARRIER_H_
#define GRADSYNC_CLI_BARRIER_H_

#include <sched.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <mutex>

namespace gradsync {

class Barrier {
 public:
  explicit Barrier(int n) : n_(n) {}
  void Wait() {
    std::unique_lock<std::mutex> l(mu_);
    const uint64_t gen = gen_.load(std::memory_order_relaxed);
    if (++waiting_ == n_) {
      waiting_ = 0;
      gen_.store(gen + 1, std::memory_order_release);
      cv_.notify_all();
      return;
    }
    l.unlock();
    const auto spin_end = std::chrono::steady_clock::now() + std::chrono::milliseconds(2);
    while (gen_.load(std::memory_order_acquire) == gen &&
           std::chrono::steady_clock::now() < spin_end) {
      sched_yield();
    }
    l.lock();
    cv_.wait(l, [&] { return gen_.load(std::memory_order_relaxed) != gen; });
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  const int n_;
  int waiting_ = 0;
  std::atomic<uint64_t> gen_{0};
};

}  // namespace gradsync

#endif  // GRADSYNC_CLI_BARRIER_H_
