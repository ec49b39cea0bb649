#include "kernels/topk.h"

#include <algorithm>
#include <cstring>
#include <cmath>
#include <limits>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"

namespace gradsync {
namespace {

// Below this many values, or samples, the selection is exact.
constexpr size_t kMinSample = 1024;
// The sample is about this fraction of the values (DGC samples 0.1-1%).
constexpr size_t kSampleDivisor = 100;

// |x|, with non-finite values the largest of all.
inline float Magnitude(float x) {
  return std::isfinite(x) ? std::fabs(x) : std::numeric_limits<float>::infinity();
}

// A candidate as one integer that orders as the selection does: larger
// magnitude first (non-negative floats order as their bits), then lower
// index.
inline uint64_t Key(float magnitude, uint32_t index) {
  uint32_t bits;
  std::memcpy(&bits, &magnitude, sizeof(bits));
  return (uint64_t{0xffffffffu - bits} << 32) | index;
}

// Keeps the k first of `keys` in that order; their indices, ascending.
void KeepFirst(size_t k, std::vector<uint64_t>* keys, std::vector<uint32_t>* selected) {
  if (keys->size() > k) {
    std::nth_element(keys->begin(), keys->begin() + static_cast<ptrdiff_t>(k), keys->end());
    keys->resize(k);
  }
  selected->resize(keys->size());
  for (size_t j = 0; j < keys->size(); ++j) (*selected)[j] = static_cast<uint32_t>((*keys)[j]);
  std::sort(selected->begin(), selected->end());
}

}  // namespace

size_t SparseSpec::K(size_t n) const {
  // In integers: r n is exact (n < 2^32, ratio_ppm < 2^20).
  const uint64_t k = uint64_t{ratio_ppm} * n / 1000000;
  return std::min<size_t>(n, std::max<uint64_t>(1, k));
}

uint64_t SparseSpec::Code() const {
  if (!on()) return 0;
  return uint64_t{ratio_ppm} | (uint64_t{momentum_milli} << 20) | (uint64_t{warmup} << 30);
}

SparseSpec SparseSpec::FromCode(uint64_t code) {
  SparseSpec s;
  s.ratio_ppm = static_cast<uint32_t>(code & 0xfffff);
  s.momentum_milli = static_cast<uint16_t>((code >> 20) & 0x3ff);
  s.warmup = static_cast<uint32_t>(code >> 30);
  return s;
}

std::string SparseSpec::ToString() const {
  std::string out = absl::StrCat("topk:", ratio());
  if (warmup != 0) absl::StrAppend(&out, ",warmup=", warmup);
  if (momentum_milli != 0) absl::StrAppend(&out, ",momentum=", momentum());
  return out;
}

absl::StatusOr<SparseSpec> ParseSparseSpec(absl::string_view text) {
  SparseSpec s;
  const std::vector<absl::string_view> parts = absl::StrSplit(text, ',');
  auto bad = [&](absl::string_view part, absl::string_view want) {
    return absl::InvalidArgumentError(
        absl::StrCat("codec 'topk:", text, "': '", part, "': ", want,
                     " (topk:RATIO[,warmup=OPS][,momentum=M], e.g. topk:0.01,warmup=50)"));
  };
  double ratio = 0;
  const absl::string_view r = absl::StripAsciiWhitespace(parts[0]);
  if (!absl::SimpleAtod(r, &ratio) || !(ratio >= 1e-6 && ratio <= 1)) {
    return bad(r, "the ratio is a number from 0.000001 to 1");
  }
  s.ratio_ppm = static_cast<uint32_t>(std::lround(ratio * 1e6));
  for (size_t i = 1; i < parts.size(); ++i) {
    absl::string_view p = absl::StripAsciiWhitespace(parts[i]);
    if (absl::ConsumePrefix(&p, "warmup=")) {
      uint32_t w = 0;
      if (!absl::SimpleAtoi(p, &w) || w >= (1u << 30)) {
        return bad(parts[i], "warmup is a count of ops below 2^30");
      }
      s.warmup = w;
    } else if (absl::ConsumePrefix(&p, "momentum=")) {
      double m = 0;
      if (!absl::SimpleAtod(p, &m) || !(m >= 0 && m < 1)) {
        return bad(parts[i], "momentum is a number from 0 to 0.999");
      }
      s.momentum_milli = static_cast<uint16_t>(std::lround(m * 1000));
      if (s.momentum_milli > 999) s.momentum_milli = 999;
    } else {
      return bad(parts[i], "not warmup=OPS or momentum=M");
    }
  }
  return s;
}

double ErrorFeedback::ResidualNorm() const {
  double sum = 0;
  for (float x : residual) {
    if (std::isfinite(x)) sum += static_cast<double>(x) * x;
  }
  return std::sqrt(sum);
}

void SelectTopK(const float* v, size_t n, size_t k, TopkWork* work,
                std::vector<uint32_t>* selected) {
  selected->clear();
  k = std::min(k, n);
  if (k == 0) return;
  std::vector<uint64_t>& keys = work->keys;
  keys.clear();
  const size_t stride = kSampleDivisor;
  const size_t samples = n / stride;
  if (samples < kMinSample || k == n) {
    keys.resize(n);
    for (size_t i = 0; i < n; ++i) keys[i] = Key(Magnitude(v[i]), static_cast<uint32_t>(i));
    KeepFirst(k, &keys, selected);
    return;
  }
  // The sample's magnitude above which a fraction k/n of the sample lies.
  std::vector<float>& s = work->sample;
  s.resize(samples);
  for (size_t j = 0; j < samples; ++j) s[j] = Magnitude(v[j * stride]);
  const size_t above = std::max<size_t>(
      1, static_cast<size_t>(std::ceil(static_cast<double>(k) * samples / static_cast<double>(n))));
  std::nth_element(s.begin(), s.begin() + static_cast<ptrdiff_t>(above - 1), s.end(),
                   [](float a, float b) { return a > b; });
  const float threshold = s[above - 1];
  for (size_t i = 0; i < n; ++i) {
    const float m = Magnitude(v[i]);
    if (m >= threshold) keys.push_back(Key(m, static_cast<uint32_t>(i)));
  }
  KeepFirst(k, &keys, selected);
}

size_t SparsifyWithFeedback(const float* x, size_t n, const SparseSpec& spec, ErrorFeedback* ef,
                            SparseEntry* out, TopkWork* work) {
  const size_t k = spec.K(n);
  std::vector<float>& v = ef->residual;
  if (v.size() != n) v.assign(n, 0.0f);
  if (spec.momentum_milli != 0) {
    std::vector<float>& u = ef->momentum;
    if (u.size() != n) u.assign(n, 0.0f);
    const float m = static_cast<float>(spec.momentum());
    for (size_t i = 0; i < n; ++i) {
      u[i] = m * u[i] + x[i];
      v[i] += u[i];
    }
  } else {
    ef->momentum.clear();
    for (size_t i = 0; i < n; ++i) v[i] += x[i];
  }
  std::vector<uint32_t>& sel = work->selected;
  SelectTopK(v.data(), n, k, work, &sel);
  size_t j = 0;
  for (uint32_t i : sel) {
    out[j++] = SparseEntry{i, v[i]};
    v[i] = 0.0f;
    if (!ef->momentum.empty()) ef->momentum[i] = 0.0f;
  }
  const size_t selected = j;
  for (; j < k; ++j) out[j] = SparseEntry{kSparsePad, 0.0f};
  return selected;
}

void ScatterAdd(const SparseEntry* entries, size_t k, float* out, size_t n) {
  for (size_t j = 0; j < k; ++j) {
    const SparseEntry& e = entries[j];
    if (e.index < n) out[e.index] += e.value;
  }
}

}  // namespace gradsync
