#include "transport/rdma_context.h"

#include <fcntl.h>
#include <infiniband/verbs.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/status_macros.h"

namespace gradsync::transport {
namespace {

// The clear-to-send entry, 48 bytes little-endian: version (1) = 1, exact
// (1), dtype (1), reserved (1), sequence (4), address (8), capacity (8),
// rkey (4), slot (4), op_seq (8), offset (8).
constexpr size_t kCtsBytes = 48;
constexpr size_t kSlotBytes = 64;  // a receive slot (a CTS fits; immediates use none)
// Tags of the bootstrap exchange on the TCP context (no op has these).
constexpr uint64_t kBootstrapOp = ~0ull - 1;

enum WrKind : uint64_t { kWrCts = 1, kWrWrite = 2, kWrRecv = 3 };
uint64_t WrId(WrKind kind, int peer, uint32_t index) {
  return (uint64_t{kind} << 56) | (uint64_t(peer) << 32) | index;
}

struct Cts {
  uint32_t seq = 0;
  uint64_t addr = 0;
  uint64_t capacity = 0;
  uint32_t rkey = 0;
  bool exact = false;
  MessageTag tag;
};

void PutLe(char* p, uint64_t v, int bytes) {
  for (int i = 0; i < bytes; ++i) p[i] = static_cast<char>(v >> (8 * i));
}
uint64_t GetLe(const char* p, int bytes) {
  uint64_t v = 0;
  for (int i = 0; i < bytes; ++i) v |= uint64_t{static_cast<uint8_t>(p[i])} << (8 * i);
  return v;
}

std::string EncodeCts(const Cts& c) {
  std::string out(kCtsBytes, '\0');
  char* p = out.data();
  p[0] = 1;
  p[1] = c.exact ? 1 : 0;
  p[2] = static_cast<char>(c.tag.dtype);
  PutLe(p + 4, c.seq, 4);
  PutLe(p + 8, c.addr, 8);
  PutLe(p + 16, c.capacity, 8);
  PutLe(p + 24, c.rkey, 4);
  PutLe(p + 28, c.tag.slot, 4);
  PutLe(p + 32, c.tag.op_seq, 8);
  PutLe(p + 40, c.tag.offset, 8);
  return out;
}

absl::StatusOr<Cts> DecodeCts(const char* p, size_t n) {
  if (n != kCtsBytes || p[0] != 1) {
    return absl::DataLossError(absl::StrCat("malformed clear-to-send entry (", n, " bytes, version ",
                                            static_cast<int>(p[0]), ")"));
  }
  Cts c;
  c.exact = p[1] != 0;
  c.tag.dtype = static_cast<uint8_t>(p[2]);
  c.seq = static_cast<uint32_t>(GetLe(p + 4, 4));
  c.addr = GetLe(p + 8, 8);
  c.capacity = GetLe(p + 16, 8);
  c.rkey = static_cast<uint32_t>(GetLe(p + 24, 4));
  c.tag.slot = static_cast<uint32_t>(GetLe(p + 28, 4));
  c.tag.op_seq = GetLe(p + 32, 8);
  c.tag.offset = GetLe(p + 40, 8);
  return c;
}

bool SameTag(const MessageTag& a, const MessageTag& b) {
  return a.op_seq == b.op_seq && a.slot == b.slot && a.dtype == b.dtype && a.offset == b.offset;
}

std::string TagText(const MessageTag& t) {
  return absl::StrCat("op ", t.op_seq, " message ", t.slot, " (offset ", t.offset, ")");
}

size_t PartsOf(size_t len) {
  return len == 0 ? 1 : (len + RdmaContext::kMaxWrite - 1) / RdmaContext::kMaxWrite;
}

// A registration of this context: the verbs region and the context's id.
class RdmaRegion final : public MemoryRegion {
 public:
  RdmaRegion(char* data, size_t size, MemKind kind, uint64_t context_id,
             std::unique_ptr<rdma::MemoryRegion> mr)
      : MemoryRegion(data, size, kind), context_id_(context_id), mr_(std::move(mr)) {}
  uint64_t context_id() const { return context_id_; }
  const rdma::MemoryRegion* mr() const { return mr_.get(); }  // null when empty

