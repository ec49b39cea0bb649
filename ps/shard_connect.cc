// A worker's connection to the shard: the job-key handshake, the checks of
// its Hello against the job, TLS for a job with data_tls, and its
// registration (or refusal).
#include "ps/shard.h"
#include "ps/shard_handshake.h"
#include "ps/shard_impl.h"

namespace gradsync::ps {

void PsShard::Impl::Refuse(transport::RoutedConnection& rc, const absl::Status& why) {
  ++connections_refused_;
  GS_LOG(WARNING) << "ps shard: refused " << rc.peer << " (job '" << rc.job_id << "' rank "
                  << rc.hello.src_rank << "): " << why.message();
  (void)transport::WriteHelloAck(rc.fd.get(), why, absl::Now() + absl::Seconds(1));
}

// Admits a proven worker into its job epoch's state (made by the first
// proven worker), counting it as connecting: the job, or why the Hello does
// not fit the job as it is here.
absl::StatusOr<std::shared_ptr<Job>> PsShard::Impl::AdmitProven(
    const transport::RoutedConnection& rc) {
  const int rank = rc.hello.src_rank;
  const int workers = rc.hello.world_size;
  const int shard = rc.hello.dst_rank;
  absl::MutexLock l(&mu_);
  if (stopping_) return absl::UnavailableError("ps shard is shutting down");
  std::shared_ptr<Job>& slot = jobs_[{rc.job_id, rc.hello.epoch}];
  if (slot == nullptr) slot = std::make_shared<Job>(rc.job_id, rc.hello.epoch, workers, shard);
  std::shared_ptr<Job> job = slot;
  absl::MutexLock jl(&job->mu);
  if (job->workers != workers) {
    return absl::FailedPreconditionError(
        absl::StrCat(job->prefix, " epoch ", job->epoch, " has ", job->workers,
                     " workers here, rank ", rank, " connected with ", workers));
  }
  if (job->shard != shard) {
    return absl::FailedPreconditionError(
        absl::StrCat(job->prefix, " epoch ", job->epoch, " uses this server as shard ", job->shard,
                     ", rank ", rank, " connected to it as shard ", shard));
  }
  if (rc.hello.stream == transport::kRdmaBootstrapStream && options_.rdma_device == nullptr) {
    return absl::FailedPreconditionError(absl::StrCat(
        "rank ", rank, " asked for RDMA, and this ps shard has no RDMA port (gradsync-ps "
        "--transport)"));
  }
  ++job->connecting;  // until the connection is registered, or given up
  return job;
}

void PsShard::Impl::Adopt(transport::RoutedConnection rc) {
  const int rank = rc.hello.src_rank;
  const int workers = rc.hello.world_size;
  // Nothing about a job is made or told before the worker proved the job
  // epoch's key: a Hello for a job this shard has no key for (a forgery, a
  // guess, or a job not assigned here) gets a proof under a random key, so
  // from outside it looks exactly like a wrong key.
  const absl::Time deadline = absl::Now() + absl::Seconds(5);
  absl::StatusOr<std::string> nonce = ReadWorkerNonce(rc, deadline);
  if (!nonce.ok()) {
    ++auth_failures_;
    GS_LOG(WARNING) << "ps shard: " << rc.peer << " sent no nonce: " << nonce.status().message();
    return;
  }
  absl::StatusOr<ShardJobKey> key = keys_.Get(std::string(JobOfPsJobId(rc.job_id)), rc.hello.epoch);
  if (!key.ok()) {
    GS_LOG(WARNING) << "ps shard: no key for " << rc.peer << " (job '" << rc.job_id << "' epoch "
                    << rc.hello.epoch << " rank " << rank << "): " << key.status().message();
  }
  const std::string proof_key = key.ok() ? key->key : transport::RandomNonce() + transport::RandomNonce();
  if (absl::Status proven = ProveJobKey(rc, proof_key, *nonce, deadline); !proven.ok() || !key.ok()) {
    ++auth_failures_;
    if (key.ok()) {
      GS_LOG(WARNING) << "ps shard: refused " << rc.peer << " (job '" << rc.job_id << "' rank "
                      << rank << "): " << proven.message();
    }
    return;
  }
  absl::StatusOr<std::shared_ptr<Job>> admitted = AdmitProven(rc);
  if (!admitted.ok()) return Refuse(rc, admitted.status());
  std::shared_ptr<Job> job = *std::move(admitted);
  const bool rdma = rc.hello.stream == transport::kRdmaBootstrapStream;
  if (absl::Status s = transport::WriteHelloAck(rc.fd.get(), absl::OkStatus(), deadline); !s.ok()) {
    GS_LOG(WARNING) << job->prefix << ": rank " << rank << " at " << rc.peer
                    << " went away before its admission: " << s.message();
    absl::MutexLock l(&mu_);
    absl::MutexLock jl(&job->mu);
    --job->connecting;
    return;
  }
  // The connection is rank `rank`'s once proven: a worker connects again
  // only after this one ended, so registrations follow its connections.
  std::shared_ptr<Conn> c, old;
  {
    absl::MutexLock l(&mu_);
    absl::MutexLock jl(&job->mu);
    --job->connecting;
    c = std::make_shared<Conn>(job, rank, rc.peer, &bytes_pulled_);
    auto it = job->conns.find(rank);
    if (it != job->conns.end()) old = it->second;
    job->conns[rank] = c;
    conns_.push_back(c);
  }
  absl::Status s;
  {
    transport::ClientSpec spec;
    spec.job_id = job->id;
    spec.epoch = job->epoch;
    spec.client_name = absl::StrCat("worker rank ", rank);
    spec.self_name = job->prefix;
    spec.encrypt = key->data_tls;
    spec.key = key->key;
    spec.deadline = deadline;
    absl::StatusOr<std::unique_ptr<transport::Context>> ctx =
        (rdma ? options_.rdma_device : device_)->AcceptClient(std::move(rc.fd), spec);
    s = ctx.status();
    if (s.ok() && !c->Start(std::move(*ctx), [this](std::shared_ptr<Conn> self) {
          ServeConnection(std::move(self));
        })) {
      s = absl::CancelledError("replaced by a newer connection");
    }
  }
  if (!s.ok()) {
    GS_LOG(WARNING) << job->prefix << ": handshake with rank " << rank << " at " << c->peer
                    << " failed: " << s.message();
    Reader rd;
    rd.conn = c;
    rd.job = job.get();
    rd.rank = rank;
    ConnectionEnded(rd, s);
    c->Finish();
    c->done = true;
  } else {
    ++connections_;
    if (key->data_tls) ++tls_connections_;
    if (rdma) ++rdma_connections_;
  }
  GS_LOG(DEBUG) << job->prefix << ": worker rank " << rank << " of " << workers
                << " connected from " << c->peer;
  if (old != nullptr) old->Close(absl::CancelledError(absl::StrCat(
      job->prefix, ": worker rank ", rank, " connected again; this connection is replaced")));
}

}  // namespace gradsync::ps
