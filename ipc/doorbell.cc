#include "ipc/doorbell.h"

#include <linux/futex.h>
#include <sched.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <climits>

#include "absl/time/clock.h"
#include "common/clock.h"

namespace gradsync {
namespace ipc {
namespace {

uint32_t* FutexAddress(std::atomic<uint32_t>* word) {
  // std::atomic<uint32_t> is a standard-layout wrapper of one uint32_t
  // (static_asserts in the header).
  return reinterpret_cast<uint32_t*>(word);
}

}  // namespace

void FutexWait(std::atomic<uint32_t>* word, uint32_t expected, absl::Duration timeout) {
  timeout = std::max(timeout, absl::ZeroDuration());
  if (timeout == absl::InfiniteDuration()) timeout = absl::Seconds(1);  // never unbounded
  const int64_t ns = absl::ToInt64Nanoseconds(timeout);
  struct timespec ts;
  ts.tv_sec = static_cast<time_t>(ns / 1000000000);
  ts.tv_nsec = static_cast<long>(ns % 1000000000);
  // Shared futex: no FUTEX_PRIVATE_FLAG (the word is in a MAP_SHARED mapping).
  ::syscall(SYS_futex, FutexAddress(word), FUTEX_WAIT, expected, &ts, nullptr, 0);
}

int FutexWake(std::atomic<uint32_t>* word, int count) {
  const long woken = ::syscall(SYS_futex, FutexAddress(word), FUTEX_WAKE, count, nullptr, nullptr, 0);
  return woken < 0 ? 0 : static_cast<int>(woken);
}

void Doorbell::Ring() {
  w_->seq.fetch_add(1, std::memory_order_seq_cst);
  if (w_->waiters.load(std::memory_order_seq_cst) != 0) FutexWake(&w_->seq, INT_MAX);
}

void Doorbell::Wait(uint32_t snapshot, absl::Duration timeout) {
  w_->waiters.fetch_add(1, std::memory_order_seq_cst);
  FutexWait(&w_->seq, snapshot, timeout);
  w_->waiters.fetch_sub(1, std::memory_order_seq_cst);
}

bool Doorbell::Spin(uint32_t snapshot, absl::Duration limit) const {
  if (limit <= absl::ZeroDuration()) return w_->seq.load(std::memory_order_seq_cst) != snapshot;
  const absl::Time end = FastNow() + limit;
  while (true) {
    if (w_->seq.load(std::memory_order_seq_cst) != snapshot) return true;
    if (FastNow() >= end) return false;
    ::sched_yield();
  }
}

}  // namespace ipc
}  // namespace gradsync