 private:
  const uint64_t context_id_;
  std::unique_ptr<rdma::MemoryRegion> mr_;
};

}  // namespace

struct RdmaContext::Peer {
  int rank = 0;
  std::unique_ptr<rdma::QueuePair> qp;
  std::vector<char> slots;  // rq_depth receive slots
  std::unique_ptr<rdma::MemoryRegion> slots_mr;
  int rq_depth = 0;
  int sq_depth = 0;
  int sq_used = 0;  // work requests posted, not yet completed

  struct Send {
    Request* req;
    const rdma::MemoryRegion* mr;  // null for an empty message
    size_t mr_offset;
    size_t len;
    MessageTag tag;
  };
  std::deque<Send> waiting;  // posted, waiting for their CTS (in posting order)
  struct Writing {
    Request* req;
    size_t len;
    int parts;
  };
  std::deque<Writing> writing;  // written, waiting for the completion
  std::deque<Cts> cts_in;       // CTS entries no send has used yet

  struct Recv {
    Request* req;
    size_t capacity;
    bool exact;
    MessageTag tag;
  };
  std::map<uint32_t, Recv> recvs;  // by CTS sequence
  std::deque<std::string> cts_out;  // encoded, waiting for send-queue room
  uint32_t next_seq = 0;
  uint64_t bytes_sent = 0;
  uint64_t bytes_received = 0;
  int sends_posted() const { return static_cast<int>(waiting.size() + writing.size()); }
};

RdmaContext::RdmaContext(const RdmaPort& port, std::unique_ptr<Context> bootstrap,
                         const RdmaContextOptions& options)
    : port_(port),
      options_(options),
      bootstrap_(std::move(bootstrap)),
      rank_(bootstrap_->rank()),
      size_(bootstrap_->size()),
      wake_fd_(eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK)) {}

RdmaContext::~RdmaContext() = default;

absl::StatusOr<std::unique_ptr<RdmaContext>> RdmaContext::Connect(
    const RdmaPort& port, std::unique_ptr<Context> bootstrap, const RdmaContextOptions& options,
    absl::Time deadline) {
  std::unique_ptr<RdmaContext> ctx(new RdmaContext(port, std::move(bootstrap), options));
  absl::Status s = ctx->SetUp(deadline);
  if (!s.ok()) {
    ctx->bootstrap_->Fail(s);  // the peers learn why at once
    return absl::Status(s.code(), absl::StrCat("rank ", ctx->rank_, ": RDMA set-up on ",
                                               port.verbs_context->name(), ": ", s.message()));
  }
  return ctx;
}

