// The compressed ring (compressed_ring.h) against a plain simulation of its
// documented arithmetic - the same plan, one encode and one decode-add per
// hop, the owner's sum encoded once for the allgather - bit for bit, for
// every codec, allreduce and reduce_scatter, sum and avg, awkward world
// sizes and sizes, over TCP, the in-process device, the RDMA emulation and
// the emulated GPU's staged path (its reducer runs the codec); every rank ends with the same bits; the result is within the codec's
// error bound of the exact sum; with error feedback the residuals hold what
// the quantizations lost; what does not apply is refused by name.
#include "collective/compressed_ring.h"

#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "collective/ring_plan.h"
#include "collective/test_cluster.h"
#include "gtest/gtest.h"
#include "kernels/codec.h"
#include "kernels/cpu_reduce.h"

namespace gradsync {
namespace {

using testing::Cluster;
using testing::DeviceKind;
using testing::DeviceName;
using testing::kAllDevices;
using testing::MakeCluster;
using testing::RunOnRanks;

constexpr CodecId kCodecs[] = {CodecId::kBf16, CodecId::kFp16, CodecId::kFp8E4M3,
                               CodecId::kFp8E5M2, CodecId::kInt8};

std::vector<float> Gradient(size_t n, int rank, uint32_t seed) {
  std::mt19937 rng(seed * 131 + static_cast<uint32_t>(rank));
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = std::ldexp(normal(rng), static_cast<int>(i % 11) - 5);
  return v;
}

// What every rank's buffer holds afterwards, simulated.
std::vector<std::vector<float>> Simulate(const std::vector<std::vector<float>>& in,
                                         CollectiveKind kind, ReduceOp op, size_t count,
                                         const Codec& codec, const RingOptions& ro) {
  const int n = static_cast<int>(in.size());
  std::vector<std::vector<float>> out = in;
  if (n == 1 || count == 0) return out;
  const RingPlan plan = internal::CompressedRingPlan(kind, count, n, 0, ro);
  const bool allreduce = kind == CollectiveKind::kAllreduce;
  for (int c = 0; c < n; ++c) {
    // allreduce: chunk c starts at rank c and ends at c-1; reduce_scatter:
    // block c starts at rank c+1 and ends at its owner c.
    const int start = allreduce ? c : (c + 1) % n;
    for (size_t k = 0; k < plan.segments(); ++k) {
      const ElementRange seg = plan.Segment(c, k);
      std::vector<float> acc(in[start].begin() + seg.begin,
                             in[start].begin() + seg.begin + seg.count);
      std::string bytes(codec.EncodedBytes(seg.count), '\0');
      for (int hop = 1; hop < n; ++hop) {
        const int r = (start + hop) % n;
        codec.Encode(acc.data(), seg.count, bytes.data());
        acc.assign(in[r].begin() + seg.begin, in[r].begin() + seg.begin + seg.count);
        codec.DecodeAdd(bytes.data(), seg.count, acc.data());
      }
      if (op == ReduceOp::kAvg) DivideBy(DType::kF32, acc.data(), seg.count, n);
      if (allreduce) {
        codec.Encode(acc.data(), seg.count, bytes.data());
        codec.Decode(bytes.data(), seg.count, acc.data());
        for (int r = 0; r < n; ++r) std::copy(acc.begin(), acc.end(), out[r].begin() + seg.begin);
      } else {
        const int owner = (start + n - 1) % n;
        std::copy(acc.begin(), acc.end(), out[owner].begin() + seg.begin);
      }
    }
  }
  return out;
}

// One op on every rank of `c` (buf[r]: rank r's buffer), with error
// feedback `ef` (one per rank; null: none kept); each rank's status.
// `device`: the kind `c` was made with (kTcpStaged: the buffers are the
// emulated GPU's, its reducer runs the codec).
std::vector<absl::Status> RunCompressed(Cluster& c, CollectiveKind kind, CodecId id, ReduceOp op,
                                        size_t count, uint64_t seq, const RingOptions& ro,
                                        std::vector<std::vector<float>>& buf,
                                        std::vector<ErrorFeedback>* ef = nullptr,
                                        DeviceKind device = DeviceKind::kTcp) {
  return RunOnRanks(c.size(), [&](int r) {
    transport::Scratch scratch(testing::ScratchAllocatorFor(device));
    CollectiveCall call;
    call.kind = kind;
    call.buffer = testing::HostBuffer(buf[r]);
    call.buffer.kind = testing::BufferKindFor(device);
    call.reducer = testing::ReducerFor(device);
    call.count = count;
    call.dtype = DType::kF32;
    call.op = op;
    call.seq = seq;
    call.deadline = absl::Now() + absl::Seconds(60);
    call.ring = ro;
    call.codec = id;
    call.codec_feedback = ef != nullptr ? &(*ef)[r] : nullptr;
    return RunCollective(*c.contexts[r], call, Algorithm::kRing, &scratch);
  });
}

// A run with error feedback, every rank's status checked.
void RunWithFeedback(Cluster& c, CollectiveKind kind, CodecId id, ReduceOp op, size_t count,
                     uint64_t seq, std::vector<std::vector<float>>& buf,
                     std::vector<ErrorFeedback>* ef) {
  const std::vector<absl::Status> st = RunCompressed(c, kind, id, op, count, seq, RingOptions{},
                                                     buf, ef);
  for (int r = 0; r < c.size(); ++r) ASSERT_TRUE(st[r].ok()) << "rank " << r << ": " << st[r];
}

void RunAndCheck(Cluster& c, CollectiveKind kind, CodecId id, ReduceOp op, size_t count,
                 uint64_t seq, const RingOptions& ro, DeviceKind device) {
  const int n = c.size();
  const Codec& codec = *CodecFor(id);
  const size_t total = kind == CollectiveKind::kAllreduce ? count : n * count;
  std::vector<std::vector<float>> in(n), buf(n);
  for (int r = 0; r < n; ++r) buf[r] = in[r] = Gradient(total, r, static_cast<uint32_t>(seq));
  const std::vector<std::vector<float>> want = Simulate(in, kind, op, count, codec, ro);
  const std::vector<absl::Status> st =
      RunCompressed(c, kind, id, op, count, seq, ro, buf, nullptr, device);
  const std::string what =
      absl::StrCat(DeviceName(device), " ", CollectiveName(kind), " ", codec.name(), " ",
                   ReduceOpName(op), " world ", n, " count ", count);
  for (int r = 0; r < n; ++r) {
    ASSERT_TRUE(st[r].ok()) << what << " rank " << r << ": " << st[r];
    // reduce_scatter defines only the rank's own block.
    const size_t begin = kind == CollectiveKind::kAllreduce ? 0 : r * count;
    ASSERT_EQ(std::memcmp(buf[r].data() + begin, want[r].data() + begin, count * sizeof(float)), 0)
        << what << " rank " << r;
  }
}

TEST(CompressedRing, BitExactAgainstTheSimulationOnEveryDevice) {
  RingOptions ro;
  ro.segment_bytes = 64 << 10;
  ro.min_segment_bytes = 16 << 10;  // several segments, blocks cut at their starts
  ro.max_inflight = 3;
  uint64_t seq = 1;
  for (DeviceKind device : kAllDevices) {
    for (int world : {2, 3, 5}) {
      Cluster c = MakeCluster(world, absl::StrCat("codec-", world), device);
      for (CodecId id : kCodecs) {
        const bool wide = device == DeviceKind::kTcp && world == 3;  // every size once
        for (size_t count : wide ? std::vector<size_t>{1, 4, 4097, 100003}
                                 : std::vector<size_t>{3, 60001}) {
          for (CollectiveKind kind : {CollectiveKind::kAllreduce, CollectiveKind::kReduceScatter}) {
            for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kAvg}) {
              RunAndCheck(c, kind, id, op, count, seq++, ro, device);
              if (::testing::Test::HasFatalFailure()) return;
            }
          }
        }
      }
    }
  }
}

