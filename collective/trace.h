// Optional timeline events from inside the algorithms (ring steps, reduces),
// for the per-job Chrome-trace timeline (worker/timeline.h). The op's
// executor thread installs a tracer with ScopedTracer; algorithms call
// TraceEvent, which costs one thread-local load when tracing is off.
#ifndef GRADSYNC_COLLECTIVE_TRACE_H_
#define GRADSYNC_COLLECTIVE_TRACE_H_

#include <string>

#include "absl/time/clock.h"
#include "absl/time/time.h"

namespace gradsync {

class OpTracer {
 public:
  virtual ~OpTracer() = default;
  // A complete event [start, end) named `name` in category `cat`.
  virtual void Event(const std::string& name, const char* cat, absl::Time start,
                     absl::Time end) = 0;
};

OpTracer* CurrentTracer();

class ScopedTracer {
 public:
  explicit ScopedTracer(OpTracer* tracer);
  ~ScopedTracer();
  ScopedTracer(const ScopedTracer&) = delete;
  ScopedTracer& operator=(const ScopedTracer&) = delete;

 private:
  OpTracer* previous_;
};

// Now() only when tracing, else InfinitePast (no clock read).
inline absl::Time TraceNow() {
  return CurrentTracer() != nullptr ? absl::Now() : absl::InfinitePast();
}
inline void TraceEvent(const std::string& name, const char* cat, absl::Time start) {
  if (OpTracer* t = CurrentTracer()) t->Event(name, cat, start, absl::Now());
}

}  // namespace gradsync

#endif  // GRADSYNC_COLLECTIVE_TRACE_H_
