// Test helpers for metrics: fetch a page over a raw TCP socket (no curl in
// tests) and read one sample out of the Prometheus text format. testonly.
#ifndef GRADSYNC_COMMON_METRICS_TESTING_H_
#define GRADSYNC_COMMON_METRICS_TESTING_H_

#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"

namespace gradsync {

// GET http://host:port<path> with HTTP/1.0 and "Connection: close". Returns
// the body of a 200 reply; UNAVAILABLE/DEADLINE_EXCEEDED on socket errors,
// INTERNAL with the status line on any other status.
absl::StatusOr<std::string> HttpGet(absl::string_view host, int port, absl::string_view path,
                                    absl::Duration timeout = absl::Seconds(5));

// The value of the sample whose series is exactly `series` (the name plus,
// if any, the labels in the exporter's order, which is sorted by name), e.g.
// `gradsync_coordinator_jobs{state="running"}`. NOT_FOUND if absent.
absl::StatusOr<double> FindSample(absl::string_view text, absl::string_view series);

}  // namespace gradsync

#endif  // GRADSYNC_COMMON_METRICS_TESTING_H_
