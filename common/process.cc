#include "common/process.h"

#include <pthread.h>

#include <string>

#include <openssl/crypto.h>

#include "absl/synchronization/mutex.h"

namespace gradsync {

void InitProcess() {
  absl::SetMutexDeadlockDetectionMode(absl::OnDeadlockCycle::kIgnore);
  KeepOpenSslAtExit();
}

void KeepOpenSslAtExit() {
  // No OpenSSL clean-up at exit: it deletes the thread-local key whose
  // destructor frees each thread's error state, and gRPC's executor threads
  // can still be ending then, so their state would be left behind (a leak
  // LeakSanitizer reports at random in our binaries' shutdown). Before gRPC
  // initializes OpenSSL, so this choice is the one that holds.
  OPENSSL_init_crypto(OPENSSL_INIT_NO_ATEXIT, nullptr);
}

void NameThread(std::thread& t, const char* name) {
  std::string n(name);
  if (n.size() > 15) n.resize(15);
  (void)pthread_setname_np(t.native_handle(), n.c_str());
}

}  // namespace gradsync
