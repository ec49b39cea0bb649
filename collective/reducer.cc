#include "collective/reducer.h"

#include <cstring>

#include "kernels/cpu_reduce.h"

namespace gradsync {
namespace {

class Cpu final : public Reducer {
 public:
  transport::MemKind kind() const override { return transport::MemKind::Host(); }
  void Reduce(DType dtype, ReduceOp op, void* dst, const void* src, size_t count) const override {
    ReduceInto(dtype, CombineOp(op), dst, src, count);
  }
  void Combine(DType dtype, ReduceOp op, void* dst, const void* a, const void* b,
               size_t count) const override {
    ReduceOutOfPlace(dtype, CombineOp(op), dst, a, b, count);
  }
  void Divide(DType dtype, void* data, size_t count, int64_t divisor) const override {
    DivideBy(dtype, data, count, divisor);
  }
  void Copy(void* dst, const void* src, size_t bytes) const override {
    if (bytes > 0) std::memcpy(dst, src, bytes);
  }
  void Encode(CodecId codec, const float* in, size_t n, void* out) const override {
    CodecFor(codec)->Encode(in, n, static_cast<char*>(out));
  }
  void Decode(CodecId codec, const void* in, size_t n, float* out, bool add) const override {
    const Codec& c = *CodecFor(codec);
    const char* bytes = static_cast<const char*>(in);
    if (add) {
      c.DecodeAdd(bytes, n, out);
    } else {
      c.Decode(bytes, n, out);
    }
  }
};

}  // namespace

const Reducer& CpuReducer() {
  static const Cpu* cpu = new Cpu();
  return *cpu;
}

}  // namespace gradsync
