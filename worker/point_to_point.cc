#include "worker/point_to_point.h"

#include <algorithm>
#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"
#include "collective/op_validation.h"
#include "common/clock.h"
#include "common/logging.h"
#include "common/process.h"
#include "worker/queued_op.h"
#include "worker/session.h"

namespace gradsync {
namespace {

// A message's frames: one per chunk of at most this many bytes.
constexpr uint64_t kChunkBytes = transport::kMaxMessageBytes;

uint64_t Chunks(uint64_t bytes) { return std::max<uint64_t>(1, (bytes + kChunkBytes - 1) / kChunkBytes); }

transport::MessageTag FrameTag(int src, int dst, int32_t tag, DType dtype, uint64_t bytes) {
  return transport::MessageTag{(static_cast<uint64_t>(src) << 32) | static_cast<uint32_t>(tag),
                               static_cast<uint32_t>(dst), static_cast<uint8_t>(dtype), bytes};
}

std::string Size(uint64_t bytes, DType dtype) {
  return absl::StrCat(bytes, " bytes (", DTypeName(dtype), "[", bytes / DTypeSize(dtype), "])");
}

}  // namespace

struct PointToPoint::Pending {
  Session* session = nullptr;  // null once finished
  std::shared_ptr<QueuedOp> op;
  int rank = -1;  // the submitting rank (on this daemon)
  int peer = -1;  // send: the destination; recv: the source, -1 any
  int32_t tag = 0;
  DType dtype = DType::kF32;
  uint64_t bytes = 0;
  bool send = false;
  bool done = false;

  char* data() const { return op->data(); }
  bool Matches(int src, int32_t t) const { return (peer == -1 || peer == src) && tag == t; }
};

struct PointToPoint::Arrival {
  int src = -1;
  int32_t tag = 0;
  DType dtype = DType::kF32;
  uint64_t bytes = 0;
  std::shared_ptr<Pending> local_send;  // a send of this daemon waiting for its recv
  std::vector<char> held;               // or a message from another daemon, whole
};

struct PointToPoint::Inbound {
  bool active = false;
  transport::MessageTag tag;
  int src = -1;
  int dst = -1;
  int32_t user_tag = 0;
  DType dtype = DType::kF32;
  uint64_t total = 0;
  uint64_t received = 0;
  std::shared_ptr<Pending> recv;  // the recv it lands in, or
  std::vector<char> held;         // memory of our own until a recv comes, or
  bool discard = false;           // nowhere (its recv failed): into `scratch`
  std::vector<char> scratch;
  std::unique_ptr<transport::MemoryRegion> mr;
  transport::Request req;
  bool posted = false;
};

struct PointToPoint::Outbound {
  std::shared_ptr<Pending> send;
  std::unique_ptr<transport::MemoryRegion> mr;
  std::vector<std::unique_ptr<transport::Request>> reqs;
  uint64_t chunks = 0;
};

PointToPoint::PointToPoint(PointToPointOptions options, std::unique_ptr<transport::Context> ctx)
    : options_(std::move(options)), ctx_(std::move(ctx)) {
  const JobPlacement& place = options_.placement;
  local_index_.assign(static_cast<size_t>(place.world), -1);
  const std::vector<int>& local = place.local_ranks();
  for (size_t i = 0; i < local.size(); ++i) local_index_[local[i]] = static_cast<int>(i);
  recvs_.resize(local.size());
  arrivals_.resize(local.size());
  outbox_.resize(static_cast<size_t>(place.nodes()));
  outbound_.resize(static_cast<size_t>(place.nodes()));
  inbound_.resize(static_cast<size_t>(place.nodes()));
  thread_ = std::thread([this] { Run(); });
  NameThread(thread_, "gs-p2p");
}

PointToPoint::~PointToPoint() {
  {
    absl::MutexLock l(&mu_);
    stop_ = true;
    cv_.SignalAll();
  }
  if (ctx_ != nullptr) ctx_->Interrupt();
  if (thread_.joinable()) thread_.join();
}

void PointToPoint::Submit(Session* session, std::shared_ptr<QueuedOp> op) {
  {
    absl::MutexLock l(&mu_);
    submitted_.emplace_back(session, std::move(op));
    cv_.SignalAll();
  }
  if (ctx_ != nullptr) ctx_->Interrupt();
}

void PointToPoint::Detach(int rank, const absl::Status& why) {
  if (rank < 0 || rank >= static_cast<int>(local_index_.size()) || local_index_[rank] < 0) return;
  absl::MutexLock l(&mu_);
  detaching_.emplace_back(rank, why);
  const uint64_t ticket = ++detach_requests_;
  cv_.SignalAll();
  if (ctx_ != nullptr) ctx_->Interrupt();
  if (thread_.get_id() == std::this_thread::get_id()) return;
  auto done = [this, ticket]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return detaches_done_ >= ticket || stop_;
  };
  if (!mu_.AwaitWithTimeout(absl::Condition(&done), absl::Seconds(30))) {
    GS_LOG(ERROR) << "job '" << options_.job_id << "': the point-to-point engine did not let go "
                  << "of rank " << rank << "'s session in 30 s";
  }
}

