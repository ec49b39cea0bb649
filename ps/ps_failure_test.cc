// Failures of the parameter-server data path: a worker that never pushes, a
// late push for an old step, mismatched step headers, a shard that dies or
// stalls, a worker that aborts, refused handshakes, the memory bound.
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "ps/protocol.h"
#include "ps/ps_testing.h"
#include "ps/shard.h"
#include "ps/shard_handshake.h"
#include "ps/slicer.h"
#include "ps/worker_client.h"
#include "transport/tcp_listener.h"
#include "transport/wire.h"

namespace gradsync::ps {
namespace {

using testing::Addresses;
using ::testing::HasSubstr;
using testing::ConnectToShard;
using testing::MakeWorkers;
using testing::RandomData;
using testing::RankOrderReference;
using testing::RunRanks;
using testing::StartShards;
using testing::WriteFrame;
using transport::FrameHeader;
using transport::FrameType;

constexpr absl::Duration kShardTimeout = absl::Milliseconds(300);

// Waits (up to 10 s) until `done` holds.
template <typename F>
void WaitFor(F done) {
  const absl::Time until = absl::Now() + absl::Seconds(10);
  while (!done() && absl::Now() < until) absl::SleepFor(absl::Milliseconds(1));
  ASSERT_TRUE(done());
}

// Every shard's accepted push bytes.
std::vector<uint64_t> TakenPushes(const std::vector<std::unique_ptr<PsShard>>& servers) {
  std::vector<uint64_t> taken;
  for (const auto& server : servers) taken.push_back(server->stats().bytes_pushed);
  return taken;
}

// Waits until the shards took, since `before`, everything `ranks` workers
// push of a step of `tensor_bytes` (f32) before they wait for a missing rank:
// each has at most kWindow partitions per shard in flight (MakeWorkers'
// max_inflight) and gets no results until every rank pushed. Then those
// workers are in the step at every shard and wait there.
constexpr size_t kWindow = 8;
void WaitUntilShardsTookFirstPushes(const std::vector<std::unique_ptr<PsShard>>& servers,
                                    const std::vector<uint64_t>& before, int ranks,
                                    uint64_t tensor_bytes, uint64_t partition_bytes) {
  std::vector<uint64_t> want(servers.size(), 0);
  std::vector<size_t> seen(servers.size(), 0);
  for (const Partition& p : BalancedSlicer().Slice(tensor_bytes, sizeof(float), partition_bytes,
                                                   static_cast<int>(servers.size()))) {
    if (seen[p.shard]++ < kWindow) want[p.shard] += ranks * p.bytes;
  }
  WaitFor([&] {
    const std::vector<uint64_t> now = TakenPushes(servers);
    for (size_t k = 0; k < servers.size(); ++k) {
      if (now[k] - before[k] != want[k]) return false;
    }
    return true;
  });
}

PsShardOptions Fast() {
  PsShardOptions o;
  o.step_timeout = kShardTimeout;
  return o;
}

std::vector<float> Floats(size_t n, float base) {
  std::vector<float> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = base + static_cast<float>(i % 17);
  return v;
}

// A step of `count` floats on the given ranks; returns their statuses. bufs[r]
// is rank r's buffer.
std::vector<absl::Status> Step(std::vector<std::unique_ptr<PsWorker>>& w,
                               std::vector<std::vector<float>>& bufs, const std::vector<int>& ranks,
                               uint64_t step, absl::Duration timeout = absl::Seconds(10),
                               uint64_t partition_bytes = 1024) {
  const BalancedSlicer slicer;
  const int n = static_cast<int>(w.size());
  return RunRanks(ranks, [&](int r) {
    return w[r]->PushPull(step, bufs[r].data(), bufs[r].size(), DType::kF32, ReduceOp::kSum, n, r,
                          partition_bytes, slicer, absl::Now() + timeout);
  });
}

// Checks that every rank's buffer is exactly the rank-order sum of `inputs`.
void ExpectExactSum(const std::vector<std::vector<float>>& bufs,
                    const std::vector<std::vector<float>>& inputs) {
  std::vector<std::vector<char>> raw;
  for (const auto& in : inputs) {
    raw.emplace_back(reinterpret_cast<const char*>(in.data()),
                     reinterpret_cast<const char*>(in.data() + in.size()));
  }
  const std::vector<char> want =
      RankOrderReference(raw, DType::kF32, ReduceOp::kSum, inputs[0].size());
  for (size_t r = 0; r < bufs.size(); ++r) {
    EXPECT_EQ(std::memcmp(bufs[r].data(), want.data(), want.size()), 0) << "rank " << r;
  }
}

TEST(PsFailure, WorkerThatNeverPushesFailsTheOthersNamingItsRankAndThePartition) {
  auto servers = StartShards(2, Fast());
  auto w = MakeWorkers(3, "silent", Addresses(servers));
  std::vector<std::vector<float>> bufs(3, Floats(4000, 1));
  const absl::Time start = absl::Now();
  std::vector<absl::Status> st = Step(w, bufs, {0, 1}, 1);  // rank 2 never shows up
  EXPECT_LT(absl::Now() - start, absl::Seconds(3));
  for (const absl::Status& s : st) {
    EXPECT_TRUE(absl::IsDeadlineExceeded(s)) << s;
    EXPECT_THAT(std::string(s.message()), HasSubstr("job 'silent' step 1 timed out after 300 ms "
                                                    "waiting for rank 2 to push partition "));
    EXPECT_THAT(std::string(s.message()), HasSubstr("rank 2 sent no step header"));
  }
  // Its late step 1 is refused with the step's error.
  st = Step(w, bufs, {2}, 1);
  EXPECT_TRUE(absl::IsDeadlineExceeded(st[0])) << st[0];
  EXPECT_THAT(std::string(st[0].message()),
              HasSubstr("refused step 1 from worker rank 2: it already failed: "));
  // The next step works for everyone.
  std::vector<std::vector<float>> in = {Floats(4000, 3), Floats(4000, -2), Floats(4000, 0.5f)};
  bufs = in;
  st = Step(w, bufs, {0, 1, 2}, 2);
  for (const absl::Status& s : st) EXPECT_TRUE(s.ok()) << s;
  ExpectExactSum(bufs, in);
}

TEST(PsFailure, LateStepIsRefusedAndNeverLandsInTheNextStep) {
  auto servers = StartShards(2, Fast());
  auto w = MakeWorkers(3, "late", Addresses(servers));
  std::vector<std::vector<float>> bufs(3, Floats(6000, 1));
  std::vector<absl::Status> st = Step(w, bufs, {0, 1}, 1);  // fails: rank 2 is late
  for (const absl::Status& s : st) ASSERT_TRUE(absl::IsDeadlineExceeded(s)) << s;

  // Ranks 0 and 1 run step 2 while rank 2 pushes its (huge-valued) step 1.
  std::vector<std::vector<float>> in = {Floats(6000, 3), Floats(6000, -2), Floats(6000, 0.25f)};
  bufs = in;
  std::vector<float> late(6000, 1e30f);
  std::vector<absl::Status> step2;
  const std::vector<uint64_t> before = TakenPushes(servers);
  std::thread others([&] { step2 = Step(w, bufs, {0, 1}, 2); });
  // Step 2 runs at the shards: ranks 0 and 1 pushed into it and wait for rank 2.
  WaitUntilShardsTookFirstPushes(servers, before, 2, 6000 * sizeof(float), 1024);
  const BalancedSlicer slicer;
  const absl::Status refused =
      w[2]->PushPull(1, late.data(), late.size(), DType::kF32, ReduceOp::kSum, 3, 2, 1024, slicer,
                     absl::Now() + absl::Seconds(5));
  EXPECT_TRUE(absl::IsDeadlineExceeded(refused)) << refused;
  EXPECT_THAT(std::string(refused.message()),
              HasSubstr("refused step 1 from worker rank 2: it already failed: "));
  // Now rank 2 joins step 2: the result is exactly the sum of the step-2 inputs.
  st = Step(w, bufs, {2}, 2);
  others.join();
  EXPECT_TRUE(st[0].ok()) << st[0];
  for (const absl::Status& s : step2) EXPECT_TRUE(s.ok()) << s;
  ExpectExactSum(bufs, in);
}

TEST(PsFailure, StalePushOnTheWireIsRefusedAndNotSummed) {
  // Rank 1 speaks the protocol by hand: it announces step 5, then pushes
  // garbage for partition 0 of step 4, then its real step-5 pushes.
  auto servers = StartShards(1, Fast());
  auto w = MakeWorkers(2, "stale-wire", Addresses(servers));
  const size_t count = 3000;
  const uint64_t pb = 4000;
  std::vector<std::vector<float>> in = {Floats(count, 1), Floats(count, 7)};
  std::vector<std::vector<float>> bufs = in;
  std::vector<absl::Status> st;
  std::thread rank0([&] { st = Step(w, bufs, {0}, 5, absl::Seconds(10), pb); });

  const absl::Time deadline = absl::Now() + absl::Seconds(10);
  auto fd = ConnectToShard({"127.0.0.1", servers[0]->port()}, "ps/stale-wire", 1, /*rank=*/1,
                           /*workers=*/2, /*shard=*/0, deadline, 1 << 20);
  ASSERT_TRUE(fd.ok()) << fd.status();
  const uint64_t tag = transport::JobTag("ps/stale-wire");
  const std::vector<Partition> parts = BalancedSlicer().Slice(count * 4, 4, pb, 1);
  StepHeader h;
  h.step = 5;
  h.workers = 2;
  h.rank = 1;
  h.tensor_bytes = count * 4;
  h.partition_bytes = pb;
  h.partitions = static_cast<uint32_t>(parts.size());
  h.table = parts;
  const std::string header = EncodeStepHeader(h);
  const uint8_t f32 = static_cast<uint8_t>(DType::kF32);
  ASSERT_TRUE(WriteFrame(fd->get(),
                         MakeFrame(FrameType::kData, tag, 1, 5, transport::kControlSlot, f32, 0,
                                   static_cast<uint32_t>(header.size())),
                         header.data(), deadline)
                  .ok());
  const std::vector<float> garbage(count, 1e30f);
  ASSERT_TRUE(WriteFrame(fd->get(),
                         MakeFrame(FrameType::kData, tag, 1, 4, parts[0].id, f32,
                                   parts[0].offset_bytes, static_cast<uint32_t>(parts[0].bytes)),
                         garbage.data(), deadline)
                  .ok());
  for (const Partition& p : parts) {
    ASSERT_TRUE(WriteFrame(fd->get(),
                           MakeFrame(FrameType::kData, tag, 1, 5, p.id, f32, p.offset_bytes,
                                     static_cast<uint32_t>(p.bytes)),
                           reinterpret_cast<const char*>(in[1].data()) + p.offset_bytes, deadline)
                    .ok());
  }
  // Read: one refusal for step 4, then every result of step 5.
  size_t results = 0;
  int refusals = 0;
  while (results < parts.size()) {
    FrameHeader f;
    ASSERT_TRUE(ReadFull(fd->get(), &f, sizeof(f), deadline).ok());
    std::string payload(f.length, '\0');
    ASSERT_TRUE(ReadFull(fd->get(), payload.data(), payload.size(), deadline).ok());
    if (f.type == static_cast<uint8_t>(FrameType::kAbort)) {
      const absl::Status s = AbortStatus(f, payload);
      EXPECT_EQ(f.op_seq, 4u);
      EXPECT_TRUE(absl::IsFailedPrecondition(s)) << s;
      EXPECT_THAT(std::string(s.message()),
                  HasSubstr("refused push of partition 0 of step 4 from worker rank 1: its "
                            "current step is 5"));
      ++refusals;
      continue;
    }
    ASSERT_EQ(f.op_seq, 5u);
    ASSERT_LE(f.offset + f.length, count * 4);
    std::memcpy(reinterpret_cast<char*>(bufs[1].data()) + f.offset, payload.data(), f.length);
    ++results;
  }
  rank0.join();
  EXPECT_EQ(refusals, 1);
  EXPECT_TRUE(st[0].ok()) << st[0];
  ExpectExactSum(bufs, in);
  EXPECT_EQ(servers[0]->stats().pushes_refused, 1u);
}

TEST(PsFailure, MismatchedStepHeadersFailEveryWorkerNamingTheRanks) {
  auto servers = StartShards(1, Fast());
  auto w = MakeWorkers(3, "mismatch", Addresses(servers));
  std::vector<std::vector<float>> bufs = {Floats(1024, 0), Floats(1000, 0), Floats(1024, 0)};
  std::vector<absl::Status> st = Step(w, bufs, {0, 1, 2}, 1);
  for (const absl::Status& s : st) {
    EXPECT_TRUE(absl::IsInvalidArgument(s)) << s;
    EXPECT_THAT(std::string(s.message()),
                HasSubstr("ps shard 0: job 'mismatch' step 1 does not match across workers: "
                          "rank 1 sent f32 sum of 4000 bytes in 4 partitions of 1024 bytes over 1 "
                          "shards by 3 workers (4 partitions here, table "));
    EXPECT_THAT(std::string(s.message()),
                HasSubstr("ranks 0,2 sent f32 sum of 4096 bytes in 4 partitions of 1024 bytes"));
  }
  // Nothing is left behind: the next step works.
  std::vector<std::vector<float>> in(3, Floats(1024, 2));
  bufs = in;
  st = Step(w, bufs, {0, 1, 2}, 2);
  for (const absl::Status& s : st) EXPECT_TRUE(s.ok()) << s;
  ExpectExactSum(bufs, in);
}

TEST(PsFailure, MismatchAcrossSeveralShardsKeepsTheCodeAndNamesTheRanks) {
  auto servers = StartShards(3, Fast());
  auto w = MakeWorkers(3, "mismatch3", Addresses(servers));
  std::vector<std::vector<float>> bufs = {Floats(5000, 0), Floats(5000, 0), Floats(5000, 0)};
  const BalancedSlicer slicer;
  std::vector<absl::Status> st = RunRanks({0, 1, 2}, [&](int r) {
    return w[r]->PushPull(1, bufs[r].data(), 5000, DType::kF32,
                          r == 2 ? ReduceOp::kMax : ReduceOp::kSum, 3, r, 1024, slicer,
                          absl::Now() + absl::Seconds(10));
  });
  for (const absl::Status& s : st) {
    EXPECT_TRUE(absl::IsInvalidArgument(s)) << s;
    EXPECT_THAT(std::string(s.message()), HasSubstr("rank 2 sent f32 max of 20000 bytes"));
    EXPECT_THAT(std::string(s.message()), HasSubstr("ranks 0,1 sent f32 sum of 20000 bytes"));
  }
}

TEST(PsFailure, ShardDestroyedMidStepFailsEveryWorkerNamingTheShardAndPartition) {
  auto servers = StartShards(2);  // 30 s step timeout: only the shard's death ends the step
  const std::vector<HostPort> addrs = Addresses(servers);
  auto w = MakeWorkers(3, "shard-dies", addrs);
  std::vector<std::vector<float>> bufs(3, Floats(4000, 1));
  std::vector<absl::Status> st;
  const absl::Time start = absl::Now();
  std::thread t([&] { st = Step(w, bufs, {0, 1}, 1); });  // rank 2 is missing: the step waits
  // Once shard 1 has every push of ranks 0 and 1, it dies.
  uint64_t shard1_bytes = 0;
  for (const Partition& p : BalancedSlicer().Slice(4000 * 4, 4, 1024, 2)) {
    if (p.shard == 1) shard1_bytes += p.bytes;
  }
  WaitFor([&] { return servers[1]->stats().bytes_pushed == 2 * shard1_bytes; });
  servers[1].reset();
  t.join();
  EXPECT_LT(absl::Now() - start, absl::Seconds(5));
  for (const absl::Status& s : st) {
    EXPECT_TRUE(absl::IsUnavailable(s)) << s;
    EXPECT_THAT(std::string(s.message()),
                HasSubstr(absl::StrCat("ps shard 1 (", addrs[1].ToString(),
                                       ") lost while pulling partition 1 of step 1: ")));
  }
}

// A server that accepts "ps/" connections and then either never answers
// (stall) or closes the connection after the step header (crash).
class FakeShard {
 public:
  explicit FakeShard(bool crash) {
    transport::ListenerOptions lo;
    lo.listen = {"127.0.0.1", 0};
    lo.route_prefix = kPsJobPrefix;
    lo.route = [this, crash](transport::RoutedConnection rc) {
      const absl::Time deadline = absl::Now() + absl::Seconds(2);
      absl::StatusOr<std::string> nonce = ReadWorkerNonce(rc, deadline);  // then the ack
      if (!nonce.ok() || !ProveJobKey(rc, "", *nonce, deadline).ok() ||
          !transport::WriteHelloAck(rc.fd.get(), absl::OkStatus(), deadline).ok()) {
        return;
      }
      if (crash) {
        FrameHeader h;
        if (ReadFull(rc.fd.get(), &h, sizeof(h), deadline).ok()) {
          std::string payload(h.length, '\0');
          (void)ReadFull(rc.fd.get(), payload.data(), payload.size(), deadline);
        }
        return;  // closes
      }
      absl::MutexLock l(&mu_);
      held_.push_back(std::move(rc.fd));
    };
    auto l = transport::TcpListener::Start(lo);
    EXPECT_TRUE(l.ok()) << l.status();
    listener_ = std::move(*l);
  }
  HostPort address() const { return {"127.0.0.1", listener_->port()}; }

