// The shard engine. Threads:
//   * the listener's handshake threads hand "ps/..." connections to Adopt();
//   * per connection, a reader (ServeConnection: step headers, pushes, worker
//     aborts) and a writer (Conn::WriteLoop: results and errors, in queue order);
//   * `threads` aggregation threads; partition p's accumulator belongs to
//     thread p % threads, so reducing never takes a shared lock;
//   * a timer thread: step deadlines, reaping closed connections, idle jobs.
// Locks, outermost first: Impl::mu_ (jobs, connections) -> Job::mu (its
// running step, its connections) -> Conn::mu / Aggregator::mu_ / BufferPool
// (queues, free lists).
// The hot path (push -> reduce -> result) takes only the queue locks.
#include "ps/shard.h"

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
#include "transport/tcp_listener.h"
#include "transport/wire.h"

namespace gradsync::ps {
namespace {

using transport::FrameHeader;
using transport::FrameType;

// Recycles one connection's push buffers (partitions are mostly of one size),
// so that steady-state pushes reuse memory instead of page-faulting fresh
// pages. The reader takes buffers; aggregation threads (staged pushes) and
// writers (results) give them back. Its lock is per connection.
class BufferPool {
 public:
  static constexpr size_t kMaxPooledBytes = 32 << 20;

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
      if (pooled_ + n <= kMaxPooledBytes) {
        free_.push_back({n, p});
        pooled_ += n;
        return;
      }
    }
    delete[] p;
  }
  ~BufferPool() {
    for (auto& [n, p] : free_) delete[] p;
  }

 private:
  absl::Mutex mu_;
  std::vector<std::pair<size_t, char*>> free_ ABSL_GUARDED_BY(mu_);
  size_t pooled_ ABSL_GUARDED_BY(mu_) = 0;
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

std::string Ranks(const std::vector<int>& ranks) {
  return absl::StrCat(ranks.size() == 1 ? "rank " : "ranks ", absl::StrJoin(ranks, ","));
}

// Reads and drops n bytes.
absl::Status Discard(int fd, uint64_t n, absl::Time deadline) {
  char scratch[64 << 10];
  while (n > 0) {
    const size_t chunk = static_cast<size_t>(std::min<uint64_t>(n, sizeof(scratch)));
    RETURN_IF_ERROR(ReadFull(fd, scratch, chunk, deadline));
    n -= chunk;
  }
  return absl::OkStatus();
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
        prefix(absl::StrCat("ps shard ", shard, ": job '", name, "'")) {}

  const std::string id;    // "ps/<job>"
  const std::string name;  // "<job>"
  const uint64_t epoch;
  const uint64_t tag;
  const int workers;
  const int shard;           // this server's index in the job's shard list
  const std::string prefix;  // "ps shard 1: job 'j'", opens every error message

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

// One worker's connection: the socket, the send queue and both threads.
struct Conn : std::enable_shared_from_this<Conn> {
  Conn(std::shared_ptr<Job> job_, UniqueFd fd_, int rank_, std::string peer_,
       absl::Duration write_timeout_, std::atomic<uint64_t>* bytes_pulled_)
      : job(std::move(job_)),
        fd(std::move(fd_)),
        rank(rank_),
        peer(std::move(peer_)),
        write_timeout(write_timeout_),
        bytes_pulled(bytes_pulled_) {}

  void Start(std::function<void(std::shared_ptr<Conn>)> serve) {
    reader = std::thread([this, serve = std::move(serve)] {
      serve(shared_from_this());
      reader_done = true;
    });
    writer = std::thread([this] {
      WriteLoop();
      writer_done = true;
    });
  }

  // Queues a frame; dropped once the connection is closed or closing.
  void Send(OutFrame f) {
    absl::MutexLock l(&mu);
    if (closed || closing) return;
    out.push_back(std::move(f));
  }

  // Drops what is queued, writes `f` and closes.
  void SendLast(OutFrame f) {
    absl::MutexLock l(&mu);
    if (closed || closing) return;
    closing = true;
    out.clear();
    f.last = true;
    out.push_back(std::move(f));
  }

  // Shuts the socket down: both threads return promptly.
  void Close() {
    absl::MutexLock l(&mu);
    if (closed) return;
    closed = true;
    out.clear();
    ::shutdown(fd.get(), SHUT_RDWR);
  }

  void WriteLoop() {
    while (true) {
      OutFrame f;
      {
        absl::MutexLock l(&mu);
        auto ready = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) { return closed || !out.empty(); };
        mu.Await(absl::Condition(&ready));
        if (closed) return;
        f = std::move(out.front());
        out.pop_front();
      }
      const absl::Status s =
          WriteFrame(fd.get(), f.header, f.payload(), absl::Now() + write_timeout);
      if (!s.ok()) {
        GS_LOG(WARNING) << job->prefix << ": cannot write to worker rank " << rank << " at " << peer
                        << ": " << s.message();
        Close();
        return;
      }
      if (f.header.type == static_cast<uint8_t>(FrameType::kData)) {
        bytes_pulled->fetch_add(f.header.length, std::memory_order_relaxed);
        job->bytes_pulled.fetch_add(f.header.length, std::memory_order_relaxed);
      }
      if (f.last) {
        Close();
        return;
      }
    }
  }

  bool Finished() const { return reader_done && writer_done; }
  void Join() {
    if (reader.joinable()) reader.join();
    if (writer.joinable()) writer.join();
  }

  const std::shared_ptr<Job> job;
  const UniqueFd fd;
  const int rank;
  const std::string peer;
  const absl::Duration write_timeout;
  std::atomic<uint64_t>* const bytes_pulled;
  const std::shared_ptr<BufferPool> pool = std::make_shared<BufferPool>();

  absl::Mutex mu;
  std::deque<OutFrame> out ABSL_GUARDED_BY(mu);
  bool closing ABSL_GUARDED_BY(mu) = false;
  bool closed ABSL_GUARDED_BY(mu) = false;

  std::thread reader;
  std::thread writer;
  std::atomic<bool> reader_done{false};
  std::atomic<bool> writer_done{false};
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

}  // namespace

class PsShard::Impl {
 public:
  explicit Impl(const PsShardOptions& options) : options_(options) {}