void PointToPoint::Break(const absl::Status& why) {
  {
    absl::MutexLock l(&mu_);
    if (break_.ok()) break_ = why.ok() ? absl::AbortedError("the epoch failed") : why;
    cv_.SignalAll();
  }
  if (ctx_ != nullptr) ctx_->Interrupt();
}

int PointToPoint::LocalIndex(int rank) const {
  return rank >= 0 && rank < static_cast<int>(local_index_.size()) ? local_index_[rank] : -1;
}

std::string PointToPoint::Describe(const Pending& p) const {
  return absl::StrCat(p.op->sig.Describe(), " on rank ", p.rank);
}

void PointToPoint::Finish(Pending& p, const absl::Status& s, int source) {
  if (p.done) return;
  p.done = true;
  Session* session = std::exchange(p.session, nullptr);
  if (session != nullptr && session->FinishPointToPoint(*p.op, s, source, FastNow()) &&
      options_.observer != nullptr) {
    options_.observer->OnOpDone(session->Record(*p.op, absl::ZeroDuration()));
  }
}

void PointToPoint::Run() {
  while (true) {
    {
      absl::MutexLock l(&mu_);
      if (stop_) break;
    }
    TakeSubmissions();
    Expire(FastNow());
    const absl::Time until = std::min(NextDeadline(), FastNow() + absl::Seconds(1));
    if (ctx_ != nullptr && ctx_failed_.ok()) {
      PostSends();
      LookAtArrivals();
      // A request may complete as it is posted (a send the socket took at
      // once): finish it now, not after the Progress below sleeps.
      if (Reap()) continue;
      const absl::Status s = ctx_->Progress(until);
      if (!s.ok() && !absl::IsDeadlineExceeded(s)) FailContext(s);
      Reap();
      LookAtArrivals();
    } else {
      absl::MutexLock l(&mu_);
      auto work = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
        return stop_ || !submitted_.empty() || !detaching_.empty() || (!break_.ok() && broken_.ok());
      };
      mu_.AwaitWithDeadline(absl::Condition(&work), until);
    }
  }
  const absl::Status stopped = absl::CancelledError(
      absl::StrCat("job '", options_.job_id, "' epoch ", options_.epoch, ": its executor stopped"));
  TakeSubmissions();
  FailContext(stopped, /*quiet=*/true);
  FailAll(stopped, /*remote_only=*/false);
  absl::MutexLock l(&mu_);
  detaches_done_ = detach_requests_;
}