absl::Status RdmaContext::SetUp(absl::Time deadline) {
  if (!wake_fd_.valid()) return absl::InternalError("eventfd failed");
  rdma::Context& vc = *port_.verbs_context;
  ASSIGN_OR_RETURN(channel_, rdma::CompletionChannel::Create(vc));
  const int flags = fcntl(channel_->fd(), F_GETFL);
  if (flags < 0 || fcntl(channel_->fd(), F_SETFL, flags | O_NONBLOCK) != 0) {
    return absl::InternalError("cannot make the completion channel non-blocking");
  }
  const int rq_depth = 2 * options_.max_in_flight + 4;
  const int sq_depth = options_.max_in_flight + static_cast<int>(kMaxParts);
  const int peers = std::max(1, size_ - 1);
  ASSIGN_OR_RETURN(cq_, rdma::CompletionQueue::Create(vc, peers * (rq_depth + sq_depth),
                                                      channel_.get()));
  peers_.resize(size_);
  std::string local(size_ * rdma::QpEndpoint::kEncodedSize, '\0');
  for (int r = 0; r < size_; ++r) {
    if (r == rank_) continue;
    auto p = std::make_unique<Peer>();
    p->rank = r;
    p->rq_depth = rq_depth;
    p->sq_depth = sq_depth;
    rdma::QueuePairOptions qo;
    qo.max_send_wr = sq_depth;
    qo.max_recv_wr = rq_depth;
    qo.max_inline_data = options_.max_inline_data;
    ASSIGN_OR_RETURN(p->qp, rdma::QueuePair::Create(*port_.pd, *cq_, *cq_, qo));
    if (p->qp->max_inline_data() < kCtsBytes) {
      return absl::FailedPreconditionError(
          absl::StrCat("the device grants ", p->qp->max_inline_data(),
                       " bytes of inline data; a clear-to-send entry needs ", kCtsBytes));
    }
    p->slots.assign(rq_depth * kSlotBytes, '\0');
    ASSIGN_OR_RETURN(p->slots_mr,
                     rdma::MemoryRegion::Register(*port_.pd, p->slots.data(), p->slots.size()));
    ASSIGN_OR_RETURN(rdma::QpEndpoint e, p->qp->LocalEndpoint(port_.connect));
    const std::string enc = e.Encode();
    std::memcpy(local.data() + r * enc.size(), enc.data(), enc.size());
    peer_of_qpn_[p->qp->qpn()] = r;
    peers_[r] = std::move(p);
  }
  // Endpoints out and in over the bootstrap, then the queue pairs connect
  // and pre-post their receives, then a one-byte "ready" each way, so no CTS
  // reaches a queue pair that cannot take it yet.
  std::string remote(local.size(), '\0');
  std::string ready_out(size_, 'R'), ready_in(size_, '\0');
  auto exchange = [&](std::string& out, std::string& in, size_t each,
                      uint32_t slot) -> absl::Status {
    ASSIGN_OR_RETURN(auto out_mr, bootstrap_->RegisterMemory(out.data(), out.size()));
    ASSIGN_OR_RETURN(auto in_mr, bootstrap_->RegisterMemory(in.data(), in.size()));
    std::vector<Request> reqs(2 * size_);
    MessageTag tag;
    tag.op_seq = kBootstrapOp;
    tag.slot = slot;
    for (int r = 0; r < size_; ++r) {
      if (r == rank_) continue;
      RETURN_IF_ERROR(bootstrap_->PostRecv(r, *in_mr, r * each, each, true, tag, &reqs[2 * r]));
      RETURN_IF_ERROR(
          bootstrap_->PostSend(r, *out_mr, r * each, each, tag, &reqs[2 * r + 1]));
    }
    for (int r = 0; r < size_; ++r) {
      if (r == rank_) continue;
      for (int k = 0; k < 2; ++k) {
        while (!reqs[2 * r + k].done) RETURN_IF_ERROR(bootstrap_->Progress(deadline));
      }
    }
    return absl::OkStatus();
  };
  RETURN_IF_ERROR(exchange(local, remote, rdma::QpEndpoint::kEncodedSize, 0));
  for (int r = 0; r < size_; ++r) {
    if (r == rank_) continue;
    Peer& p = *peers_[r];
    const size_t n = rdma::QpEndpoint::kEncodedSize;
    ASSIGN_OR_RETURN(rdma::QpEndpoint mine,
                     rdma::QpEndpoint::Decode(absl::string_view(local.data() + r * n, n)));
    absl::StatusOr<rdma::QpEndpoint> theirs =
        rdma::QpEndpoint::Decode(absl::string_view(remote.data() + r * n, n));
    if (!theirs.ok()) {
      return absl::DataLossError(absl::StrCat("rank ", r, " sent a bad endpoint: ",
                                              theirs.status().message()));
    }
    absl::Status s = p.qp->Connect(mine, *theirs, port_.connect);
    if (!s.ok()) {
      return absl::Status(s.code(), absl::StrCat("connecting to rank ", r, ": ", s.message()));
    }
    for (int i = 0; i < p.rq_depth; ++i) {
      RETURN_IF_ERROR(p.qp->PostRecv(*p.slots_mr, i * kSlotBytes, kSlotBytes,
                                     WrId(kWrRecv, r, static_cast<uint32_t>(i))));
    }
  }
  return exchange(ready_out, ready_in, 1, 1);
}