// The result is the exact sum within what the hops' quantization allows:
// with n ranks, n-1 quantized partial sums and one more for the allgather.
TEST(CompressedRing, AllreduceIsWithinTheCodecsBoundOfTheExactSum) {
  const int n = 4;
  const size_t count = 50000;
  Cluster c = MakeCluster(n, "codec-bound", DeviceKind::kInProc);
  const struct {
    CodecId id;
    double relative;  // per quantization, of the block's largest magnitude
  } kCases[] = {{CodecId::kBf16, 1.0 / 256},
                {CodecId::kFp16, 1.0 / 2048},
                {CodecId::kFp8E4M3, 1.0 / 16},
                {CodecId::kFp8E5M2, 1.0 / 8},
                {CodecId::kInt8, 1.0 / 254 * 1.001}};
  uint64_t seq = 100;
  for (const auto& k : kCases) {
    std::vector<std::vector<float>> in(n), buf(n);
    std::vector<double> exact(count, 0.0);
    for (int r = 0; r < n; ++r) {
      buf[r] = in[r] = Gradient(count, r, 7);
      for (size_t i = 0; i < count; ++i) exact[i] += buf[r][i];
    }
    const std::vector<absl::Status> st = RunOnRanks(n, [&](int r) {
      transport::Scratch scratch;
      CollectiveCall call;
      call.buffer = testing::HostBuffer(buf[r]);
      call.count = count;
      call.seq = seq;
      call.deadline = absl::Now() + absl::Seconds(60);
      call.codec = k.id;
      return RunCollective(*c.contexts[r], call, Algorithm::kRing, &scratch);
    });
    ++seq;
    for (int r = 0; r < n; ++r) ASSERT_TRUE(st[r].ok()) << st[r];
    // Each of the n quantizations (n-1 hops, then the allgather) errs by at
    // most `relative` of its codec block's largest magnitude, which no
    // partial sum exceeds by more than a hair: A = the block's largest
    // sum over ranks of |input|.
    const RingPlan plan =
        internal::CompressedRingPlan(CollectiveKind::kAllreduce, count, n, 0, RingOptions{});
    double worst = 0;
    for (int ch = 0; ch < n; ++ch) {
      for (size_t sg = 0; sg < plan.segments(); ++sg) {
        const ElementRange seg = plan.Segment(ch, sg);
        for (size_t b = 0; b < seg.count; b += kCodecBlockElements) {
          const size_t end = std::min(seg.count, b + kCodecBlockElements);
          double amax = 0;
          for (size_t i = seg.begin + b; i < seg.begin + end; ++i) {
            double abs_sum = 0;
            for (int r = 0; r < n; ++r) abs_sum += std::fabs(in[r][i]);
            amax = std::max(amax, abs_sum);
          }
          const double bound = n * k.relative * amax * 1.01;
          for (size_t i = seg.begin + b; i < seg.begin + end; ++i) {
            const double err = std::fabs(buf[0][i] - exact[i]);
            worst = std::max(worst, err);
            ASSERT_LE(err, bound) << CodecName(k.id) << " element " << i;
          }
        }
      }
    }
    EXPECT_GT(worst, 0.0) << CodecName(k.id) << ": a lossy codec changed nothing";
    for (int r = 1; r < n; ++r) {
      ASSERT_EQ(std::memcmp(buf[r].data(), buf[0].data(), count * sizeof(float)), 0)
          << CodecName(k.id) << " rank " << r;
    }
  }
}

