#include "common/logging.h"

#include <sys/syscall.h>
#include <sys/time.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <string>

namespace gradsync {
namespace {
std::atomic<int> g_min_level{static_cast<int>(LogLevel::kInfo)};
std::string* g_tag = new std::string();
}  // namespace

void SetMinLogLevel(LogLevel level) { g_min_level.store(static_cast<int>(level)); }
LogLevel MinLogLevel() { return static_cast<LogLevel>(g_min_level.load(std::memory_order_relaxed)); }
void SetLogTag(const char* tag) { *g_tag = tag; }

LogMessage::LogMessage(LogLevel level, const char* file, int line) : level_(level) {
  static const char kLetters[] = "DIWEF";
  struct timeval tv;
  gettimeofday(&tv, nullptr);
  struct tm tm;
  localtime_r(&tv.tv_sec, &tm);
  const char* base = std::strrchr(file, '/');
  char head[128];
  std::snprintf(head, sizeof(head), "%c%02d%02d %02d:%02d:%02d.%06ld %ld %s:%d] ",
                kLetters[static_cast<int>(level)], tm.tm_mon + 1, tm.tm_mday, tm.tm_hour,
                tm.tm_min, tm.tm_sec, static_cast<long>(tv.tv_usec),
                static_cast<long>(syscall(SYS_gettid)), base ? base + 1 : file, line);
  if (!g_tag->empty()) stream_ << *g_tag << " ";
  stream_ << head;
}

LogMessage::~LogMessage() {
  stream_ << '\n';
  const std::string s = stream_.str();
  (void)!::write(STDERR_FILENO, s.data(), s.size());
  if (level_ == LogLevel::kFatal) std::abort();
}

}  // namespace gradsync
