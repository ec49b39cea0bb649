// Internal to the parameter-server shard (ps/shard.cc: lifecycle,
// connections, frames; ps/shard_steps.cc: steps, aggregation, timer): its
// jobs, steps, connections and aggregation threads. Not for other users.
// The shard engine. Threads:
//   * the listener's handshake threads hand "ps/..." connections to Adopt(),
//     which makes each a server context of the device (Device::AcceptClient);
//   * per connection, one thread driving its context (Serve: step headers,
//     pushes and worker aborts in; results and errors out, in queue order);
//   * `threads` aggregation threads; partition p's accumulator belongs to
//     thread p % threads, so reducing never takes a shared lock;
//   * a timer thread: step deadlines, reaping closed connections, idle jobs.
// Locks, outermost first: Impl::mu_ (jobs, connections) -> Job::mu (its
// running step, its connections) -> Conn::mu / Aggregator::mu_ / BufferPool
// (queues, free lists).
// The hot path (push -> reduce -> result) takes only the queue locks.
#ifndef GRADSYNC_PS_SHARD_IMPL_H_
#define GRADSYNC_PS_SHARD_IMPL_H_

#include <sys/socket.h>
#include <algorithm>
#include <atomic>
#include <deque>
#include <functional>
#include <list>
#include <map>
#include <string>
#include <thread>
#include <utility>
#include <vector>
#include "absl/base/thread_annotations.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "common/logging.h"
#include "common/status_macros.h"
#include "kernels/cpu_reduce.h"
#include "ps/protocol.h"
#include "transport/device.h"
#include "transport/tcp_listener.h"
#include "transport/wire.h"
#include "ps/shard.h"
#include "ps/shard_handshake.h"

namespace gradsync::ps {
namespace shard_internal {


using transport::FrameHeader;
using transport::FrameType;

// Recycles a job's partition buffers (partitions are mostly of one size):
// a push lands in one, the first rank's push becomes the partition's result,
// and the result goes back once every worker's copy is sent. Steady-state
// steps reuse memory instead of page-faulting fresh pages, and each buffer
// keeps its registration on every connection's context that received into it
// or sent from it (made on first use: over RDMA an ibv_reg_mr pins the pages,
// so it is made once, not per frame), dropped when the buffer is freed or
// that connection ends. Connection threads take buffers and register them;
// aggregation threads (staged pushes) and senders (results) give them back.
// Its lock is per job.
class BufferPool {
 public:
  // Keeps at most this many bytes per worker of free buffers.
  static constexpr size_t kMaxPooledBytesPerWorker = 32 << 20;

  explicit BufferPool(int workers)
      : max_pooled_(kMaxPooledBytesPerWorker * static_cast<size_t>(std::max(workers, 1))) {}

  char* Take(size_t n) {
    {
      absl::MutexLock l(&mu_);
      for (size_t i = 0; i < free_.size(); ++i) {
        if (free_[i].first != n) continue;
        char* p = free_[i].second;
        free_[i] = free_.back();
        free_.pop_back();
        pooled_ -= n;
        return p;
      }
    }
    return new char[n];
  }
  void Give(char* p, size_t n) {
    {
      absl::MutexLock l(&mu_);
      if (pooled_ + n <= max_pooled_) {
        free_.push_back({n, p});
        pooled_ += n;
        return;
      }
      regions_.erase(p);  // the memory is freed: no context may keep it
    }
    delete[] p;
  }

  // The registration of buffer [p, p+n) (taken from this pool and held by the
  // caller) on `ctx`, made once per context.
  absl::StatusOr<const transport::MemoryRegion*> Registration(transport::Context& ctx, char* p,
                                                               size_t n) {
    absl::MutexLock l(&mu_);
    std::unique_ptr<transport::MemoryRegion>& r = regions_[p][&ctx];
    if (r == nullptr || r->size() != n) {
      absl::StatusOr<std::unique_ptr<transport::MemoryRegion>> mr = ctx.RegisterMemory(p, n);
      if (!mr.ok()) {
        regions_[p].erase(&ctx);
        return mr.status();
      }
      r = std::move(*mr);
    }
    return r.get();
  }
  // `ctx` is going away: drops every registration on it.
  void ForgetRegistrations(const transport::Context& ctx) {
    absl::MutexLock l(&mu_);
    for (auto it = regions_.begin(); it != regions_.end();) {
      it->second.erase(&ctx);
      it = it->second.empty() ? regions_.erase(it) : std::next(it);
    }
  }
  ~BufferPool() {
    for (auto& [n, p] : free_) delete[] p;
  }

