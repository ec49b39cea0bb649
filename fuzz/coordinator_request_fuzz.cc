// libFuzzer target: the coordinator's request validation and job state
// machine (server/job_registry.h, server/shard_registry.h) under a sequence
// of requests as a node daemon or a PS shard sends them. Each input is a
// series of records [kind][length][message bytes]; messages that do not
// parse as the request's proto are skipped. Joins wait asynchronously
// (StartJoin, no deadline) so rendezvous complete, conflict and cancel as
// they do for concurrent callers; the clock is the fuzzer's, advanced by
// record bytes. Traps when an answer breaks the registry's promises.
#include <cstdint>
#include <string>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/logging.h"
#include "proto/coordinator.pb.h"
#include "server/job_registry.h"
#include "server/shard_registry.h"

namespace {

using gradsync::JobRegistry;

void Check(bool ok) {
  if (!ok) __builtin_trap();
}

// A join answer as the registry promises it: a rank of the world, every
// member listed by rank.
void CheckJoin(const absl::StatusOr<gradsync::v1::JoinJobResponse>& r) {
  if (!r.ok()) {
    Check(!r.status().message().empty());
    return;
  }
  Check(r->world_size() >= 1 && r->world_size() <= gradsync::kMaxWorldSize);
  Check(r->rank() >= 0 && r->rank() < r->world_size());
  Check(r->members_size() == r->world_size());
  for (int i = 0; i < r->members_size(); ++i) Check(r->members(i).rank() == i);
}

struct Answers {
  absl::Mutex mu;
  int answered = 0;
};

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  gradsync::SetMinLogLevel(gradsync::LogLevel::kError);  // the registry logs every event at INFO
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  absl::Time clock = absl::FromUnixSeconds(1'000'000);
  Answers answers;
  int started = 0;
  {
    JobRegistry::Options options;
    options.start_liveness_thread = false;
    options.now = [&clock] { return clock; };
    JobRegistry registry(options);
    gradsync::ShardRegistry shards(absl::Seconds(5));
    std::vector<uint64_t> joins;
    size_t i = 0;
    while (i + 2 <= size) {
      const uint8_t kind = data[i];
      const size_t len = std::min<size_t>(data[i + 1], size - i - 2);
      const std::string bytes(reinterpret_cast<const char*>(data + i + 2), len);
      i += 2 + len;
      switch (kind % 10) {
        case 0: {
          gradsync::v1::CreateJobRequest req;
          if (!req.ParseFromString(bytes)) break;
          gradsync::NamespaceLimits limits;
          limits.max_forming_jobs = 3;
          limits.max_jobs = 8;
          limits.max_forming_ranks = 8192;
          auto r = registry.CreateJob(req, limits);
          if (r.ok()) Check(r->options().heartbeat_timeout_ms() > 0);
          break;
        }
        case 1: {
          gradsync::v1::JoinJobRequest req;
          if (!req.ParseFromString(bytes)) break;
          req.set_timeout_ms(0);  // the registry default: joins end by events, not time
          ++started;
          const uint64_t id = registry.StartJoin(
              req, absl::InfiniteFuture(),
              [&answers](absl::StatusOr<gradsync::v1::JoinJobResponse> r) {
                CheckJoin(r);
                absl::MutexLock l(&answers.mu);
                ++answers.answered;
              });
          if (id != 0) joins.push_back(id);
          break;
        }
        case 2: {
          gradsync::v1::HeartbeatRequest req;
          if (!req.ParseFromString(bytes)) break;
          (void)registry.Heartbeat(req);
          break;
        }
        case 3: {
          gradsync::v1::LeaveJobRequest req;
          if (!req.ParseFromString(bytes)) break;
          (void)registry.LeaveJob(req);
          break;
        }
        case 4: {
          auto st = registry.GetJobStatus(bytes);
          if (st.ok()) {
            Check(st->world_size() >= 1);
            for (const auto& m : st->members()) Check(m.rank() < st->world_size());
          }
          break;
        }
        case 5:
          Check(registry.ListJobs().jobs_size() <= static_cast<int>(gradsync::kMaxJobs));
          break;
        case 6:
          if (!joins.empty()) registry.CancelJoin(joins[len % joins.size()]);
          break;
        case 7:
          clock += absl::Milliseconds(static_cast<int64_t>(len) * 97);
          registry.CheckLiveness();
          break;
        case 8: {
          gradsync::v1::RegisterShardRequest req;
          if (!req.ParseFromString(bytes)) break;
          (void)shards.Register(req.shard_id(), req.endpoint());
          break;
        }
        case 9: {
          auto a = shards.AssignForJob(bytes, static_cast<int64_t>(len), 1 + len % 4);
          if (a.ok()) Check(a->ids.size() == a->endpoints.size());
          break;
        }
      }
    }
  }  // ~JobRegistry: shut down, every waiting join answered, join thread joined
  absl::MutexLock l(&answers.mu);
  Check(answers.answered == started);
  return 0;
}