absl::StatusOr<std::unique_ptr<MemoryRegion>> RdmaContext::RegisterMemory(void* data, size_t size,
                                                                         MemKind kind) {
  if (kind.type == MemKind::kCuda && !port_.cuda_memory) {
    return absl::FailedPreconditionError(absl::StrCat(
        "the RDMA device ", port_.verbs_context->name(), " cannot register ", kind.ToString(),
        " memory: GPUDirect RDMA is not available (device buffers are staged through host "
        "memory)"));
  }
  std::unique_ptr<rdma::MemoryRegion> mr;
  if (data != nullptr && size > 0) {
    ASSIGN_OR_RETURN(mr, rdma::MemoryRegion::Register(*port_.pd, data, size));
  }
  return std::unique_ptr<MemoryRegion>(
      new RdmaRegion(static_cast<char*>(data), size, kind, id(), std::move(mr)));
}

absl::StatusOr<RdmaContext::Peer*> RdmaContext::PeerFor(int peer, const char* what) {
  if (peer < 0 || peer >= size_ || peer == rank_) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, ": rank ", peer, " is not a peer of rank ", rank_, " (world ", size_,
                     ")"));
  }
  return peers_[peer].get();
}

namespace {
absl::StatusOr<const RdmaRegion*> CheckRegion(const MemoryRegion& mr, uint64_t context_id,
                                              size_t offset, size_t len, const char* what) {
  const auto* reg = dynamic_cast<const RdmaRegion*>(&mr.registered());
  if (reg == nullptr || reg->context_id() != context_id) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, ": the memory is not registered with this RDMA context"));
  }
  if (offset > mr.size() || len > mr.size() - offset) {
    return absl::InvalidArgumentError(absl::StrCat(what, ": [", offset, ", +", len,
                                                   ") is outside the ", mr.size(),
                                                   "-byte region"));
  }
  return reg;
}
}  // namespace

absl::Status RdmaContext::PostSend(int peer, const MemoryRegion& mr, size_t offset, size_t len,
                                   const MessageTag& tag, Request* req) {
  ASSIGN_OR_RETURN(Peer * p, PeerFor(peer, "send"));
  ASSIGN_OR_RETURN(const RdmaRegion* reg, CheckRegion(mr, id(), offset, len, "send"));
  RETURN_IF_ERROR(status_);
  if (PartsOf(len) > kMaxParts) {
    return absl::InvalidArgumentError(absl::StrCat("send of ", len, " bytes exceeds the ",
                                                   kMaxParts, " GiB an RDMA message carries"));
  }
  if (p->sends_posted() >= options_.max_in_flight) {
    return absl::ResourceExhaustedError(
        absl::StrCat(options_.max_in_flight, " sends to rank ", peer, " are in flight"));
  }
  req->done = false;
  req->bytes = 0;
  const size_t mr_offset = (mr.data() - reg->data()) + offset;
  p->waiting.push_back(Peer::Send{req, reg->mr(), mr_offset, len, tag});
  return PumpPeer(*p);
}

absl::Status RdmaContext::PostRecv(int peer, const MemoryRegion& mr, size_t offset,
                                   size_t capacity, bool exact, const MessageTag& tag,
                                   Request* req) {
  ASSIGN_OR_RETURN(Peer * p, PeerFor(peer, "receive"));
  ASSIGN_OR_RETURN(const RdmaRegion* reg, CheckRegion(mr, id(), offset, capacity, "receive"));
  RETURN_IF_ERROR(status_);
  if (bootstrap_->PeerClosed(peer)) {
    return absl::UnavailableError(absl::StrCat("rank ", peer, " left the job"));
  }
  if (static_cast<int>(p->recvs.size()) >= options_.max_in_flight) {
    return absl::ResourceExhaustedError(
        absl::StrCat(options_.max_in_flight, " receives from rank ", peer, " are in flight"));
  }
  req->done = false;
  req->bytes = 0;
  Cts c;
  c.seq = p->next_seq;
  p->next_seq = (p->next_seq + 1) & 0xffffff;
  c.addr = reinterpret_cast<uintptr_t>(mr.data() + offset);
  c.capacity = capacity;
  c.rkey = reg->mr() != nullptr ? reg->mr()->rkey() : 0;
  c.exact = exact;
  c.tag = tag;
  p->recvs[c.seq] = Peer::Recv{req, capacity, exact, tag};
  p->cts_out.push_back(EncodeCts(c));
  return PumpPeer(*p);
}

