#include "collective/ring_plan.h"

#include <algorithm>

namespace gradsync {

RingPlan::RingPlan(size_t count, int world, int rank, size_t elem_size, size_t segment_bytes)
    : count_(count), world_(world < 1 ? 1 : world), rank_(rank) {
  const size_t max_chunk = (count_ + world_ - 1) / world_;
  const size_t seg_elems = std::max<size_t>(1, segment_bytes / std::max<size_t>(1, elem_size));
  segments_ = std::max<size_t>(1, (max_chunk + seg_elems - 1) / seg_elems);
}

ElementRange RingPlan::Chunk(int c) const {
  const size_t b = count_ * static_cast<size_t>(c) / world_;
  const size_t e = count_ * static_cast<size_t>(c + 1) / world_;
  return {b, e - b};
}

ElementRange RingPlan::Segment(int c, size_t k) const {
  const ElementRange ch = Chunk(c);
  const size_t b = ch.count * k / segments_;
  const size_t e = ch.count * (k + 1) / segments_;
  return {ch.begin + b, e - b};
}

size_t RingPlan::max_segment_elements() const {
  const size_t max_chunk = (count_ + world_ - 1) / world_;
  return (max_chunk + segments_ - 1) / segments_;
}

RingMessage RingPlan::Make(size_t i, bool send) const {
  RingMessage m;
  m.step = static_cast<int>(i / segments_);
  m.segment = static_cast<int>(i % segments_);
  m.reduce = m.step < world_ - 1;
  if (m.reduce) {
    m.chunk = Mod(send ? rank_ - m.step : rank_ - m.step - 1);
  } else {
    const int a = m.step - (world_ - 1);
    m.chunk = Mod(send ? rank_ + 1 - a : rank_ - a);
  }
  m.range = Segment(m.chunk, static_cast<size_t>(m.segment));
  return m;
}

RingMessage RingPlan::Send(size_t i) const { return Make(i, true); }
RingMessage RingPlan::Recv(size_t i) const { return Make(i, false); }

}  // namespace gradsync
