// Test-only, for the OpPath tests (client/op_path.h): a fake daemon and
// helpers that build and run ops.
#ifndef GRADSYNC_CLIENT_OP_PATH_TESTING_H_
#define GRADSYNC_CLIENT_OP_PATH_TESTING_H_

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <map>
#include <mutex>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "client/op_channel.h"
#include "client/op_path.h"
#include "collective/algorithm.h"
#include "ipc/op_counters.h"

namespace gradsync {
namespace client {
namespace internal {

// The daemon, as far as a path can tell. It takes the ops it is sent
// (refusing them, or ones out of sequence, as the op queue does) and
// completes them when the test says so; it keeps what the path shows the
// daemon of the ops it runs itself.
class FakeOpChannel final : public OpChannel {
 public:
  FakeOpChannel() {
    for (auto& c : counters_) Zero(&c);
    for (auto& kind : unsent_.failed) {
      for (auto& n : kind) n.store(0);
    }
  }

  absl::StatusOr<SubmitTicket> Submit(const SubmitArgs& args) override {
    std::lock_guard<std::mutex> l(mu_);
    if (!refuse_.ok()) return refuse_;
    if (!sent_.empty() && args.sequence <= sent_.back()) {  // as the op queue's tokens
      return absl::InvalidArgumentError(absl::StrCat("op sequence ", args.sequence,
                                                     " is not above the previous token ",
                                                     sent_.back()));
    }
    sent_.push_back(args.sequence);
    names_[args.sequence] = std::string(args.name);
    return SubmitTicket{args.sequence, args.sequence};
  }
  absl::StatusOr<WaitOutcome> Wait(uint64_t op_id, absl::Time deadline) override {
    std::unique_lock<std::mutex> l(mu_);
    while (true) {
      auto it = done_.find(op_id);
      if (it != done_.end()) {
        absl::Status s = it->second;
        done_.erase(it);
        if (!s.ok()) return s;
        WaitOutcome o;
        o.done = true;
        o.algorithm = algorithm_;
        return o;
      }
      const absl::Time now = absl::Now();
      if (now >= deadline) return WaitOutcome{};
      cv_.wait_for(l, std::chrono::milliseconds(std::max<int64_t>(
                          1, std::min<int64_t>(20, absl::ToInt64Milliseconds(deadline - now)))));
    }
  }
  absl::Status Health() override {
    std::lock_guard<std::mutex> l(mu_);
    if (!alive_.ok()) return alive_;
    return health_;
  }
  absl::Status Alive() override {
    std::lock_guard<std::mutex> l(mu_);
    return alive_;
  }
  ipc::OpCounters* DirectCounters(int kind) override { return &counters_[kind]; }
  ipc::UnsentFailures* DirectUnsent() override { return &unsent_; }
  void SetDirectCurrent(const ipc::DirectOp* op) override {
    std::lock_guard<std::mutex> l(mu_);
    current_ = op != nullptr ? *op : ipc::DirectOp{};
  }
  void SetDirectLast(const ipc::DirectOp& op) override {
    std::lock_guard<std::mutex> l(mu_);
    last_ = op;
    if (current_.seq == op.seq) current_ = ipc::DirectOp{};
  }
  void SetDirectInFlight(uint64_t n) override {
    std::lock_guard<std::mutex> l(mu_);
    in_flight_ = n;
  }

  // The test's side.
  void Complete(uint64_t id, absl::Status s = absl::OkStatus()) {
    std::lock_guard<std::mutex> l(mu_);
    done_[id] = s;
    cv_.notify_all();
  }
  std::vector<uint64_t> sent() {
    std::lock_guard<std::mutex> l(mu_);
    return sent_;
  }
  // Submit fails with `s` (OK: takes ops again).
  void Refuse(absl::Status s) {
    std::lock_guard<std::mutex> l(mu_);
    refuse_ = s;
  }
  // Health() says `s` (the daemon refuses new ops for the session).
  void SetHealth(absl::Status s) {
    std::lock_guard<std::mutex> l(mu_);
    health_ = s;
  }
  // Alive() (and Health()) say `s` (the daemon stopped serving).
  void SetAlive(absl::Status s) {
    std::lock_guard<std::mutex> l(mu_);
    alive_ = s;
  }
  void SetAlgorithm(std::string a) {
    std::lock_guard<std::mutex> l(mu_);
    algorithm_ = std::move(a);
  }
  ipc::DirectOp current() {
    std::lock_guard<std::mutex> l(mu_);
    return current_;
  }
  ipc::DirectOp last() {
    std::lock_guard<std::mutex> l(mu_);
    return last_;
  }
  uint64_t in_flight() {
    std::lock_guard<std::mutex> l(mu_);
    return in_flight_;
  }
  uint64_t unsent(CollectiveKind kind, absl::StatusCode code) {
    return unsent_.failed[static_cast<int>(kind)][static_cast<int>(code)].load();
  }

 private:
  static void Zero(ipc::OpCounters* c) {
    c->ok.store(0);
    c->bytes.store(0);
    c->run_ns.store(0);
    c->wait_ns.store(0);
    for (auto& f : c->failed) f.store(0);
  }

  std::mutex mu_;
  std::condition_variable cv_;
  std::vector<uint64_t> sent_;
  std::map<uint64_t, std::string> names_;
  std::map<uint64_t, absl::Status> done_;
  absl::Status refuse_, health_, alive_;
  std::string algorithm_ = "hier";
  ipc::OpCounters counters_[ipc::kOpCounterKinds];
  ipc::UnsentFailures unsent_;
  ipc::DirectOp current_, last_;
  uint64_t in_flight_ = 0;
};

// Runs fn(r) for every rank r on a thread of its own and joins them.
inline void OnEveryRank(int n, const std::function<void(int)>& fn) {
  std::vector<std::thread> threads;
  for (int r = 0; r < n; ++r) threads.emplace_back(fn, r);
  for (auto& t : threads) t.join();
}

// An allreduce of `count` elements at `offset` of `buf`; `local`: run among
// the clients (else the daemon runs it).
inline PathOp Allreduce(std::vector<char>& buf, size_t count, DType t, ReduceOp op,
                        const std::string& name, uint64_t buffer_id = 1, size_t offset = 0,
                        bool local = true) {
  PathOp p;
  p.args.kind = CollectiveKind::kAllreduce;
  p.args.count = count;
  p.args.dtype = t;
  p.args.reduce_op = op;
  p.args.name = name;  // the path copies what the views point at
  p.args.buffer_id = buffer_id;
  p.args.offset_bytes = offset;
  p.forced = kAutoCode;
  p.local = local;
  p.data = buf.data() + offset;
  p.bytes = count * DTypeSize(t);
  return p;
}

// Submits `op` and waits for it (30 s).
inline absl::StatusOr<WaitOutcome> RunOp(OpPath& p, const PathOp& op) {
  auto t = p.Submit(op);
  if (!t.ok()) return t.status();
  return p.Wait(t->op_id, absl::Now() + absl::Seconds(30));
}

}  // namespace internal
}  // namespace client
}  // namespace gradsync

#endif  // GRADSYNC_CLIENT_OP_PATH_TESTING_H_