// Posts what the send queue has room for: CTS entries first, then the head
// sends whose CTS arrived.
absl::Status RdmaContext::PumpPeer(Peer& p) {
  while (!p.cts_out.empty()) {
    if (p.sq_used >= p.sq_depth) {
      ++counters_.send_queue_waits;
      break;
    }
    const std::string& c = p.cts_out.front();
    absl::Status s = p.qp->PostSendInline(c.data(), c.size(), WrId(kWrCts, p.rank, 0), true);
    if (!s.ok()) return FailWith(s, PeerFault{PeerFault::kLost, p.rank, true, s.ToString()});
    ++p.sq_used;
    ++counters_.cts_sent;
    p.cts_out.pop_front();
  }
  while (!p.waiting.empty()) {
    Peer::Send& send = p.waiting.front();
    auto cts = std::find_if(p.cts_in.begin(), p.cts_in.end(),
                            [&](const Cts& c) { return SameTag(c.tag, send.tag); });
    if (cts == p.cts_in.end()) break;
    if (send.len > cts->capacity || (cts->exact && send.len != cts->capacity)) {
      return FailWith(
          absl::DataLossError(absl::StrCat(
              "rank ", p.rank, " takes ", cts->exact ? "exactly " : "at most ", cts->capacity,
              " bytes for ", TagText(send.tag), "; rank ", rank_, " sends ", send.len)),
          PeerFault{PeerFault::kProtocol, p.rank, true, "message size mismatch"});
    }
    const int parts = static_cast<int>(PartsOf(send.len));
    if (p.sq_used + parts > p.sq_depth) {
      ++counters_.send_queue_waits;
      break;
    }
    const rdma::RemoteMemory remote{cts->addr, cts->capacity, cts->rkey};
    const rdma::MemoryRegion& src = send.mr != nullptr ? *send.mr : *p.slots_mr;
    const size_t src_offset = send.mr != nullptr ? send.mr_offset : 0;
    for (int i = 0; i < parts; ++i) {
      const size_t off = static_cast<size_t>(i) * kMaxWrite;
      const size_t n = std::min(kMaxWrite, send.len - off);
      const bool last = i == parts - 1;
      const uint32_t imm = cts->seq | (static_cast<uint32_t>(parts - 1) << 24);
      absl::Status s = p.qp->PostWrite(src, src_offset + off, n, remote, off,
                                       WrId(kWrWrite, p.rank, 0), last, last ? &imm : nullptr);
      if (!s.ok()) {
        return FailWith(s, PeerFault{PeerFault::kLost, p.rank, true, s.ToString()});
      }
      ++counters_.writes;
    }
    p.sq_used += parts;
    p.writing.push_back(Peer::Writing{send.req, send.len, parts});
    p.cts_in.erase(cts);
    p.waiting.pop_front();
  }
  return absl::OkStatus();
}

