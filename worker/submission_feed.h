// A source of submissions that the job's executor polls itself while it is
// idle: the shared-memory op queue (worker/op_queue_server.h). Without it a
// poller thread takes each submission and wakes the executor, one thread
// hand-off (a futex wake, tens of microseconds on a virtual CPU) per op.
#ifndef GRADSYNC_WORKER_SUBMISSION_FEED_H_
#define GRADSYNC_WORKER_SUBMISSION_FEED_H_

#include <cstdint>

#include "absl/time/time.h"

namespace gradsync {

class SubmissionFeed {
 public:
  virtual ~SubmissionFeed() = default;
  // The doorbell's state; take it before looking for work, so a ring after
  // it makes Spin/Wait return at once.
  virtual uint32_t Snapshot() = 0;
  // Takes every submission waiting (handing each to the session's Submit).
  // Never blocks for long; called without session locks held.
  virtual void Pump() = 0;
  // Polls the doorbell (yielding the CPU) until it rings or `limit` passes;
  // true if it rang.
  virtual bool Spin(uint32_t snapshot, absl::Duration limit) = 0;
  // Sleeps until the doorbell rings or `timeout` passes.
  virtual void Wait(uint32_t snapshot, absl::Duration timeout) = 0;
  // Rings the doorbell: wakes a Spin or Wait (work arrived another way).
  virtual void Wake() = 0;
  // How long to keep polling after the last activity before sleeping.
  virtual absl::Duration spin() const = 0;
};

}  // namespace gradsync

#endif  // GRADSYNC_WORKER_SUBMISSION_FEED_H_
