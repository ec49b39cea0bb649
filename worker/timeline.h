// Per-job timeline: every op's phases on one rank as Chrome-trace JSON
// (open in chrome://tracing or https://ui.perfetto.dev). Switched on per job
// (JobOptions.timeline / SessionOptions::timeline); each rank's daemon writes
// <--timeline_dir>/<job>.epoch<E>.rank<R>.trace.json. Events: "queued"
// (submission to start), "negotiate" (waiting for every rank to submit, the
// signature check), the algorithm's run ("ring", "hier", ...), each ring step,
// each reduce of a received segment, and an instant "done"/"failed". pid = the
// rank, so several ranks' files can be loaded side by side (or concatenated).
#ifndef GRADSYNC_WORKER_TIMELINE_H_
#define GRADSYNC_WORKER_TIMELINE_H_

#include <cstdio>
#include <memory>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "collective/trace.h"

namespace gradsync {

class Timeline final : public OpTracer {
 public:
  // Creates the directory if needed and starts the JSON array.
  static absl::StatusOr<std::unique_ptr<Timeline>> Open(const std::string& path, int rank,
                                                        const std::string& process_name);
  ~Timeline() override;  // closes the JSON array: the file is valid JSON afterwards

  const std::string& path() const { return path_; }
  // The op the following events belong to (shown in their args).
  void SetOp(uint64_t seq, const std::string& description);
  void Event(const std::string& name, const char* cat, absl::Time start, absl::Time end) override;
  void Instant(const std::string& name, absl::Time at);

 private:
  Timeline(std::string path, std::FILE* f, int rank) : path_(std::move(path)), f_(f), rank_(rank) {}
  void Write(const std::string& json) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const std::string path_;
  absl::Mutex mu_;
  std::FILE* f_ ABSL_GUARDED_BY(mu_);
  const int rank_;
  bool first_ ABSL_GUARDED_BY(mu_) = true;
  uint64_t seq_ ABSL_GUARDED_BY(mu_) = 0;
  std::string desc_ ABSL_GUARDED_BY(mu_);
};

}  // namespace gradsync

#endif  // GRADSYNC_WORKER_TIMELINE_H_
