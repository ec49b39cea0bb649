// The shard's lifecycle and the frames of its connections (the design: ps/shard_impl.h;
// accepting a connection: ps/shard_connect.cc).
#include "ps/shard.h"

#include "ps/shard_impl.h"
#include "transport/tcp_device.h"

namespace gradsync::ps {

absl::Status PsShard::Impl::Init() {
  device_ = options_.device;
  if (device_ == nullptr) {
    own_device_ = transport::TcpDevice::DialOnly(options_.socket_buffer_bytes, options_.tls);
    device_ = own_device_.get();
  }
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
  s.tls_connections = tls_connections_;
  s.rdma_connections = rdma_connections_;
  s.connections_refused = connections_refused_;
  s.auth_failures = auth_failures_;
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
    while (!c->Finished() && absl::Now() < until) absl::SleepFor(absl::Milliseconds(2));
  }
  for (auto& c : conns) c->Close(absl::UnavailableError("ps shard: shutting down"));
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

namespace {

// Sets o.region to the memory a DATA frame is sent from: a partition result
// from the job's pool is registered once per connection (the pool keeps it);
// anything else gets a registration of its own, dropped with the frame.
absl::Status RegisterOutgoing(transport::Context& ctx, ServeState::Outgoing& o) {
  char* p = const_cast<char*>(o.frame.payload());
  const size_t n = o.frame.header.length;
  const GiveBack* owner = o.frame.data ? std::get_deleter<GiveBack>(o.frame.data) : nullptr;
  if (owner != nullptr && owner->pool != nullptr && owner->size == n) {
    ASSIGN_OR_RETURN(o.region, owner->pool->Registration(ctx, p, n));
    return absl::OkStatus();
  }
  ASSIGN_OR_RETURN(o.mr, ctx.RegisterMemory(p, n));
  o.region = o.mr.get();
  return absl::OkStatus();
}

}  // namespace

void PsShard::Impl::ServeConnection(std::shared_ptr<Conn> c) {
  Reader rd;
  rd.conn = c;
  rd.job = c->job.get();
  rd.rank = c->rank;
  transport::Context* ctx;
  {
    absl::MutexLock l(&c->mu);
    ctx = c->ctx.get();
  }
  // The state outlives the context's last use: a failing context finishes
  // the frame half on the wire from the sends' memory before its ABORT.
  ServeState state;
  const absl::Status why = Serve(rd, *ctx, state);
  if (!why.ok() && ctx->health().ok()) (void)ctx->Fail(why);  // tells the worker
  if (state.pending != nullptr) Release(*state.pending);
  c->job->pool->ForgetRegistrations(*ctx);
  ConnectionEnded(rd, why);
}

absl::Status PsShard::Impl::Serve(Reader& rd, transport::Context& ctx, ServeState& state) {
  Conn& c = *rd.conn;
  Job& job = *rd.job;
  std::deque<ServeState::Outgoing>& sending = state.sending;
  std::deque<OutFrame>& waiting = state.waiting;
  std::unique_ptr<ServeState::Incoming>& pending = state.pending;
  using Incoming = ServeState::Incoming;
  // A frame received outside a running step's reservation (a step header, a
  // push that is discarded) is charged against the staging budget before its
  // memory is allocated, so what a hostile peer announces cannot grow the
  // shard past max_memory_bytes (ServeConnection returns what is held).
  const size_t bound = ctx.max_in_flight() > 0 ? static_cast<size_t>(ctx.max_in_flight()) : 64;
  while (true) {
    c.TakeQueued(&waiting);
    while (!waiting.empty() && sending.size() < bound) {
      ServeState::Outgoing& o = sending.emplace_back();
      o.frame = std::move(waiting.front());
      waiting.pop_front();
      o.posted = absl::Now();
      const FrameHeader& h = o.frame.header;
      absl::Status st;
      if (h.type == static_cast<uint8_t>(FrameType::kAbort)) {
        st = ctx.PostAbort(0, h.op_seq, AbortStatus(h, o.frame.owned), &o.req);
      } else {
        st = RegisterOutgoing(ctx, o);
        if (st.ok()) {
          st = ctx.PostSend(0, *o.region, 0, h.length,
                            transport::MessageTag{h.op_seq, h.slot, h.dtype, h.offset}, &o.req);
        }
      }
      if (!st.ok()) return st;
    }
    while (!sending.empty() && sending.front().req.done) {
      const ServeState::Outgoing& o = sending.front();
      if (o.frame.header.type == static_cast<uint8_t>(FrameType::kData)) {
        c.bytes_pulled->fetch_add(o.frame.header.length, std::memory_order_relaxed);
        job.bytes_pulled.fetch_add(o.frame.header.length, std::memory_order_relaxed);
      }
      if (o.frame.last) {
        return absl::UnavailableError(
            absl::StrCat("closed by the shard: ", AbortStatus(o.frame.header, o.frame.owned).message()));
      }
      sending.pop_front();
    }
    if (pending != nullptr && pending->req.done) {
      std::unique_ptr<Incoming> got = std::move(pending);
      if (got->kind == Incoming::kHeader) {
        HandleStepHeader(rd, got->in, got->header);
      } else if (got->kind == Incoming::kPush) {
        AcceptPush(rd, got->local, std::move(got->buf));
      }
      got->mr.reset();
      got->buf.reset();
      got->header.clear();
      got->header.shrink_to_fit();
      Release(*got);
      continue;  // what it queued goes out first
    }
    if (pending == nullptr) {
      transport::Incoming in;
      if (ctx.Probe(0, &in)) {
        pending = std::make_unique<Incoming>();
        Incoming& p = *pending;
        p.in = in;
        p.deadline = absl::Now() + options_.step_timeout;  // a started frame must arrive
        if (in.tag.slot == transport::kControlSlot) {
          p.kind = Incoming::kHeader;
          if (in.bytes > kMaxStepHeaderBytes) {
            return absl::InvalidArgumentError(absl::StrCat(
                job.prefix, ": worker rank ", rd.rank, " announced a step header of ", in.bytes,
                " bytes; at most ", kMaxStepHeaderBytes, " (", kMaxPartitions, " partitions)"));
          }
        } else {
          p.local = AdmitPush(rd, in);
          p.kind = p.local >= 0 ? Incoming::kPush : Incoming::kDiscard;
        }
        if (p.kind != Incoming::kPush) {
          if (!Reserve(in.bytes)) {
            return absl::ResourceExhaustedError(absl::StrCat(
                job.prefix, ": a ", in.bytes, "-byte frame from worker rank ", rd.rank,
                " does not fit into the shard's staging memory (", reserved_.load(), " of ",
                options_.max_memory_bytes, " bytes in use)"));
          }
          p.charged = in.bytes;
        }
        if (p.kind == Incoming::kHeader) {
          p.header.assign(in.bytes, '\0');
          ASSIGN_OR_RETURN(p.mr, ctx.RegisterMemory(p.header.data(), in.bytes));
          p.region = p.mr.get();
        } else if (p.kind == Incoming::kPush) {  // within its step's reservation
          p.buf = Buffer(job.pool->Take(in.bytes), GiveBack{job.pool, in.bytes});
          ASSIGN_OR_RETURN(p.region, job.pool->Registration(ctx, p.buf.get(), in.bytes));
        } else {  // discarded: not pooled, freed once read
          p.buf = Buffer(new char[in.bytes], GiveBack{nullptr, in.bytes});
          ASSIGN_OR_RETURN(p.mr, ctx.RegisterMemory(p.buf.get(), in.bytes));
          p.region = p.mr.get();
        }
        RETURN_IF_ERROR(ctx.PostRecv(0, *p.region, 0, in.bytes, /*exact=*/true, in.tag, &p.req));
        continue;
      }
      if (ctx.PeerClosed(0)) return absl::UnavailableError("closed by peer");
    }
    absl::Time deadline = absl::Now() + absl::Seconds(1);
    if (pending != nullptr) deadline = std::min(deadline, pending->deadline);
    if (!sending.empty()) deadline = std::min(deadline, sending.front().posted + options_.step_timeout);
    const absl::Status st = ctx.Progress(deadline);
    if (st.ok()) continue;
    if (absl::IsDeadlineExceeded(st) && ctx.health().ok()) {
      const absl::Time now = absl::Now();
      if (pending != nullptr && now >= pending->deadline) {
        return absl::DeadlineExceededError(absl::StrCat(
            "a frame from worker rank ", rd.rank, " did not arrive within ",
            absl::ToInt64Milliseconds(options_.step_timeout), " ms"));
      }
      if (!sending.empty() && now >= sending.front().posted + options_.step_timeout) {
        GS_LOG(WARNING) << job.prefix << ": cannot write to worker rank " << rd.rank << " at "
                        << c.peer << ": it has read nothing for "
                        << absl::ToInt64Milliseconds(options_.step_timeout) << " ms";
        return absl::DeadlineExceededError(absl::StrCat("worker rank ", rd.rank,
                                                        " reads no results"));
      }
      continue;  // woken (Interrupt) or a tick
    }
    const transport::PeerFault f = ctx.fault();
    if (f.kind == transport::PeerFault::kAborted) {
      HandleWorkerAbort(rd, f.op_seq, absl::Status(f.code, f.cause));
    } else if (f.kind == transport::PeerFault::kProtocol) {
      GS_LOG(WARNING) << st.message();
    }
    return st;
  }
}

void PsShard::Impl::ConnectionEnded(Reader& rd, const absl::Status& why) {
  Job& job = *rd.job;
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

void PsShard::Impl::HandleStepHeader(Reader& rd, const transport::Incoming& in,
                                     const std::string& payload) {
  Job& job = *rd.job;
  const uint64_t s = in.tag.op_seq;
  absl::StatusOr<StepHeader> header = DecodeStepHeader(s, payload);
  absl::Status bad = header.status();
  if (bad.ok() &&
      (header->rank != rd.rank || header->workers != job.workers || header->shard != job.shard ||
       in.tag.dtype != static_cast<uint8_t>(header->dtype))) {
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

int PsShard::Impl::AdmitPush(Reader& rd, const transport::Incoming& in) {
  Job& job = *rd.job;
  const uint64_t s = in.tag.op_seq;
  if (!rd.has_step || s != rd.step) {
    ++pushes_refused_;
    if (!rd.refused_any || rd.last_refused != s) {
      rd.refused_any = true;
      rd.last_refused = s;
      SendAbort(rd.conn, s,
                absl::FailedPreconditionError(
                    absl::StrCat(job.prefix, ": refused push of partition ", in.tag.slot,
                                 " of step ", s, " from worker rank ", rd.rank, ": ",
                                 rd.has_step ? absl::StrCat("its current step is ", rd.step)
                                             : std::string("it sent no step header"))));
    }
    return -1;
  }
  if (rd.cur == nullptr || rd.cur->state.load() != kRunning) {
    ++pushes_refused_;  // refused, mismatched or failed step: the error went out already
    return -1;
  }
  Step& st = *rd.cur;
  const int i = st.LocalIndex(in.tag.slot);
  std::string bad;
  if (i < 0) {
    bad = absl::StrCat("partition ", in.tag.slot, " is not on this shard");
  } else {
    const Partition& p = st.ref.table[i];
    if (in.tag.offset != p.offset_bytes || in.bytes != p.bytes ||
        in.tag.dtype != static_cast<uint8_t>(st.ref.dtype)) {
      bad = absl::StrCat("partition ", p.id, " arrived at offset ", in.tag.offset, " with ",
                         in.bytes, " bytes of dtype ", static_cast<int>(in.tag.dtype),
                         ", expected offset ", p.offset_bytes, " length ", p.bytes);
    } else if (rd.pushed[i]) {
      bad = absl::StrCat("partition ", p.id, " was pushed twice");
    }
  }
  if (!bad.empty()) {
    ++pushes_refused_;
    FailStep(rd.cur, absl::InvalidArgumentError(absl::StrCat(
                         job.prefix, " step ", s, ": worker rank ", rd.rank, ": ", bad)));
    return -1;
  }
  return i;
}

void PsShard::Impl::AcceptPush(Reader& rd, int i, Buffer buf) {
  Job& job = *rd.job;
  Step& st = *rd.cur;
  const uint64_t bytes = st.ref.table[i].bytes;
  rd.pushed[i] = 1;
  ++rd.pushed_count;
  st.pushed[static_cast<size_t>(i) * st.workers + rd.rank].store(1, std::memory_order_relaxed);
  bytes_pushed_.fetch_add(bytes, std::memory_order_relaxed);
  job.bytes_pushed.fetch_add(bytes, std::memory_order_relaxed);
  Task t;
  t.step = rd.cur;
  t.local = i;
  t.rank = rd.rank;
  t.data = std::move(buf);
  aggregators_[st.ref.table[i].id % aggregators_.size()]->Post(std::move(t));
}

void PsShard::Impl::HandleWorkerAbort(Reader& rd, uint64_t step, const absl::Status& reason) {
  Job& job = *rd.job;
  Deferred d;
  {
    absl::MutexLock l(&job.mu);
    if (job.active != nullptr && job.active->step() == step) {
      FailStepLocked(job, job.active,
                     absl::Status(reason.code(), absl::StrCat(job.prefix, " step ", step,
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