absl::Status RdmaContext::OnCompletion(const rdma::WorkCompletion& wc, bool* completed) {
  const WrKind kind = static_cast<WrKind>(wc.wr_id >> 56);
  const int peer = static_cast<int>((wc.wr_id >> 32) & 0xffffff);
  if (peer < 0 || peer >= size_ || peers_[peer] == nullptr) {
    return FailWith(absl::InternalError(absl::StrCat("completion for unknown work request ",
                                                     wc.wr_id)),
                    {});
  }
  Peer& p = *peers_[peer];
  if (!wc.ok) {
    // The peer's own account (an ABORT, or its closed connection) is the
    // better one when there is one.
    if (!CheckBootstrap().ok()) return status_;
    const bool sending = kind != kWrRecv;
    const std::string cause = absl::StrCat(wc.status_text, " (verbs status ", wc.status, ")");
    return FailWith(absl::UnavailableError(absl::StrCat("RDMA connection to rank ", peer,
                                                        " failed while ",
                                                        sending ? "sending" : "receiving", ": ",
                                                        cause)),
                    PeerFault{PeerFault::kLost, peer, sending, cause});
  }
  switch (kind) {
    case kWrCts:
      --p.sq_used;
      return PumpPeer(p);
    case kWrWrite: {
      if (p.writing.empty()) {
        return FailWith(absl::InternalError("write completion without a write"), {});
      }
      const Peer::Writing w = p.writing.front();
      p.writing.pop_front();
      p.sq_used -= w.parts;
      w.req->bytes = w.len;
      w.req->done = true;
      p.bytes_sent += w.len;
      ++counters_.messages_sent;
      *completed = true;
      return PumpPeer(p);
    }
    case kWrRecv: {
      const uint32_t slot = static_cast<uint32_t>(wc.wr_id & 0xffffffff);
      if (wc.opcode == IBV_WC_RECV_RDMA_WITH_IMM) {
        const uint32_t seq = wc.imm_data & 0xffffff;
        const size_t parts = (wc.imm_data >> 24) + 1;
        auto it = p.recvs.find(seq);
        const size_t len = (parts - 1) * kMaxWrite + wc.byte_len;
        if (it == p.recvs.end() || len > it->second.capacity ||
            (it->second.exact && len != it->second.capacity)) {
          return FailWith(
              absl::DataLossError(absl::StrCat("rank ", peer, " wrote ", len,
                                               " bytes for clear-to-send ", seq,
                                               it == p.recvs.end() ? ", which was never sent"
                                                                   : ", which does not fit")),
              PeerFault{PeerFault::kProtocol, peer, false, "unexpected write"});
        }
        it->second.req->bytes = len;
        it->second.req->done = true;
        p.bytes_received += len;
        ++counters_.messages_received;
        p.recvs.erase(it);
        *completed = true;
      } else {
        ASSIGN_OR_RETURN(Cts c, DecodeCts(p.slots.data() + slot * kSlotBytes, wc.byte_len));
        p.cts_in.push_back(c);
        ++counters_.cts_received;
      }
      absl::Status s = p.qp->PostRecv(*p.slots_mr, slot * kSlotBytes, kSlotBytes, wc.wr_id);
      if (!s.ok()) return FailWith(s, PeerFault{PeerFault::kLost, peer, false, s.ToString()});
      return PumpPeer(p);
    }
  }
  return FailWith(absl::InternalError(absl::StrCat("bad work request id ", wc.wr_id)), {});
}

absl::Status RdmaContext::Drain(bool* completed) {
  while (true) {
    wcs_.clear();
    absl::StatusOr<int> n = cq_->Poll(64, &wcs_);
    if (!n.ok()) {
      return FailWith(absl::UnavailableError(absl::StrCat(
                          "RDMA completion queue failed (overrun?): ", n.status().message())),
                      {});
    }
    for (const rdma::WorkCompletion& wc : wcs_) {
      RETURN_IF_ERROR(OnCompletion(wc, completed));
    }
    if (*n < 64) return absl::OkStatus();
  }
}

absl::Status RdmaContext::CheckBootstrap() {
  absl::Status s = bootstrap_->Progress(absl::Now());
  if (s.ok() || absl::IsDeadlineExceeded(s)) return CheckPeersLeft();
  if (status_.ok()) status_ = s;  // the bootstrap has told the other peers
  return status_;
}

