#include "collective/stream_tuner.h"

namespace gradsync {

StreamTuner::StreamTuner(int streams, int probe_choice)
    : streams_(streams < 1 ? 1 : streams),
      choice_(probe_choice <= 1 ? 1 : streams_),
      first_(choice_),
      warmup_(choice_ > 1 ? 1 : 0),
      pending_(choice_ > 1 ? 2 : 0) {}

int StreamTuner::Propose() const {
  if (pending_ == 2) return first_;
  if (pending_ == 1) return first_ == 1 ? streams_ : 1;
  return choice_;
}

void StreamTuner::Observe(int streams, size_t bytes, double micros) {
  if (streams_ <= 1 || bytes == 0 || micros <= 0) return;
  const double per_byte = micros / static_cast<double>(bytes);
  if (warmup_ > 0) {  // the job's first large op: cold, whatever it ran on
    --warmup_;
    return;
  }
  if (pending_ == 0) {
    if (++since_explore_ >= kReexploreEvery) {
      since_explore_ = 0;
      first_ = choice_;
      pending_ = 2;
    }
    return;
  }
  if (streams != Propose()) return;  // rank 0 proposed something else: not ours to count
  sample_[streams == 1 ? 0 : 1] = per_byte;
  if (--pending_ > 0) return;
  best_[0] = sample_[0];
  best_[1] = sample_[1];
  choice_ = best_[1] < (1 - kAllMargin) * best_[0] ? streams_ : 1;
}

}  // namespace gradsync
