#include "transport/rdma_context.h"

#include <infiniband/verbs.h>
#include <poll.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/status_macros.h"
#include "transport/rdma_context_internal.h"

namespace gradsync::transport {

using rdma_control::Entry;
using rdma_control::Kind;
using rdma_control::WrId;
using rdma_internal::PartsOf;
using rdma_internal::RdmaRegion;
using rdma_internal::SameTag;
using rdma_internal::TagText;

absl::StatusOr<RdmaContext::Peer*> RdmaContext::PeerFor(int peer, const char* what) {
  if (peer < 0 || peer >= size_ || peer == rank_) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, ": rank ", peer, " is not a peer of ", SelfName(), " (", size_,
                     " peers)"));
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
        absl::StrCat(options_.max_in_flight, " sends to ", PeerName(peer), " are in flight"));
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
    return absl::UnavailableError(absl::StrCat(PeerName(peer), " left the job"));
  }
  if (static_cast<int>(p->recvs.size()) >= options_.max_in_flight) {
    return absl::ResourceExhaustedError(
        absl::StrCat(options_.max_in_flight, " receives from ", PeerName(peer), " are in flight"));
  }
  req->done = false;
  req->bytes = 0;
  // A message the peer announced (RTS) is taken by this receive.
  auto announced = std::find_if(p->unexpected.begin(), p->unexpected.end(),
                                [&](const Incoming& in) { return SameTag(in.tag, tag); });
  if (announced != p->unexpected.end()) p->unexpected.erase(announced);
  Entry c;
  c.kind = Kind::kCts;
  c.seq = p->next_seq;
  p->next_seq = (p->next_seq + 1) & 0xffffff;
  c.addr = reinterpret_cast<uintptr_t>(mr.data() + offset);
  c.capacity = capacity;
  c.rkey = reg->mr() != nullptr ? reg->mr()->rkey() : 0;
  c.exact = exact;
  c.tag = tag;
  p->recvs[c.seq] = Peer::Recv{req, capacity, exact, tag};
  p->control_out.push_back(rdma_control::Encode(c));
  return PumpPeer(*p);
}

bool RdmaContext::Probe(int peer, Incoming* in) {
  if (!options_.report_unexpected || peer < 0 || peer >= size_ || peers_[peer] == nullptr ||
      peers_[peer]->unexpected.empty()) {
    return false;
  }
  *in = peers_[peer]->unexpected.front();
  return true;
}

absl::Status RdmaContext::PostAbort(int peer, uint64_t op_seq, const absl::Status& why,
                                    Request* req) {
  RETURN_IF_ERROR(status_);
  // Over the bootstrap connection, where the peer reads ABORTs.
  return bootstrap_->PostAbort(peer, op_seq, why, req);
}

