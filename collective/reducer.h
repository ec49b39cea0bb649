// What the collective algorithms reduce with: element-wise dst = dst OP src,
// the final division of avg and plain copies, for the memory kind the op's
// buffer lives in. The algorithms take it from their CollectiveCall; the CPU reducer
// (kernels/cpu_reduce.h, SIMD picked at run time) serves host memory. A CUDA
// reducer (cuda/cuda_reduce.h) serves device memory on a device that can
// register it.
#ifndef GRADSYNC_COLLECTIVE_REDUCER_H_
#define GRADSYNC_COLLECTIVE_REDUCER_H_

#include <cstddef>
#include <cstdint>

#include "common/types.h"
#include "kernels/codec.h"
#include "transport/transport.h"

namespace gradsync {

class Reducer {
 public:
  virtual ~Reducer() = default;
  // The memory it reads and writes.
  virtual transport::MemKind kind() const = 0;
  // dst[i] = dst[i] OP src[i] for i < count (avg: sum).
  virtual void Reduce(DType dtype, ReduceOp op, void* dst, const void* src, size_t count) const = 0;
  // dst[i] = a[i] OP b[i] (the operand order matters for bit-exact floats;
  // any of the three may be the same pointer).
  virtual void Combine(DType dtype, ReduceOp op, void* dst, const void* a, const void* b,
                       size_t count) const = 0;
  // data[i] /= divisor (avg's last step; integers truncate).
  virtual void Divide(DType dtype, void* data, size_t count, int64_t divisor) const = 0;
  // dst[0, bytes) = src[0, bytes) (non-overlapping) in this memory.
  virtual void Copy(void* dst, const void* src, size_t bytes) const = 0;
  // The wire codecs (kernels/codec.h) in this memory, bit for bit the CPU
  // codec's: n f32 values into CodecFor(codec)->EncodedBytes(n) bytes, and
  // back (add: out[i] += the decoded value, one f32 addition each). The
  // compressed ring's hops.
  virtual void Encode(CodecId codec, const float* in, size_t n, void* out) const = 0;
  virtual void Decode(CodecId codec, const void* in, size_t n, float* out, bool add) const = 0;
};

// The host-memory reducer (a process-wide instance).
const Reducer& CpuReducer();

}  // namespace gradsync

#endif  // GRADSYNC_COLLECTIVE_REDUCER_H_
