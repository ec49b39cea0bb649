#include "worker/session_epoch.h"

#include "gtest/gtest.h"

namespace gradsync {
namespace {

TEST(SessionEpoch, AHealthyEpochTakesOps) {
  SessionEpoch e("j", 3);
  EXPECT_TRUE(e.health().ok());
  EXPECT_TRUE(e.Refusal().ok());
  EXPECT_FALSE(e.closed());
}

TEST(SessionEpoch, DrainingRefusesWithTheReasonButStaysHealthy) {
  SessionEpoch e("j", 3);
  e.StopAccepting("daemon is draining (gradsyncd shutdown)");
  EXPECT_EQ(e.Refusal(), absl::UnavailableError("daemon is draining (gradsyncd shutdown)"));
  EXPECT_TRUE(e.health().ok());
}

TEST(SessionEpoch, TheFirstFailureBreaksItAndIsKept) {
  SessionEpoch e("j", 3);
  EXPECT_FALSE(e.Fail(absl::OkStatus()));  // not a failure
  EXPECT_TRUE(e.Refusal().ok());
  EXPECT_TRUE(e.Fail(absl::UnavailableError("rank 1 is gone")));
  EXPECT_FALSE(e.Fail(absl::DeadlineExceededError("later")));
  EXPECT_EQ(e.health(), absl::UnavailableError("rank 1 is gone"));
  EXPECT_EQ(e.Refusal(),
            absl::FailedPreconditionError(
                "job 'j' epoch 3 is no longer usable (open a new session): rank 1 is gone"));
}

TEST(SessionEpoch, DrainingIsReportedBeforeAFailure) {
  SessionEpoch e("j", 3);
  e.Fail(absl::AbortedError("coordinator ended the epoch"));
  e.StopAccepting("draining");
  EXPECT_EQ(e.Refusal(), absl::UnavailableError("draining"));
}

TEST(SessionEpoch, ClosedIsReportedBeforeEverythingAndKeepsAnEarlierCause) {
  SessionEpoch healthy("j", 3);
  healthy.StopAccepting("draining");
  healthy.Close();
  EXPECT_TRUE(healthy.closed());
  EXPECT_EQ(healthy.Refusal(), absl::FailedPreconditionError("session is closed"));
  EXPECT_EQ(healthy.health(), absl::CancelledError("session closed"));
  EXPECT_FALSE(healthy.Fail(absl::InternalError("after close")));

  SessionEpoch named("j", 3);
  named.Close(absl::CancelledError("rank 2 closed its session"));
  EXPECT_EQ(named.health(), absl::CancelledError("rank 2 closed its session"));

  SessionEpoch failed("j", 3);
  failed.Fail(absl::DataLossError("truncated frame"));
  failed.Close(absl::CancelledError("rank 2 closed its session"));
  EXPECT_EQ(failed.health(), absl::DataLossError("truncated frame"));
  EXPECT_EQ(failed.Refusal(), absl::FailedPreconditionError("session is closed"));
}

}  // namespace
}  // namespace gradsync