absl::Status RdmaContext::CheckPeersLeft() {
  for (const auto& p : peers_) {
    if (p == nullptr || !bootstrap_->PeerClosed(p->rank)) continue;
    if (p->recvs.empty() && p->waiting.empty() && p->writing.empty()) continue;
    const std::string cause = "closed its connections while this rank waited on it";
    return FailWith(absl::UnavailableError(absl::StrCat("connection to rank ", p->rank,
                                                        " lost: ", cause)),
                    PeerFault{PeerFault::kLost, p->rank, !p->writing.empty(), cause});
  }
  return absl::OkStatus();
}

absl::Status RdmaContext::Progress(absl::Time deadline) {
  bool completed = false;
  while (true) {
    RETURN_IF_ERROR(status_);
    if (aborted_.load()) {
      absl::Status reason;
      {
        absl::MutexLock l(&abort_mu_);
        reason = abort_reason_;
      }
      return FailWith(reason, {});
    }
    RETURN_IF_ERROR(Drain(&completed));
    if (completed) return absl::OkStatus();
    if (interrupted_.exchange(false)) return absl::DeadlineExceededError("interrupted");
    RETURN_IF_ERROR(CheckBootstrap());
    const absl::Time now = absl::Now();
    if (now >= deadline) {
      return absl::DeadlineExceededError(absl::StrCat("rank ", rank_, ": RDMA progress deadline"));
    }
    // Arm, then look once more: a completion between the poll and the arm
    // would not wake the channel.
    absl::Status s = cq_->RequestNotify();
    if (!s.ok()) return FailWith(s, {});
    RETURN_IF_ERROR(Drain(&completed));
    if (completed) return absl::OkStatus();
    // Sleep on the channel and the wake-up eventfd; at most 2 ms, so the
    // bootstrap connections (a peer's ABORT or close) are looked at often.
    const absl::Duration wait = std::min(deadline - now, absl::Milliseconds(2));
    pollfd fds[2] = {{channel_->fd(), POLLIN, 0}, {wake_fd_.get(), POLLIN, 0}};
    const int ms = static_cast<int>(absl::ToInt64Milliseconds(wait + absl::Microseconds(999)));
    if (::poll(fds, 2, ms) > 0) {
      if (fds[0].revents & POLLIN) {
        s = channel_->TakeEvents();
        if (!s.ok()) return FailWith(s, {});
      }
      if (fds[1].revents & POLLIN) {
        uint64_t v;
        (void)!::read(wake_fd_.get(), &v, sizeof(v));
      }
    }
  }
}

void RdmaContext::Abort(const absl::Status& reason) {
  {
    absl::MutexLock l(&abort_mu_);
    if (abort_reason_.ok()) {
      abort_reason_ = reason.ok() ? absl::AbortedError("aborted") : reason;
    }
  }
  aborted_.store(true);
  const uint64_t one = 1;
  (void)!::write(wake_fd_.get(), &one, sizeof(one));
}

void RdmaContext::Interrupt() {
  interrupted_.store(true);
  const uint64_t one = 1;
  (void)!::write(wake_fd_.get(), &one, sizeof(one));
}

absl::Status RdmaContext::Fail(const absl::Status& reason) { return FailWith(reason, {}); }

absl::Status RdmaContext::FailWith(const absl::Status& reason, const PeerFault& fault) {
  if (!status_.ok()) return status_;
  status_ = reason.ok() ? absl::InternalError("failed without a reason") : reason;
  if (fault.kind != PeerFault::kNone) {
    fault_ = fault;
    own_fault_ = true;
  }
  bootstrap_->Fail(status_);  // ABORT to every peer, with the reason
  return status_;
}

PeerFault RdmaContext::fault() const { return own_fault_ ? fault_ : bootstrap_->fault(); }

uint64_t RdmaContext::BytesSentTo(int peer) const {
  return peer >= 0 && peer < size_ && peers_[peer] ? peers_[peer]->bytes_sent : 0;
}
uint64_t RdmaContext::BytesReceivedFrom(int peer) const {
  return peer >= 0 && peer < size_ && peers_[peer] ? peers_[peer]->bytes_received : 0;
}

}  // namespace gradsync::transport
