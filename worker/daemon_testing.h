// Test fixture for daemons in one process (testonly): a real coordinator
// (server/coordinator_service.h) on 127.0.0.1 port 0, plaintext, and daemons
// whose data planes listen on loopback (TCP); sessions driven through the
// daemon's C++ API as worker/worker_service.cc drives them, their buffers
// mapped as a client maps them. Used by daemon_test and point_to_point_test.
#ifndef GRADSYNC_WORKER_DAEMON_TESTING_H_
#define GRADSYNC_WORKER_DAEMON_TESTING_H_

#include <sys/mman.h>

#include <functional>
#include <future>
#include <memory>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "ipc/shared_memory.h"
#include "server/coordinator_service.h"
#include "worker/daemon.h"

namespace gradsync {
namespace testing_daemon {

// Polls `pred` every millisecond until it holds or `timeout` passes.
inline bool Eventually(const std::function<bool()>& pred, absl::Duration timeout = absl::Seconds(5)) {
  const absl::Time deadline = absl::Now() + timeout;
  while (!pred()) {
    if (absl::Now() >= deadline) return false;
    absl::SleepFor(absl::Milliseconds(1));
  }
  return true;
}

// A buffer of a session, mapped here as its client maps it.
class MappedBuffer {
 public:
  static absl::StatusOr<std::unique_ptr<MappedBuffer>> Allocate(Session& session, size_t bytes) {
    absl::StatusOr<BufferInfo> info = session.AllocateBuffer(bytes, /*by_descriptor=*/true);
    if (!info.ok()) return info.status();
    absl::StatusOr<UniqueFd> fd = session.TakeBufferFd(info->id);
    if (!fd.ok()) return fd.status();
    absl::StatusOr<void*> p = ipc::MapSharedFile(fd->get(), bytes, info->shm_name);
    if (!p.ok()) return p.status();
    return std::unique_ptr<MappedBuffer>(new MappedBuffer(info->id, *p, bytes));
  }
  ~MappedBuffer() { ::munmap(data_, bytes_); }

  uint64_t id() const { return id_; }
  template <typename T>
  T* as() const {
    return static_cast<T*>(data_);
  }

 private:
  MappedBuffer(uint64_t id, void* data, size_t bytes) : id_(id), data_(data), bytes_(bytes) {}
  const uint64_t id_;
  void* const data_;
  const size_t bytes_;
};

inline OpDesc Allreduce(const MappedBuffer& buf, uint64_t count, const std::string& name,
                 DType dtype = DType::kF32) {
  OpDesc op;
  op.kind = CollectiveKind::kAllreduce;
  op.dtype = dtype;
  op.op = ReduceOp::kSum;
  op.count = count;
  op.buffer_id = buf.id();
  op.name = name;
  return op;
}

// Waits for op `id` of `session` and returns its own status (a Wait error,
// or an op still running at the deadline, as a test failure's status).
inline absl::Status RunToEnd(Session& session, uint64_t id, absl::Duration timeout = absl::Seconds(5)) {
  absl::StatusOr<OpOutcome> out = session.Wait(id, timeout);
  if (!out.ok()) return absl::InternalError(absl::StrCat("Wait: ", out.status().ToString()));
  if (!out->done) return absl::DeadlineExceededError("the op was still running at the deadline");
  return out->status;
}

class DaemonTest : public ::testing::Test {
 protected:
  void SetUp() override {
    CoordinatorServerOptions options;
    options.listen_address = "127.0.0.1:0";
    options.registry.liveness_interval = absl::Milliseconds(20);
    auto server = CoordinatorServer::Start(std::move(options));
    ASSERT_TRUE(server.ok()) << server.status();
    coordinator_ = std::move(*server);
  }

  // A daemon at the test's coordinator, its data plane on loopback (TCP) at
  // `host` (any 127.x.y.z: daemons on different ones are on different
  // "hosts" to the planner, collective/two_level.h).
  std::unique_ptr<Daemon> StartDaemon(const std::string& node_id,
                                      absl::Duration session_lease = absl::Minutes(2),
                                      DaemonObserver* observer = nullptr,
                                      const std::string& host = "127.0.0.1") {
    DaemonOptions o;
    o.observer = observer;
    o.session_lease = session_lease;
    o.coordinator = coordinator_->address();
    o.data_listen = HostPort{host, 0};
    o.advertise_host = host;
    o.node_id = node_id;
    o.transport = TransportMode::kTcp;
    o.heartbeat_interval = absl::Milliseconds(50);
    o.spin_us = 0;  // the test machine may be busy: no spinning
    o.executor_spin = absl::ZeroDuration();
    o.timeline_dir = ::testing::TempDir();
    auto d = Daemon::Start(o);
    EXPECT_TRUE(d.ok()) << d.status();
    return d.ok() ? std::move(*d) : nullptr;
  }

  static OpenSessionArgs Args(const std::string& job, int world_size, int rank) {
    OpenSessionArgs a;
    a.job_id = job;
    a.world_size = world_size;
    a.rank = rank;
    a.timeout = absl::Seconds(10);
    a.client_name = "daemon_test";
    return a;
  }

  // Rank r of a job of daemons.size() ranks opens its session on daemons[r],
  // all at once (the rendezvous waits for every rank).
  static std::vector<std::shared_ptr<Session>> OpenJob(const std::vector<Daemon*>& daemons,
                                                       const std::string& job) {
    const int n = static_cast<int>(daemons.size());
    std::vector<std::future<absl::StatusOr<std::shared_ptr<Session>>>> opening;
    for (int r = 0; r < n; ++r) {
      opening.push_back(std::async(std::launch::async, [&daemons, job, n, r] {
        return daemons[r]->OpenSession(Args(job, n, r));
      }));
    }
    std::vector<std::shared_ptr<Session>> sessions;
    for (int r = 0; r < n; ++r) {
      absl::StatusOr<std::shared_ptr<Session>> s = opening[r].get();
      EXPECT_TRUE(s.ok()) << "rank " << r << ": " << s.status();
      if (s.ok()) sessions.push_back(*std::move(s));
    }
    return sessions;
  }

  // Declared first: the daemons leave their jobs here when they stop.
  std::unique_ptr<CoordinatorServer> coordinator_;
};

}  // namespace testing_daemon
}  // namespace gradsync

#endif  // GRADSYNC_WORKER_DAEMON_TESTING_H_
