// The shard's lifecycle, connections and frames (the design: ps/shard_impl.h).
#include "ps/shard.h"

#include "ps/shard_impl.h"

namespace gradsync::ps {

absl::Status PsShard::Impl::Init() {
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

PsShardStats PsShard::Impl::stats() const {
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

void PsShard::Impl::Shutdown() {
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

void PsShard::Impl::Refuse(transport::RoutedConnection& rc, const absl::Status& why) {
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

void PsShard::Impl::Adopt(transport::RoutedConnection rc) {
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
  absl::Status s = TuneDataSocket(rc.fd.get(), options_.socket_buffer_bytes);
  // The connection is rank `rank`'s before the worker hears the HelloAck:
  // a worker connects again only after an ack, so registrations follow the
  // order of its connections, and a slow handshake can never replace (and
  // close) the connection the worker made after it.
  std::shared_ptr<Conn> c, old;
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
    c = std::make_shared<Conn>(job, std::move(rc.fd), rank, rc.peer, options_.step_timeout,
                               &bytes_pulled_);
    auto it = job->conns.find(rank);
    if (it != job->conns.end()) old = it->second;
    job->conns[rank] = c;
    conns_.push_back(c);
    c->Start([this](std::shared_ptr<Conn> self) { ServeConnection(std::move(self)); });
  }
  const transport::HelloAck ack{transport::kHelloMagic, 0, 0};
  s = WriteFull(c->fd.get(), &ack, sizeof(ack), absl::Now() + absl::Seconds(2));
  if (!s.ok()) {
    GS_LOG(WARNING) << job->prefix << ": handshake with rank " << rank << " at " << c->peer
                    << " failed: " << s.message();
    c->Close();  // its reader sees the end and unregisters it
  } else {
    ++connections_;
  }
  GS_LOG(DEBUG) << job->prefix << ": worker rank " << rank << " of " << workers
                << " connected from " << rc.peer;
  if (old != nullptr) old->Close();  // a reconnect replaces the old connection
}

void PsShard::Impl::ServeConnection(std::shared_ptr<Conn> c) {
  Reader rd;
  rd.conn = c;
  rd.job = c->job.get();
  rd.rank = c->rank;
  bool protocol_error = false;
  const absl::Status why = ReadFrames(rd, &protocol_error);
  ConnectionEnded(rd, why, protocol_error);
}

absl::Status PsShard::Impl::ReadFrames(Reader& rd, bool* protocol_error) {
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

void PsShard::Impl::ConnectionEnded(Reader& rd, const absl::Status& why, bool protocol_error) {
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

void PsShard::Impl::SendAbort(const std::shared_ptr<Conn>& c, uint64_t step, const absl::Status& status) {
  OutFrame f;
  f.header = MakeAbortFrame(c->job->tag, c->job->epoch, step, status, &f.owned);
  c->Send(std::move(f));
}

void PsShard::Impl::HandleStepHeader(Reader& rd, const FrameHeader& h, const std::string& payload) {
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

absl::Status PsShard::Impl::Admissible(Job& job, uint64_t s, int rank) ABSL_EXCLUSIVE_LOCKS_REQUIRED(job.mu) {
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

void PsShard::Impl::JoinStepLocked(Job& job, Reader& rd, StepHeader header, Deferred* d)
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

absl::Status PsShard::Impl::HandlePush(Reader& rd, const FrameHeader& h, absl::Time deadline) {
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

void PsShard::Impl::HandleWorkerAbort(Reader& rd, const FrameHeader& h, const std::string& msg) {
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