  absl::Status Init() {
    for (int t = 0; t < options_.threads; ++t) {
      aggregators_.push_back(
          std::make_unique<Aggregator>([this, t](Task& task) { Aggregate(t, task); }));
    }
    transport::ListenerOptions lo;
    lo.listen = options_.listen;
    lo.route_prefix = kPsJobPrefix;
    lo.route = [this](transport::RoutedConnection rc) { Adopt(std::move(rc)); };
    ASSIGN_OR_RETURN(listener_, transport::TcpListener::Start(lo));
    port_ = listener_->port();
    timer_ = std::thread([this] { TimerLoop(); });
    return absl::OkStatus();
  }

  ~Impl() { Shutdown(); }

  int port() const { return port_; }

  PsShardStats stats() const {
    PsShardStats s;
    s.connections = connections_;
    s.connections_refused = connections_refused_;
    s.steps_completed = steps_completed_;
    s.steps_failed = steps_failed_;
    s.bytes_pushed = bytes_pushed_;
    s.bytes_pulled = bytes_pulled_;
    s.pushes_refused = pushes_refused_;
    s.reserved_bytes = reserved_;
    absl::MutexLock l(&mu_);
    s.jobs = jobs_.size();
    std::map<std::string, PsJobStats> by_name;  // epochs of one job add up
    for (const auto& [key, job] : jobs_) {
      PsJobStats& j = by_name[job->name];
      j.job = job->name;
      j.steps_completed += job->steps_completed.load();
      j.steps_failed += job->steps_failed.load();
      j.bytes_pushed += job->bytes_pushed.load();
      j.bytes_pulled += job->bytes_pulled.load();
    }
    for (auto& [name, j] : by_name) s.per_job.push_back(std::move(j));
    return s;
  }

  void Shutdown() {
    {
      absl::MutexLock l(&mu_);
      if (stopping_) return;
      stopping_ = true;
    }
    listener_.reset();  // waits for handshakes in Adopt()
    if (timer_.joinable()) timer_.join();
    std::list<std::shared_ptr<Conn>> conns;
    {
      absl::MutexLock l(&mu_);
      conns = conns_;
    }
    for (auto& c : conns) {
      OutFrame f;
      f.header = MakeAbortFrame(
          c->job->tag, c->job->epoch, kConnectionStep,
          absl::UnavailableError(absl::StrCat("ps shard ", c->job->shard, ": shutting down")),
          &f.owned);
      c->SendLast(std::move(f));
    }
    const absl::Time until = absl::Now() + absl::Milliseconds(500);
    for (auto& c : conns) {
      while (!c->writer_done && absl::Now() < until) absl::SleepFor(absl::Milliseconds(2));
    }
    for (auto& c : conns) c->Close();
    for (auto& c : conns) c->Join();
    aggregators_.clear();
    absl::MutexLock l(&mu_);
    for (auto& [key, job] : jobs_) {
      absl::MutexLock jl(&job->mu);
      job->active.reset();
      job->conns.clear();
    }
    jobs_.clear();
    conns_.clear();
  }