void PointToPoint::TakeSubmissions() {
  std::vector<std::pair<Session*, std::shared_ptr<QueuedOp>>> subs;
  std::vector<std::pair<int, absl::Status>> detaches;
  absl::Status brk;
  {
    absl::MutexLock l(&mu_);
    subs.swap(submitted_);
    detaches.swap(detaching_);
    brk = break_;
  }
  if (!brk.ok() && broken_.ok()) {
    broken_ = brk;
    FailContext(brk, /*quiet=*/true);  // the executor logged why the epoch failed
    FailAll(brk, /*remote_only=*/false);
  }
  for (auto& [session, op] : subs) {
    auto p = std::make_shared<Pending>();
    p->session = session;
    p->rank = session->rank();
    p->peer = op->sig.root;
    p->tag = op->sig.tag;
    p->dtype = op->sig.dtype;
    p->bytes = op->sig.count * DTypeSize(op->sig.dtype);
    p->send = op->sig.kind == CollectiveKind::kSend;
    p->op = std::move(op);
    Accept(std::move(p));
  }
  if (detaches.empty()) return;
  for (const auto& [rank, why] : detaches) {
    auto fail_rank = [&, rank = rank, why = why](const std::shared_ptr<Pending>& p) {
      if (p != nullptr && p->rank == rank) {
        Finish(*p, absl::Status(why.code(), absl::StrCat(Describe(*p), ": ", why.message())),
               p->peer);
      }
    };
    ForEachPending(fail_rank);
    // Sends here waiting for the rank's recv: none will come.
    for (auto& a : arrivals_[static_cast<size_t>(LocalIndex(rank))]) {
      if (a.local_send != nullptr && !a.local_send->done) {
        Finish(*a.local_send,
               absl::Status(why.code(), absl::StrCat(Describe(*a.local_send), ": ", why.message())),
               rank);
      }
    }
  }
  // Finished ops leave the queues that only hold unstarted ones.
  for (auto& q : recvs_) q.erase(std::remove_if(q.begin(), q.end(), [](auto& p) { return p->done; }), q.end());
  for (auto& q : arrivals_) {
    q.erase(std::remove_if(q.begin(), q.end(),
                           [](const Arrival& a) { return a.local_send != nullptr && a.local_send->done; }),
            q.end());
  }
  absl::MutexLock l(&mu_);
  detaches_done_ += detaches.size();
}

void PointToPoint::Accept(std::shared_ptr<Pending> p) {
  if (!broken_.ok()) {
    Finish(*p, absl::Status(broken_.code(), absl::StrCat(Describe(*p), ": the epoch failed earlier: ",
                                                         broken_.message())),
           p->peer);
    return;
  }
  const JobPlacement& place = options_.placement;
  if (p->peer >= 0 && LocalIndex(p->peer) < 0) {
    const int node = place.node_of_rank[p->peer];
    absl::Status unusable;
    if (ctx_ == nullptr) {
      unusable = absl::FailedPreconditionError(absl::StrCat(
          "rank ", p->peer, " is on daemon ", node, " (", place.node_names[node],
          ") and this job's daemons have no point-to-point connections (an in-process device)"));
    } else if (!ctx_failed_.ok()) {
      unusable = absl::Status(ctx_failed_.code(),
                              absl::StrCat("the point-to-point connections failed earlier: ",
                                           ctx_failed_.message()));
    }
    if (!unusable.ok()) {
      Finish(*p, absl::Status(unusable.code(), absl::StrCat(Describe(*p), ": ", unusable.message())),
             p->peer);
      return;
    }
    if (p->send) {
      outbox_[node].push_back(std::move(p));
      return;
    }
  }
  if (p->send) {
    SendLocal(std::move(p));
  } else {
    PostRecv(std::move(p));
  }
}

namespace {

// The recv `r` takes message (src, tag, dtype, bytes): OK, or why not, in
// the recv's words.
absl::Status CheckFits(const std::string& recv_what, int src, int32_t tag, DType dtype,
                       uint64_t bytes, DType want_dtype, uint64_t want_bytes) {
  if (dtype == want_dtype && bytes == want_bytes) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat(
      recv_what, ": the message from rank ", src, " with tag ", tag, " has ", Size(bytes, dtype),
      "; this recv's tensor has ", Size(want_bytes, want_dtype),
      " (send and recv must agree on dtype and size)"));
}

}  // namespace

