#include "ps/slicer.h"

#include <algorithm>
#include <functional>
#include <queue>
#include <utility>

namespace gradsync::ps {

std::vector<Partition> BalancedSlicer::Slice(uint64_t tensor_bytes, size_t elem_size,
                                             uint64_t partition_bytes, int shards) const {
  std::vector<Partition> out;
  if (tensor_bytes == 0 || elem_size == 0 || shards < 1 || tensor_bytes % elem_size != 0) {
    return out;
  }
  uint64_t elems = std::max<uint64_t>(1, partition_bytes / elem_size);
  elems = std::min<uint64_t>(elems, std::max<uint64_t>(1, kMaxPartitionBytes / elem_size));
  const uint64_t step = elems * elem_size;
  const uint64_t n = (tensor_bytes + step - 1) / step;
  if (n > kMaxPartitions) return out;
  out.reserve(n);
  // Min-heap of (bytes assigned, shard): the least-loaded shard, lowest index on ties.
  using Load = std::pair<uint64_t, int>;
  std::priority_queue<Load, std::vector<Load>, std::greater<Load>> loads;
  for (int s = 0; s < shards; ++s) loads.push({0, s});
  for (uint64_t i = 0; i < n; ++i) {
    Partition p;
    p.id = static_cast<uint32_t>(i);
    p.offset_bytes = i * step;
    p.bytes = std::min(step, tensor_bytes - p.offset_bytes);
    Load least = loads.top();
    loads.pop();
    p.shard = least.second;
    loads.push({least.first + p.bytes, least.second});
    out.push_back(p);
  }
  return out;
}

}  // namespace gradsync::ps