 private:
  // ---- connections ---------------------------------------------------------

  void Refuse(transport::RoutedConnection& rc, const absl::Status& why) {
    ++connections_refused_;
    GS_LOG(WARNING) << "ps shard: refused " << rc.peer << " (job '" << rc.job_id << "' rank "
                    << rc.hello.src_rank << "): " << why.message();
    const std::string msg(why.message().substr(0, 1024));
    transport::HelloAck ack{transport::kHelloMagic, static_cast<uint16_t>(why.code()),
                            static_cast<uint16_t>(msg.size())};
    const absl::Time deadline = absl::Now() + absl::Seconds(1);
    if (WriteFull(rc.fd.get(), &ack, sizeof(ack), deadline).ok()) {
      (void)WriteFull(rc.fd.get(), msg.data(), msg.size(), deadline);
    }
  }

  // The listener's route: a worker's connection to this shard.
  void Adopt(transport::RoutedConnection rc) {
    const int rank = rc.hello.src_rank;
    const int workers = rc.hello.world_size;
    const int shard = rc.hello.dst_rank;
    std::shared_ptr<Job> job;
    absl::Status refuse;
    {
      absl::MutexLock l(&mu_);
      if (stopping_) {
        refuse = absl::UnavailableError("ps shard is shutting down");
      } else {
        std::shared_ptr<Job>& slot = jobs_[{rc.job_id, rc.hello.epoch}];
        if (slot == nullptr)
          slot = std::make_shared<Job>(rc.job_id, rc.hello.epoch, workers, shard);
        job = slot;
        absl::MutexLock jl(&job->mu);
        if (job->workers != workers) {
          refuse = absl::FailedPreconditionError(
              absl::StrCat(job->prefix, " epoch ", job->epoch, " has ", job->workers,
                           " workers here, rank ", rank, " connected with ", workers));
        } else if (job->shard != shard) {
          refuse = absl::FailedPreconditionError(
              absl::StrCat(job->prefix, " epoch ", job->epoch, " uses this server as shard ",
                           job->shard, ", rank ", rank, " connected to it as shard ", shard));
        } else {
          ++job->connecting;
        }
      }
    }
    if (!refuse.ok()) return Refuse(rc, refuse);
    const absl::Time deadline = absl::Now() + absl::Seconds(2);
    transport::HelloAck ack{transport::kHelloMagic, 0, 0};
    absl::Status s = WriteFull(rc.fd.get(), &ack, sizeof(ack), deadline);
    if (s.ok()) s = TuneDataSocket(rc.fd.get(), options_.socket_buffer_bytes);
    std::shared_ptr<Conn> old;
    {
      absl::MutexLock l(&mu_);
      absl::MutexLock jl(&job->mu);
      --job->connecting;
      if (!s.ok()) {
        GS_LOG(WARNING) << job->prefix << ": handshake with rank " << rank << " at " << rc.peer
                        << " failed: " << s.message();
        if (job->conns.empty()) job->idle_since = absl::Now();
        return;
      }
      auto c = std::make_shared<Conn>(job, std::move(rc.fd), rank, rc.peer, options_.step_timeout,
                                      &bytes_pulled_);
      auto it = job->conns.find(rank);
      if (it != job->conns.end()) old = it->second;
      job->conns[rank] = c;
      conns_.push_back(c);
      c->Start([this](std::shared_ptr<Conn> self) { ServeConnection(std::move(self)); });
    }
    ++connections_;
    GS_LOG(DEBUG) << job->prefix << ": worker rank " << rank << " of " << workers
                  << " connected from " << rc.peer;
    if (old != nullptr) old->Close();  // a reconnect replaces the old connection
  }

  // The reader thread of a connection.
  void ServeConnection(std::shared_ptr<Conn> c) {
    Reader rd;
    rd.conn = c;
    rd.job = c->job.get();
    rd.rank = c->rank;
    bool protocol_error = false;
    const absl::Status why = ReadFrames(rd, &protocol_error);
    ConnectionEnded(rd, why, protocol_error);
  }