void PointToPoint::SendLocal(std::shared_ptr<Pending> send) {
  Arrival a;
  a.src = send->rank;
  a.tag = send->tag;
  a.dtype = send->dtype;
  a.bytes = send->bytes;
  const int li = LocalIndex(send->peer);
  a.local_send = std::move(send);
  (void)MatchArrival(li, std::move(a));
}

// Delivers `a` to the first posted recv of local index `li` it matches, or
// keeps it for a recv to come. Returns whether a recv took it.
bool PointToPoint::MatchArrival(int li, Arrival a) {
  auto& posted = recvs_[static_cast<size_t>(li)];
  for (auto it = posted.begin(); it != posted.end(); ++it) {
    if (!(*it)->Matches(a.src, a.tag)) continue;
    std::shared_ptr<Pending> recv = std::move(*it);
    posted.erase(it);
    const absl::Status fits =
        CheckFits(Describe(*recv), a.src, a.tag, a.dtype, a.bytes, recv->dtype, recv->bytes);
    if (!fits.ok()) {
      Finish(*recv, fits, a.src);
      if (a.local_send != nullptr) {
        Finish(*a.local_send,
               absl::InvalidArgumentError(absl::StrCat(
                   Describe(*a.local_send), ": rank ", recv->rank, "'s matching recv (",
                   recv->op->sig.Describe(), ") has ", Size(recv->bytes, recv->dtype),
                   "; this message has ", Size(a.bytes, a.dtype))),
               recv->rank);
      }
    } else {
      const char* from = a.local_send != nullptr ? a.local_send->data() : a.held.data();
      if (a.bytes > 0) std::memcpy(recv->data(), from, a.bytes);
      Finish(*recv, absl::OkStatus(), a.src);
      if (a.local_send != nullptr) Finish(*a.local_send, absl::OkStatus(), recv->rank);
    }
    if (a.local_send == nullptr) unexpected_bytes_ -= a.held.size();
    return true;
  }
  arrivals_[static_cast<size_t>(li)].push_back(std::move(a));
  return false;
}

void PointToPoint::PostRecv(std::shared_ptr<Pending> recv) {
  const int li = LocalIndex(recv->rank);
  auto& here = arrivals_[static_cast<size_t>(li)];
  for (auto it = here.begin(); it != here.end(); ++it) {
    if (!recv->Matches(it->src, it->tag)) continue;
    Arrival a = std::move(*it);
    here.erase(it);
    recvs_[static_cast<size_t>(li)].push_front(std::move(recv));
    (void)MatchArrival(li, std::move(a));  // the recv just put first takes it
    return;
  }
  recvs_[static_cast<size_t>(li)].push_back(std::move(recv));
  // A message parked in a socket for want of room may be this recv's: the
  // next LookAtArrivals binds it.
}

void PointToPoint::PostSends() {
  const int self = options_.placement.node_index;
  for (size_t node = 0; node < outbox_.size(); ++node) {
    if (static_cast<int>(node) == self) continue;
    while (ctx_failed_.ok()) {
      auto& posted = outbound_[node];
      if (posted.empty() || posted.back().reqs.size() == posted.back().chunks) {
        // The next send starts only once the one before is wholly posted:
        // a message's frames are contiguous on the connection.
        auto& box = outbox_[node];
        while (!box.empty() && box.front()->done) box.pop_front();
        if (box.empty()) break;
        Outbound o;
        o.send = std::move(box.front());
        box.pop_front();
        auto mr = ctx_->RegisterMemory(o.send->data(), o.send->bytes);
        if (!mr.ok()) {
          Finish(*o.send, absl::Status(mr.status().code(), absl::StrCat(Describe(*o.send), ": ",
                                                                        mr.status().message())),
                 o.send->peer);
          continue;
        }
        o.mr = std::move(*mr);
        o.chunks = Chunks(o.send->bytes);
        posted.push_back(std::move(o));
      }
      Outbound& o = posted.back();
      const Pending& s = *o.send;
      bool full = false;
      while (o.reqs.size() < o.chunks) {
        const uint64_t off = o.reqs.size() * kChunkBytes;
        const uint64_t len = std::min(kChunkBytes, s.bytes - std::min(s.bytes, off));
        auto req = std::make_unique<transport::Request>();
        const absl::Status st = ctx_->PostSend(static_cast<int>(node), *o.mr, off, len,
                                               FrameTag(s.rank, s.peer, s.tag, s.dtype, s.bytes),
                                               req.get());
        if (absl::IsResourceExhausted(st)) {  // the posting bound: again once some completed
          full = true;
          break;
        }
        if (!st.ok()) {
          FailContext(st);
          return;
        }
        o.reqs.push_back(std::move(req));
      }
      if (full) break;
    }
  }
}

