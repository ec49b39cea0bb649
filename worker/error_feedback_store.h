// The error-feedback state this daemon keeps for one job's compressed ops,
// per key (OpRunner::FeedbackKeyOf: the op's name, or for an unnamed op on
// the client's own memory that memory and offset, the entry then ending
// with it): with one rank per daemon it is that rank's, with ranks
// sharing the daemon it is the daemon's share's (the input of the stage
// among the daemons). The residual of what an op did not deliver joins the
// next op of the same name:
//
//   top-k (kernels/topk.h)   the values not selected (and DDP's momentum)
//   a wire codec             what the codec's quantizations on this daemon
//   (kernels/codec.h)        lost (collective/compressed_ring.h); one entry
//                            whichever codec ran, so that `auto` may change
//                            its choice without losing what is owed; a
//                            dense op of the name takes what is owed into
//                            its input (TakeResidual)
//
// Layout: an entry is for one element count and one scheme (top-k with its
// parameters, or quantization); an op of the same name with another layout
// drops it (logged) and starts afresh. The store lives as long as the job's
// epoch on this daemon (the executor's OpRunner): a membership change starts
// an empty one, and what the old one held is logged when it is dropped.
//
// Memory: an entry's residual (and momentum) is charged to the session of
// the op that made it (SessionBuffers::ChargeState) before it is allocated;
// refused, the op runs without kept state (what it does not deliver is
// lost), and the refusal is logged and counted (refusals()).
//
// Threading: the executor's thread only.
#ifndef GRADSYNC_WORKER_ERROR_FEEDBACK_STORE_H_
#define GRADSYNC_WORKER_ERROR_FEEDBACK_STORE_H_

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "kernels/topk.h"
#include "worker/session_buffers.h"

namespace gradsync {

// What an entry is for: `count` f32 values, and how they travel.
struct FeedbackLayout {
  size_t count = 0;
  SparseSpec topk;  // on: top-k with these parameters; off: a wire codec's quantization

  static FeedbackLayout Topk(size_t count, const SparseSpec& spec) { return {count, spec}; }
  static FeedbackLayout Quantized(size_t count) { return {count, SparseSpec{}}; }
  // The state's bytes (the residual, and top-k's momentum).
  uint64_t StateBytes() const;
  // "4096 elements, topk:0.01", "4096 elements, quantized".
  std::string ToString() const;
  bool operator==(const FeedbackLayout& o) const {
    return count == o.count && topk.Code() == o.topk.Code();
  }
};

class ErrorFeedbackStore {
 public:
  ErrorFeedbackStore(std::string job_id, int64_t epoch) : job_id_(std::move(job_id)), epoch_(epoch) {}
  ~ErrorFeedbackStore();
  ErrorFeedbackStore(const ErrorFeedbackStore&) = delete;
  ErrorFeedbackStore& operator=(const ErrorFeedbackStore&) = delete;

  // An entry's key, and what bounds its life: an entry whose `owner` is
  // set and has expired (the client memory it was keyed by was freed) is
  // dropped, logged, before the store is next used.
  struct Key {
    std::string name;
    std::weak_ptr<const void> owner;  // empty: lives with the epoch
  };

  // Ops of `name` counted so far with this layout (0: none, or another
  // layout): top-k's warm-up decision.
  uint64_t OpsSoFar(const std::string& name, const FeedbackLayout& layout) const;
  // Counts one op of `key` (a dense warm-up op or a compressed one).
  void CountOp(const Key& key, const FeedbackLayout& layout);
  // The state a compressed op of `key` updates: made, and charged to
  // `quota` (may be null: not charged), on first use or after a layout
  // change. Null when the quota refused it.
  ErrorFeedback* StateFor(const Key& key, const FeedbackLayout& layout,
                          const std::shared_ptr<SessionBuffers>& quota);
  // Drops the entry of `name` (an op that failed midway left its residual
  // half written), logging `why`.
  void Drop(const std::string& name, const std::string& why);
  // The residual of `name` if its entry has this layout (empty otherwise),
  // taken out of the store with the entry (its charge released): a dense op
  // of the name pays it back.
  std::vector<float> TakeResidual(const std::string& name, const FeedbackLayout& layout);

  size_t keys() const { return entries_.size(); }
  // Bytes of every entry's state, and the norm of all the residuals together.
  uint64_t bytes() const;
  double ResidualNorm() const;
  uint64_t refusals() const { return refusals_; }

 private:
  struct Entry {
    FeedbackLayout layout;
    ErrorFeedback state;
    uint64_t charged = 0;
    std::shared_ptr<SessionBuffers> quota;
    std::weak_ptr<const void> owner;
    bool owned = false;  // `owner` was set: the entry ends with it
  };
  // The entry of `key` for this layout, replacing one of another layout.
  Entry& EntryFor(const Key& key, const FeedbackLayout& layout);
  // Drops the entries whose owner has expired.
  void DropOrphans();
  static void Release(Entry& e);

  const std::string job_id_;
  const int64_t epoch_;
  std::map<std::string, Entry> entries_;
  uint64_t refusals_ = 0;
};

}  // namespace gradsync

#endif  // GRADSYNC_WORKER_ERROR_FEEDBACK_STORE_H_
