// Helpers for multi-process tests: start a LocalCluster (or share one across
// a test suite), open one session per rank of a job on its daemons (in
// parallel, since the rendezvous blocks), and run a function on every rank's
// thread.
#ifndef GRADSYNC_TESTS_CLUSTER_UTIL_H_
#define GRADSYNC_TESTS_CLUSTER_UTIL_H_

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <functional>
#include <memory>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "cli/local_cluster.h"
#include "client/client.h"
#include "gtest/gtest.h"

namespace gradsync::testing {

// A cluster of `daemons` gradsyncd (with `flags`) and a coordinator; null
// (and the test failed) if it did not start.
inline std::unique_ptr<LocalCluster> StartCluster(int daemons,
                                                  std::vector<std::string> flags = {}) {
  LocalClusterOptions o;
  o.daemons = daemons;
  o.daemon_flags = std::move(flags);
  auto c = LocalCluster::Start(o);
  EXPECT_TRUE(c.ok()) << c.status();
  return c.ok() ? std::move(*c) : nullptr;
}

// A test suite whose tests share one cluster of `Daemons` daemons, started
// before its first test and stopped after its last.
template <int Daemons>
class SharedClusterTest : public ::testing::Test {
 public:
  static LocalCluster* cluster() { return cluster_; }

 protected:
  static void SetUpTestSuite() { cluster_ = StartCluster(Daemons).release(); }
  static void TearDownTestSuite() {
    if (cluster_ != nullptr) {
      // After a failed test the daemons' and coordinator's logs are kept
      // (the test log says where) to see the daemons' side of it.
      if (::testing::UnitTest::GetInstance()->failed_test_count() > 0) {
        cluster_->KeepLogs();
        std::fprintf(stderr, "the cluster's logs are kept in %s\n", cluster_->work_dir().c_str());
      }
      const absl::Status stopped = cluster_->StopAll();
      EXPECT_TRUE(stopped.ok()) << stopped;
      delete cluster_;
      cluster_ = nullptr;
    }
  }
  void SetUp() override { ASSERT_NE(cluster_, nullptr); }
  static LocalCluster* cluster_;
};
template <int Daemons>
LocalCluster* SharedClusterTest<Daemons>::cluster_ = nullptr;

struct RankHandle {
  std::unique_ptr<client::Client> client;
  std::unique_ptr<client::Session> session;
};

// Rank r joins through daemon daemons[r]. Fails the whole call if any rank fails.
inline absl::StatusOr<std::vector<RankHandle>> OpenJob(LocalCluster& cluster,
                                                       const std::string& job,
                                                       const std::vector<int>& daemons,
                                                       int64_t op_timeout_ms = 30000,
                                                       int64_t heartbeat_timeout_ms = 0,
                                                       int ps_shards = 0) {
  const int n = static_cast<int>(daemons.size());
  std::vector<RankHandle> ranks(n);
  std::vector<absl::Status> st(n);
  std::vector<std::thread> threads;
  for (int r = 0; r < n; ++r) {
    threads.emplace_back([&, r] {
      auto c = client::Client::Connect(cluster.daemon_target(daemons[r]), absl::Seconds(10));
      if (!c.ok()) {
        st[r] = c.status();
        return;
      }
      ranks[r].client = std::move(*c);
      client::SessionOptions so;
      so.job_id = job;
      so.world_size = n;
      so.rank = r;
      so.timeout = absl::Seconds(20);
      so.op_timeout_ms = op_timeout_ms;
      so.heartbeat_timeout_ms = heartbeat_timeout_ms;
      so.ps_shards = ps_shards;
      auto s = ranks[r].client->OpenSession(so);
      if (!s.ok()) {
        st[r] = s.status();
        return;
      }
      ranks[r].session = std::move(*s);
    });
  }
  for (auto& t : threads) t.join();
  for (int r = 0; r < n; ++r) {
    if (!st[r].ok()) {
      return absl::Status(st[r].code(), absl::StrCat("rank ", r, ": ", st[r].message()));
    }
  }
  return ranks;
}

// Sets an environment variable for its lifetime (e.g. GRADSYNC_OP_CHANNEL=grpc,
// read by OpenSession), restoring what was there.
class ScopedEnv {
 public:
  ScopedEnv(const char* name, const char* value) : name_(name) {
    if (const char* old = std::getenv(name)) {
      had_ = true;
      old_ = old;
    }
    ::setenv(name, value, 1);
  }
  ~ScopedEnv() {
    if (had_) {
      ::setenv(name_, old_.c_str(), 1);
    } else {
      ::unsetenv(name_);
    }
  }
  ScopedEnv(const ScopedEnv&) = delete;
  ScopedEnv& operator=(const ScopedEnv&) = delete;