void PointToPoint::LookAtArrivals() {
  const int self = options_.placement.node_index;
  for (size_t node = 0; node < inbound_.size() && ctx_failed_.ok(); ++node) {
    if (static_cast<int>(node) == self) continue;
    Inbound& in = inbound_[node];
    if (in.posted) continue;
    transport::Incoming incoming;
    if (!ctx_->Probe(static_cast<int>(node), &incoming)) continue;
    if (in.active) {
      ContinueInbound(static_cast<int>(node), incoming);
    } else {
      StartInbound(static_cast<int>(node), incoming);
    }
  }
}

void PointToPoint::StartInbound(int node, const transport::Incoming& incoming) {
  const JobPlacement& place = options_.placement;
  const transport::MessageTag& t = incoming.tag;
  const int src = static_cast<int>(t.op_seq >> 32);
  const int32_t user_tag = static_cast<int32_t>(static_cast<uint32_t>(t.op_seq));
  const int dst = static_cast<int>(t.slot);
  const int li = LocalIndex(dst);
  if (src < 0 || src >= place.world || place.node_of_rank[src] != node || li < 0 ||
      !IsValidDType(t.dtype) || t.offset > kMaxOpBytes ||
      incoming.bytes != std::min<uint64_t>(t.offset, kChunkBytes)) {
    FailContext(absl::DataLossError(absl::StrCat(
        "daemon ", node, " (", place.node_names[node],
        ") sent a malformed point-to-point frame (source rank ", src, ", destination rank ", dst,
        ", dtype ", static_cast<int>(t.dtype), ", ", t.offset, " bytes, frame of ", incoming.bytes,
        " bytes)")));
    return;
  }
  Inbound& in = inbound_[static_cast<size_t>(node)];
  const DType dtype = static_cast<DType>(t.dtype);
  const uint64_t total = t.offset;
  std::shared_ptr<Pending> recv;
  bool discard = false;
  auto& posted = recvs_[static_cast<size_t>(li)];
  for (auto it = posted.begin(); it != posted.end(); ++it) {
    if (!(*it)->Matches(src, user_tag)) continue;
    recv = std::move(*it);
    posted.erase(it);
    const absl::Status fits = CheckFits(Describe(*recv), src, user_tag, dtype, total, recv->dtype,
                                        recv->bytes);
    if (!fits.ok()) {
      Finish(*recv, fits, src);
      recv = nullptr;
      discard = true;
    }
    break;
  }
  if (recv == nullptr && !discard) {
    if (unexpected_bytes_ + total > options_.max_unexpected_bytes) {
      return;  // parked in the socket until a recv comes or room is made
    }
    unexpected_bytes_ += total;
    in.held.assign(total, '\0');
  }
  in.active = true;
  in.tag = t;
  in.src = src;
  in.dst = dst;
  in.user_tag = user_tag;
  in.dtype = dtype;
  in.total = total;
  in.received = 0;
  in.recv = std::move(recv);
  in.discard = discard;
  absl::StatusOr<std::unique_ptr<transport::MemoryRegion>> mr;
  if (in.recv != nullptr) {
    mr = ctx_->RegisterMemory(in.recv->data(), total);
  } else if (discard) {
    in.scratch.assign(std::min(total, kChunkBytes), '\0');
    mr = ctx_->RegisterMemory(in.scratch.data(), in.scratch.size());
  } else {
    mr = ctx_->RegisterMemory(in.held.data(), total);
  }
  if (!mr.ok()) {
    FailContext(mr.status());
    return;
  }
  in.mr = std::move(*mr);
  ContinueInbound(node, incoming);
}