 private:
  const size_t max_pooled_;
  absl::Mutex mu_;
  std::vector<std::pair<size_t, char*>> free_ ABSL_GUARDED_BY(mu_);
  size_t pooled_ ABSL_GUARDED_BY(mu_) = 0;
  std::map<char*, std::map<const transport::Context*, std::unique_ptr<transport::MemoryRegion>>>
      regions_ ABSL_GUARDED_BY(mu_);
};

// Returns a buffer to its pool (which it keeps alive) when dropped.
struct GiveBack {
  std::shared_ptr<BufferPool> pool;
  size_t size = 0;
  void operator()(char* p) const {
    if (pool != nullptr) {
      pool->Give(p, size);
    } else {
      delete[] p;
    }
  }
};
using Buffer = std::unique_ptr<char[], GiveBack>;

enum StepState : int { kRunning = 0, kCompleted = 1, kFailed = 2 };

inline std::string Ranks(const std::vector<int>& ranks) {
  return absl::StrCat(ranks.size() == 1 ? "rank " : "ranks ", absl::StrJoin(ranks, ","));
}

// One frame waiting in a connection's send queue.
struct OutFrame {
  FrameHeader header;
  std::shared_ptr<char[]> data;  // a partition result, shared by every worker's frame
  std::string owned;             // small payloads (ABORT messages)
  bool last = false;             // close the connection once written
  const char* payload() const { return data ? data.get() : owned.data(); }
};

struct Conn;
struct Step;

// A job as this shard sees it: (data-plane job id, epoch).
struct Job {
  Job(std::string id_, uint64_t epoch_, int workers_, int shard_)
      : id(std::move(id_)),
        name(JobOfPsJobId(id)),
        epoch(epoch_),
        tag(transport::JobTag(id)),
        workers(workers_),
        shard(shard_),
        prefix(absl::StrCat("ps shard ", shard, ": job '", name, "'")),
        pool(std::make_shared<BufferPool>(workers_)) {}

  const std::string id;    // "ps/<job>"
  const std::string name;  // "<job>"
  const uint64_t epoch;
  const uint64_t tag;
  const int workers;
  const int shard;           // this server's index in the job's shard list
  const std::string prefix;  // "ps shard 1: job 'j'", opens every error message
  // Its partition buffers (pushes, then results) and their registrations.
  const std::shared_ptr<BufferPool> pool;

  absl::Mutex mu;
  std::map<int, std::shared_ptr<Conn>> conns ABSL_GUARDED_BY(mu);  // by rank
  int connecting ABSL_GUARDED_BY(mu) = 0;                          // handshakes in flight
  std::shared_ptr<Step> active ABSL_GUARDED_BY(mu);                // the running step
  bool any_closed ABSL_GUARDED_BY(mu) = false;
  uint64_t last_closed ABSL_GUARDED_BY(mu) = 0;   // the newest finished step
  absl::Status last_failure ABSL_GUARDED_BY(mu);  // why it failed (OK: it completed)
  absl::Time idle_since ABSL_GUARDED_BY(mu) = absl::Now();
  // Per-job metrics (gradsync_ps_job_*).
  std::atomic<uint64_t> steps_completed{0};
  std::atomic<uint64_t> steps_failed{0};
  std::atomic<uint64_t> bytes_pushed{0};
  std::atomic<uint64_t> bytes_pulled{0};
};

// One step of one job on this shard.
struct Step {
  Step(std::shared_ptr<Job> job_, StepHeader ref_, absl::Duration timeout)
      : job(std::move(job_)),
        ref(std::move(ref_)),
        workers(ref.workers),
        elem(DTypeSize(ref.dtype)),
        started(absl::Now()),
        deadline(started + timeout),
        remaining(static_cast<int64_t>(ref.table.size())),
        pushed(new std::atomic<uint8_t>[ref.table.size() * ref.workers]()),
        headers(ref.workers),
        conns(ref.workers),
        accs(ref.table.size()) {}

