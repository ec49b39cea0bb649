// How a tensor is cut into partitions and spread over parameter-server shards.
//
// A Slicer is a pure function of its arguments: every worker of a job calls it
// with the same arguments and must get the same partitions, on every step, so
// that all workers push partition i to the same shard and the assignment is
// stable across steps. It is replaceable (ps-lite's "slicer"): PsWorker takes
// any implementation; the shard never runs it, it only checks that all
// workers sent it the same partition table (see ps/README.md).
#ifndef GRADSYNC_PS_SLICER_H_
#define GRADSYNC_PS_SLICER_H_

#include <cstddef>
#include <cstdint>
#include <vector>

namespace gradsync::ps {

// The largest partition: one partition travels as one frame (transport/wire.h
// kMaxFrameBytes).
inline constexpr uint64_t kMaxPartitionBytes = 64ull << 20;
// The most partitions one tensor may be cut into.
inline constexpr uint32_t kMaxPartitions = 1u << 20;

// A byte range of the tensor, owned by one shard.
struct Partition {
  uint32_t id = 0;            // 0, 1, ... in offset order for BalancedSlicer
  uint64_t offset_bytes = 0;  // start within the tensor
  uint64_t bytes = 0;         // > 0, a whole number of elements
  int shard = 0;              // 0 <= shard < shards

  bool operator==(const Partition& o) const {
    return id == o.id && offset_bytes == o.offset_bytes && bytes == o.bytes && shard == o.shard;
  }
};

class Slicer {
 public:
  virtual ~Slicer() = default;

  // Cuts a tensor of `tensor_bytes` (a multiple of `elem_size`) into
  // partitions of about `partition_bytes` and assigns each to a shard in
  // [0, shards). Contract (PsWorker checks it and fails the step with
  // InvalidArgument otherwise): the result is in id order with ids 0..n-1, the
  // partitions cover [0, tensor_bytes) exactly without overlap, each is a
  // whole number of elements, at most kMaxPartitionBytes, and n <=
  // kMaxPartitions. Deterministic. Empty for tensor_bytes == 0 and for
  // invalid arguments (elem_size == 0, shards < 1, tensor_bytes not a
  // multiple of elem_size, more than kMaxPartitions partitions). Thread-safe.
  virtual std::vector<Partition> Slice(uint64_t tensor_bytes, size_t elem_size,
                                       uint64_t partition_bytes, int shards) const = 0;
};

// Fixed-size partitions cut at element boundaries: every partition has
// max(1, partition_bytes / elem_size) elements (capped at kMaxPartitionBytes),
// except the last, which has the rest. Partitions are assigned in id order,
// each to the shard with the fewest bytes so far, ties to the lowest shard
// index: equal partitions go round-robin and shard loads differ by at most
// one partition.
class BalancedSlicer final : public Slicer {
 public:
  std::vector<Partition> Slice(uint64_t tensor_bytes, size_t elem_size, uint64_t partition_bytes,
                               int shards) const override;
};

}  // namespace gradsync::ps

#endif  // GRADSYNC_PS_SLICER_H_