void PointToPoint::ContinueInbound(int node, const transport::Incoming& incoming) {
  Inbound& in = inbound_[static_cast<size_t>(node)];
  const uint64_t left = in.total - in.received;
  const uint64_t len = std::min(left, kChunkBytes);
  const transport::MessageTag& t = incoming.tag;
  if (t.op_seq != in.tag.op_seq || t.slot != in.tag.slot || t.offset != in.total ||
      incoming.bytes != len) {
    FailContext(absl::DataLossError(absl::StrCat(
        "daemon ", node, " (", options_.placement.node_names[node],
        ") broke off a point-to-point message from rank ", in.src, " to rank ", in.dst, " after ",
        in.received, " of ", in.total, " bytes")));
    return;
  }
  const uint64_t at = in.discard ? 0 : in.received;
  in.req = transport::Request{};
  const absl::Status st =
      ctx_->PostRecv(node, *in.mr, at, len, /*exact=*/true, in.tag, &in.req);
  if (!st.ok()) {
    FailContext(st);
    return;
  }
  in.posted = true;
}

bool PointToPoint::Reap() {
  bool any = false;
  const int self = options_.placement.node_index;
  for (size_t node = 0; node < outbound_.size(); ++node) {
    if (static_cast<int>(node) == self) continue;
    auto& posted = outbound_[node];
    while (!posted.empty()) {
      Outbound& o = posted.front();
      const bool all_done = o.reqs.size() == o.chunks &&
                            std::all_of(o.reqs.begin(), o.reqs.end(),
                                        [](const auto& r) { return r->done; });
      if (!all_done) break;
      Finish(*o.send, absl::OkStatus(), o.send->peer);
      posted.pop_front();
      any = true;
    }
    Inbound& in = inbound_[node];
    if (!in.posted || !in.req.done) continue;
    any = true;
    in.posted = false;
    in.received += in.req.bytes;
    if (in.received < in.total) continue;
    in.active = false;
    in.mr.reset();
    in.scratch.clear();
    if (in.recv != nullptr) {
      Finish(*in.recv, absl::OkStatus(), in.src);
      in.recv = nullptr;
    } else if (!in.discard) {
      Arrival a;
      a.src = in.src;
      a.tag = in.user_tag;
      a.dtype = in.dtype;
      a.bytes = in.total;
      a.held = std::move(in.held);
      in.held.clear();
      const int li = LocalIndex(in.dst);
      (void)MatchArrival(li, std::move(a));
    }
  }
  return any;
}

template <typename F>
void PointToPoint::ForEachPending(F&& f) const {
  for (const auto& q : recvs_) for (const auto& p : q) f(p);
  for (const auto& q : arrivals_) for (const auto& a : q) f(a.local_send);
  for (const auto& q : outbox_) for (const auto& p : q) f(p);
  for (const auto& q : outbound_) for (const auto& o : q) f(o.send);
  for (const auto& in : inbound_) f(in.recv);
}

absl::Time PointToPoint::NextDeadline() const {
  absl::Time t = absl::InfiniteFuture();
  auto see = [&t](const std::shared_ptr<Pending>& p) {
    if (p != nullptr && !p->done) t = std::min(t, p->op->deadline);
  };
  ForEachPending(see);
  return t;
}