  // The index of partition `id` in ref.table, or -1.
  int LocalIndex(uint32_t id) const {
    auto it = std::lower_bound(ref.table.begin(), ref.table.end(), id,
                               [](const Partition& p, uint32_t v) { return p.id < v; });
    if (it == ref.table.end() || it->id != id) return -1;
    return static_cast<int>(it - ref.table.begin());
  }
  uint64_t step() const { return ref.step; }
  int PushedCount(int rank) const {
    int n = 0;
    for (size_t i = 0; i < ref.table.size(); ++i) n += pushed[i * workers + rank].load();
    return n;
  }

  const std::shared_ptr<Job> job;
  const StepHeader ref;  // the first header; its table is this shard's partitions
  const int workers;
  const size_t elem;
  const absl::Time started;
  const absl::Time deadline;
  uint64_t reserved = 0;  // staging bytes reserved; set before the step is published

  std::atomic<int> state{kRunning};
  std::atomic<int64_t> remaining;  // partitions not reduced yet
  // [i * workers + rank] = 1 once that push was received (for error messages).
  std::unique_ptr<std::atomic<uint8_t>[]> pushed;

  // Guarded by job->mu. conns[r] is set with rank r's header, before any of
  // its pushes reaches an aggregation thread (which reads it without a lock).
  std::vector<std::unique_ptr<StepHeader>> headers;
  int headers_seen = 0;
  bool mismatch = false;
  std::vector<std::weak_ptr<Conn>> conns;

  // accs[i] belongs to the aggregation thread of partition ref.table[i].
  struct Acc {
    int next_rank = 0;           // ranks [0, next_rank) are reduced into `acc`
    std::vector<Buffer> staged;  // pushes waiting for their turn, by rank
    Buffer acc;
  };
  std::vector<Acc> accs;
};

// Errors and purges decided under a Job lock, carried out after it is released.
struct Deferred {
  std::vector<std::pair<std::shared_ptr<Conn>, OutFrame>> sends;
  std::vector<std::shared_ptr<Step>> purges;
};

// One worker's connection: a server context of the data plane's device
// (Device::AcceptClient), driven by one thread (PsShard::Impl::Serve), and
// the queue of frames other threads (aggregation, timer, other connections'
// threads) want sent on it; queueing wakes the thread (Context::Interrupt).
struct Conn : std::enable_shared_from_this<Conn> {
  Conn(std::shared_ptr<Job> job_, int rank_, std::string peer_,
       std::atomic<uint64_t>* bytes_pulled_)
      : job(std::move(job_)), rank(rank_), peer(std::move(peer_)), bytes_pulled(bytes_pulled_) {}

  // Runs serve(self) on the connection's thread over `context`; false (and
  // nothing runs) when the connection was closed before it started.
  bool Start(std::unique_ptr<transport::Context> context,
             std::function<void(std::shared_ptr<Conn>)> serve) {
    absl::MutexLock l(&mu);
    if (closed) return false;
    ctx = std::move(context);
    thread = std::thread([this, serve = std::move(serve)] {
      serve(shared_from_this());
      Finish();
      done = true;
    });
    return true;
  }

  // Queues a frame; dropped once the connection is closed or closing.
  void Send(OutFrame f) {
    absl::MutexLock l(&mu);
    if (closed || closing) return;
    out.push_back(std::move(f));
    if (ctx != nullptr) ctx->Interrupt();
  }

  // Drops what is queued, sends `f` and closes.
  void SendLast(OutFrame f) {
    absl::MutexLock l(&mu);
    if (closed || closing) return;
    closing = true;
    out.clear();
    f.last = true;
    out.push_back(std::move(f));
    if (ctx != nullptr) ctx->Interrupt();
  }

  // Fails the context (the worker hears why): the thread returns promptly.
  void Close(const absl::Status& why) {
    absl::MutexLock l(&mu);
    if (closed) return;
    closed = true;
    out.clear();
    if (ctx != nullptr) ctx->Abort(why);
  }

  // The connection's thread, when it is done: closes the connection.
  void Finish() {
    std::unique_ptr<transport::Context> gone;
    absl::MutexLock l(&mu);
    closed = true;
    out.clear();
    gone = std::move(ctx);
  }

  // The serving thread takes what is queued.
  void TakeQueued(std::deque<OutFrame>* into) {
    absl::MutexLock l(&mu);
    while (!out.empty()) {
      into->push_back(std::move(out.front()));
      out.pop_front();
    }
  }

