// MetricsServer under hostile connections (issue 34, finding 7): idle
// connections by the hundred, half-sent requests, one host at its limit,
// every slot taken. Other hosts are emulated by binding the client sockets to
// 127.0.0.2, 127.0.0.3, ... (all of 127.0.0.0/8 is local).
#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <functional>
#include <iostream>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/metrics.h"
#include "common/metrics_testing.h"
#include "common/net.h"
#include "common/net_testing.h"

namespace gradsync {
namespace {

using testing::ConnectFrom;

// Everything `fd` receives until the peer closes, or until the deadline
// (then `*closed` is false).
std::string ReadToEof(int fd, absl::Time deadline, bool* closed) {
  std::string out;
  *closed = false;
  char buf[4096];
  while (true) {
    struct pollfd p = {fd, POLLIN, 0};
    const int ready = ::poll(&p, 1, PollTimeoutMs(deadline));
    if (ready == 0) return out;
    if (ready < 0) continue;
    const ssize_t r = ::recv(fd, buf, sizeof(buf), 0);
    if (r > 0) {
      out.append(buf, static_cast<size_t>(r));
      continue;
    }
    *closed = true;  // EOF, or a reset
    return out;
  }
}

// Sends `request` from `source` and returns the whole reply ("" on failure).
std::string Exchange(const char* source, int port, const std::string& request) {
  UniqueFd fd = ConnectFrom(source, port);
  const absl::Time deadline = absl::Now() + absl::Seconds(5);
  if (!WriteFull(fd.get(), request.data(), request.size(), deadline).ok()) return "";
  bool closed = false;
  std::string reply = ReadToEof(fd.get(), deadline, &closed);
  EXPECT_TRUE(closed) << "no complete reply within 5 s: " << reply;
  return reply;
}

std::string Get(const char* source, int port, const std::string& target = "/metrics") {
  return Exchange(source, port, absl::StrCat("GET ", target, " HTTP/1.1\r\nHost: 127.0.0.1:",
                                             port, "\r\nUser-Agent: test\r\n\r\n"));
}

// Whether the server has closed `fd` (EOF or reset pending), without waiting.
bool ClosedByServer(int fd) {
  struct pollfd p = {fd, POLLIN, 0};
  if (::poll(&p, 1, 0) != 1) return false;
  char c;
  return ::recv(fd, &c, 1, MSG_PEEK | MSG_DONTWAIT) <= 0;
}

// Waits up to 10 s for `done`, checking every millisecond.
bool Await(const std::function<bool()>& done) {
  const absl::Time deadline = absl::Now() + absl::Seconds(10);
  while (!done()) {
    if (absl::Now() > deadline) return false;
    absl::SleepFor(absl::Milliseconds(1));
  }
  return true;
}

double Sample(const std::string& body, absl::string_view series) {
  absl::StatusOr<double> v = FindSample(body, series);
  EXPECT_TRUE(v.ok()) << v.status();
  return v.ok() ? *v : -1;
}

// What used to time a scrape out: civetweb served a connection per thread, so
// N idle connections delayed a scrape by about N/4 x 2 s (226 of them took
// longer than Prometheus' scrape timeout). Here 300 idle connections from
// three hosts are all held open (the request timeout is stretched so none
// expires) and scrapes from a fourth still take milliseconds.
TEST(MetricsServerAttack, ThreeHundredIdleConnectionsDoNotDelayAScrape) {
  MetricsRegistry registry;
  ASSERT_TRUE(registry.AddProcessMetrics().ok());
  MetricsServer::Options options;
  options.request_timeout = absl::Seconds(60);
  auto server = MetricsServer::Start("127.0.0.1:0", registry, options);
  ASSERT_TRUE(server.ok()) << server.status();
  const int port = (*server)->port();
  std::vector<UniqueFd> idle;
  for (const char* host : {"127.0.0.2", "127.0.0.3", "127.0.0.4"}) {
    for (int i = 0; i < 100; ++i) idle.push_back(ConnectFrom(host, port));
  }
  ASSERT_TRUE(Await([&] { return (*server)->open_connections() == 300; }))
      << (*server)->open_connections();

  absl::Duration slowest;
  for (int i = 0; i < 5; ++i) {
    const absl::Time start = absl::Now();
    absl::StatusOr<std::string> body =
        HttpGet("127.0.0.1", port, "/metrics", absl::Seconds(5));
    const absl::Duration took = absl::Now() - start;
    ASSERT_TRUE(body.ok()) << body.status();
    EXPECT_EQ(Sample(*body, "gradsync_metrics_connections"), 301);  // the idle ones + this one
    EXPECT_TRUE(FindSample(*body, "process_open_fds").ok());
    slowest = std::max(slowest, took);
  }
  EXPECT_LT(slowest, absl::Seconds(1));
  std::cout << "slowest of 5 scrapes with 300 idle connections open: "
            << absl::FormatDuration(slowest) << "\n";
  for (const UniqueFd& fd : idle) EXPECT_FALSE(ClosedByServer(fd.get()));
  // The scrapers' connections go as they close them; the idle ones stay.
  EXPECT_TRUE(Await([&] { return (*server)->open_connections() == 300; }))
      << (*server)->open_connections();
}

// A connection that sends half a request (no blank line) is closed at the
// request deadline (2 s after it was accepted), with a 408; one that sends
// nothing is closed silently. Scrapes meanwhile are answered at once.
TEST(MetricsServerAttack, AHalfRequestIsClosedAtTheRequestDeadline) {
  MetricsRegistry registry;
  auto server = MetricsServer::Start("127.0.0.1:0", registry);
  ASSERT_TRUE(server.ok()) << server.status();
  const int port = (*server)->port();
  const absl::Time start = absl::Now();
  UniqueFd half = ConnectFrom("127.0.0.2", port);
  UniqueFd silent = ConnectFrom("127.0.0.2", port);
  const std::string part = "GET /metrics HTTP/1.1\r\nHost: 127.0.0.1\r\n";
  ASSERT_TRUE(WriteFull(half.get(), part.data(), part.size(), start + absl::Seconds(1)).ok());

  const std::string scrape = Get("127.0.0.1", port);
  EXPECT_TRUE(absl::StartsWith(scrape, "HTTP/1.1 200 OK\r\n")) << scrape;
  EXPECT_LT(absl::Now() - start, absl::Seconds(1));

  bool closed = false;
  const std::string reply = ReadToEof(half.get(), start + absl::Seconds(10), &closed);
  const absl::Duration half_lived = absl::Now() - start;
  EXPECT_TRUE(closed);
  EXPECT_TRUE(absl::StartsWith(reply, "HTTP/1.1 408 Request Timeout\r\n")) << reply;
  EXPECT_GE(half_lived, absl::Milliseconds(MetricsServer::kRequestTimeoutMs));
  EXPECT_LT(half_lived, absl::Milliseconds(MetricsServer::kRequestTimeoutMs) + absl::Seconds(1));
  EXPECT_EQ(ReadToEof(silent.get(), start + absl::Seconds(10), &closed), "");
  EXPECT_TRUE(closed);
  std::cout << "half request closed after " << absl::FormatDuration(half_lived) << "\n";

  const std::string after = Get("127.0.0.1", port);
  EXPECT_EQ(Sample(after, "gradsync_metrics_connections_dropped_total{reason=\"timeout\"}"), 2);
  EXPECT_EQ(Sample(after, "gradsync_metrics_scrapes_total"), 2);
}

// One host opens more connections than its share: the ones past
// kMaxConnectionsPerSource are closed at once, the earlier ones stay open,
// and other hosts (and the same host's scraper, once it is under its limit)
// are served.
TEST(MetricsServerAttack, AHostAtItsLimitDoesNotLockOthersOut) {
  MetricsRegistry registry;
  MetricsServer::Options options;
  options.request_timeout = absl::Seconds(60);
  auto server = MetricsServer::Start("127.0.0.1:0", registry, options);
  ASSERT_TRUE(server.ok()) << server.status();
  const int port = (*server)->port();
  constexpr int kLimit = MetricsServer::kMaxConnectionsPerSource;
  std::vector<UniqueFd> held;
  for (int i = 0; i < kLimit + 4; ++i) held.push_back(ConnectFrom("127.0.0.2", port));
  for (int i = kLimit; i < kLimit + 4; ++i) {
    bool closed = false;
    EXPECT_EQ(ReadToEof(held[i].get(), absl::Now() + absl::Seconds(5), &closed), "");
    EXPECT_TRUE(closed) << "connection " << i << " past the limit is still open";
  }
  ASSERT_TRUE(Await([&] { return (*server)->open_connections() == kLimit; }));

  for (const char* other : {"127.0.0.1", "127.0.0.3"}) {
    const std::string reply = Get(other, port);
    EXPECT_TRUE(absl::StartsWith(reply, "HTTP/1.1 200 OK\r\n")) << other << ": " << reply;
    EXPECT_EQ(Sample(reply, "gradsync_metrics_connections_dropped_total{reason=\"source_limit\"}"),
              4);
  }
  for (int i = 0; i < kLimit; ++i) EXPECT_FALSE(ClosedByServer(held[i].get())) << i;
  // The host itself gets in again once one of its connections is gone.
  held[0].Reset();
  ASSERT_TRUE(Await([&] { return (*server)->open_connections() == kLimit - 1; }));
  EXPECT_TRUE(absl::StartsWith(Get("127.0.0.2", port), "HTTP/1.1 200 OK\r\n"));
}

// Two hosts take every slot between them; a scrape from a third host takes
// the slot of the oldest connection of a biggest holder, and a newcomer from a
// host at its limit is refused.
TEST(MetricsServerAttack, WhenEverySlotIsTakenAHostWithFewerConnectionsGetsIn) {
  MetricsRegistry registry;
  MetricsServer::Options options;
  options.max_connections = 8;
  options.max_connections_per_source = 4;
  options.request_timeout = absl::Seconds(60);
  auto server = MetricsServer::Start("127.0.0.1:0", registry, options);
  ASSERT_TRUE(server.ok()) << server.status();
  const int port = (*server)->port();
  std::vector<UniqueFd> held;
  for (const char* host : {"127.0.0.2", "127.0.0.3"}) {
    for (int i = 0; i < 4; ++i) held.push_back(ConnectFrom(host, port));
  }
  ASSERT_TRUE(Await([&] { return (*server)->open_connections() == 8; }));

  const std::string reply = Get("127.0.0.1", port);
  ASSERT_TRUE(absl::StartsWith(reply, "HTTP/1.1 200 OK\r\n")) << reply;
  EXPECT_EQ(Sample(reply, "gradsync_metrics_connections_dropped_total{reason=\"evicted\"}"), 1);
  bool closed = false;
  ReadToEof(held[0].get(), absl::Now() + absl::Seconds(5), &closed);
  EXPECT_TRUE(closed) << "the oldest connection of the first host was not the one dropped";
  for (size_t i = 1; i < held.size(); ++i) EXPECT_FALSE(ClosedByServer(held[i].get())) << i;

  // 127.0.0.3 is at its limit of 4: its newcomer is refused, nobody evicted.
  UniqueFd extra = ConnectFrom("127.0.0.3", port);
  ReadToEof(extra.get(), absl::Now() + absl::Seconds(5), &closed);
  EXPECT_TRUE(closed);
  const std::string again = Get("127.0.0.1", port);
  EXPECT_EQ(Sample(again, "gradsync_metrics_connections_dropped_total{reason=\"source_limit\"}"),
            1);
  for (size_t i = 1; i < held.size(); ++i) EXPECT_FALSE(ClosedByServer(held[i].get())) << i;
}

TEST(MetricsServerHttp, AnswersMetricsWithTheExpositionHeaders) {
  MetricsRegistry registry;
  auto c = registry.AddCounter("gradsync_test_events_total", "events");
  ASSERT_TRUE(c.ok());
  (*c)->Increment(7);
  auto server = MetricsServer::Start("127.0.0.1:0", registry);
  ASSERT_TRUE(server.ok()) << server.status();
  const int port = (*server)->port();

  const std::string reply = Get("127.0.0.1", port, "/metrics?from=prometheus");
  const size_t end = reply.find("\r\n\r\n");
  ASSERT_NE(end, std::string::npos) << reply;
  const std::string head = reply.substr(0, end + 2);
  const std::string body = reply.substr(end + 4);
  EXPECT_TRUE(absl::StartsWith(head, "HTTP/1.1 200 OK\r\n")) << head;
  EXPECT_TRUE(absl::StrContains(
      head, "\r\nContent-Type: text/plain; version=0.0.4; charset=utf-8\r\n")) << head;
  EXPECT_TRUE(absl::StrContains(head, absl::StrCat("\r\nContent-Length: ", body.size(), "\r\n")))
      << head;
  EXPECT_TRUE(absl::StrContains(head, "\r\nConnection: close\r\n")) << head;
  EXPECT_EQ(Sample(body, "gradsync_test_events_total"), 7);

  const std::string head_only =
      Exchange("127.0.0.1", port, "HEAD /metrics HTTP/1.0\r\n\r\n");
  EXPECT_TRUE(absl::StartsWith(head_only, "HTTP/1.1 200 OK\r\n")) << head_only;
  EXPECT_TRUE(absl::EndsWith(head_only, "\r\n\r\n")) << head_only;  // no body
}

TEST(MetricsServerHttp, OtherPathsMethodsAndMalformedRequestsAreErrors) {
  MetricsRegistry registry;
  auto server = MetricsServer::Start("127.0.0.1:0", registry);
  ASSERT_TRUE(server.ok()) << server.status();
  const int port = (*server)->port();
  auto status_line = [](const std::string& reply) { return reply.substr(0, reply.find("\r\n")); };

  EXPECT_EQ(status_line(Get("127.0.0.1", port, "/")), "HTTP/1.1 404 Not Found");
  EXPECT_EQ(status_line(Get("127.0.0.1", port, "/metrics/x")), "HTTP/1.1 404 Not Found");
  const std::string post =
      Exchange("127.0.0.1", port, "POST /metrics HTTP/1.1\r\nContent-Length: 0\r\n\r\n");
  EXPECT_EQ(status_line(post), "HTTP/1.1 405 Method Not Allowed");
  EXPECT_TRUE(absl::StrContains(post, "\r\nAllow: GET, HEAD\r\n")) << post;
  EXPECT_EQ(status_line(Exchange("127.0.0.1", port, "hello\r\n\r\n")), "HTTP/1.1 400 Bad Request");
  // Headers past kMaxRequestBytes: 431 without waiting for the rest.
  const std::string huge = absl::StrCat("GET /metrics HTTP/1.1\r\nX-Pad: ",
                                        std::string(MetricsServer::kMaxRequestBytes, 'a'), "\r\n");
  EXPECT_EQ(status_line(Exchange("127.0.0.1", port, huge)),
            "HTTP/1.1 431 Request Header Fields Too Large");
  EXPECT_TRUE(HttpGet("127.0.0.1", port, "/metrics").ok());
}

TEST(MetricsServerHttp, StoppingClosesHeldConnectionsAtOnce) {
  MetricsRegistry registry;
  MetricsServer::Options options;
  options.request_timeout = absl::Seconds(60);
  auto server = MetricsServer::Start("127.0.0.1:0", registry, options);
  ASSERT_TRUE(server.ok()) << server.status();
  UniqueFd idle = ConnectFrom("127.0.0.2", (*server)->port());
  ASSERT_TRUE(Await([&] { return (*server)->open_connections() == 1; }));
  const absl::Time start = absl::Now();
  server->reset();
  EXPECT_LT(absl::Now() - start, absl::Seconds(1));
  bool closed = false;
  ReadToEof(idle.get(), absl::Now() + absl::Seconds(1), &closed);
  EXPECT_TRUE(closed);
}

}  // namespace
}  // namespace gradsync