void PointToPoint::Expire(absl::Time now) {
  auto late = [now](const std::shared_ptr<Pending>& p) {
    return p != nullptr && !p->done && now >= p->op->deadline;
  };
  auto timed_out = [this](const Pending& p, absl::string_view what) {
    return absl::DeadlineExceededError(absl::StrCat(Describe(p), ": ", what));
  };
  for (auto& q : recvs_) {
    for (auto& p : q) {
      if (!late(p)) continue;
      Finish(*p,
             timed_out(*p, absl::StrCat("no matching send from ",
                                        p->peer < 0 ? "any rank" : absl::StrCat("rank ", p->peer),
                                        " with tag ", p->tag, " arrived by the op's deadline")),
             p->peer);
    }
    q.erase(std::remove_if(q.begin(), q.end(), [](auto& p) { return p->done; }), q.end());
  }
  for (auto& q : arrivals_) {
    for (auto& a : q) {
      if (!late(a.local_send)) continue;
      Finish(*a.local_send,
             timed_out(*a.local_send,
                       absl::StrCat("rank ", a.local_send->peer, " posted no matching recv (from rank ",
                                    a.src, ", tag ", a.tag, ") by the op's deadline")),
             a.local_send->peer);
    }
    q.erase(std::remove_if(q.begin(), q.end(),
                           [](const Arrival& a) { return a.local_send != nullptr && a.local_send->done; }),
            q.end());
  }
  const JobPlacement& place = options_.placement;
  for (size_t node = 0; node < outbox_.size(); ++node) {
    for (auto& p : outbox_[node]) {
      if (!late(p)) continue;
      Finish(*p,
             timed_out(*p, absl::StrCat("not sent by the op's deadline: the messages before it to "
                                        "daemon ", node, " (", place.node_names[node],
                                        ") were still being sent")),
             p->peer);
    }
  }
  // Bytes in motion: the op ends only when nothing touches its buffer.
  for (auto& q : outbound_) {
    for (auto& o : q) {
      if (!late(o.send)) continue;
      FailContext(timed_out(*o.send, absl::StrCat("the message to rank ", o.send->peer,
                                                  " was still being sent at the op's deadline")));
      return;
    }
  }
  for (auto& in : inbound_) {
    if (!late(in.recv)) continue;
    FailContext(timed_out(*in.recv, absl::StrCat("the message from rank ", in.src, " (",
                                                 in.received, " of ", in.total,
                                                 " bytes) was still arriving at the op's deadline")));
    return;
  }
}

void PointToPoint::FailContext(const absl::Status& why, bool quiet) {
  if (ctx_ == nullptr || !ctx_failed_.ok()) return;
  ctx_failed_ = why.ok() ? absl::AbortedError("point-to-point connections closed") : why;
  if (!quiet) {
    GS_LOG(WARNING) << "job '" << options_.job_id << "' epoch " << options_.epoch
                    << ": point-to-point connections failed: " << why.message();
  }
  (void)ctx_->Fail(ctx_failed_);  // tells the other daemons; nothing is touched after this
  FailAll(ctx_failed_, /*remote_only=*/true);
}

void PointToPoint::FailAll(const absl::Status& why, bool remote_only) {
  auto fail = [&](const std::shared_ptr<Pending>& p) {
    if (p == nullptr || p->done) return;
    Finish(*p, absl::Status(why.code(), absl::StrCat(Describe(*p), ": ", why.message())), p->peer);
  };
  for (auto& q : outbox_) {
    for (auto& p : q) fail(p);
    q.clear();
  }
  for (auto& q : outbound_) {
    for (auto& o : q) fail(o.send);
    q.clear();
  }
  for (auto& in : inbound_) {
    fail(in.recv);
    if (in.active && in.recv == nullptr && !in.discard) unexpected_bytes_ -= in.total;
    in = Inbound{};
  }
  for (auto& q : recvs_) {
    for (auto& p : q) {
      if (!remote_only || (p->peer >= 0 && LocalIndex(p->peer) < 0)) fail(p);
    }
    q.erase(std::remove_if(q.begin(), q.end(), [](auto& p) { return p->done; }), q.end());
  }
  if (remote_only) return;
  for (auto& q : arrivals_) {
    for (auto& a : q) fail(a.local_send);
    q.clear();
  }
  unexpected_bytes_ = 0;
}

}  // namespace gradsync