 private:
  absl::Mutex mu_;
  std::vector<UniqueFd> held_;
  std::unique_ptr<transport::TcpListener> listener_;
};

TEST(PsFailure, StalledShardTimesOutNamingTheShardAndThePartition) {
  auto servers = StartShards(1);
  FakeShard stalled(/*crash=*/false);
  const std::vector<HostPort> addrs = {{"127.0.0.1", servers[0]->port()}, stalled.address()};
  auto w = MakeWorkers(2, "stall", addrs);
  std::vector<std::vector<float>> bufs(2, Floats(4000, 1));
  const absl::Time start = absl::Now();
  std::vector<absl::Status> st = Step(w, bufs, {0, 1}, 3, absl::Milliseconds(500));
  EXPECT_LT(absl::Now() - start, absl::Seconds(3));
  for (const absl::Status& s : st) {
    EXPECT_TRUE(absl::IsDeadlineExceeded(s)) << s;
    EXPECT_THAT(std::string(s.message()),
                HasSubstr(absl::StrCat("ps shard 1 (", addrs[1].ToString(),
                                       "): step 3 timed out waiting for partition 1 (pulled 0 of 8 "
                                       "partitions from this shard, pushed 8)")));
  }
}

TEST(PsFailure, CrashedShardFailsEveryWorkerNamingTheShard) {
  auto servers = StartShards(1, Fast());
  FakeShard crashed(/*crash=*/true);
  const std::vector<HostPort> addrs = {{"127.0.0.1", servers[0]->port()}, crashed.address()};
  auto w = MakeWorkers(2, "crash", addrs);
  std::vector<std::vector<float>> bufs(2, Floats(400000, 1));
  std::vector<absl::Status> st = Step(w, bufs, {0, 1}, 1, absl::Seconds(10), 64 << 10);
  for (const absl::Status& s : st) {
    EXPECT_TRUE(absl::IsUnavailable(s)) << s;
    EXPECT_THAT(std::string(s.message()),
                HasSubstr(absl::StrCat("ps shard 1 (", addrs[1].ToString(), ") lost while ")));
    EXPECT_THAT(std::string(s.message()), HasSubstr(" of step 1: "));
  }
}

TEST(PsFailure, WorkerThatAbortsFailsTheStepOnTheOthersWithItsReason) {
  auto servers = StartShards(2);
  auto w = MakeWorkers(3, "abort", Addresses(servers));
  std::vector<std::vector<float>> bufs(3, Floats(4000, 1));
  std::vector<absl::Status> st;
  std::thread t([&] { st = Step(w, bufs, {1, 2}, 1); });  // rank 0 is missing
  WaitFor(
      [&] { return servers[0]->stats().connections == 2 && servers[1]->stats().connections == 2; });
  w[2]->Abort(absl::CancelledError("the training process went away"));
  t.join();
  EXPECT_TRUE(absl::IsCancelled(st[1])) << st[1];
  EXPECT_EQ(st[1].message(), "the training process went away");
  EXPECT_TRUE(absl::IsCancelled(st[0])) << st[0];
  EXPECT_THAT(std::string(st[0].message()),
              HasSubstr("step 1 aborted by worker rank 2: the training process went away"));
  // Abort is sticky.
  st = Step(w, bufs, {2}, 2);
  EXPECT_TRUE(absl::IsCancelled(st[0])) << st[0];
}

TEST(PsFailure, WorkerThatDisconnectsMidStepFailsTheOthersNamingIt) {
  auto servers = StartShards(1);
  auto w = MakeWorkers(3, "vanish", Addresses(servers));
  std::vector<std::vector<float>> bufs(3, Floats(4000, 1));
  // Rank 2 announces the step and pushes part of it by hand, then goes away.
  const absl::Time deadline = absl::Now() + absl::Seconds(10);
  auto fd =
      ConnectToShard({"127.0.0.1", servers[0]->port()}, "ps/vanish", 1, 2, 3, 0, deadline, 1 << 20);
  ASSERT_TRUE(fd.ok()) << fd.status();
  const std::vector<Partition> parts = BalancedSlicer().Slice(16000, 4, 1024, 1);
  StepHeader h;
  h.step = 1;
  h.workers = 3;
  h.rank = 2;
  h.tensor_bytes = 16000;
  h.partition_bytes = 1024;
  h.partitions = static_cast<uint32_t>(parts.size());
  h.table = parts;
  const std::string header = EncodeStepHeader(h);
  const uint64_t tag = transport::JobTag("ps/vanish");
  ASSERT_TRUE(WriteFrame(fd->get(),
                         MakeFrame(FrameType::kData, tag, 1, 1, transport::kControlSlot, 1, 0,
                                   static_cast<uint32_t>(header.size())),
                         header.data(), deadline)
                  .ok());
  std::vector<absl::Status> st;
  const std::vector<uint64_t> before = TakenPushes(servers);
  std::thread t([&] { st = Step(w, bufs, {0, 1}, 1); });
  // Ranks 0 and 1 pushed into step 1 at the shard and wait for rank 2.
  WaitUntilShardsTookFirstPushes(servers, before, 2, 4000 * sizeof(float), 1024);
  fd->Reset();
  t.join();
  for (const absl::Status& s : st) {
    EXPECT_TRUE(absl::IsUnavailable(s)) << s;
    EXPECT_THAT(std::string(s.message()),
                HasSubstr("ps shard 0: job 'vanish' step 1: worker rank 2 disconnected after "
                          "pushing 0 of 16 partitions here"));
  }
}

TEST(PsFailure, StepThatDoesNotFitTheMemoryBoundIsRefused) {
  PsShardOptions o = Fast();
  o.max_memory_bytes = 1 << 20;
  auto servers = StartShards(1, o);
  auto w = MakeWorkers(2, "big", Addresses(servers));
  std::vector<std::vector<float>> bufs(2, Floats(256 << 10, 1));  // 1 MiB each: 2 MiB to stage
  std::vector<absl::Status> st = Step(w, bufs, {0, 1}, 1, absl::Seconds(10), 64 << 10);
  for (const absl::Status& s : st) {
    EXPECT_TRUE(absl::IsResourceExhausted(s)) << s;
    EXPECT_THAT(std::string(s.message()),
                HasSubstr("ps shard 0: job 'big' step 1: 2 workers x 1048576 bytes do not fit "
                          "into the shard's staging memory"));
  }
  // Pushes already on the wire when the step failed are charged while they
  // are discarded; then nothing stays reserved.
  const absl::Time until = absl::Now() + absl::Seconds(10);
  while (servers[0]->stats().reserved_bytes != 0 && absl::Now() < until) {
    absl::SleepFor(absl::Milliseconds(5));
  }
  EXPECT_EQ(servers[0]->stats().reserved_bytes, 0u);
  std::vector<std::vector<float>> in(2, Floats(1000, 1));
  bufs = in;
  st = Step(w, bufs, {0, 1}, 2);
  for (const absl::Status& s : st) EXPECT_TRUE(s.ok()) << s;
  ExpectExactSum(bufs, in);
}

// What a peer announces is charged against the staging budget before memory
// is allocated: 16 connections each announcing a 4 MiB frame (a step header,
// or a push without one) to a shard with an 8 MiB budget get at most two
// frames held at once; the rest are refused at the header, naming the
// budget, and every charge is returned when the connections end.
TEST(PsFailure, AnnouncedFramesAreChargedAgainstTheStagingBudgetFirst) {
  PsShardOptions o = Fast();
  o.max_memory_bytes = 8 << 20;
  auto servers = StartShards(1, o);
  const uint64_t tag = transport::JobTag("ps/hog");
  const uint8_t f32 = static_cast<uint8_t>(DType::kF32);
  const absl::Time deadline = absl::Now() + absl::Seconds(10);
  std::vector<UniqueFd> conns;
  for (int i = 0; i < 16; ++i) {
    auto fd = ConnectToShard({"127.0.0.1", servers[0]->port()}, "ps/hog", 1, i, 16, 0, deadline,
                             0);
    ASSERT_TRUE(fd.ok()) << fd.status();
    const FrameHeader h = MakeFrame(FrameType::kData, tag, 1, 1,
                                    i % 2 == 0 ? transport::kControlSlot : 0, f32, 0, 4 << 20);
    ASSERT_TRUE(WriteFull(fd->get(), &h, sizeof(h), deadline).ok());  // the payload never comes
    conns.push_back(std::move(*fd));
  }
  int over_budget = 0;
  for (UniqueFd& fd : conns) {
    absl::Status last;
    while (true) {
      FrameHeader f;
      ASSERT_TRUE(ReadFull(fd.get(), &f, sizeof(f), deadline).ok());
      std::string payload(f.length, '\0');
      ASSERT_TRUE(ReadFull(fd.get(), payload.data(), payload.size(), deadline).ok());
      ASSERT_EQ(f.type, static_cast<uint8_t>(FrameType::kAbort));
      if (f.op_seq != kConnectionStep) continue;  // a refusal of the push alone
      last = AbortStatus(f, payload);
      break;
    }
    if (absl::IsResourceExhausted(last)) {
      ++over_budget;
      EXPECT_THAT(std::string(last.message()),
                  HasSubstr("-byte frame from worker rank "));
      EXPECT_THAT(std::string(last.message()),
                  HasSubstr("does not fit into the shard's staging memory"));
    } else {  // held until the step timeout
      EXPECT_TRUE(absl::IsDeadlineExceeded(last)) << last;
    }
  }
  EXPECT_GE(over_budget, 14);
  conns.clear();
  WaitFor([&] { return servers[0]->stats().reserved_bytes == 0; });
  // A step header larger than any step can have is refused outright.
  auto fd = ConnectToShard({"127.0.0.1", servers[0]->port()}, "ps/hog", 1, 0, 16, 0, deadline, 0);
  ASSERT_TRUE(fd.ok()) << fd.status();
  const FrameHeader h = MakeFrame(FrameType::kData, tag, 1, 2, transport::kControlSlot, f32, 0,
                                  static_cast<uint32_t>(kMaxStepHeaderBytes + 1));
  ASSERT_TRUE(WriteFull(fd->get(), &h, sizeof(h), deadline).ok());
  FrameHeader f;
  ASSERT_TRUE(ReadFull(fd->get(), &f, sizeof(f), deadline).ok());
  std::string payload(f.length, '\0');
  ASSERT_TRUE(ReadFull(fd->get(), payload.data(), payload.size(), deadline).ok());
  const absl::Status refused = AbortStatus(f, payload);
  EXPECT_TRUE(absl::IsInvalidArgument(refused)) << refused;
  EXPECT_THAT(std::string(refused.message()), HasSubstr("announced a step header of"));
  // The shard still serves a real job.
  auto w = MakeWorkers(2, "after-hog", Addresses(servers));
  std::vector<std::vector<float>> in(2, Floats(1000, 1));
  std::vector<std::vector<float>> bufs = in;
  for (const absl::Status& s : Step(w, bufs, {0, 1}, 1)) EXPECT_TRUE(s.ok()) << s;
  ExpectExactSum(bufs, in);
}

TEST(PsFailure, ConnectionWithAnotherWorldSizeIsRefused) {
  auto servers = StartShards(1);
  auto w = MakeWorkers(2, "sizes", Addresses(servers));
  std::vector<std::vector<float>> bufs(2, Floats(100, 1));
  for (const absl::Status& s : Step(w, bufs, {0, 1}, 1)) ASSERT_TRUE(s.ok()) << s;
  // Rank 1 comes back believing the job has 3 workers.
  const BalancedSlicer slicer;
  const absl::Status s = w[1]->PushPull(2, bufs[1].data(), 100, DType::kF32, ReduceOp::kSum, 3, 1,
                                        1024, slicer, absl::Now() + absl::Seconds(5));
  EXPECT_TRUE(absl::IsFailedPrecondition(s)) << s;
  EXPECT_THAT(std::string(s.message()), HasSubstr("ps shard 0 (127.0.0.1:"));
  EXPECT_THAT(std::string(s.message()),
              HasSubstr("cannot connect: refused: ps shard 0: job 'sizes' epoch 1 has 2 "
                        "workers here, rank 1 connected with 3"));
}

TEST(PsFailure, ShardShutdownBetweenStepsMakesTheNextStepUnavailable) {
  auto servers = StartShards(1);
  const std::vector<HostPort> addrs = Addresses(servers);
  auto w = MakeWorkers(1, "gone", addrs);
  std::vector<std::vector<float>> bufs(1, Floats(100, 1));
  ASSERT_TRUE(Step(w, bufs, {0}, 1)[0].ok());
  servers[0]->Shutdown();
  const absl::Status s = Step(w, bufs, {0}, 2)[0];
  EXPECT_TRUE(absl::IsUnavailable(s)) << s;
  EXPECT_THAT(std::string(s.message()),
              HasSubstr(absl::StrCat("ps shard 0 (", addrs[0].ToString(), ")")));
}

TEST(PsWorker, RejectsBadArgumentsAndBrokenSlicers) {
  auto servers = StartShards(1);
  auto w = MakeWorkers(1, "args", Addresses(servers));
  std::vector<float> buf(100, 1);
  const BalancedSlicer good;
  auto call = [&](const Slicer& slicer, int world, int rank, uint64_t pb) {
    return w[0]->PushPull(1, buf.data(), buf.size(), DType::kF32, ReduceOp::kSum, world, rank, pb,
                          slicer, absl::Now() + absl::Seconds(5));
  };
  EXPECT_TRUE(absl::IsInvalidArgument(call(good, 2, 2, 64)));
  EXPECT_TRUE(absl::IsInvalidArgument(call(good, 1, 0, 0)));
  class Overlapping : public Slicer {
   public:
    std::vector<Partition> Slice(uint64_t bytes, size_t, uint64_t, int) const override {
      return {Partition{0, 0, bytes, 0}, Partition{1, 0, 4, 0}};
    }
  };
  const absl::Status s = call(Overlapping(), 1, 0, 64);
  EXPECT_TRUE(absl::IsInvalidArgument(s)) << s;
  EXPECT_THAT(std::string(s.message()), HasSubstr("ps step 1: the slicer"));
  EXPECT_TRUE(PsWorker::Create(PsWorkerOptions{}).status().code() ==
              absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace gradsync::ps
