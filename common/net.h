// Socket helpers: an owning fd, TCP listen/connect with deadlines, exact
// reads/writes with deadlines. All waits are bounded; nothing here blocks forever.
#ifndef GRADSYNC_COMMON_NET_H_
#define GRADSYNC_COMMON_NET_H_

#include <cstddef>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"

namespace gradsync {

// Owns a file descriptor; closes it on destruction. Move-only.
class UniqueFd {
 public:
  UniqueFd() = default;
  explicit UniqueFd(int fd) : fd_(fd) {}
  ~UniqueFd() { Reset(); }
  UniqueFd(UniqueFd&& o) noexcept : fd_(o.Release()) {}
  UniqueFd& operator=(UniqueFd&& o) noexcept {
    if (this != &o) Reset(o.Release());
    return *this;
  }
  UniqueFd(const UniqueFd&) = delete;
  UniqueFd& operator=(const UniqueFd&) = delete;

  int get() const { return fd_; }
  bool valid() const { return fd_ >= 0; }
  int Release() { return std::exchange(fd_, -1); }
  void Reset(int fd = -1);

 private:
  int fd_ = -1;
};

struct HostPort {
  std::string host;
  int port = 0;
  std::string ToString() const;
};
// Whether every endpoint is on one machine: the same host string, or all of
// them loopback (127.0.0.0/8, ::1, localhost). Different spellings of one
// machine's address (a name and its IP) count as different hosts.
bool AllOnOneHost(const std::vector<HostPort>& endpoints);
// Parses "host:port" or "[v6]:port".
absl::StatusOr<HostPort> ParseHostPort(absl::string_view s);

// Whether two gRPC targets name the same server: equal strings, or both
// "host:port" (optionally "dns:///" or "ipv4:"/"ipv6:" prefixed) whose hosts
// resolve to a common address with the same port. Anything else (unix:, a
// name that does not resolve) only matches itself.
bool SameGrpcTarget(absl::string_view a, absl::string_view b);

// An errno as "Connection refused (errno 111)".
std::string ErrnoString(int err);

// Listening TCP socket bound to host:port (port 0 = any); SO_REUSEADDR set.
absl::StatusOr<UniqueFd> TcpListen(const HostPort& addr, int backlog = 128);
// The local port a socket is bound to.
absl::StatusOr<int> LocalPort(int fd);
// Connects with a deadline (non-blocking connect + poll). Retries ECONNREFUSED
// until the deadline when retry_refused is set (the peer may not listen yet).
absl::StatusOr<UniqueFd> TcpConnect(const HostPort& addr, absl::Time deadline,
                                    bool retry_refused = false);
// TCP_NODELAY, large socket buffers, non-blocking.
absl::Status TuneDataSocket(int fd, int buffer_bytes);
absl::Status SetNonBlocking(int fd, bool on);

// Reads/writes exactly n bytes or fails: DeadlineExceeded at the deadline,
// Unavailable on EOF or a socket error. Works on blocking and non-blocking fds.
absl::Status ReadFull(int fd, void* buf, size_t n, absl::Time deadline);
absl::Status WriteFull(int fd, const void* buf, size_t n, absl::Time deadline);

// Milliseconds from now to the deadline for poll(), clamped to [0, max_ms].
int PollTimeoutMs(absl::Time deadline, int max_ms = 1 << 30);

}  // namespace gradsync

#endif  // GRADSYNC_COMMON_NET_H_
