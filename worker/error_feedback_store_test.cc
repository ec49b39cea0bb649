// The error-feedback store: one entry per op name and layout, charged to the
// session's quota before it is allocated, dropped on a layout change or when
// asked, taken by a dense op, released when the store (the job's epoch) ends.
#include "worker/error_feedback_store.h"

#include <memory>
#include <vector>

#include "gtest/gtest.h"
#include "worker/tenant_memory.h"

namespace gradsync {
namespace {

constexpr uint64_t kPage = 4096;

std::shared_ptr<SessionBuffers> Quota(uint64_t limit) {
  SessionBuffers::Options o;
  o.session_id = "s1";
  o.job_id = "j";
  o.rank = 0;
  o.memory_limit_bytes = limit;
  return std::make_shared<SessionBuffers>(o, std::make_shared<TenantMemory>(0));
}

TEST(ErrorFeedbackStore, OneEntryPerNameAndLayoutChargedToTheSession) {
  auto quota = Quota(4 * kPage);
  {
    ErrorFeedbackStore store("j", 1);
    const FeedbackLayout quantized = FeedbackLayout::Quantized(kPage / 4);  // a page of f32
    ErrorFeedback* g = store.StateFor({"g"}, quantized, quota);
    ASSERT_NE(g, nullptr);
    EXPECT_EQ(quota->state_bytes(), kPage);
    g->residual.assign(kPage / 4, 0.5f);
    // The same name and layout: the same state, charged once.
    EXPECT_EQ(store.StateFor({"g"}, quantized, quota), g);
    EXPECT_EQ(quota->state_bytes(), kPage);
    EXPECT_EQ(g->residual[0], 0.5f);
    // Top-k with momentum: another layout for "g" (twice the memory); what
    // was kept for the old one is dropped.
    SparseSpec topk;
    topk.ratio_ppm = 10000;
    topk.momentum_milli = 900;
    const FeedbackLayout sparse = FeedbackLayout::Topk(kPage / 4, topk);
    EXPECT_EQ(sparse.StateBytes(), 2 * kPage);
    EXPECT_EQ(sparse.ToString(), "1024 elements, topk:0.01,momentum=0.9");
    EXPECT_EQ(quantized.ToString(), "1024 elements, quantized");
    ErrorFeedback* t = store.StateFor({"g"}, sparse, quota);
    ASSERT_NE(t, nullptr);
    EXPECT_TRUE(t->residual.empty());
    EXPECT_EQ(quota->state_bytes(), 2 * kPage);
    store.CountOp({"g"}, sparse);
    EXPECT_EQ(store.OpsSoFar("g", sparse), 1u);
    EXPECT_EQ(store.OpsSoFar("g", quantized), 0u);  // another layout
    // A second name fits (3 of 4 pages with the first); a third is refused,
    // counted, and gets no state.
    ASSERT_NE(store.StateFor({"h"}, FeedbackLayout::Quantized(kPage / 4), quota), nullptr);
    EXPECT_EQ(store.StateFor({"i"}, FeedbackLayout::Quantized(kPage / 2), quota), nullptr);
    EXPECT_EQ(store.refusals(), 1u);
    EXPECT_EQ(quota->state_bytes(), 3 * kPage);
    // Drop releases what the entry held.
    store.Drop("h", "the op failed midway");
    EXPECT_EQ(quota->state_bytes(), 2 * kPage);
    EXPECT_EQ(store.keys(), 2u);  // "g", and "i" (counted, never charged)
  }
  // The epoch ended: every charge is released.
  EXPECT_EQ(quota->state_bytes(), 0u);
}

TEST(ErrorFeedbackStore, ADenseOpTakesWhatIsOwed) {
  auto quota = Quota(4 * kPage);
  ErrorFeedbackStore store("j", 1);
  const FeedbackLayout quantized = FeedbackLayout::Quantized(kPage / 4);
  ErrorFeedback* g = store.StateFor({"g"}, quantized, quota);
  ASSERT_NE(g, nullptr);
  g->residual.assign(kPage / 4, 0.25f);
  // Another layout, or another name: nothing to take.
  EXPECT_TRUE(store.TakeResidual("g", FeedbackLayout::Quantized(8)).empty());
  EXPECT_TRUE(store.TakeResidual("h", quantized).empty());
  EXPECT_EQ(store.keys(), 1u);
  const std::vector<float> owed = store.TakeResidual("g", quantized);
  ASSERT_EQ(owed.size(), kPage / 4);
  EXPECT_EQ(owed[7], 0.25f);
  EXPECT_EQ(store.keys(), 0u);
  EXPECT_EQ(quota->state_bytes(), 0u);
  EXPECT_TRUE(store.TakeResidual("g", quantized).empty());
}

TEST(ErrorFeedbackStore, AnEntryKeyedByMemoryEndsWithIt) {
  auto quota = Quota(4 * kPage);
  ErrorFeedbackStore store("j", 1);
  auto memory = std::make_shared<int>(0);
  const FeedbackLayout quantized = FeedbackLayout::Quantized(kPage / 4);
  ASSERT_NE(store.StateFor({"on memory", memory}, quantized, quota), nullptr);
  ASSERT_NE(store.StateFor({"named"}, quantized, quota), nullptr);
  EXPECT_EQ(quota->state_bytes(), 2 * kPage);
  // While the memory lives its entry stays; freed, it goes (and its charge)
  // the next time the store is used.
  ASSERT_NE(store.StateFor({"named"}, quantized, quota), nullptr);
  EXPECT_EQ(store.keys(), 2u);
  memory.reset();
  ASSERT_NE(store.StateFor({"named"}, quantized, quota), nullptr);
  EXPECT_EQ(store.keys(), 1u);
  EXPECT_EQ(quota->state_bytes(), kPage);
  EXPECT_TRUE(store.TakeResidual("on memory", quantized).empty());
}

TEST(ErrorFeedbackStore, TheNormIsOfEveryResidualTogether) {
  ErrorFeedbackStore store("j", 1);
  ErrorFeedback* a = store.StateFor({"a"}, FeedbackLayout::Quantized(2), nullptr);
  ErrorFeedback* b = store.StateFor({"b"}, FeedbackLayout::Quantized(1), nullptr);
  ASSERT_NE(a, nullptr);
  ASSERT_NE(b, nullptr);
  a->residual = {3.0f, 0.0f};
  b->residual = {4.0f};
  EXPECT_DOUBLE_EQ(store.ResidualNorm(), 5.0);
  EXPECT_EQ(store.bytes(), (a->residual.capacity() + b->residual.capacity()) * sizeof(float));
}

}  // namespace
}  // namespace gradsync
