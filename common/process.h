// Process-wide settings every gradsync binary applies at start-up.
#ifndef GRADSYNC_COMMON_PROCESS_H_
#define GRADSYNC_COMMON_PROCESS_H_

#include <thread>

namespace gradsync {

// Call first in main(). Turns off absl::Mutex's deadlock-cycle detection:
// Debian's Abseil is built without NDEBUG, so every Lock records the lock
// graph (GraphCycles showed up in per-op profiles of the daemon); unit tests
// keep it on and catch lock-order cycles there. And keeps OpenSSL from
// cleaning up at exit (process.cc says why).
void InitProcess();

// The OpenSSL part of InitProcess alone, for test binaries that keep
// absl's deadlock detection (//common:openssl_no_atexit links it in).
void KeepOpenSslAtExit();

// Names a thread for top/perf/gdb (at most 15 characters are kept).
void NameThread(std::thread& t, const char* name);

}  // namespace gradsync

#endif  // GRADSYNC_COMMON_PROCESS_H_