  bool Finished() const { return done; }
  void Join() {
    if (thread.joinable()) thread.join();
  }

  const std::shared_ptr<Job> job;
  const int rank;
  const std::string peer;
  std::atomic<uint64_t>* const bytes_pulled;

  absl::Mutex mu;
  std::deque<OutFrame> out ABSL_GUARDED_BY(mu);
  bool closing ABSL_GUARDED_BY(mu) = false;
  bool closed ABSL_GUARDED_BY(mu) = false;
  // Driven by `thread` only; other threads call Interrupt/Abort under mu.
  std::unique_ptr<transport::Context> ctx ABSL_GUARDED_BY(mu);

  std::thread thread;
  std::atomic<bool> done{false};  // the thread ended, or never started
};

// Work for an aggregation thread: one push to reduce, or (local < 0) the
// purge of a failed step's partitions.
struct Task {
  std::shared_ptr<Step> step;
  int local = -1;
  int rank = 0;
  Buffer data;
};

class Aggregator {
 public:
  explicit Aggregator(std::function<void(Task&)> run) : run_(std::move(run)) {
    thread_ = std::thread([this] { Loop(); });
  }
  ~Aggregator() {
    {
      absl::MutexLock l(&mu_);
      stop_ = true;
    }
    thread_.join();
  }
  void Post(Task t) {
    absl::MutexLock l(&mu_);
    if (!stop_) queue_.push_back(std::move(t));
  }

 private:
  void Loop() {
    std::deque<Task> batch;
    while (true) {
      {
        absl::MutexLock l(&mu_);
        auto ready = [this]()
                         ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return stop_ || !queue_.empty(); };
        mu_.Await(absl::Condition(&ready));
        if (stop_) return;  // pending work belongs to steps being torn down
        batch.swap(queue_);
      }
      for (Task& t : batch) run_(t);
      batch.clear();
    }
  }

  const std::function<void(Task&)> run_;
  absl::Mutex mu_;
  std::deque<Task> queue_ ABSL_GUARDED_BY(mu_);
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  std::thread thread_;
};

// A connection thread's frames: those posted to the context (in order),
// those taken from the queue beyond the posting bound, and the one being
// received. Owned by ServeConnection, so it outlives the context's last use.
struct ServeState {
  struct Outgoing {
    OutFrame frame;
    std::unique_ptr<transport::MemoryRegion> mr;  // a frame's own (a pooled result's is the pool's)
    const transport::MemoryRegion* region = nullptr;
    transport::Request req;
    absl::Time posted;
  };
  struct Incoming {
    transport::Incoming in;
    enum Kind { kHeader, kPush, kDiscard } kind = kDiscard;
    int local = -1;
    std::string header;
    Buffer buf;
    std::unique_ptr<transport::MemoryRegion> mr;  // the header's (a push's is the pool's)
    const transport::MemoryRegion* region = nullptr;
    transport::Request req;
    absl::Time deadline;
    uint64_t charged = 0;  // of the staging budget, while the frame is held
  };
  std::deque<Outgoing> sending;
  std::deque<OutFrame> waiting;
  std::unique_ptr<Incoming> pending;
};

// What a connection's reader knows about its worker.
struct Reader {
  std::shared_ptr<Conn> conn;
  Job* job = nullptr;
  int rank = 0;
  bool has_step = false;
  uint64_t step = 0;            // the step of the worker's latest header
  std::shared_ptr<Step> cur;    // null: pushes of `step` are discarded
  std::vector<uint8_t> pushed;  // by local partition index of `cur`
  size_t pushed_count = 0;
  bool refused_any = false;
  uint64_t last_refused = 0;  // one refusal message per stale step
};

}  // namespace shard_internal

// Only the shard's two source files include this header.
using namespace shard_internal;  // NOLINT(build/namespaces)

class PsShard::Impl {
 public:
  explicit Impl(const PsShardOptions& options) : options_(options), keys_(options.job_key) {}

  absl::Status Init();

  ~Impl() { Shutdown(); }

  int port() const { return port_; }

  PsShardStats stats() const;

  void Shutdown();

 private:
  // ---- connections ---------------------------------------------------------

  void Refuse(transport::RoutedConnection& rc, const absl::Status& why);

