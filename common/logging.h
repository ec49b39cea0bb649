// Minimal leveled logging to stderr: GS_LOG(INFO) << "text";
// Lines look like: "I1130 01:02:03.456789 12345 file.cc:42] text".
// The level threshold comes from SetMinLogLevel (flags: --v / config), once, at start-up.
#ifndef GRADSYNC_COMMON_LOGGING_H_
#define GRADSYNC_COMMON_LOGGING_H_

#include <sstream>

namespace gradsync {

enum class LogLevel { kDebug = 0, kInfo = 1, kWarning = 2, kError = 3, kFatal = 4 };

void SetMinLogLevel(LogLevel level);
LogLevel MinLogLevel();
// Prefix every line with a process tag, e.g. "gradsyncd[1]".
void SetLogTag(const char* tag);

class LogMessage {
 public:
  LogMessage(LogLevel level, const char* file, int line);
  ~LogMessage();  // writes the line; kFatal aborts
  std::ostream& stream() { return stream_; }

 private:
  LogLevel level_;
  std::ostringstream stream_;
};

}  // namespace gradsync

#define GS_LOG_DEBUG ::gradsync::LogLevel::kDebug
#define GS_LOG_INFO ::gradsync::LogLevel::kInfo
#define GS_LOG_WARNING ::gradsync::LogLevel::kWarning
#define GS_LOG_ERROR ::gradsync::LogLevel::kError
#define GS_LOG_FATAL ::gradsync::LogLevel::kFatal

namespace gradsync {
// Turns `stream << ...` into a void expression for the ?: in GS_LOG (the glog
// idiom), so `if (x) GS_LOG(INFO) << y; else ...` parses as written.
struct LogVoidify {
  void operator&(std::ostream&) {}
};
}  // namespace gradsync

#define GS_LOG(level)                                    \
  (GS_LOG_##level < ::gradsync::MinLogLevel())           \
      ? (void)0                                          \
      : ::gradsync::LogVoidify() &                       \
            ::gradsync::LogMessage(GS_LOG_##level, __FILE__, __LINE__).stream()

#define GS_CHECK(cond) \
  (cond) ? (void)0     \
         : ::gradsync::LogVoidify() & GS_LOG_STREAM_FATAL_ << "Check failed: " #cond " "
#define GS_LOG_STREAM_FATAL_ \
  ::gradsync::LogMessage(::gradsync::LogLevel::kFatal, __FILE__, __LINE__).stream()

#endif  // GRADSYNC_COMMON_LOGGING_H_