  absl::Status ReadFrames(Reader& rd, bool* protocol_error) {
    const int fd = rd.conn->fd.get();
    Job& job = *rd.job;
    while (true) {
      FrameHeader h;
      char* hp = reinterpret_cast<char*>(&h);
      // Idle connections wait as long as it takes; a started frame must
      // arrive within the step timeout.
      RETURN_IF_ERROR(ReadFull(fd, hp, 1, absl::InfiniteFuture()));
      const absl::Time deadline = absl::Now() + options_.step_timeout;
      RETURN_IF_ERROR(ReadFull(fd, hp + 1, sizeof(h) - 1, deadline));
      absl::Status v = transport::ValidateFrameHeader(h);
      if (v.ok() && (h.job_tag != job.tag || h.epoch != job.epoch)) {
        v = absl::DataLossError(
            absl::StrCat("frame of another job or epoch ", transport::DescribeFrame(h)));
      }
      if (!v.ok()) {
        *protocol_error = true;
        return absl::DataLossError(absl::StrCat(job.prefix, ": protocol error from worker rank ",
                                                rd.rank, ": ", v.message()));
      }
      if (h.type == static_cast<uint8_t>(FrameType::kAbort)) {
        std::string msg(h.length, '\0');
        RETURN_IF_ERROR(ReadFull(fd, msg.data(), msg.size(), deadline));
        HandleWorkerAbort(rd, h, msg);
      } else if (h.slot == transport::kControlSlot) {
        std::string payload(h.length, '\0');
        RETURN_IF_ERROR(ReadFull(fd, payload.data(), payload.size(), deadline));
        HandleStepHeader(rd, h, payload);
      } else {
        RETURN_IF_ERROR(HandlePush(rd, h, deadline));
      }
    }
  }

  void ConnectionEnded(Reader& rd, const absl::Status& why, bool protocol_error) {
    Job& job = *rd.job;
    if (protocol_error) {
      GS_LOG(WARNING) << why.message();
      OutFrame f;
      f.header = MakeAbortFrame(job.tag, job.epoch, kConnectionStep, why, &f.owned);
      rd.conn->SendLast(std::move(f));
    } else {
      rd.conn->Close();
    }
    Deferred d;
    {
      absl::MutexLock l(&job.mu);
      auto it = job.conns.find(rd.rank);
      if (it != job.conns.end() && it->second == rd.conn) job.conns.erase(it);
      if (job.conns.empty()) job.idle_since = absl::Now();
      const std::shared_ptr<Step>& active = job.active;
      if (active != nullptr && rd.cur == active && rd.pushed_count < active->ref.table.size()) {
        FailStepLocked(job, active,
                       absl::UnavailableError(absl::StrCat(
                           job.prefix, " step ", active->step(), ": worker rank ", rd.rank,
                           " disconnected after pushing ", rd.pushed_count, " of ",
                           active->ref.table.size(), " partitions here (", why.message(), ")")),
                       &d);
      }
    }
    Flush(d);
    GS_LOG(DEBUG) << job.prefix << ": worker rank " << rd.rank
                  << " disconnected: " << why.message();
  }

  // ---- frames --------------------------------------------------------------

  void SendAbort(const std::shared_ptr<Conn>& c, uint64_t step, const absl::Status& status) {
    OutFrame f;
    f.header = MakeAbortFrame(c->job->tag, c->job->epoch, step, status, &f.owned);
    c->Send(std::move(f));
  }

  void HandleStepHeader(Reader& rd, const FrameHeader& h, const std::string& payload) {
    Job& job = *rd.job;
    const uint64_t s = h.op_seq;
    absl::StatusOr<StepHeader> header = DecodeStepHeader(s, payload);
    absl::Status bad = header.status();
    if (bad.ok() &&
        (header->rank != rd.rank || header->workers != job.workers || header->shard != job.shard ||
         h.dtype != static_cast<uint8_t>(header->dtype))) {
      bad = absl::InvalidArgumentError(
          absl::StrCat("it is for rank ", header->rank, " of ", header->workers,
                       " workers at shard ", header->shard, ", this connection is rank ", rd.rank,
                       " of ", job.workers, " workers at shard ", job.shard));
    }
    if (rd.has_step && s <= rd.step) {
      SendAbort(rd.conn, s,
                absl::FailedPreconditionError(
                    absl::StrCat(job.prefix, ": refused step ", s, " from worker rank ", rd.rank,
                                 ": steps must increase (its previous step was ", rd.step, ")")));
      return;
    }
    rd.has_step = true;
    rd.step = s;
    rd.cur.reset();
    rd.pushed.clear();
    rd.pushed_count = 0;
    Deferred d;
    {
      absl::MutexLock l(&job.mu);
      if (!bad.ok()) {
        const absl::Status st = absl::InvalidArgumentError(
            absl::StrCat(job.prefix, " step ", s, ": worker rank ", rd.rank,
                         " sent a bad step header: ", bad.message()));
        if (job.active != nullptr && job.active->step() == s) {
          FailStepLocked(job, job.active, st, &d);
        } else {
          d.sends.push_back({rd.conn, AbortFrame(job, s, st)});
        }
      } else if (absl::Status r = Admissible(job, s, rd.rank); !r.ok()) {
        d.sends.push_back({rd.conn, AbortFrame(job, s, r)});
      } else {
        JoinStepLocked(job, rd, std::move(*header), &d);
      }
    }
    Flush(d);
  }