// Posts what the send queue has room for: control entries first (CTS, and
// RTS for sends not yet announced), then the head sends whose CTS arrived.
absl::Status RdmaContext::PumpPeer(Peer& p) {
  if (options_.announce_sends) {
    for (Peer::Send& send : p.waiting) {
      if (send.announced) continue;
      Entry rts;
      rts.kind = Kind::kRts;
      rts.capacity = send.len;
      rts.tag = send.tag;
      p.control_out.push_back(rdma_control::Encode(rts));
      send.announced = true;
      ++counters_.rts_sent;
    }
  }
  while (!p.control_out.empty()) {
    if (p.sq_used >= p.sq_depth) {
      ++counters_.send_queue_waits;
      break;
    }
    const std::string& c = p.control_out.front();
    absl::Status s = p.qp->PostSendInline(c.data(), c.size(),
                                          WrId(rdma_control::kWrControl, p.rank, 0), true);
    if (!s.ok()) return FailWith(s, PeerFault{PeerFault::kLost, p.rank, true, s.ToString()});
    ++p.sq_used;
    ++counters_.control_sent;
    p.control_out.pop_front();
  }
  // A send's RTS is posted before its data (the receiver knows of it first).
  if (!p.control_out.empty() && options_.announce_sends) return absl::OkStatus();
  while (!p.waiting.empty()) {
    Peer::Send& send = p.waiting.front();
    auto cts = std::find_if(p.cts_in.begin(), p.cts_in.end(),
                            [&](const Entry& c) { return SameTag(c.tag, send.tag); });
    if (cts == p.cts_in.end()) break;
    if (send.len > cts->capacity || (cts->exact && send.len != cts->capacity)) {
      return FailWith(
          absl::DataLossError(absl::StrCat(
              PeerName(p.rank), " takes ", cts->exact ? "exactly " : "at most ", cts->capacity,
              " bytes for ", TagText(send.tag), "; ", SelfName(), " sends ", send.len)),
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
                                       WrId(rdma_control::kWrWrite, p.rank, 0), last,
                                       last ? &imm : nullptr);
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
  const auto kind = static_cast<rdma_control::WrKind>(wc.wr_id >> 56);
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
    const bool sending = kind != rdma_control::kWrRecv;
    const std::string cause = absl::StrCat(wc.status_text, " (verbs status ", wc.status, ")");
    return FailWith(absl::UnavailableError(absl::StrCat("RDMA connection to ", PeerName(peer),
                                                        " failed while ",
                                                        sending ? "sending" : "receiving", ": ",
                                                        cause)),
                    PeerFault{PeerFault::kLost, peer, sending, cause});
  }
  switch (kind) {
    case rdma_control::kWrControl:
      --p.sq_used;
      return PumpPeer(p);
    case rdma_control::kWrWrite: {
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
    case rdma_control::kWrRecv: {
      const uint32_t slot = static_cast<uint32_t>(wc.wr_id & 0xffffffff);
      if (wc.opcode == IBV_WC_RECV_RDMA_WITH_IMM) {
        const uint32_t seq = wc.imm_data & 0xffffff;
        const size_t parts = (wc.imm_data >> 24) + 1;
        auto it = p.recvs.find(seq);
        const size_t len = (parts - 1) * kMaxWrite + wc.byte_len;
        if (it == p.recvs.end() || len > it->second.capacity ||
            (it->second.exact && len != it->second.capacity)) {
          return FailWith(
              absl::DataLossError(absl::StrCat(PeerName(peer), " wrote ", len,
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
        absl::StatusOr<Entry> e =
            rdma_control::Decode(p.slots.data() + slot * rdma_control::kSlotBytes, wc.byte_len);
        if (!e.ok()) {
          return FailWith(absl::DataLossError(absl::StrCat(PeerName(peer), " sent a ",
                                                           e.status().message())),
                          PeerFault{PeerFault::kProtocol, peer, false, "bad control entry"});
        }
        if (e->kind == Kind::kCts) {
          p.cts_in.push_back(*e);
          ++counters_.cts_received;
        } else {
          RETURN_IF_ERROR(OnAnnounced(p, *e, completed));
        }
      }
      absl::Status s = p.qp->PostRecv(*p.slots_mr, slot * rdma_control::kSlotBytes,
                                      rdma_control::kSlotBytes, wc.wr_id);
      if (!s.ok()) return FailWith(s, PeerFault{PeerFault::kLost, peer, false, s.ToString()});
      return PumpPeer(p);
    }
  }
  return FailWith(absl::InternalError(absl::StrCat("bad work request id ", wc.wr_id)), {});
}

absl::Status RdmaContext::OnAnnounced(Peer& p, const Entry& rts, bool* completed) {
  ++counters_.rts_received;
  if (!options_.report_unexpected) {
    return FailWith(absl::DataLossError(absl::StrCat(PeerName(p.rank), " announced ",
                                                     TagText(rts.tag),
                                                     ", but this context takes no announcements")),
                    PeerFault{PeerFault::kProtocol, p.rank, false, "unexpected announcement"});
  }
  for (const auto& [seq, r] : p.recvs) {
    if (SameTag(r.tag, rts.tag)) return absl::OkStatus();  // already posted: its CTS is out
  }
  if (p.unexpected.size() >= static_cast<size_t>(options_.max_in_flight)) {
    return FailWith(absl::ResourceExhaustedError(absl::StrCat(
                        PeerName(p.rank), " announced more than ", options_.max_in_flight,
                        " messages no receive is posted for")),
                    PeerFault{PeerFault::kProtocol, p.rank, false, "too many announcements"});
  }
  p.unexpected.push_back(Incoming{rts.tag, static_cast<size_t>(rts.capacity)});
  *completed = true;  // a server's Progress returns: it probes and posts the receive
  return absl::OkStatus();
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

absl::Status RdmaContext::CheckPeers() {
  if (!status_.ok() || aborted_.load()) return status_;  // Abort() is told by Progress
  absl::Status s = bootstrap_->CheckPeers();
  if (!s.ok() && status_.ok()) status_ = s;  // the bootstrap has told the other peers
  return status_;
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
      return absl::DeadlineExceededError(absl::StrCat(SelfName(), ": RDMA progress deadline"));
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
  (void)bootstrap_->Fail(status_);  // ABORT to every peer, with the reason
  return status_;
}

}  // namespace gradsync::transport
