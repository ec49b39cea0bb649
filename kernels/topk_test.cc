#include "kernels/topk.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <random>
#include <vector>

#include "gtest/gtest.h"

namespace gradsync {
namespace {

std::vector<float> Gaussian(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> d(0.0f, 1.0f);
  std::vector<float> v(n);
  for (float& x : v) x = d(rng);
  return v;
}

float Mag(float x) { return std::isfinite(x) ? std::fabs(x) : std::numeric_limits<float>::infinity(); }

// The reference: every index ordered by (magnitude desc, index asc), the
// first k, ascending.
std::vector<uint32_t> ExactTopK(const std::vector<float>& v, size_t k) {
  std::vector<uint32_t> idx(v.size());
  for (size_t i = 0; i < v.size(); ++i) idx[i] = static_cast<uint32_t>(i);
  std::stable_sort(idx.begin(), idx.end(),
                   [&](uint32_t a, uint32_t b) { return Mag(v[a]) > Mag(v[b]); });
  idx.resize(std::min(k, idx.size()));
  std::sort(idx.begin(), idx.end());
  return idx;
}

TEST(SelectTopK, BelowTheSampleSizeTheSelectionIsExact) {
  for (size_t n : {1u, 7u, 1000u, 50000u}) {
    std::vector<float> v = Gaussian(n, 3);
    if (n > 10) v[5] = v[9];  // a tie: the lower index goes first
    for (size_t k : {size_t{1}, n / 3 + 1, n}) {
      TopkWork work;
      std::vector<uint32_t> got;
      SelectTopK(v.data(), n, k, &work, &got);
      EXPECT_EQ(got, ExactTopK(v, k)) << "n " << n << " k " << k;
    }
  }
}

// Above the sample size the selection is a top set: at most k values, none
// smaller than any value left out; and the sampled threshold keeps close to k.
TEST(SelectTopK, TheSampledThresholdSelectsATopSetOfAboutK) {
  for (size_t n : {size_t{200000}, size_t{1} << 20}) {
    const std::vector<float> v = Gaussian(n, 11);
    for (double ratio : {0.001, 0.01, 0.1}) {
      const size_t k = static_cast<size_t>(ratio * n);
      TopkWork work;
      std::vector<uint32_t> got;
      SelectTopK(v.data(), n, k, &work, &got);
      ASSERT_LE(got.size(), k);
      EXPECT_GE(got.size(), k * 6 / 10) << "n " << n << " ratio " << ratio;
      ASSERT_TRUE(std::is_sorted(got.begin(), got.end()));
      std::vector<bool> in(n, false);
      float smallest_in = std::numeric_limits<float>::infinity();
      for (uint32_t i : got) {
        in[i] = true;
        smallest_in = std::min(smallest_in, Mag(v[i]));
      }
      float largest_out = 0;
      for (size_t i = 0; i < n; ++i) {
        if (!in[i]) largest_out = std::max(largest_out, Mag(v[i]));
      }
      EXPECT_GE(smallest_in, largest_out);
      // A full set (sampling overshot) is the exact top-k.
      if (got.size() == k) EXPECT_EQ(got, ExactTopK(v, k));
    }
  }
}

TEST(SelectTopK, NonFiniteValuesAreSelectedFirst) {
  std::vector<float> v = Gaussian(300000, 5);
  v[17] = std::numeric_limits<float>::quiet_NaN();
  v[299999] = -std::numeric_limits<float>::infinity();
  TopkWork work;
  std::vector<uint32_t> got;
  SelectTopK(v.data(), v.size(), 3, &work, &got);
  ASSERT_GE(got.size(), 2u);
  EXPECT_EQ(got.front(), 17u);
  EXPECT_EQ(got.back(), 299999u);
}

// Every value is sent once or still owed: per element, what was sent over
// the steps plus the final residual is the sum of the inputs, and the
// residual is exactly zero where a value was just sent.
TEST(SparsifyWithFeedback, WhatIsNotSentIsOwedAndSentLater) {
  const size_t n = 5000;
  SparseSpec spec;
  spec.ratio_ppm = 20000;  // 2%: k = 100
  ASSERT_EQ(spec.K(n), 100u);
  ErrorFeedback ef;
  TopkWork work;
  std::vector<double> sent(n, 0), input(n, 0);
  std::vector<SparseEntry> out(spec.K(n));
  for (uint32_t step = 0; step < 30; ++step) {
    const std::vector<float> x = Gaussian(n, 100 + step);
    for (size_t i = 0; i < n; ++i) input[i] += x[i];
    const std::vector<float> before = ef.residual.empty() ? std::vector<float>(n, 0) : ef.residual;
    const size_t selected = SparsifyWithFeedback(x.data(), n, spec, &ef, out.data(), &work);
    EXPECT_EQ(selected, 100u);  // n below the sample size: exact
    EXPECT_EQ(ef.ops, 0u);      // the caller counts ops
    for (size_t j = 0; j < selected; ++j) {
      const SparseEntry& e = out[j];
      ASSERT_LT(e.index, n);
      EXPECT_EQ(e.value, before[e.index] + x[e.index]);  // one f32 addition
      EXPECT_EQ(ef.residual[e.index], 0.0f);
      sent[e.index] += e.value;
    }
  }
  double worst = 0;
  for (size_t i = 0; i < n; ++i) {
    worst = std::max(worst, std::fabs(sent[i] + ef.residual[i] - input[i]));
  }
  EXPECT_LT(worst, 1e-4);
  EXPECT_GT(ef.ResidualNorm(), 0.0);
}

TEST(SparsifyWithFeedback, MomentumCorrectionAccumulatesVelocityAndMasksWhatWasSent) {
  const size_t n = 64;
  SparseSpec spec;
  spec.ratio_ppm = 1000000 / 16;  // k = 4
  spec.momentum_milli = 900;
  ErrorFeedback ef;
  TopkWork work;
  std::vector<SparseEntry> out(spec.K(n));
  std::vector<float> u(n, 0), v(n, 0);  // the reference state
  for (uint32_t step = 0; step < 5; ++step) {
    const std::vector<float> x = Gaussian(n, 7 + step);
    for (size_t i = 0; i < n; ++i) {
      u[i] = 0.9f * u[i] + x[i];
      v[i] += u[i];
    }
    const std::vector<uint32_t> want = ExactTopK(v, 4);
    ASSERT_EQ(SparsifyWithFeedback(x.data(), n, spec, &ef, out.data(), &work), 4u);
    for (size_t j = 0; j < 4; ++j) {
      EXPECT_EQ(out[j].index, want[j]);
      EXPECT_EQ(out[j].value, v[want[j]]);
      v[want[j]] = 0;
      u[want[j]] = 0;
    }
    EXPECT_EQ(ef.residual, v);
    EXPECT_EQ(ef.momentum, u);
  }
}

TEST(SparsifyWithFeedback, ASampleThatOvershootsLeavesAShortPaddedSelection) {
  // The sampled positions (every 100th) hold the large values: the sample's
  // threshold is the largest value, and only that one is a candidate.
  std::vector<float> x(300000, 0.0f);
  for (size_t i = 0; i < x.size(); i += 100) x[i] = static_cast<float>(i / 100 + 1);
  SparseSpec spec;
  spec.ratio_ppm = 100;  // k = 30
  ErrorFeedback ef;
  TopkWork work;
  std::vector<SparseEntry> out(spec.K(x.size()));
  ASSERT_EQ(out.size(), 30u);
  EXPECT_EQ(SparsifyWithFeedback(x.data(), x.size(), spec, &ef, out.data(), &work), 1u);
  EXPECT_EQ(out[0].index, 299900u);
  EXPECT_EQ(out[0].value, 3000.0f);
  for (size_t j = 1; j < out.size(); ++j) EXPECT_EQ(out[j].index, kSparsePad);
  EXPECT_EQ(ef.residual[299800], 2999.0f);  // owed, sent by a later op
}

TEST(SparsifyWithFeedback, TiesGoToTheLowerIndex) {
  // A flat field with one spike the sample misses: the threshold is the
  // field's, every value is a candidate, the spike and the lowest indices go.
  std::vector<float> y(300000, 1.0f);
  y[1] = 50;
  SparseSpec spec;
  spec.ratio_ppm = 100;  // k = 30
  ErrorFeedback ef;
  TopkWork work;
  std::vector<SparseEntry> out(spec.K(y.size()));
  EXPECT_EQ(SparsifyWithFeedback(y.data(), y.size(), spec, &ef, out.data(), &work), 30u);
  for (uint32_t j = 0; j < 30; ++j) EXPECT_EQ(out[j].index, j);
  EXPECT_EQ(out[1].value, 50.0f);
}

TEST(ScatterAdd, AddsEntriesAndSkipsPadding) {
  std::vector<float> out(8, 1.0f);
  const SparseEntry e[] = {{2, 0.5f}, {7, -1.0f}, {kSparsePad, 9.0f}, {100, 9.0f}};
  ScatterAdd(e, 4, out.data(), out.size());
  EXPECT_EQ(out, (std::vector<float>{1, 1, 1.5f, 1, 1, 1, 1, 0}));
}

TEST(SparseSpec, ParsesPacksAndNamesItself) {
  auto s = ParseSparseSpec("0.01,warmup=50,momentum=0.9");
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_EQ(s->ratio_ppm, 10000u);
  EXPECT_EQ(s->warmup, 50u);
  EXPECT_EQ(s->momentum_milli, 900);
  EXPECT_EQ(SparseSpec::FromCode(s->Code()), *s);
  EXPECT_EQ(s->ToString(), "topk:0.01,warmup=50,momentum=0.9");
  EXPECT_EQ(s->K(1000), 10u);
  EXPECT_EQ(s->K(10), 1u);  // at least one
  EXPECT_EQ(SparseSpec().Code(), 0u);
  for (const char* bad : {"0", "2", "x", "0.01,warm=3", "0.01,momentum=1", "0.01,warmup=-1"}) {
    absl::StatusOr<SparseSpec> r = ParseSparseSpec(bad);
    ASSERT_FALSE(r.ok()) << bad;
    EXPECT_NE(r.status().message().find("topk:RATIO"), std::string::npos) << r.status();
  }
}

}  // namespace
}  // namespace gradsync