  // Whether step s may start or be joined (steps only move forward).
  absl::Status Admissible(Job& job, uint64_t s, int rank) ABSL_EXCLUSIVE_LOCKS_REQUIRED(job.mu) {
    const std::string refused =
        absl::StrCat(job.prefix, ": refused step ", s, " from worker rank ", rank, ": ");
    if (job.any_closed && s <= job.last_closed) {
      if (s < job.last_closed) {
        return absl::FailedPreconditionError(
            absl::StrCat(refused, "step ", job.last_closed, " already finished"));
      }
      if (job.last_failure.ok()) {
        return absl::FailedPreconditionError(absl::StrCat(refused, "it already completed"));
      }
      // The step's own error (its code too): the late worker learns why it failed.
      return absl::Status(job.last_failure.code(),
                          absl::StrCat(refused, "it already failed: ", job.last_failure.message()));
    }
    if (job.active != nullptr && s < job.active->step()) {
      return absl::FailedPreconditionError(
          absl::StrCat(refused, "step ", job.active->step(), " is already running"));
    }
    return absl::OkStatus();
  }

  void JoinStepLocked(Job& job, Reader& rd, StepHeader header, Deferred* d)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(job.mu) {
    const uint64_t s = header.step;
    if (job.active != nullptr && job.active->step() < s) {
      Step& old = *job.active;
      FailStepLocked(job, job.active,
                     absl::AbortedError(absl::StrCat(
                         job.prefix, " step ", old.step(), " aborted: worker rank ", rd.rank,
                         " started step ", s, " before it finished", OwedSummary(old))),
                     d);
    }
    if (job.active == nullptr) {
      uint64_t bytes = 0;
      for (const Partition& p : header.table) bytes += p.bytes;
      const uint64_t need = bytes * static_cast<uint64_t>(job.workers);
      auto step = std::make_shared<Step>(rd.conn->job, header, options_.step_timeout);
      job.active = step;
      if (!Reserve(need)) {
        FailStepLocked(job, step,
                       absl::ResourceExhaustedError(absl::StrCat(
                           job.prefix, " step ", s, ": ", job.workers, " workers x ", bytes,
                           " bytes do not fit into the shard's staging memory (", reserved_.load(),
                           " of ", options_.max_memory_bytes, " bytes in use)")),
                       d);
        return;
      }
      step->reserved = need;
    }
    Step& st = *job.active;
    if (st.headers[rd.rank] != nullptr) {
      FailStepLocked(
          job, job.active,
          absl::InvalidArgumentError(absl::StrCat(job.prefix, " step ", s, ": worker rank ",
                                                  rd.rank, " sent its step header twice")),
          d);
      return;
    }
    const bool same = SameStep(st.ref, header);
    st.headers[rd.rank] = std::make_unique<StepHeader>(std::move(header));
    ++st.headers_seen;
    st.conns[rd.rank] = rd.conn;
    if (!same) st.mismatch = true;
    if (st.mismatch) {
      if (st.headers_seen == st.workers) {
        FailStepLocked(job, job.active, absl::InvalidArgumentError(MismatchMessage(job, st)), d);
      }
      return;  // this worker's pushes are discarded
    }
    rd.cur = job.active;
    rd.pushed.assign(st.ref.table.size(), 0);
  }