// With error feedback each rank keeps exactly what its quantizations took
// from the result: result (times n under avg) plus every rank's residual is
// the exact sum, to f32 rounding - far inside the codec's own error.
TEST(CompressedRing, ErrorFeedbackKeepsExactlyWhatTheQuantizationsLost) {
  const int n = 3;
  const size_t count = 3 * kCodecBlockElements + 101;
  Cluster c = MakeCluster(n, "codec-ef", DeviceKind::kInProc);
  uint64_t seq = 200;
  for (CodecId id : {CodecId::kInt8, CodecId::kFp8E4M3, CodecId::kBf16}) {
    for (CollectiveKind kind : {CollectiveKind::kAllreduce, CollectiveKind::kReduceScatter}) {
      for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kAvg}) {
        const std::string what = absl::StrCat(CodecName(id), " ", CollectiveName(kind), " ",
                                              ReduceOpName(op));
        const size_t total = kind == CollectiveKind::kAllreduce ? count : n * count;
        std::vector<std::vector<float>> buf(n);
        std::vector<double> exact(total, 0.0);
        for (int r = 0; r < n; ++r) {
          buf[r] = Gradient(total, r, static_cast<uint32_t>(seq));
          for (size_t i = 0; i < total; ++i) exact[i] += buf[r][i];
        }
        std::vector<ErrorFeedback> ef(n);
        RunWithFeedback(c, kind, id, op, count, seq++, buf, &ef);
        if (::testing::Test::HasFatalFailure()) return;
        double worst_codec = 0, worst_kept = 0, amax = 0;
        for (int r = 0; r < n; ++r) {
          ASSERT_EQ(ef[r].residual.size(), total) << what;
          const size_t begin = kind == CollectiveKind::kAllreduce ? 0 : r * count;
          for (size_t i = begin; i < begin + count; ++i) {
            const double got = op == ReduceOp::kAvg ? n * double{buf[r][i]} : buf[r][i];
            double owed = 0;
            for (int q = 0; q < n; ++q) owed += ef[q].residual[i];
            worst_codec = std::max(worst_codec, std::fabs(got - exact[i]));
            worst_kept = std::max(worst_kept, std::fabs(got + owed - exact[i]));
            amax = std::max(amax, std::fabs(exact[i]));
          }
          if (kind == CollectiveKind::kReduceScatter) {  // its own block is never quantized
            for (size_t i = begin; i < begin + count; ++i) {
              ASSERT_EQ(ef[r].residual[i], 0.0f) << what << " rank " << r << " element " << i;
            }
          }
        }
        EXPECT_GT(worst_codec, 0.0) << what;
        // f32 rounding of n partial sums and the avg scaling: a few ulps of
        // the largest sum.
        EXPECT_LE(worst_kept, amax * n * 4 * std::ldexp(1.0, -24)) << what;
        EXPECT_LT(worst_kept * 100, worst_codec) << what;
      }
    }
  }
}

