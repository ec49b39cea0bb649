// A futex doorbell in shared memory, used by the op queue (ipc/op_queue.h).
//
// A doorbell is a pair of 32-bit words: `seq` (the futex word) and
// `waiters`. Ringing = seq += 1, then FUTEX_WAKE only if waiters > 0, so a
// busy queue costs no system calls. Waiting = snapshot seq, re-check the
// condition, waiters += 1, FUTEX_WAIT(seq, snapshot, timeout), waiters -= 1.
// All four steps are sequentially consistent, so a ring between the snapshot
// and the wait is never lost. The futex calls are shared (no
// FUTEX_PRIVATE_FLAG: the words are in MAP_SHARED mappings seen by several
// processes), and every wait has a timeout: nothing here waits forever.
// Before sleeping a waiter may Spin() briefly: a waker that finds no sleeper
// makes no system call, and the waiter skips the futex wake-up latency.
#ifndef GRADSYNC_IPC_DOORBELL_H_
#define GRADSYNC_IPC_DOORBELL_H_

#include <atomic>
#include <cstdint>

#include "absl/time/time.h"

namespace gradsync {
namespace ipc {

// Futex words must be plain, lock-free, address-free 32-bit words to be
// shared between processes. (Lock-free atomics are address-free on every
// platform we build for.)
static_assert(std::atomic<uint32_t>::is_always_lock_free, "futex words must be lock-free");
static_assert(sizeof(std::atomic<uint32_t>) == sizeof(uint32_t), "futex word is 32 bits");

struct DoorbellWords {
  std::atomic<uint32_t> seq;      // the futex word
  std::atomic<uint32_t> waiters;  // sleepers on seq (or about to sleep)
};

// FUTEX_WAIT (shared) on `word` while it equals `expected`, for at most
// `timeout` (clamped to >= 0; an infinite one is cut to 1 s). Returns early on
// a wake, a signal, or if the word already differs; callers re-check their
// condition.
void FutexWait(std::atomic<uint32_t>* word, uint32_t expected, absl::Duration timeout);
// FUTEX_WAKE (shared) of up to `count` waiters; returns how many were woken.
int FutexWake(std::atomic<uint32_t>* word, int count);

// A view of a doorbell in shared memory (see the file comment).
class Doorbell {
 public:
  explicit Doorbell(DoorbellWords* words) : w_(words) {}
  uint32_t Snapshot() const { return w_->seq.load(std::memory_order_seq_cst); }
  void Ring();
  // Sleeps until the bell rings after `snapshot`, or `timeout` passes, or
  // spuriously; never longer than `timeout`.
  void Wait(uint32_t snapshot, absl::Duration timeout);
  // Polls (yielding the CPU between looks) until the bell rings after
  // `snapshot` or `limit` passes; true if it rang. No system call but
  // sched_yield: a ring seen here costs the ringer no FUTEX_WAKE and the
  // waiter no wake-up latency (tens of microseconds on an idle virtual CPU).
  bool Spin(uint32_t snapshot, absl::Duration limit) const;

 private:
  DoorbellWords* w_;
};

}  // namespace ipc
}  // namespace gradsync

#endif  // GRADSYNC_IPC_DOORBELL_H_