  absl::Status HandlePush(Reader& rd, const FrameHeader& h, absl::Time deadline) {
    Job& job = *rd.job;
    const int fd = rd.conn->fd.get();
    const uint64_t s = h.op_seq;
    if (!rd.has_step || s != rd.step) {
      ++pushes_refused_;
      RETURN_IF_ERROR(Discard(fd, h.length, deadline));
      if (!rd.refused_any || rd.last_refused != s) {
        rd.refused_any = true;
        rd.last_refused = s;
        SendAbort(rd.conn, s,
                  absl::FailedPreconditionError(
                      absl::StrCat(job.prefix, ": refused push of partition ", h.slot, " of step ",
                                   s, " from worker rank ", rd.rank, ": ",
                                   rd.has_step ? absl::StrCat("its current step is ", rd.step)
                                               : std::string("it sent no step header"))));
      }
      return absl::OkStatus();
    }
    if (rd.cur == nullptr || rd.cur->state.load() != kRunning) {
      ++pushes_refused_;  // refused, mismatched or failed step: the error went out already
      return Discard(fd, h.length, deadline);
    }
    Step& st = *rd.cur;
    const int i = st.LocalIndex(h.slot);
    std::string bad;
    if (i < 0) {
      bad = absl::StrCat("partition ", h.slot, " is not on this shard");
    } else {
      const Partition& p = st.ref.table[i];
      if (h.offset != p.offset_bytes || h.length != p.bytes ||
          h.dtype != static_cast<uint8_t>(st.ref.dtype)) {
        bad = absl::StrCat("partition ", p.id, " arrived as ", transport::DescribeFrame(h),
                           ", expected offset ", p.offset_bytes, " length ", p.bytes);
      } else if (rd.pushed[i]) {
        bad = absl::StrCat("partition ", p.id, " was pushed twice");
      }
    }
    if (!bad.empty()) {
      ++pushes_refused_;
      RETURN_IF_ERROR(Discard(fd, h.length, deadline));
      FailStep(rd.cur, absl::InvalidArgumentError(absl::StrCat(
                           job.prefix, " step ", s, ": worker rank ", rd.rank, ": ", bad)));
      return absl::OkStatus();
    }
    Buffer buf(rd.conn->pool->Take(h.length), GiveBack{rd.conn->pool, h.length});
    RETURN_IF_ERROR(ReadFull(fd, buf.get(), h.length, deadline));
    rd.pushed[i] = 1;
    ++rd.pushed_count;
    st.pushed[static_cast<size_t>(i) * st.workers + rd.rank].store(1, std::memory_order_relaxed);
    bytes_pushed_.fetch_add(h.length, std::memory_order_relaxed);
    job.bytes_pushed.fetch_add(h.length, std::memory_order_relaxed);
    Task t;
    t.step = rd.cur;
    t.local = i;
    t.rank = rd.rank;
    t.data = std::move(buf);
    aggregators_[st.ref.table[i].id % aggregators_.size()]->Post(std::move(t));
    return absl::OkStatus();
  }

  void HandleWorkerAbort(Reader& rd, const FrameHeader& h, const std::string& msg) {
    Job& job = *rd.job;
    Deferred d;
    {
      absl::MutexLock l(&job.mu);
      if (job.active != nullptr && job.active->step() == h.op_seq) {
        const absl::Status reason = AbortStatus(h, msg);
        FailStepLocked(job, job.active,
                       absl::Status(reason.code(), absl::StrCat(job.prefix, " step ", h.op_seq,
                                                                " aborted by worker rank ", rd.rank,
                                                                ": ", reason.message())),
                       &d);
      }
    }
    Flush(d);
  }

  // ---- steps ---------------------------------------------------------------

  OutFrame AbortFrame(const Job& job, uint64_t step, const absl::Status& status) {
    OutFrame f;
    f.header = MakeAbortFrame(job.tag, job.epoch, step, status, &f.owned);
    return f;
  }

  bool Reserve(uint64_t bytes) {
    uint64_t cur = reserved_.load();
    do {
      if (cur > options_.max_memory_bytes || bytes > options_.max_memory_bytes - cur) return false;
    } while (!reserved_.compare_exchange_weak(cur, cur + bytes));
    return true;
  }

  // Marks `step` failed (if it still runs), closes it in its job and queues
  // the error for every connected worker of the job.
  bool FailStepLocked(Job& job, std::shared_ptr<Step> step, const absl::Status& status, Deferred* d)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(job.mu) {
    int expected = kRunning;
    if (!step->state.compare_exchange_strong(expected, kFailed)) return false;
    if (job.active == step) job.active.reset();
    if (!job.any_closed || step->step() >= job.last_closed) {
      job.any_closed = true;
      job.last_closed = step->step();
      job.last_failure = status;
    }
    reserved_.fetch_sub(step->reserved);
    for (auto& [rank, c] : job.conns)
      d->sends.push_back({c, AbortFrame(job, step->step(), status)});
    d->purges.push_back(std::move(step));
    ++steps_failed_;
    ++job.steps_failed;
    GS_LOG(WARNING) << status;
    return true;
  }

  void FailStep(const std::shared_ptr<Step>& step, const absl::Status& status) {
    Deferred d;
    {
      absl::MutexLock l(&step->job->mu);
      FailStepLocked(*step->job, step, status, &d);
    }
    Flush(d);
  }

