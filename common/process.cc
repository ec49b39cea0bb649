#include "common/process.h"

#include <pthread.h>

#include <string>

#include "absl/synchronization/mutex.h"

namespace gradsync {

void InitProcess() { absl::SetMutexDeadlockDetectionMode(absl::OnDeadlockCycle::kIgnore); }

void NameThread(std::thread& t, const char* name) {
  std::string n(name);
  if (n.size() > 15) n.resize(15);
  (void)pthread_setname_np(t.native_handle(), n.c_str());
}

}  // namespace gradsync
