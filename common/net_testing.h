// Test helpers for sockets: connections from other loopback addresses, so a
// test on one machine can play several hosts (per-source limits, fairness).
#ifndef GRADSYNC_COMMON_NET_TESTING_H_
#define GRADSYNC_COMMON_NET_TESTING_H_

#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <sys/socket.h>

#include "common/net.h"
#include "gtest/gtest.h"

namespace gradsync::testing {

// A blocking TCP connection to 127.0.0.1:port from `source`, an address of
// lo ("127.0.0.2"; the whole 127.0.0.0/8 is local). Fails the test if it
// cannot be made.
inline UniqueFd ConnectFrom(const char* source, int port) {
  UniqueFd fd(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
  EXPECT_TRUE(fd.valid());
  sockaddr_in from{};
  from.sin_family = AF_INET;
  ::inet_pton(AF_INET, source, &from.sin_addr);
  EXPECT_EQ(::bind(fd.get(), reinterpret_cast<sockaddr*>(&from), sizeof(from)), 0)
      << ErrnoString(errno);
  sockaddr_in to{};
  to.sin_family = AF_INET;
  to.sin_port = htons(static_cast<uint16_t>(port));
  to.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  EXPECT_EQ(::connect(fd.get(), reinterpret_cast<sockaddr*>(&to), sizeof(to)), 0)
      << ErrnoString(errno);
  return fd;
}

}  // namespace gradsync::testing

#endif  // GRADSYNC_COMMON_NET_TESTING_H_