  bool CompleteStep(const std::shared_ptr<Step>& step) {
    int expected = kRunning;
    if (!step->state.compare_exchange_strong(expected, kCompleted)) return false;
    Job& job = *step->job;
    {
      absl::MutexLock l(&job.mu);
      if (job.active == step) job.active.reset();
      if (!job.any_closed || step->step() >= job.last_closed) {
        job.any_closed = true;
        job.last_closed = step->step();
        job.last_failure = absl::OkStatus();
      }
    }
    reserved_.fetch_sub(step->reserved);
    ++steps_completed_;
    ++job.steps_completed;
    return true;
  }

  void Flush(Deferred& d) {
    for (auto& [c, f] : d.sends) c->Send(std::move(f));
    for (auto& step : d.purges) {
      for (auto& a : aggregators_) {
        Task t;
        t.step = step;
        a->Post(std::move(t));
      }
    }
  }

  // " (rank 2 pushed 0 of 4 partitions here; rank 3 sent no step header)", or "".
  std::string OwedSummary(const Step& st) {
    std::vector<std::string> parts;
    for (int r = 0; r < st.workers; ++r) {
      const int n = static_cast<int>(st.ref.table.size());
      if (st.headers[r] == nullptr) {
        parts.push_back(absl::StrCat("rank ", r, " sent no step header"));
      } else if (int got = st.PushedCount(r); got < n) {
        parts.push_back(absl::StrCat("rank ", r, " pushed ", got, " of ", n, " partitions here"));
      }
    }
    if (parts.empty()) return "";
    return absl::StrCat(" (", absl::StrJoin(parts, "; "), ")");
  }

  // The timeout error, or OK when no worker owes anything (the remaining
  // work is local and bounded).
  absl::Status TimeoutStatus(const Job& job, const Step& st) {
    const std::string waited =
        absl::StrCat(absl::ToInt64Milliseconds(options_.step_timeout), " ms");
    if (st.mismatch) {
      std::vector<int> silent;
      for (int r = 0; r < st.workers; ++r) {
        if (st.headers[r] == nullptr) silent.push_back(r);
      }
      return absl::InvalidArgumentError(absl::StrCat(MismatchMessage(job, st), "; ", Ranks(silent),
                                                     " sent no step header within ", waited));
    }
    for (size_t i = 0; i < st.ref.table.size(); ++i) {
      std::vector<int> missing;
      for (int r = 0; r < st.workers; ++r) {
        if (st.headers[r] == nullptr || !st.pushed[i * st.workers + r].load()) missing.push_back(r);
      }
      if (missing.empty()) continue;
      return absl::DeadlineExceededError(absl::StrCat(
          job.prefix, " step ", st.step(), " timed out after ", waited, " waiting for ",
          Ranks(missing), " to push partition ", st.ref.table[i].id, OwedSummary(st)));
    }
    return absl::OkStatus();
  }

  std::string MismatchMessage(const Job& job, const Step& st) {
    std::map<std::string, std::vector<int>> groups;
    for (int r = 0; r < st.workers; ++r) {
      if (st.headers[r] != nullptr) groups[DescribeStepHeader(*st.headers[r])].push_back(r);
    }
    std::vector<std::pair<std::string, std::vector<int>>> ordered(groups.begin(), groups.end());
    std::stable_sort(ordered.begin(), ordered.end(), [](const auto& a, const auto& b) {
      if (a.second.size() != b.second.size()) return a.second.size() < b.second.size();
      return a.second.front() < b.second.front();
    });
    std::vector<std::string> parts;
    for (const auto& [desc, ranks] : ordered) {
      parts.push_back(absl::StrCat(Ranks(ranks), " sent ", desc));
    }
    return absl::StrCat(job.prefix, " step ", st.step(),
                        " does not match across workers: ", absl::StrJoin(parts, ", "));
  }

  // ---- aggregation ---------------------------------------------------------