  // The listener's route: a worker's connection to this shard.
  void Adopt(transport::RoutedConnection rc);
  absl::StatusOr<std::shared_ptr<Job>> AdmitProven(const transport::RoutedConnection& rc)
      ABSL_LOCKS_EXCLUDED(mu_);

  // The thread of a connection: Serve, then ConnectionEnded.
  void ServeConnection(std::shared_ptr<Conn> c);

  // Sends what is queued and receives the worker's frames until the
  // connection ends; returns why.
  absl::Status Serve(Reader& rd, transport::Context& ctx, ServeState& state);

  // Returns a frame's charge against the staging budget.
  void Release(ServeState::Incoming& in) {
    if (in.charged > 0) reserved_.fetch_sub(in.charged);
    in.charged = 0;
  }

  void ConnectionEnded(Reader& rd, const absl::Status& why);

  // ---- frames --------------------------------------------------------------

  void SendAbort(const std::shared_ptr<Conn>& c, uint64_t step, const absl::Status& status);

  void HandleStepHeader(Reader& rd, const transport::Incoming& in, const std::string& payload);

  // Whether step s may start or be joined (steps only move forward).
  absl::Status Admissible(Job& job, uint64_t s, int rank) ABSL_EXCLUSIVE_LOCKS_REQUIRED(job.mu);

  void JoinStepLocked(Job& job, Reader& rd, StepHeader header, Deferred* d)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(job.mu);

  // Whether the push `in` is taken: the partition's local index, or -1 when
  // it is refused or discarded (errors queued already).
  int AdmitPush(Reader& rd, const transport::Incoming& in);

  // A received push of local partition `i`: on to its aggregation thread.
  void AcceptPush(Reader& rd, int i, Buffer buf);

  void HandleWorkerAbort(Reader& rd, uint64_t step, const absl::Status& reason);

  // ---- steps ---------------------------------------------------------------

  OutFrame AbortFrame(const Job& job, uint64_t step, const absl::Status& status);

  bool Reserve(uint64_t bytes);

  // Marks `step` failed (if it still runs), closes it in its job and queues
  // the error for every connected worker of the job.
  bool FailStepLocked(Job& job, std::shared_ptr<Step> step, const absl::Status& status, Deferred* d)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(job.mu);

  void FailStep(const std::shared_ptr<Step>& step, const absl::Status& status);

  bool CompleteStep(const std::shared_ptr<Step>& step);

  void Flush(Deferred& d);

  // " (rank 2 pushed 0 of 4 partitions here; rank 3 sent no step header)", or "".
  std::string OwedSummary(const Step& st);

  // The timeout error, or OK when no worker owes anything (the remaining
  // work is local and bounded).
  absl::Status TimeoutStatus(const Job& job, const Step& st);

  std::string MismatchMessage(const Job& job, const Step& st);

  // ---- aggregation ---------------------------------------------------------

  void Aggregate(int thread, Task& task);

  // ---- timer ---------------------------------------------------------------

  void TimerLoop();

  const PsShardOptions options_;
  std::unique_ptr<transport::Device> own_device_;  // when options_.device is null
  transport::Device* device_ = nullptr;
  std::unique_ptr<transport::TcpListener> listener_;
  int port_ = 0;
  std::vector<std::unique_ptr<Aggregator>> aggregators_;
  std::thread timer_;

  mutable absl::Mutex mu_;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::map<std::pair<std::string, uint64_t>, std::shared_ptr<Job>> jobs_ ABSL_GUARDED_BY(mu_);
  std::list<std::shared_ptr<Conn>> conns_ ABSL_GUARDED_BY(mu_);

  std::atomic<uint64_t> reserved_{0};
  std::atomic<uint64_t> connections_{0};
  std::atomic<uint64_t> tls_connections_{0};
  std::atomic<uint64_t> rdma_connections_{0};
  std::atomic<uint64_t> connections_refused_{0};
  std::atomic<uint64_t> auth_failures_{0};
  ShardKeyCache keys_;
  std::atomic<uint64_t> steps_completed_{0};
  std::atomic<uint64_t> steps_failed_{0};
  std::atomic<uint64_t> bytes_pushed_{0};
  std::atomic<uint64_t> bytes_pulled_{0};
  std::atomic<uint64_t> pushes_refused_{0};
};

}  // namespace gradsync::ps

#endif  // GRADSYNC_PS_SHARD_IMPL_H_