 private:
  const char* name_;
  bool had_ = false;
  std::string old_;
};

inline void OnEveryRank(int n, const std::function<void(int)>& fn) {
  std::vector<std::thread> threads;
  for (int r = 0; r < n; ++r) threads.emplace_back(fn, r);
  for (auto& t : threads) t.join();
}

// Every rank sums (rank + 1) * (k % 1000) over `count` i32 elements of a
// new buffer with `algo` ("" = the planner's) and checks every element.
inline void ExpectAllreduceExact(std::vector<RankHandle>& ranks, size_t count,
                                 const std::string& algo) {
  const int n = static_cast<int>(ranks.size());
  OnEveryRank(n, [&](int r) {
    auto buf = ranks[r].session->AllocateBuffer(count * 4);
    ASSERT_TRUE(buf.ok()) << buf.status();
    auto* v = static_cast<int32_t*>((*buf)->data());
    for (size_t k = 0; k < count; ++k) v[k] = static_cast<int32_t>((r + 1) * (k % 1000));
    client::CollectiveSpec spec;
    spec.buffer = buf->get();
    spec.count = count;
    spec.dtype = DType::kI32;
    spec.algorithm = algo;
    spec.name = "g." + algo;
    auto res = ranks[r].session->Run(spec);
    ASSERT_TRUE(res.ok()) << "rank " << r << " (" << algo << "): " << res.status();
    for (size_t k = 0; k < count; ++k) {
      ASSERT_EQ(v[k], static_cast<int32_t>(n * (n + 1) / 2 * (k % 1000)))
          << algo << ": rank " << r << " element " << k;
    }
  });
}

// A whole file ("" if it cannot be read), e.g. a daemon's log.
inline std::string ReadTextFile(const std::string& path) {
  std::ifstream in(path);
  std::stringstream all;
  all << in.rdbuf();
  return all.str();
}

// One buffer of `bytes` per rank (the test failed, and the list is short, if
// an allocation fails).
inline std::vector<std::unique_ptr<client::Buffer>> AllocateOnEveryRank(
    std::vector<RankHandle>& ranks, size_t bytes) {
  std::vector<std::unique_ptr<client::Buffer>> bufs;
  for (RankHandle& r : ranks) {
    auto b = r.session->AllocateBuffer(bytes);
    EXPECT_TRUE(b.ok()) << b.status();
    if (!b.ok()) break;
    bufs.push_back(std::move(*b));
  }
  return bufs;
}

// An allreduce of `count` elements at the start of `buf`.
inline client::CollectiveSpec AllreduceSpec(const client::Buffer* buf, size_t count,
                                            const std::string& name, DType dtype = DType::kF32) {
  client::CollectiveSpec spec;
  spec.buffer = buf;
  spec.count = count;
  spec.dtype = dtype;
  spec.name = name;
  return spec;
}

// Runs a shell command, returns its stdout.
inline std::string RunCommand(const std::string& cmd) {
  std::string out;
  FILE* p = ::popen(cmd.c_str(), "r");
  if (p == nullptr) return out;
  char buf[4096];
  size_t n;
  while ((n = std::fread(buf, 1, sizeof(buf), p)) > 0) out.append(buf, n);
  ::pclose(p);
  return out;
}

inline std::vector<int> FirstN(int n) {
  std::vector<int> v(n);
  for (int i = 0; i < n; ++i) v[i] = i;
  return v;
}

}  // namespace gradsync::testing

#endif  // GRADSYNC_TESTS_CLUSTER_UTIL_H_
