// How many of a job's TCP streams its large ops use, learnt from the ops
// themselves (pure, no I/O).
//
// The link probe picks a stream count when the job forms, from 4 MiB ring
// allreduces (worker/link_probe.h). What is faster for those is not always
// what is faster for the job's large ops: on loopback a second stream helps
// a 4 MiB allreduce in about a third of the jobs and slows a 64 MiB one by
// 5-15%. So every rank proposes a stream count for each bandwidth-bound op
// in its signature (OpSignature::streams, not compared; rank 0's proposal
// wins, as for the algorithm), and rank 0's tuner tries both counts and
// keeps the faster:
//   1. when the probe chose all the streams, the job's first large op runs
//      on all and is not counted (it is cold: fresh buffers to fault in, TCP
//      windows still growing; on loopback it ran at a third of the second's
//      speed), the second runs on all, the third on one (when the probe chose
//      one, that is trusted until step 3: one stream is the cheaper setting,
//      and what the probe gets wrong is favouring all);
//   2. from then on the faster per byte, where "all" must be at least
//      kAllMargin faster (fewer streams are fewer system calls and a
//      single flow's ordering);
//   3. every kReexploreEvery large ops both are tried once more (the current
//      choice first), so the choice follows a link whose behaviour changes.
// "Large" is a ring or rhd allreduce, reduce_scatter or allgather of at
// least kMinBytes per rank. Not thread-safe: the job's executor owns it (through its planner).
#ifndef GRADSYNC_COLLECTIVE_STREAM_TUNER_H_
#define GRADSYNC_COLLECTIVE_STREAM_TUNER_H_

#include <cstddef>
#include <cstdint>

namespace gradsync {

class StreamTuner {
 public:
  static constexpr size_t kMinBytes = 16 << 20;
  static constexpr double kAllMargin = 0.05;
  static constexpr int kReexploreEvery = 64;

  // `streams`: the job's connections per peer; `probe_choice`: what the
  // probe chose (1 or `streams`).
  StreamTuner(int streams, int probe_choice);

  // Whether an op of `bytes` per rank counts as large (see above); the
  // caller checks the algorithm.
  static bool Large(size_t bytes) { return bytes >= kMinBytes; }

  // The stream count to propose for the next large op.
  int Propose() const;
  // A large op of `bytes` ran on `streams` streams in `micros`.
  void Observe(int streams, size_t bytes, double micros);

  // The best per-byte cost seen for one stream and for all (0: none yet).
  double one_us_per_byte() const { return best_[0]; }
  double all_us_per_byte() const { return best_[1]; }
  // The count it settled on (the probe's until both were tried).
  int choice() const { return choice_; }

 private:
  int streams_;
  int choice_;
  int first_;             // tried first in every exploration: the current choice
  int warmup_ = 0;        // large ops still to run before the first exploration counts
  int pending_ = 0;       // large ops left in the current exploration (2, 1, 0)
  int since_explore_ = 0; // large ops since the last exploration ended
  double sample_[2] = {0, 0};  // this exploration's per-byte cost, [one, all]
  double best_[2] = {0, 0};    // the last exploration's figures
};

}  // namespace gradsync

#endif  // GRADSYNC_COLLECTIVE_STREAM_TUNER_H_