  void Aggregate(int thread, Task& task) {
    Step& st = *task.step;
    const int threads = static_cast<int>(aggregators_.size());
    if (task.local < 0) {  // purge a failed step
      for (size_t i = 0; i < st.accs.size(); ++i) {
        if (static_cast<int>(st.ref.table[i].id % threads) == thread) st.accs[i] = Step::Acc();
      }
      return;
    }
    if (st.state.load() == kFailed) return;
    Step::Acc& a = st.accs[task.local];
    const Partition& p = st.ref.table[task.local];
    const size_t count = p.bytes / st.elem;
    if (a.staged.empty()) a.staged.resize(st.workers);
    a.staged[task.rank] = std::move(task.data);
    // Reduce in rank order: acc = x_0, then acc = acc OP x_r for r = 1, 2, ...
    while (a.next_rank < st.workers && a.staged[a.next_rank] != nullptr) {
      if (a.next_rank == 0) {
        a.acc = std::move(a.staged[0]);
      } else {
        ReduceInto(st.ref.dtype, st.ref.op, a.acc.get(), a.staged[a.next_rank].get(), count);
        a.staged[a.next_rank].reset();
      }
      ++a.next_rank;
    }
    if (a.next_rank < st.workers) return;
    if (st.ref.op == ReduceOp::kAvg && st.workers > 1) {
      DivideBy(st.ref.dtype, a.acc.get(), count, st.workers);
    }
    std::shared_ptr<char[]> result(std::move(a.acc));
    a.staged = std::vector<Buffer>();
    // Close the step before its last result leaves, so a worker that has all
    // its results never finds the step still running. Other partitions'
    // results may still be on their way out then: only a failed step drops them.
    if (st.remaining.fetch_sub(1) == 1) {
      if (!CompleteStep(task.step)) return;
    } else if (st.state.load() == kFailed) {
      return;
    }
    const Job& job = *st.job;
    const FrameHeader h = MakeFrame(FrameType::kData, job.tag, job.epoch, st.step(), p.id,
                                    static_cast<uint8_t>(st.ref.dtype), p.offset_bytes,
                                    static_cast<uint32_t>(p.bytes));
    for (int r = 0; r < st.workers; ++r) {
      if (std::shared_ptr<Conn> c = st.conns[r].lock()) {
        OutFrame f;
        f.header = h;
        f.data = result;
        c->Send(std::move(f));
      }
    }
  }

  // ---- timer ---------------------------------------------------------------

  void TimerLoop() {
    while (true) {
      std::vector<std::shared_ptr<Job>> jobs;
      std::vector<std::shared_ptr<Conn>> finished;
      {
        absl::MutexLock l(&mu_);
        mu_.AwaitWithTimeout(absl::Condition(&stopping_), absl::Milliseconds(20));
        if (stopping_) return;
        const absl::Time now = absl::Now();
        for (auto it = conns_.begin(); it != conns_.end();) {
          if ((*it)->Finished()) {
            finished.push_back(*it);
            it = conns_.erase(it);
          } else {
            ++it;
          }
        }
        for (auto it = jobs_.begin(); it != jobs_.end();) {
          Job& job = *it->second;
          absl::MutexLock jl(&job.mu);
          if (job.conns.empty() && job.connecting == 0 && job.active == nullptr &&
              now - job.idle_since > options_.idle_job_timeout) {
            it = jobs_.erase(it);
          } else {
            jobs.push_back(it->second);
            ++it;
          }
        }
      }
      for (auto& c : finished) c->Join();
      const absl::Time now = absl::Now();
      for (auto& job : jobs) {
        Deferred d;
        {
          absl::MutexLock l(&job->mu);
          if (job->active != nullptr && now >= job->active->deadline) {
            absl::Status s = TimeoutStatus(*job, *job->active);
            if (!s.ok()) FailStepLocked(*job, job->active, s, &d);
          }
        }
        Flush(d);
      }
    }
  }

  const PsShardOptions options_;
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
  std::atomic<uint64_t> connections_refused_{0};
  std::atomic<uint64_t> steps_completed_{0};
  std::atomic<uint64_t> steps_failed_{0};
  std::atomic<uint64_t> bytes_pushed_{0};
  std::atomic<uint64_t> bytes_pulled_{0};
  std::atomic<uint64_t> pushes_refused_{0};
};

absl::StatusOr<std::unique_ptr<PsShard>> PsShard::Start(const PsShardOptions& options) {
  if (options.threads < 1 || options.threads > 256) {
    return absl::InvalidArgumentError(
        absl::StrCat("ps shard: threads must be 1..256, got ", options.threads));
  }
  if (options.step_timeout <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError("ps shard: step_timeout must be > 0");
  }
  auto impl = std::make_unique<Impl>(options);
  RETURN_IF_ERROR(impl->Init());
  return std::unique_ptr<PsShard>(new PsShard(std::move(impl)));
}

PsShard::PsShard(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
PsShard::~PsShard() { Shutdown(); }
int PsShard::port() const { return impl_->port(); }
PsShardStats PsShard::stats() const { return impl_->stats(); }
void PsShard::Shutdown() { impl_->Shutdown(); }

}  // namespace gradsync::ps
