// Internal to the job registry (server/job_registry.cc: jobs, rendezvous;
// server/job_membership.cc: heartbeats, leaving, liveness, queries): the
// state both files work on. Not for other users.
#ifndef GRADSYNC_SERVER_JOB_REGISTRY_STATE_H_
#define GRADSYNC_SERVER_JOB_REGISTRY_STATE_H_

#include <algorithm>
#include <deque>
#include <memory>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/synchronization/mutex.h"
#include "server/job_registry.h"

namespace gradsync {
namespace registry_internal {

inline std::string FormatEndpoint(const v1::Endpoint& ep) {
  if (ep.host().empty() && ep.port() == 0) return "";
  if (ep.host().find(':') != std::string::npos) return absl::StrCat("[", ep.host(), "]:", ep.port());
  return absl::StrCat(ep.host(), ":", ep.port());
}

// "rank 2 (member 'x')" or "rank 2 (member 'x' at host:port)".
inline std::string DescribeMember(int rank, const std::string& member_id, const v1::Endpoint* ep) {
  std::string s = absl::StrCat("rank ", rank, " (member '", member_id, "'");
  if (ep != nullptr) {
    const std::string addr = FormatEndpoint(*ep);
    if (!addr.empty()) absl::StrAppend(&s, " at ", addr);
  }
  s += ")";
  return s;
}

inline std::string Seconds(int64_t ms) { return absl::StrFormat("%.1f s", ms / 1000.0); }


// Compares member keys in time independent of where they differ.
inline bool KeysEqual(const std::string& a, const std::string& b) {
  unsigned char diff = a.size() == b.size() ? 0 : 1;
  for (size_t i = 0; i < std::min(a.size(), b.size()); ++i) {
    diff |= static_cast<unsigned char>(a[i] ^ b[i]);
  }
  return diff == 0;
}

struct MemberState {
  std::string member_id;
  std::string key;  // JoinJobRequest.member_key: proves the member; never shown
  v1::Endpoint endpoint;
  std::string status_endpoint;
  bool alive = true;   // false once declared dead
  bool left = false;   // LeaveJob after the rendezvous completed
  absl::Time last_heartbeat;
  int waiting_joins = 0;  // JoinJob calls of this member blocked in the rendezvous
  uint64_t serial = 0;    // distinguishes a re-added member from a removed one
};

// One epoch's rendezvous; shared with the JoinJob calls waiting on it.
struct Rendezvous {
  explicit Rendezvous(int64_t e) : epoch(e) {}
  const int64_t epoch;
  bool complete = false;  // guarded by the registry mutex
  // Set when another rank asked for this job with a different world size:
  // every member waiting in this rendezvous fails with it at once (guarded
  // by the registry mutex; cleared once nobody waits).
  absl::Status conflict;
  // Set once complete, immutable afterwards (rank left unset).
  std::shared_ptr<const v1::JoinJobResponse> response;
};

}  // namespace registry_internal

// A join waiting for its epoch's rendezvous (server/job_join.cc).
struct JobRegistry::PendingJoin {
  std::string job_id;
  std::string member_id;
  int rank = -1;
  uint64_t serial = 0;  // of the member entry this join registered or retried
  std::shared_ptr<registry_internal::Rendezvous> rv;
  absl::Time deadline;
  int64_t waited_ms = 0;
  bool cancelled = false;
  JoinDone done;
};

struct JobWatch::Queue {
  absl::Mutex mu;
  absl::CondVar cv;
  std::deque<std::shared_ptr<const v1::JobEvent>> events ABSL_GUARDED_BY(mu);
  bool closed ABSL_GUARDED_BY(mu) = false;  // nothing more will be pushed
  absl::Status end ABSL_GUARDED_BY(mu);     // returned once `events` is drained

  void Push(std::shared_ptr<const v1::JobEvent> event) {
    absl::MutexLock lock(&mu);
    if (closed) return;
    if (events.size() >= kMaxQueuedWatchEvents) {
      events.clear();
      closed = true;
      end = absl::ResourceExhaustedError(absl::StrCat(
          "watch of job '", event->job_id(), "' fell ", kMaxQueuedWatchEvents,
          " events behind; reconnect to get a fresh snapshot"));
    } else {
      events.push_back(std::move(event));
    }
    cv.Signal();
  }

  void Close(absl::Status status) {
    absl::MutexLock lock(&mu);
    if (closed) return;
    closed = true;
    end = std::move(status);
    cv.Signal();
  }
};

struct JobRegistry::Job {
  std::string id;
  // 32 random bytes made at CreateJob, handed only to members (in every
  // JoinJobResponse; never in status or events): the daemons prove it to
  // each other on the data plane.
  std::string key;
  int world_size = 0;
  v1::JobOptions options;
  int64_t epoch = 1;
  v1::JobState state = v1::JOB_STATE_FORMING;
  std::vector<std::optional<registry_internal::MemberState>> members;  // by rank, size world_size
  std::unordered_map<std::string, int> rank_of;     // member_id -> rank
  std::string abort_reason;
  std::vector<int> dead_ranks;
  // While FORMING: when the last member waiting in JoinJob left (or the job
  // was created); the job expires forming_job_timeout later.
  absl::Time idle_since;
  std::shared_ptr<registry_internal::Rendezvous> rendezvous;
  std::vector<std::weak_ptr<JobWatch::Queue>> watchers;

  int JoinedCount() const {
    return static_cast<int>(rank_of.size());
  }
  registry_internal::MemberState* FindMember(const std::string& member_id, int rank) {
    if (!member_id.empty()) {
      auto it = rank_of.find(member_id);
      return it == rank_of.end() ? nullptr : &*members[it->second];
    }
    if (rank < 0 || rank >= world_size || !members[rank].has_value()) return nullptr;
    return &*members[rank];
  }
  // The member a heartbeat or leave names whose key is `key`; null if none.
  // *wrong_key: a member was found but the key differs.
  registry_internal::MemberState* FindMemberWithKey(const std::string& member_id, int rank,
                                                    const std::string& key, bool* wrong_key) {
    registry_internal::MemberState* m = FindMember(member_id, rank);
    *wrong_key = m != nullptr && !registry_internal::KeysEqual(m->key, key);
    return *wrong_key ? nullptr : m;
  }
  int RankOf(const registry_internal::MemberState* m) const {
    return rank_of.at(m->member_id);
  }
};

}  // namespace gradsync

#endif  // GRADSYNC_SERVER_JOB_REGISTRY_STATE_H_
