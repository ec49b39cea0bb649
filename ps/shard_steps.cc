// The shard's steps, aggregation and timer (see ps/shard_impl.h).
#include "ps/shard_impl.h"

namespace gradsync::ps {

OutFrame PsShard::Impl::AbortFrame(const Job& job, uint64_t step, const absl::Status& status) {
  OutFrame f;
  f.header = MakeAbortFrame(job.tag, job.epoch, step, status, &f.owned);
  return f;
}

bool PsShard::Impl::Reserve(uint64_t bytes) {
  uint64_t cur = reserved_.load();
  do {
    if (cur > options_.max_memory_bytes || bytes > options_.max_memory_bytes - cur) return false;
  } while (!reserved_.compare_exchange_weak(cur, cur + bytes));
  return true;
}

bool PsShard::Impl::FailStepLocked(Job& job, std::shared_ptr<Step> step, const absl::Status& status, Deferred* d)
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

void PsShard::Impl::FailStep(const std::shared_ptr<Step>& step, const absl::Status& status) {
  Deferred d;
  {
    absl::MutexLock l(&step->job->mu);
    FailStepLocked(*step->job, step, status, &d);
  }
  Flush(d);
}

bool PsShard::Impl::CompleteStep(const std::shared_ptr<Step>& step) {
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

void PsShard::Impl::Flush(Deferred& d) {
  for (auto& [c, f] : d.sends) c->Send(std::move(f));
  for (auto& step : d.purges) {
    for (auto& a : aggregators_) {
      Task t;
      t.step = step;
      a->Post(std::move(t));
    }
  }
}

std::string PsShard::Impl::OwedSummary(const Step& st) {
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

absl::Status PsShard::Impl::TimeoutStatus(const Job& job, const Step& st) {
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

std::string PsShard::Impl::MismatchMessage(const Job& job, const Step& st) {
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

void PsShard::Impl::Aggregate(int thread, Task& task) {
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

void PsShard::Impl::TimerLoop() {
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

}  // namespace gradsync::ps
