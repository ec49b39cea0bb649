#include "worker/threaded_cluster_testing.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/status_macros.h"
#include "transport/device.h"

namespace gradsync::testing {

ClusterSpec ClusterSpec::Blocks(int daemons, int ranks_per_daemon) {
  ClusterSpec spec;
  spec.node_of_rank.clear();
  for (int d = 0; d < daemons; ++d) {
    for (int r = 0; r < ranks_per_daemon; ++r) spec.node_of_rank.push_back(d);
  }
  return spec;
}

absl::StatusOr<uint64_t> SubmitOp(Session& session, const OpSpec& op) {
  return session.Submit(op);
}

bool WaitUntil(const std::function<bool()>& pred, absl::Duration timeout) {
  const absl::Time deadline = absl::Now() + timeout;
  while (!pred()) {
    if (absl::Now() >= deadline) return false;
    absl::SleepFor(absl::Microseconds(200));
  }
  return true;
}

ThreadedCluster::ThreadedCluster(ClusterSpec spec, int64_t epoch)
    : spec_(std::move(spec)), epoch_(epoch) {}

ThreadedCluster::~ThreadedCluster() {
  // The clients go first (as when their processes exit), then the daemons.
  for (auto& s : sessions_) s->Close();
  sessions_.clear();
  executors_.clear();
}

absl::StatusOr<RankBuffer> ThreadedCluster::Allocate(int rank, size_t bytes) {
  ASSIGN_OR_RETURN(BufferInfo info, sessions_[rank]->AllocateBuffer(bytes, /*by_descriptor=*/true));
  ASSIGN_OR_RETURN(UniqueFd fd, sessions_[rank]->TakeBufferFd(info.id));
  ASSIGN_OR_RETURN(std::unique_ptr<ipc::SharedMemory> mem,
                   ipc::SharedMemory::MapFd(fd.get(), bytes,
                                            absl::StrCat("rank ", rank, " buffer ", info.id)));
  RankBuffer b{info.id, static_cast<char*>(mem->data()), bytes};
  mappings_.push_back(std::move(mem));
  return b;
}

absl::StatusOr<RankBuffer> ThreadedCluster::Register(int rank, size_t bytes) {
  UniqueFd fd(::memfd_create("threaded-cluster", MFD_ALLOW_SEALING | MFD_CLOEXEC));
  if (!fd.valid() || ::ftruncate(fd.get(), static_cast<off_t>(bytes)) != 0 ||
      ::fcntl(fd.get(), F_ADD_SEALS, F_SEAL_SHRINK) != 0) {
    return absl::InternalError(absl::StrCat("a sealed memfd for rank ", rank, ": errno ", errno));
  }
  ASSIGN_OR_RETURN(std::unique_ptr<ipc::SharedMemory> mem,
                   ipc::SharedMemory::MapFd(fd.get(), bytes,
                                            absl::StrCat("rank ", rank, " own memory")));
  ASSIGN_OR_RETURN(BufferInfo info, sessions_[rank]->RegisterBuffer(
                                        fd.get(), 0, bytes, absl::StrCat("rank ", rank, " memfd")));
  RankBuffer b{info.id, static_cast<char*>(mem->data()), bytes};
  mappings_.push_back(std::move(mem));
  return b;
}

absl::StatusOr<uint64_t> ThreadedCluster::Submit(int rank, const OpSpec& op) {
  return SubmitOp(*sessions_[rank], op);
}

absl::StatusOr<OpOutcome> ThreadedCluster::Wait(int rank, uint64_t id, absl::Duration timeout) {
  ASSIGN_OR_RETURN(OpOutcome out, sessions_[rank]->Wait(id, timeout));
  if (!out.done) {
    return absl::DeadlineExceededError(absl::StrCat("op ", id, " of rank ", rank,
                                                    " did not finish within ",
                                                    absl::FormatDuration(timeout)));
  }
  return out;
}

std::vector<absl::Status> ThreadedCluster::RunOnAll(const OpSpec& op,
                                                    const std::vector<uint64_t>& buffer_ids,
                                                    std::vector<OpOutcome>* outcomes) {
  std::vector<absl::Status> result(world());
  std::vector<uint64_t> ids(world(), 0);
  for (int r = 0; r < world(); ++r) {
    OpSpec mine = op;
    if (!buffer_ids.empty()) mine.buffer_id = buffer_ids[r];
    absl::StatusOr<uint64_t> id = Submit(r, mine);
    if (id.ok()) {
      ids[r] = *id;
    } else {
      result[r] = id.status();
    }
  }
  if (outcomes != nullptr) outcomes->assign(world(), OpOutcome{});
  for (int r = 0; r < world(); ++r) {
    if (ids[r] == 0) continue;
    absl::StatusOr<OpOutcome> out = Wait(r, ids[r]);
    if (!out.ok()) {
      result[r] = out.status();
      continue;
    }
    result[r] = out->status;
    if (outcomes != nullptr) (*outcomes)[r] = *out;
  }
  return result;
}

JobPlacement FakeCoordinator::PlacementFor(int d) const {
  JobPlacement p;
  p.world = spec_.world();
  p.node_index = d;
  for (int r = 0; r < spec_.world(); ++r) {
    const int node = spec_.node_of_rank[r];
    p.node_of_rank.push_back(node);
    if (node >= p.nodes()) {
      p.ranks_of_node.resize(node + 1);
      p.node_names.resize(node + 1);
    }
    p.ranks_of_node[node].push_back(r);
  }
  for (int n = 0; n < p.nodes(); ++n) {
    p.node_names[n] = static_cast<size_t>(n) < spec_.host_of_node.size()
                          ? absl::StrCat(spec_.host_of_node[n], ":", 7000 + n)
                          : absl::StrCat("inproc-daemon-", n);
  }
  return p;
}

SessionInfo FakeCoordinator::InfoFor(int rank, int64_t epoch) const {
  SessionInfo info;
  info.session_id = absl::StrCat("s-", epoch, "-", rank);
  info.job_id = spec_.job_id;
  info.member_id = absl::StrCat("member-", rank);
  info.member_key = std::string(16, static_cast<char>('a' + rank % 26));
  info.job_key = absl::StrCat("job-key-of-epoch-", epoch);
  info.rank = rank;
  info.world_size = spec_.world();
  info.epoch = epoch;
  info.default_op_timeout = spec_.op_timeout;
  info.job_algorithm = spec_.job_algorithm;
  info.job_codec = spec_.job_codec;
  info.link = spec_.link;
  return info;
}

absl::StatusOr<std::unique_ptr<ThreadedCluster>> FakeCoordinator::Form() {
  // Daemons numbered by first appearance, none skipped.
  int next = 0;
  for (int node : spec_.node_of_rank) {
    if (node > next || node < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("daemon ", node, " appears before daemon ", next, " in node_of_rank"));
    }
    if (node == next) ++next;
  }
  if (spec_.node_of_rank.empty()) return absl::InvalidArgumentError("a job needs a rank");
  const int64_t epoch = ++epoch_;
  std::unique_ptr<ThreadedCluster> c(new ThreadedCluster(spec_, epoch));
  const int daemons = next;
  if (daemons > 1) {
    c->device_ = std::make_unique<transport::InProcDevice>(daemons, spec_.faults);
  }
  for (int d = 0; d < daemons; ++d) {
    c->placements_.push_back(PlacementFor(d));
    std::unique_ptr<transport::Context> node_ctx;
    std::string transport_name = "local";
    if (c->device_ != nullptr) {
      transport::ContextSpec cs;
      cs.job_id = spec_.job_id;
      cs.epoch = static_cast<uint64_t>(epoch);
      cs.rank = d;
      cs.world_size = daemons;
      cs.peers.resize(daemons);
      cs.deadline = absl::Now() + absl::Seconds(10);
      cs.job_key = InfoFor(0, epoch).job_key;
      ASSIGN_OR_RETURN(node_ctx, c->device_->CreateContext(cs));
      transport_name = "inproc";
    }
    JobExecutorOptions eo;
    eo.job_id = spec_.job_id;
    eo.epoch = epoch;
    eo.placement = c->placements_.back();
    eo.link = spec_.link;
    eo.planner = spec_.planner;
    eo.ring = spec_.ring;
    eo.transport = transport_name;
    eo.transport_detail = "threaded cluster (worker/threaded_cluster_testing.h)";
    c->executors_.push_back(JobExecutor::Start(std::move(eo), std::move(node_ctx)));
  }
  for (int r = 0; r < spec_.world(); ++r) {
    SessionInfo info = InfoFor(r, epoch);
    JobExecutor& e = *c->executors_[spec_.node_of_rank[r]];
    info.transport = absl::StrCat(e.transport(), ": ", e.transport_detail());
    auto s = std::make_shared<Session>(std::move(info), c->executors_[spec_.node_of_rank[r]]);
    e.Attach(s.get());
    c->sessions_.push_back(std::move(s));
  }
  return c;
}

absl::StatusOr<std::unique_ptr<ThreadedCluster>> FakeCoordinator::Reform(
    ThreadedCluster& old, const absl::Status& reason) {
  for (int r = 0; r < old.world(); ++r) old.session(r).AbortEpoch(reason);
  return Form();
}

}  // namespace gradsync::testing