// The point of it: ops of the same name add up to the inputs' sum. Sixteen
// ops of one input: with feedback the running mean of the results errs by
// the last residual over 16; without, by the codec's whole (systematic)
// error every time.
TEST(CompressedRing, ErrorFeedbackMakesTheRunningSumConverge) {
  const int n = 3;
  const size_t count = 2 * kCodecBlockElements;
  const int ops = 16;
  Cluster c = MakeCluster(n, "codec-ef-run", DeviceKind::kInProc);
  std::vector<std::vector<float>> in(n);
  std::vector<double> exact(count, 0.0);
  for (int r = 0; r < n; ++r) {
    in[r] = Gradient(count, r, 9);
    for (size_t i = 0; i < count; ++i) exact[i] += in[r][i];
  }
  uint64_t seq = 300;
  double error[2] = {0, 0};  // of the mean result: without feedback, with
  for (int with : {0, 1}) {
    std::vector<ErrorFeedback> ef(n);
    std::vector<double> sum(count, 0.0);
    for (int k = 0; k < ops; ++k) {
      std::vector<std::vector<float>> buf = in;
      RunWithFeedback(c, CollectiveKind::kAllreduce, CodecId::kInt8, ReduceOp::kSum, count, seq++,
                      buf, with ? &ef : nullptr);
      if (::testing::Test::HasFatalFailure()) return;
      for (size_t i = 0; i < count; ++i) sum[i] += buf[0][i];
    }
    for (size_t i = 0; i < count; ++i) {
      error[with] = std::max(error[with], std::fabs(sum[i] / ops - exact[i]));
    }
  }
  EXPECT_GT(error[0], 0.0);
  EXPECT_LT(error[1] * 4, error[0]) << "without feedback " << error[0] << ", with " << error[1];
}

TEST(CompressedRing, RefusesWhatItDoesNotApplyTo) {
  using internal::CheckCodecApplies;
  const auto host = transport::MemKind::Host();
  EXPECT_EQ(CheckCodecApplies(CodecId::kInt8, CollectiveKind::kAllgather, Algorithm::kRing,
                              DType::kF32, ReduceOp::kSum, host, false)
                .message(),
            "codec 'int8' does not apply to this allgather: codecs compress allreduce and "
            "reduce_scatter only");
  EXPECT_EQ(CheckCodecApplies(CodecId::kBf16, CollectiveKind::kAllreduce,
                              Algorithm::kRecursiveHalvingDoubling, DType::kF32, ReduceOp::kSum,
                              host, false)
                .message(),
            "codec 'bf16' does not apply to this allreduce: compressed ops run the ring "
            "algorithm, not 'rhd'");
  EXPECT_EQ(CheckCodecApplies(CodecId::kFp16, CollectiveKind::kAllreduce, Algorithm::kRing,
                              DType::kI32, ReduceOp::kSum, host, false)
                .message(),
            "codec 'fp16' does not apply to this allreduce: codecs encode f32 values, not i32");
  EXPECT_EQ(CheckCodecApplies(CodecId::kFp8E4M3, CollectiveKind::kReduceScatter,
                              Algorithm::kRing, DType::kF32, ReduceOp::kMax, host, false)
                .message(),
            "codec 'fp8e4m3' does not apply to this reduce_scatter: codecs sum (sum, avg, "
            "premul_sum), not max");
  EXPECT_EQ(CheckCodecApplies(CodecId::kInt8, CollectiveKind::kAllreduce, Algorithm::kRing,
                              DType::kF32, ReduceOp::kSum, transport::MemKind::Cuda(0), true)
                .message(),
            "codec 'int8' does not apply to this allreduce: the buffer is cuda:0 memory; error "
            "feedback keeps host memory (device buffers run codecs without it)");
  EXPECT_TRUE(CheckCodecApplies(CodecId::kInt8, CollectiveKind::kAllreduce, Algorithm::kRing,
                                DType::kF32, ReduceOp::kSum, transport::MemKind::Cuda(0), false)
                  .ok());
  EXPECT_TRUE(CheckCodecApplies(CodecId::kInt8, CollectiveKind::kAllreduce, Algorithm::kRing,
                                DType::kF32, ReduceOp::kPremulSum, host, false)
                  .ok());
}

}  // namespace
}  // namespace gradsync
