// A forwarding TCP proxy for tests of what is on the wire: tests dial the
// tap instead of the real endpoint, and it records (and can corrupt) the
// bytes the dialing side sends.
#ifndef GRADSYNC_TRANSPORT_TCP_TAP_TESTING_H_
#define GRADSYNC_TRANSPORT_TCP_TAP_TESTING_H_

#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <cstdint>
#include <string>
#include <thread>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "common/net.h"
#include "gtest/gtest.h"

namespace gradsync::transport::testing {

// Forwards each connection it accepts to 127.0.0.1:`target_port`, recording
// what the dialing side sends (every connection's bytes, in arrival order).
class Tap {
 public:
  explicit Tap(int target_port) : target_port_(target_port) {
    auto l = TcpListen(HostPort{"127.0.0.1", 0});
    EXPECT_TRUE(l.ok());
    listener_ = std::move(*l);
    port_ = *LocalPort(listener_.get());
    thread_ = std::thread([this] { Loop(); });
  }
  ~Tap() {
    stop_ = true;
    thread_.join();
    for (std::thread& t : pumps_) t.join();
  }
  int port() const { return port_; }
  // Flips a byte of the dialing side's stream once `after` more bytes have passed.
  void FlipAfter(size_t after) { flip_at_ = recorded_size() + after; }
  std::string recorded() {
    absl::MutexLock l(&mu_);
    return recorded_;
  }
  size_t recorded_size() {
    absl::MutexLock l(&mu_);
    return recorded_.size();
  }

 private:
  void Loop() {
    while (!stop_) {
      pollfd p{listener_.get(), POLLIN, 0};
      if (::poll(&p, 1, 20) <= 0) continue;
      int fd = ::accept(listener_.get(), nullptr, nullptr);
      if (fd >= 0) pumps_.emplace_back([this, fd] { Pump(UniqueFd(fd)); });
    }
  }
  void Pump(UniqueFd from) {
    auto to = TcpConnect(HostPort{"127.0.0.1", target_port_}, absl::Now() + absl::Seconds(5));
    if (!to.ok()) return;
    const int fds[2] = {from.get(), to->get()};
    char buf[64 << 10];
    while (!stop_) {
      pollfd p[2] = {{fds[0], POLLIN, 0}, {fds[1], POLLIN, 0}};
      if (::poll(p, 2, 20) <= 0) continue;
      for (int i = 0; i < 2; ++i) {
        if (p[i].revents == 0) continue;
        const ssize_t n = ::read(fds[i], buf, sizeof(buf));
        if (n <= 0) return;
        if (i == 0) {
          absl::MutexLock l(&mu_);
          const size_t before = recorded_.size();
          recorded_.append(buf, static_cast<size_t>(n));
          const size_t at = flip_at_.load();
          if (at >= before && at < recorded_.size()) buf[at - before] ^= 0x01;
        }
        if (!WriteFull(fds[1 - i], buf, static_cast<size_t>(n), absl::Now() + absl::Seconds(5)).ok()) {
          return;
        }
      }
    }
  }
  UniqueFd listener_;
  int port_ = 0;
  const int target_port_;
  std::atomic<bool> stop_{false};
  std::atomic<size_t> flip_at_{SIZE_MAX};
  absl::Mutex mu_;
  std::string recorded_ ABSL_GUARDED_BY(mu_);
  std::thread thread_;
  std::vector<std::thread> pumps_;
};

}  // namespace gradsync::transport::testing

#endif  // GRADSYNC_TRANSPORT_TCP_TAP_TESTING_H_
