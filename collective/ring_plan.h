// Chunk and segment arithmetic of the ring allreduce (pure, no I/O).
//
// The buffer of `count` elements is cut into `world` chunks whose sizes differ
// by at most one element (chunk c = [c*count/world, (c+1)*count/world)). Each
// chunk is cut the same way into `segments` segments, the unit of pipelining:
// every ring step moves one chunk as `segments` messages, and a segment can go
// on to the next rank as soon as it has been reduced here.
//
// Messages are numbered 0 .. 2*(world-1)*segments-1 in the order they cross
// the ring. Step s < world-1 is reduce-scatter: rank r sends chunk (r-s) and
// receives chunk (r-s-1), which it reduces into its buffer. Step s >= world-1
// is allgather step a = s-(world-1): rank r sends chunk (r+1-a) and receives
// chunk (r-a) straight into place. After reduce-scatter rank r owns the fully
// reduced chunk (r+1). Send i depends on receive i-segments having been
// processed (the data it forwards), for i >= segments.
#ifndef GRADSYNC_COLLECTIVE_RING_PLAN_H_
#define GRADSYNC_COLLECTIVE_RING_PLAN_H_

#include <cstddef>
#include <cstdint>

namespace gradsync {

struct ElementRange {
  size_t begin = 0;
  size_t count = 0;
};

struct RingMessage {
  int step = 0;
  bool reduce = false;  // reduce-scatter phase: combine into the buffer
  int chunk = 0;
  int segment = 0;
  ElementRange range;
};

class RingPlan {
 public:
  // segment_bytes: target pipelining unit; the plan uses at least one segment
  // per chunk and no segment larger than segment_bytes (except single elements).
  RingPlan(size_t count, int world, int rank, size_t elem_size, size_t segment_bytes);

  size_t count() const { return count_; }
  int world() const { return world_; }
  int rank() const { return rank_; }
  size_t segments() const { return segments_; }
  size_t num_messages() const { return 2 * static_cast<size_t>(world_ - 1) * segments_; }
  size_t reduce_scatter_messages() const { return static_cast<size_t>(world_ - 1) * segments_; }
  size_t max_segment_elements() const;

  ElementRange Chunk(int c) const;
  ElementRange Segment(int c, size_t k) const;
  RingMessage Send(size_t i) const;
  RingMessage Recv(size_t i) const;
  // The chunk rank r holds fully reduced after reduce-scatter.
  int OwnedChunk() const { return Mod(rank_ + 1); }

 private:
  int Mod(int x) const { return ((x % world_) + world_) % world_; }
  RingMessage Make(size_t i, bool send) const;

  size_t count_;
  int world_;
  int rank_;
  size_t segments_;
};

}  // namespace gradsync

#endif  // GRADSYNC_COLLECTIVE_RING_PLAN_H_
