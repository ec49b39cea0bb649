// FakeSystemd: a datagram socket playing systemd's notification socket in
// tests. It binds a unique abstract name chosen by the kernel (no trouble
// with the 107-byte sun_path limit and Bazel's long TEST_TMPDIR), sets NOTIFY_SOCKET=@name in this
// process's environment (inherited by children spawned afterwards), and reads
// every datagram on a thread as systemd does, so senders never block on a full
// socket queue. The destructor unsets NOTIFY_SOCKET. testonly.
#ifndef GRADSYNC_COMMON_SD_NOTIFY_TESTING_H_
#define GRADSYNC_COMMON_SD_NOTIFY_TESTING_H_

#include <deque>
#include <string>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

namespace gradsync {

class FakeSystemd {
 public:
  FakeSystemd();
  ~FakeSystemd();
  FakeSystemd(const FakeSystemd&) = delete;
  FakeSystemd& operator=(const FakeSystemd&) = delete;

  bool bound() const { return fd_ >= 0; }
  // "@name", the value of NOTIFY_SOCKET.
  const std::string& socket_name() const { return name_; }

  // The next datagram, or "" if none arrives within `timeout`.
  std::string Receive(absl::Duration timeout = absl::Seconds(5));
  // The next datagram that is not "WATCHDOG=1" (those are counted), or "".
  std::string ReceiveSkippingWatchdog(absl::Duration timeout = absl::Seconds(5));
  int watchdog_pings();

 private:
  void ReadLoop();

  std::string name_;
  int fd_ = -1;
  int stop_pipe_[2] = {-1, -1};
  absl::Mutex mu_;
  std::deque<std::string> received_ ABSL_GUARDED_BY(mu_);
  int watchdog_pings_ ABSL_GUARDED_BY(mu_) = 0;
  std::thread reader_;
};

}  // namespace gradsync

#endif  // GRADSYNC_COMMON_SD_NOTIFY_TESTING_H_
