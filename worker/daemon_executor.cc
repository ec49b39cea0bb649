// Daemon::GetOrCreateExecutor: the one executor per job epoch on this
// daemon, shared by its local ranks; the first of them connects the job's
// daemons (TCP or RDMA, as the transport choice says), the others wait.
#include <algorithm>
#include <set>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/logging.h"
#include "common/status_macros.h"
#include "worker/daemon.h"
#include "worker/link_probe.h"

namespace gradsync {

absl::StatusOr<std::shared_ptr<JobExecutor>> Daemon::GetOrCreateExecutor(
    const SessionInfo& info, const JobPlacement& placement,
    const std::vector<HostPort>& node_endpoints, const std::vector<TransportAdvert>& node_rdma,
    int streams, absl::Time deadline) {
  const std::string key = absl::StrCat(info.scoped_job_id(), "#", info.epoch);
  std::shared_ptr<ExecutorEntry> entry;
  bool create = false;
  {
    absl::MutexLock l(&mu_);
    for (auto it = executors_.begin(); it != executors_.end();) {  // drop finished ones
      if (it->second->ready.HasBeenNotified() && it->second->executor.expired()) {
        it = executors_.erase(it);
      } else {
        ++it;
      }
    }
    auto it = executors_.find(key);
    if (it == executors_.end()) {
      entry = std::make_shared<ExecutorEntry>();
      executors_[key] = entry;
      create = true;
    } else {
      entry = it->second;
    }
  }
  if (!create) {
    if (!entry->ready.WaitForNotificationWithDeadline(deadline)) {
      return absl::DeadlineExceededError(absl::StrCat(
          "job '", info.job_id, "': this daemon's executor for the job did not start in time"));
    }
    if (!entry->status.ok()) return entry->status;
    auto e = entry->executor.lock();
    if (e == nullptr) {
      return absl::AbortedError(absl::StrCat("job '", info.job_id, "': its executor stopped"));
    }
    return e;
  }
  auto fail = [&](absl::Status s) {
    entry->status = s;
    entry->ready.Notify();
    return s;
  };
  // The daemons of the job connect (one rank per daemon) and measure their
  // links; a job whose ranks all use this daemon needs neither.
  std::unique_ptr<transport::Context> node_ctx, p2p_ctx;
  LinkParams link;
  bool node_moves_device_memory = false;  // RDMA with GPUDirect
  std::string transport_name = "local";  // every rank on this daemon: no network
  std::string transport_detail = "every rank of the job on this daemon";
  if (placement.nodes() > 1) {
    // Every daemon of the epoch decides alike, from what each advertised.
    absl::StatusOr<TransportChoice> choice =
        ChooseTransport(options_.transport, node_rdma, info.data_tls, info.job_id);
    if (!choice.ok()) return fail(choice.status());
    transport::Device* device = choice->rdma ? rdma_device_ : device_.get();
    transport_name = choice->rdma ? "rdma" : "tcp";
    node_moves_device_memory = choice->rdma && rdma_device_->gpudirect();
    transport_detail = choice->rdma ? rdma_device_->description()
                                    : absl::StrCat(streams, " TCP stream(s) per peer",
                                                   choice->why_not_rdma.empty() ? "" : "; not RDMA: ",
                                                   choice->why_not_rdma);
    transport::ContextSpec co;
    co.job_id = info.scoped_job_id();
    co.epoch = static_cast<uint64_t>(info.epoch);
    co.rank = placement.node_index;
    co.world_size = placement.nodes();
    co.peers = node_endpoints;
    co.deadline = deadline;
    co.lanes = streams;  // every daemon uses the job's count, whoever created the job
    co.job_key = info.job_key;
    co.encrypt = info.data_tls;
    auto ctx = device->CreateContext(co);
    if (!ctx.ok()) return fail(ctx.status());
    for (int p = 0; p < placement.nodes(); ++p) {
      if (p == placement.node_index) continue;
      GS_LOG(INFO) << "job '" << info.job_id << "' epoch " << info.epoch << ": daemon " << p
                   << " (" << placement.node_names[p] << ") over " << transport_name << " ("
                   << transport_detail << ")";
    }
    node_ctx = std::move(*ctx);
    // Point-to-point messages (send/recv) have connections of their own,
    // over TCP whatever carries the collectives: their receiver posts a
    // receive only for a message it has seen (worker/point_to_point.h).
    transport::ContextSpec po = co;
    po.job_id = absl::StrCat(co.job_id, "/p2p");
    po.lanes = 1;
    po.announce_arrivals = true;
    for (int p = 0; p < placement.nodes(); ++p) {
      po.peer_names.push_back(absl::StrCat("daemon ", p, " (", placement.node_names[p], ")"));
    }
    auto p2p = device_->CreateContext(po);
    if (!p2p.ok()) {
      return fail(absl::Status(p2p.status().code(),
                               absl::StrCat("job '", info.job_id, "' point-to-point connections: ",
                                            p2p.status().message())));
    }
    p2p_ctx = std::move(*p2p);
    const bool one_host = AllOnOneHost(node_endpoints);
    auto probe = ProbeLinks(*node_ctx, one_host, deadline);
    if (!probe.ok()) {
      return fail(absl::Status(probe.status().code(), absl::StrCat("job '", info.job_id,
                                                                   "' link probe: ",
                                                                   probe.status().message())));
    }
    link = probe->link;
    if (options_.observer != nullptr) options_.observer->OnLinkProbe(link);
    GS_LOG(INFO) << "job '" << info.job_id << "' epoch " << info.epoch << ": daemon "
                 << placement.node_index << " of " << placement.nodes() << "; links: alpha "
                 << link.alpha_us << " us, "
                 << (link.beta_us_per_byte > 0 ? 1e-3 / link.beta_us_per_byte : 0)
                 << " GB/s, all-to-all "
                 << (link.burst_us_per_byte > 0 ? 1e-3 / link.burst_us_per_byte : 0)
                 << " GB/s, reduce "
                 << (link.reduce_us_per_byte > 0 ? 1e-3 / link.reduce_us_per_byte : 0)
                 << " GB/s; "
                 << (transport_name == "rdma"
                         ? std::string("RDMA")
                         : absl::StrCat("TCP streams in use ", probe->streams, " of ", streams))
                 << (probe->one_stream_gbps > 0
                         ? absl::StrCat(" (probe: 1 stream ", probe->one_stream_gbps, " GB/s, ",
                                        streams, " streams ", probe->all_streams_gbps, " GB/s)")
                         : std::string())
                 << (info.data_tls ? "; data TLS 1.3" : "; data in plaintext")
                 << "; signatures by " << SignaturePatternName(link.signatures)
                 << (one_host ? " (every daemon on one host)" : " (daemons on several hosts)");
  }
  // The parameter-server path: one context to every shard, so RDMA only
  // when every shard has this daemon's kind of port.
  transport::Device* ps_device = device_.get();
  if (!info.ps_shards.empty()) {
    std::vector<TransportAdvert> adverts = {
        {rdma_advertised_, options_.transport == TransportMode::kRdma, "this daemon"}};
    for (size_t k = 0; k < info.ps_shards.size(); ++k) {
      adverts.push_back({info.ps_shard_rdma[k], false,
                         absl::StrCat("ps shard ", k, " (", info.ps_shards[k].ToString(), ")")});
    }
    absl::StatusOr<TransportChoice> ps = ChooseTransport(options_.transport, adverts,
                                                         info.data_tls, info.job_id);
    if (!ps.ok()) return fail(ps.status());
    if (ps->rdma) ps_device = rdma_device_;
    GS_LOG(INFO) << "job '" << info.job_id << "' epoch " << info.epoch << ": its "
                 << info.ps_shards.size() << " ps shard(s) over " << (ps->rdma ? "rdma" : "tcp")
                 << (ps->why_not_rdma.empty() ? "" : absl::StrCat(" (not RDMA: ", ps->why_not_rdma, ")"));
  }
  JobExecutorOptions eo;
  eo.job_id = info.scoped_job_id();
  eo.epoch = info.epoch;
  eo.placement = placement;
  eo.link = link;
  eo.planner = options_.planner;
  eo.ring = options_.ring;
  eo.ps_shards = info.ps_shards;
  eo.ps_shard_keys = info.ps_shard_keys;
  eo.data_tls = info.data_tls;
  eo.device = ps_device;
  eo.transport = transport_name;
  eo.node_moves_device_memory = node_moves_device_memory;
  eo.transport_detail = transport_detail;
  eo.spin = options_.executor_spin;
  eo.observer = options_.observer;
  auto executor = JobExecutor::Start(std::move(eo), std::move(node_ctx), std::move(p2p_ctx));
  entry->executor = executor;
  entry->ready.Notify();
  return executor;
}

}  // namespace gradsync
