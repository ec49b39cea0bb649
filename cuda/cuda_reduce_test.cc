#include "cuda/cuda_reduce.h"
#include "cuda/cuda_testing.h"

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/fp8.h"
#include "common/types.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace gradsync {
namespace cuda {
namespace {

using ::testing::HasSubstr;

// ---------------------------------------------------------------------------
// Without a device (this is the case in CI: no GPU, or the stub build).
// ---------------------------------------------------------------------------

// The CPU's fp8 rounding (common/fp8.h) is the toolkit's (cuda_fp8.h, which the
// kernels use): every float whose top 24 bits vary, with four low-byte patterns.
// Host code only, so it runs in every --config=cuda build, GPU or not.
TEST(CudaFp8, CpuConversionMatchesTheToolkitBitForBit) {
  if (!BuiltWithCuda()) GTEST_SKIP() << "built without CUDA (--config=cuda compares)";
  std::vector<float> in;
  in.reserve(size_t{4} << 24);
  for (uint32_t hi = 0; hi < (1u << 24); ++hi) {
    for (uint32_t lo : {0u, 1u, 0x80u, 0xffu}) {
      const uint32_t u = (hi << 8) | lo;
      float f;
      std::memcpy(&f, &u, sizeof(f));
      in.push_back(f);
    }
  }
  std::vector<uint8_t> toolkit(in.size());
  for (DType t : {DType::kF8E4M3, DType::kF8E5M2}) {
    ASSERT_TRUE(ToolkitFloatToFp8(t, in.data(), toolkit.data(), in.size()).ok());
    size_t wrong = 0;
    for (size_t i = 0; i < in.size(); ++i) {
      const uint8_t cpu = t == DType::kF8E4M3 ? FloatToFp8E4M3(in[i]) : FloatToFp8E5M2(in[i]);
      if (cpu != toolkit[i] && wrong++ < 10) {
        ADD_FAILURE() << DTypeName(t) << " " << in[i] << ": cpu 0x" << std::hex << int{cpu}
                      << ", toolkit 0x" << int{toolkit[i]};
      }
    }
    EXPECT_EQ(wrong, 0u) << DTypeName(t);
  }
  EXPECT_EQ(ToolkitFloatToFp8(DType::kF32, in.data(), toolkit.data(), 1).code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(CudaAvailability, AgreesWithDeviceList) {
  EXPECT_EQ(CudaAvailable(), ListCudaDevices().ok());
  EXPECT_EQ(CudaAvailable(), CudaUsable().ok());
}

TEST(CudaAvailability, ReportsWhyNoDeviceIsUsable) {
  if (CudaAvailable()) GTEST_SKIP() << "a CUDA device is usable on this host";

  const absl::StatusOr<std::vector<CudaDeviceInfo>> devices = ListCudaDevices();
  ASSERT_FALSE(devices.ok());
  EXPECT_EQ(devices.status().code(), absl::StatusCode::kUnavailable);
  const std::string reason(devices.status().message());
  EXPECT_FALSE(reason.empty());
  if (BuiltWithCuda()) {
    // e.g. "CUDA driver not usable: CUDA driver version is insufficient for CUDA
    // runtime version (cudaErrorInsufficientDriver)", or "no CUDA devices".
    EXPECT_TRUE(absl::StrContains(reason, "CUDA driver not usable: ") ||
                reason == "no CUDA devices")
        << reason;
    if (absl::StrContains(reason, "driver")) {
      EXPECT_THAT(reason, HasSubstr("(cudaError"));
    }
  } else {
    EXPECT_EQ(reason, "gradsync was built without CUDA (build with --config=cuda)");
  }
  std::printf("no CUDA device: %s\n", reason.c_str());

  // Every other entry point refuses cleanly, naming the same reason.
  const absl::Status usable = CudaUsable();
  EXPECT_EQ(usable.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(usable.message()), HasSubstr(reason));

  float host[4] = {1, 2, 3, 4};
  const absl::Status reduce =
      CudaReduceInto(DType::kF32, ReduceOp::kSum, host, host, 4, /*stream=*/nullptr);
  EXPECT_EQ(reduce.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(reduce.message()), HasSubstr(reason));

  const absl::Status divide = CudaDivideBy(DType::kF32, host, 4, 2, nullptr);
  EXPECT_EQ(divide.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(divide.message()), HasSubstr(reason));
  EXPECT_EQ(host[0], 1.0f);  // untouched

  EXPECT_EQ(CudaSynchronize(nullptr).code(), absl::StatusCode::kFailedPrecondition);

  const absl::StatusOr<DeviceBuffer> buffer = DeviceBuffer::Allocate(1024);
  ASSERT_FALSE(buffer.ok());
  EXPECT_EQ(buffer.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(buffer.status().message()), HasSubstr(reason));

  const absl::StatusOr<Stream> stream = Stream::Create();
  ASSERT_FALSE(stream.ok());
  EXPECT_EQ(stream.status().code(), absl::StatusCode::kFailedPrecondition);
}

// ---------------------------------------------------------------------------
// Scalar host reference (the CPU kernels' semantics), written independently of
// the CUDA code.
// ---------------------------------------------------------------------------

template <typename C>
C RefFloatOp(ReduceOp op, C x, C y) {
  switch (op) {
    case ReduceOp::kSum:
    case ReduceOp::kAvg: return x + y;
    case ReduceOp::kProd: return x * y;
    case ReduceOp::kMin: return x < y ? x : y;
    case ReduceOp::kMax: return x > y ? x : y;
  }
  return x;
}

template <typename S, typename U>
S RefIntOp(ReduceOp op, S x, S y) {
  switch (op) {
    case ReduceOp::kSum:
    case ReduceOp::kAvg:
      return static_cast<S>(static_cast<U>(static_cast<U>(x) + static_cast<U>(y)));
    case ReduceOp::kProd:
      return static_cast<S>(static_cast<U>(static_cast<U>(x) * static_cast<U>(y)));
    case ReduceOp::kMin: return x < y ? x : y;
    case ReduceOp::kMax: return x > y ? x : y;
  }
  return x;
}

template <typename T>
T LoadAt(const std::vector<uint8_t>& bytes, size_t i) {
  T v;
  std::memcpy(&v, bytes.data() + i * sizeof(T), sizeof(T));
  return v;
}

template <typename T>
void StoreAt(std::vector<uint8_t>& bytes, size_t i, T v) {
  std::memcpy(bytes.data() + i * sizeof(T), &v, sizeof(T));
}

// dst = dst OP src, element by element.
void RefReduce(DType dtype, ReduceOp op, std::vector<uint8_t>& dst, const std::vector<uint8_t>& src,
               size_t count) {
  for (size_t i = 0; i < count; ++i) {
    switch (dtype) {
      case DType::kF32:
        StoreAt(dst, i, RefFloatOp(op, LoadAt<float>(dst, i), LoadAt<float>(src, i)));
        break;
      case DType::kF64:
        StoreAt(dst, i, RefFloatOp(op, LoadAt<double>(dst, i), LoadAt<double>(src, i)));
        break;
      case DType::kF16:
        StoreAt(dst, i,
                FloatToHalf(RefFloatOp(op, HalfToFloat(LoadAt<uint16_t>(dst, i)),
                                       HalfToFloat(LoadAt<uint16_t>(src, i)))));
        break;
      case DType::kBF16:
        StoreAt(dst, i,
                FloatToBFloat16(RefFloatOp(op, BFloat16ToFloat(LoadAt<uint16_t>(dst, i)),
                                           BFloat16ToFloat(LoadAt<uint16_t>(src, i)))));
        break;
      case DType::kI32:
        StoreAt(dst, i,
                RefIntOp<int32_t, uint32_t>(op, LoadAt<int32_t>(dst, i), LoadAt<int32_t>(src, i)));
        break;
      case DType::kI64:
        StoreAt(dst, i,
                RefIntOp<int64_t, uint64_t>(op, LoadAt<int64_t>(dst, i), LoadAt<int64_t>(src, i)));
        break;
      case DType::kU8:
        StoreAt(dst, i,
                RefIntOp<uint8_t, uint8_t>(op, LoadAt<uint8_t>(dst, i), LoadAt<uint8_t>(src, i)));
        break;
      case DType::kF8E4M3:
        StoreAt(dst, i, FloatToFp8E4M3(RefFloatOp(op, Fp8E4M3ToFloat(LoadAt<uint8_t>(dst, i)),
                                                  Fp8E4M3ToFloat(LoadAt<uint8_t>(src, i)))));
        break;
      case DType::kF8E5M2:
        StoreAt(dst, i, FloatToFp8E5M2(RefFloatOp(op, Fp8E5M2ToFloat(LoadAt<uint8_t>(dst, i)),
                                                  Fp8E5M2ToFloat(LoadAt<uint8_t>(src, i)))));
        break;
    }
  }
}

void RefDivide(DType dtype, std::vector<uint8_t>& data, size_t count, int64_t divisor) {
  for (size_t i = 0; i < count; ++i) {
    switch (dtype) {
      case DType::kF32:
        StoreAt(data, i, LoadAt<float>(data, i) / static_cast<float>(divisor));
        break;
      case DType::kF64:
        StoreAt(data, i, LoadAt<double>(data, i) / static_cast<double>(divisor));
        break;
      case DType::kF16:
        StoreAt(data, i,
                FloatToHalf(HalfToFloat(LoadAt<uint16_t>(data, i)) / static_cast<float>(divisor)));
        break;
      case DType::kBF16:
        StoreAt(data, i,
                FloatToBFloat16(BFloat16ToFloat(LoadAt<uint16_t>(data, i)) /
                                static_cast<float>(divisor)));
        break;
      case DType::kI32:
        StoreAt(data, i, static_cast<int32_t>(LoadAt<int32_t>(data, i) / divisor));
        break;
      case DType::kI64: {
        const int64_t x = LoadAt<int64_t>(data, i);
        StoreAt(data, i,
                divisor == -1 ? static_cast<int64_t>(uint64_t{0} - static_cast<uint64_t>(x))
                              : x / divisor);
        break;
      }
      case DType::kU8:
        StoreAt(data, i, static_cast<uint8_t>(LoadAt<uint8_t>(data, i) / divisor));
        break;
      case DType::kF8E4M3:
        StoreAt(data, i, FloatToFp8E4M3(Fp8E4M3ToFloat(LoadAt<uint8_t>(data, i)) /
                                        static_cast<float>(divisor)));
        break;
      case DType::kF8E5M2:
        StoreAt(data, i, FloatToFp8E5M2(Fp8E5M2ToFloat(LoadAt<uint8_t>(data, i)) /
                                        static_cast<float>(divisor)));
        break;
    }
  }
}

// Deterministic inputs: a mix of arbitrary bit patterns (subnormals, huge values,
// NaN, inf) and ordinary values (where rounding matters), plus special values at
// the front so that even count 7 sees +-0, +-inf and NaN.
std::vector<uint8_t> MakeInput(DType dtype, size_t count, uint64_t seed, bool is_src) {
  std::mt19937_64 rng(seed * 2 + (is_src ? 1 : 0));
  std::uniform_real_distribution<double> ordinary(-100.0, 100.0);
  std::vector<uint8_t> bytes(count * DTypeSize(dtype));
  const float kInf = std::numeric_limits<float>::infinity();
  const float kNaN = std::numeric_limits<float>::quiet_NaN();
  const float specials_dst[] = {0.0f, -0.0f, kInf, -kInf, kNaN, 1.0f, 0.0f, 3.0f};
  const float specials_src[] = {-0.0f, 0.0f, -kInf, 2.0f, 1.0f, kNaN, 0.0f, kInf};
  for (size_t i = 0; i < count; ++i) {
    const uint64_t bits = rng();
    const bool use_bits = (bits & 3) == 0;
    const double plain = ordinary(rng);
    const bool special = i < 8;  // floating types only
    const double value = special ? (is_src ? specials_src[i] : specials_dst[i]) : plain;
    switch (dtype) {
      case DType::kF32: {
        float f = static_cast<float>(value);
        if (use_bits && !special) std::memcpy(&f, &bits, sizeof(f));
        StoreAt(bytes, i, f);
        break;
      }
      case DType::kF64: {
        double d = value;
        if (use_bits && !special) std::memcpy(&d, &bits, sizeof(d));
        StoreAt(bytes, i, d);
        break;
      }
      case DType::kF16:
        StoreAt(bytes, i,
                use_bits && !special ? static_cast<uint16_t>(bits >> 16)
                                     : FloatToHalf(static_cast<float>(value)));
        break;
      case DType::kBF16:
        StoreAt(bytes, i,
                use_bits && !special ? static_cast<uint16_t>(bits >> 16)
                                     : FloatToBFloat16(static_cast<float>(value)));
        break;
      case DType::kI32: {
        int32_t v = static_cast<int32_t>(bits >> 8);
        if (i == 0) v = std::numeric_limits<int32_t>::max();
        if (i == 1) v = std::numeric_limits<int32_t>::min();
        if ((bits & 7) == 1) v = static_cast<int32_t>(plain);  // small values too
        StoreAt(bytes, i, v);
        break;
      }
      case DType::kI64: {
        int64_t v = static_cast<int64_t>(bits);
        if (i == 0) v = std::numeric_limits<int64_t>::max();
        if (i == 1) v = std::numeric_limits<int64_t>::min();
        if ((bits & 7) == 1) v = static_cast<int64_t>(plain);
        StoreAt(bytes, i, v);
        break;
      }
      case DType::kU8: StoreAt(bytes, i, static_cast<uint8_t>(bits >> 24)); break;
      case DType::kF8E4M3:
        StoreAt(bytes, i, use_bits && !special ? static_cast<uint8_t>(bits >> 24)
                                               : FloatToFp8E4M3(static_cast<float>(value)));
        break;
      case DType::kF8E5M2:
        StoreAt(bytes, i, use_bits && !special ? static_cast<uint8_t>(bits >> 24)
                                               : FloatToFp8E5M2(static_cast<float>(value)));
        break;
    }
  }
  return bytes;
}

bool IsFloat(DType dtype) { return IsFloatDType(dtype); }

bool IsNaN(DType dtype, const std::vector<uint8_t>& bytes, size_t i) {
  switch (dtype) {
    case DType::kF32: return std::isnan(LoadAt<float>(bytes, i));
    case DType::kF64: return std::isnan(LoadAt<double>(bytes, i));
    case DType::kF16: return (LoadAt<uint16_t>(bytes, i) & 0x7fff) > 0x7c00;
    case DType::kBF16: return (LoadAt<uint16_t>(bytes, i) & 0x7fff) > 0x7f80;
    case DType::kF8E4M3: return (LoadAt<uint8_t>(bytes, i) & 0x7f) == 0x7f;
    case DType::kF8E5M2: return (LoadAt<uint8_t>(bytes, i) & 0x7f) > 0x7c;
    default: return false;
  }
}

std::string HexElement(DType dtype, const std::vector<uint8_t>& bytes, size_t i) {
  const size_t n = DTypeSize(dtype);
  std::string out = "0x";
  for (size_t b = n; b-- > 0;) out += absl::StrFormat("%02x", bytes[i * n + b]);
  return out;
}

// Bit-exact, except that any NaN matches any NaN (the payload of a NaN result is
// not part of the contract: x86 and CUDA produce different quiet NaNs).
::testing::AssertionResult SameElements(DType dtype, const std::vector<uint8_t>& want,
                                        const std::vector<uint8_t>& got,
                                        const std::vector<uint8_t>& dst_in,
                                        const std::vector<uint8_t>& src_in, size_t count) {
  const size_t n = DTypeSize(dtype);
  size_t mismatches = 0;
  std::string report;
  for (size_t i = 0; i < count; ++i) {
    if (std::memcmp(want.data() + i * n, got.data() + i * n, n) == 0) continue;
    if (IsNaN(dtype, want, i) && IsNaN(dtype, got, i)) continue;
    if (++mismatches <= 5) {
      absl::StrAppend(&report, "\n  [", i, "] dst=", HexElement(dtype, dst_in, i));
      if (!src_in.empty()) absl::StrAppend(&report, " src=", HexElement(dtype, src_in, i));
      absl::StrAppend(&report, " want=", HexElement(dtype, want, i),
                      " got=", HexElement(dtype, got, i));
    }
  }
  if (mismatches == 0) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure()
         << mismatches << " of " << count << " elements differ:" << report;
}

// ---------------------------------------------------------------------------
// On a GPU (built with --config=cuda): kernels against the reference.
// ---------------------------------------------------------------------------

constexpr size_t kCounts[] = {0, 1, 7, 1000, (size_t{1} << 20) + 3};

class CudaGpuReduceTest : public CudaGpuTest {
 protected:
  // Runs dst OP src on the device with the operands at element offsets
  // dst_offset / src_offset inside their buffers, and compares with RefReduce.
  void CheckReduce(DType dtype, ReduceOp op, size_t count, size_t dst_offset, size_t src_offset,
                   void* stream) {
    SCOPED_TRACE(absl::StrCat(DTypeName(dtype), " ", ReduceOpName(op), " count=", count,
                              " dst_offset=", dst_offset, " src_offset=", src_offset));
    const size_t n = DTypeSize(dtype);
    const uint64_t seed =
        static_cast<uint64_t>(dtype) * 1000003u + static_cast<uint64_t>(op) * 7919u + count;
    const std::vector<uint8_t> dst_in = MakeInput(dtype, count, seed, /*is_src=*/false);
    const std::vector<uint8_t> src_in = MakeInput(dtype, count, seed, /*is_src=*/true);
    std::vector<uint8_t> want = dst_in;
    RefReduce(dtype, op, want, src_in, count);

    absl::StatusOr<DeviceBuffer> dst = DeviceBuffer::Allocate((count + dst_offset) * n);
    absl::StatusOr<DeviceBuffer> src = DeviceBuffer::Allocate((count + src_offset) * n);
    ASSERT_TRUE(dst.ok()) << dst.status();
    ASSERT_TRUE(src.ok()) << src.status();
    ASSERT_TRUE(dst->CopyFromHost(dst_in.data(), count * n, dst_offset * n).ok());
    ASSERT_TRUE(src->CopyFromHost(src_in.data(), count * n, src_offset * n).ok());
    void* dst_ptr =
        dst->data() == nullptr ? nullptr : static_cast<char*>(dst->data()) + dst_offset * n;
    const void* src_ptr =
        src->data() == nullptr ? nullptr : static_cast<char*>(src->data()) + src_offset * n;

    const absl::Status status = CudaReduceInto(dtype, op, dst_ptr, src_ptr, count, stream);
    ASSERT_TRUE(status.ok()) << status;
    ASSERT_TRUE(CudaSynchronize(stream).ok());

    std::vector<uint8_t> got(count * n);
    ASSERT_TRUE(dst->CopyToHost(got.data(), count * n, dst_offset * n).ok());
    EXPECT_TRUE(SameElements(dtype, want, got, dst_in, src_in, count));
  }
};

class CudaReduceAllTypesTest : public CudaGpuReduceTest,
                               public ::testing::WithParamInterface<std::tuple<DType, ReduceOp>> {};

TEST_P(CudaReduceAllTypesTest, MatchesScalarReferenceBitExactly) {
  const auto [dtype, op] = GetParam();
  for (size_t count : kCounts) CheckReduce(dtype, op, count, 0, 0, nullptr);
}

TEST_P(CudaReduceAllTypesTest, HandlesUnalignedOperands) {
  const auto [dtype, op] = GetParam();
  // Same misalignment (scalar head, then vector packs) and different misalignment
  // (all scalar), on a count that leaves a tail.
  for (size_t count : {size_t{5}, size_t{4099}}) {
    CheckReduce(dtype, op, count, 1, 1, nullptr);
    CheckReduce(dtype, op, count, 1, 2, nullptr);
    CheckReduce(dtype, op, count, 0, 3, nullptr);
  }
}

INSTANTIATE_TEST_SUITE_P(AllDTypesAndOps, CudaReduceAllTypesTest,
                         ::testing::Combine(::testing::ValuesIn(kAllDTypes),
                                            ::testing::ValuesIn(kAllReduceOps)),
                         [](const ::testing::TestParamInfo<std::tuple<DType, ReduceOp>>& info) {
                           return absl::StrCat(DTypeName(std::get<0>(info.param)), "_",
                                               ReduceOpName(std::get<1>(info.param)));
                         });

class CudaDivideTest : public CudaGpuReduceTest, public ::testing::WithParamInterface<DType> {};

TEST_P(CudaDivideTest, MatchesScalarReferenceBitExactly) {
  const DType dtype = GetParam();
  const size_t n = DTypeSize(dtype);
  for (size_t count : kCounts) {
    for (int64_t divisor : {int64_t{1}, int64_t{3}, int64_t{8}, int64_t{1000}, int64_t{-1},
                            int64_t{-7}, int64_t{0}}) {
      if (divisor == 0 && !IsFloat(dtype)) continue;  // kInvalidArgument, tested below
      for (size_t offset : {size_t{0}, size_t{1}}) {
        SCOPED_TRACE(absl::StrCat(DTypeName(dtype), " count=", count, " divisor=", divisor,
                                  " offset=", offset));
        const std::vector<uint8_t> in =
            MakeInput(dtype, count, static_cast<uint64_t>(dtype) * 31 + count, false);
        std::vector<uint8_t> want = in;
        RefDivide(dtype, want, count, divisor);

        absl::StatusOr<DeviceBuffer> buf = DeviceBuffer::Allocate((count + offset) * n);
        ASSERT_TRUE(buf.ok()) << buf.status();
        ASSERT_TRUE(buf->CopyFromHost(in.data(), count * n, offset * n).ok());
        void* ptr = buf->data() == nullptr ? nullptr : static_cast<char*>(buf->data()) + offset * n;
        const absl::Status status = CudaDivideBy(dtype, ptr, count, divisor, nullptr);
        ASSERT_TRUE(status.ok()) << status;
        ASSERT_TRUE(CudaSynchronize(nullptr).ok());
        std::vector<uint8_t> got(count * n);
        ASSERT_TRUE(buf->CopyToHost(got.data(), count * n, offset * n).ok());
        EXPECT_TRUE(SameElements(dtype, want, got, in, {}, count));
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(AllDTypes, CudaDivideTest, ::testing::ValuesIn(kAllDTypes),
                         [](const ::testing::TestParamInfo<DType>& info) {
                           return std::string(DTypeName(info.param));
                         });

TEST_F(CudaGpuReduceTest, ListsDevicesWithNamesAndMemory) {
  const absl::StatusOr<std::vector<CudaDeviceInfo>> devices = ListCudaDevices();
  ASSERT_TRUE(devices.ok()) << devices.status();
  ASSERT_FALSE(devices->empty());
  for (size_t i = 0; i < devices->size(); ++i) {
    const CudaDeviceInfo& d = (*devices)[i];
    EXPECT_EQ(d.index, static_cast<int>(i));
    EXPECT_FALSE(d.name.empty());
    EXPECT_GT(d.total_memory, 0u);
    EXPECT_GE(d.cc_major, 7);
  }
}

TEST_F(CudaGpuReduceTest, ReducesOnAnExplicitStream) {
  absl::StatusOr<Stream> stream = Stream::Create();
  ASSERT_TRUE(stream.ok()) << stream.status();
  ASSERT_NE(stream->get(), nullptr);
  CheckReduce(DType::kF32, ReduceOp::kSum, 100003, 0, 0, stream->get());
  CheckReduce(DType::kBF16, ReduceOp::kMax, 100003, 0, 0, stream->get());
  EXPECT_TRUE(stream->Synchronize().ok());
}

TEST_F(CudaGpuReduceTest, AverageIsSumThenDivide) {
  const size_t count = 12345;
  std::vector<float> a(count), b(count), want(count);
  for (size_t i = 0; i < count; ++i) {
    a[i] = static_cast<float>(i) * 0.5f;
    b[i] = 1.0f - static_cast<float>(i);
    want[i] = (a[i] + b[i]) / 2.0f;
  }
  absl::StatusOr<DeviceBuffer> da = DeviceBuffer::Allocate(count * sizeof(float));
  absl::StatusOr<DeviceBuffer> db = DeviceBuffer::Allocate(count * sizeof(float));
  ASSERT_TRUE(da.ok() && db.ok());
  ASSERT_TRUE(da->CopyFromHost(a.data(), count * sizeof(float)).ok());
  ASSERT_TRUE(db->CopyFromHost(b.data(), count * sizeof(float)).ok());
  ASSERT_TRUE(
      CudaReduceInto(DType::kF32, ReduceOp::kAvg, da->data(), db->data(), count, nullptr).ok());
  ASSERT_TRUE(CudaDivideBy(DType::kF32, da->data(), count, 2, nullptr).ok());
  std::vector<float> got(count);
  ASSERT_TRUE(da->CopyToHost(got.data(), count * sizeof(float)).ok());
  EXPECT_EQ(std::memcmp(got.data(), want.data(), count * sizeof(float)), 0);
}

TEST_F(CudaGpuReduceTest, RejectsBadArgumentsWithoutTouchingTheContext) {
  absl::StatusOr<DeviceBuffer> buf = DeviceBuffer::Allocate(1024);
  ASSERT_TRUE(buf.ok()) << buf.status();
  std::vector<float> host(256, 1.0f);

  absl::Status s =
      CudaReduceInto(DType::kF32, ReduceOp::kSum, host.data(), buf->data(), 256, nullptr);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_THAT(std::string(s.message()), HasSubstr("dst"));

  s = CudaReduceInto(DType::kF32, ReduceOp::kSum, buf->data(), nullptr, 16, nullptr);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;

  s = CudaReduceInto(DType::kF32, ReduceOp::kSum, static_cast<char*>(buf->data()) + 2, buf->data(),
                     16, nullptr);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_THAT(std::string(s.message()), HasSubstr("aligned"));

  s = CudaReduceInto(static_cast<DType>(99), ReduceOp::kSum, buf->data(), buf->data(), 16, nullptr);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  s = CudaReduceInto(DType::kF32, static_cast<ReduceOp>(0), buf->data(), buf->data(), 16, nullptr);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;

  s = CudaDivideBy(DType::kI32, buf->data(), 16, 0, nullptr);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_THAT(std::string(s.message()), HasSubstr("division by zero"));

  EXPECT_EQ(buf->CopyFromHost(host.data(), 2048).code(), absl::StatusCode::kOutOfRange);
  EXPECT_TRUE(CudaReduceInto(DType::kF32, ReduceOp::kSum, nullptr, nullptr, 0, nullptr).ok());

  // The context is still healthy.
  EXPECT_TRUE(buf->Fill(0).ok());
  EXPECT_TRUE(CudaSynchronize(nullptr).ok());
  CheckReduce(DType::kF32, ReduceOp::kSum, 1000, 0, 0, nullptr);
}

TEST_F(CudaGpuReduceTest, DeviceBufferMovesOwnership) {
  absl::StatusOr<DeviceBuffer> a = DeviceBuffer::Allocate(64);
  ASSERT_TRUE(a.ok());
  void* ptr = a->data();
  DeviceBuffer b = std::move(*a);
  EXPECT_EQ(b.data(), ptr);
  EXPECT_EQ(b.size(), 64u);
  EXPECT_EQ(a->data(), nullptr);  // NOLINT(bugprone-use-after-move)
  absl::StatusOr<DeviceBuffer> empty = DeviceBuffer::Allocate(0);
  ASSERT_TRUE(empty.ok());
  EXPECT_EQ(empty->data(), nullptr);
}

}  // namespace
}  // namespace cuda
}  // namespace gradsync
