// The emulated wire: delivery of work requests, completions, errors.
#include <arpa/inet.h>
#include <endian.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "common/logging.h"
#include "rdma/verbs_emulation_fabric.h"

namespace gradsync::rdma {

void VerbsEmulation::Fabric::PumpLocked(absl::Time now) {
  bool progressed = true;
  while (progressed) {
    progressed = false;
    for (auto& [qpn, q] : qps_) {
      while (!q->sq.empty() && q->qp.state == IBV_QPS_RTS) {
        PendingWr& p = q->sq.front();
        if (p.due == absl::InfiniteFuture()) {  // dropped: retries exhausted
          Fail(q, IBV_WC_RETRY_EXC_ERR);
          break;
        }
        if (p.due > now) break;
        if (!Deliver(q, p)) break;  // receiver not ready: wait
        progressed = true;
      }
      if (!q->inbound.empty() && PumpInbound(q)) progressed = true;
    }
  }
}

bool VerbsEmulation::Fabric::Gather(EmuQp* q, const PendingWr& p, std::string* data) {
  if (p.is_inline) {
    *data = p.inline_data;
    return true;
  }
  data->clear();
  for (const ibv_sge& s : p.sges) {
    if (Find(s.lkey, q->pd, s.addr, s.length, 0, /*remote=*/false) == nullptr) return false;
    data->append(reinterpret_cast<const char*>(s.addr), s.length);
  }
  return true;
}

bool VerbsEmulation::Fabric::Deliver(EmuQp* q, PendingWr& p) {
  std::string data;
  if (!Gather(q, p, &data)) {
    Fail(q, IBV_WC_LOC_PROT_ERR);
    return true;
  }
  const int node = PeerNode(q);
  if (link_ != nullptr && node != node_) {
    // The wire: the peer's process lands it and answers (verbs_emulation_remote.cc).
    SendRemote(q, p, data);
    q->remote_node = node;
    q->inflight.push_back(std::move(p));
    q->sq.pop_front();
    return true;
  }
  ibv_wc_status st;
  if (!Land(Remote(q), p.opcode, data, p.remote_addr, p.rkey, p.imm, q->rnr_retry, &st)) {
    if (!p.waited) ++stats_.rnr_waits;
    p.waited = true;
    return false;
  }
  CompleteSend(q, p, st);
  q->sq.pop_front();
  if (st != IBV_WC_SUCCESS) ToError(q);
  return true;
}

bool VerbsEmulation::Fabric::Land(EmuQp* r, ibv_wr_opcode opcode, const std::string& data,
                                  uint64_t remote_addr, uint32_t rkey, uint32_t imm,
                                  uint8_t rnr_retry, ibv_wc_status* status) {
  if (r == nullptr || r->qp.state == IBV_QPS_ERR || r->qp.state == IBV_QPS_RESET) {
    *status = IBV_WC_RETRY_EXC_ERR;
    return true;
  }
  const bool needs_recv = opcode != IBV_WR_RDMA_WRITE;
  if (needs_recv && r->rq.empty()) {
    if (r->qp.state != IBV_QPS_RTR && r->qp.state != IBV_QPS_RTS) return false;
    if (rnr_retry < 7) {
      *status = IBV_WC_RNR_RETRY_EXC_ERR;
      return true;
    }
    return false;
  }
  ibv_wc rwc;
  std::memset(&rwc, 0, sizeof(rwc));
  if (opcode == IBV_WR_SEND) {
    ibv_recv_wr& rw = r->rq.front();
    size_t room = 0;
    for (int i = 0; i < rw.num_sge; ++i) room += rw.sg_list[i].length;
    if (room < data.size()) {
      Complete(r, RecvEntry(r, rw.wr_id, IBV_WC_LOC_LEN_ERR, IBV_WC_RECV, 0));
      PopRecv(r);
      ToError(r);
      *status = IBV_WC_REM_INV_REQ_ERR;
      return true;
    }
    size_t off = 0;
    for (int i = 0; i < rw.num_sge && off < data.size(); ++i) {
      const ibv_sge& s = rw.sg_list[i];
      const size_t n = std::min<size_t>(s.length, data.size() - off);
      if (Find(s.lkey, r->pd, s.addr, n, IBV_ACCESS_LOCAL_WRITE, false) == nullptr) {
        Complete(r, RecvEntry(r, rw.wr_id, IBV_WC_LOC_PROT_ERR, IBV_WC_RECV, 0));
        PopRecv(r);
        ToError(r);
        *status = IBV_WC_REM_OP_ERR;
        return true;
      }
      std::memcpy(reinterpret_cast<void*>(s.addr), data.data() + off, n);
      off += n;
    }
    rwc = RecvEntry(r, rw.wr_id, IBV_WC_SUCCESS, IBV_WC_RECV, data.size());
    ++stats_.sends;
    stats_.send_bytes += data.size();
  } else {
    if (!data.empty() &&
        Find(rkey, r->pd, remote_addr, data.size(), IBV_ACCESS_REMOTE_WRITE, true) == nullptr) {
      ToError(r);
      *status = IBV_WC_REM_ACCESS_ERR;
      return true;
    }
    if (!data.empty()) std::memcpy(reinterpret_cast<void*>(remote_addr), data.data(), data.size());
    ++stats_.writes;
    stats_.write_bytes += data.size();
    if (opcode == IBV_WR_RDMA_WRITE_WITH_IMM) {
      rwc =
          RecvEntry(r, r->rq.front().wr_id, IBV_WC_SUCCESS, IBV_WC_RECV_RDMA_WITH_IMM, data.size());
      rwc.wc_flags = IBV_WC_WITH_IMM;
      rwc.imm_data = imm;
    }
  }
  if (needs_recv) {
    PopRecv(r);
    Complete(r, rwc);
  }
  *status = IBV_WC_SUCCESS;
  return true;
}

void VerbsEmulation::Fabric::CompleteSend(EmuQp* q, const PendingWr& p, ibv_wc_status st) {
  if (st == IBV_WC_SUCCESS && !p.signaled) {
    ++q->unsignaled_run;
    return;
  }
  CqEntry e;
  std::memset(&e.wc, 0, sizeof(e.wc));
  e.wc.wr_id = p.wr_id;
  e.wc.status = st;
  if (st == IBV_WC_SUCCESS) e.wc.opcode = p.opcode == IBV_WR_SEND ? IBV_WC_SEND : IBV_WC_RDMA_WRITE;
  e.wc.qp_num = q->qp.qp_num;
  e.sq_owner = q;
  e.covers = q->unsignaled_run + 1;
  q->unsignaled_run = 0;
  Push(Of<EmuCq>(q->qp.send_cq), e);
}

ibv_wc VerbsEmulation::Fabric::RecvEntry(EmuQp* r, uint64_t wr_id, ibv_wc_status st,
                                         ibv_wc_opcode op, size_t len) {
  ibv_wc wc;
  std::memset(&wc, 0, sizeof(wc));
  wc.wr_id = wr_id;
  wc.status = st;
  wc.opcode = op;
  wc.byte_len = static_cast<uint32_t>(len);
  wc.qp_num = r->qp.qp_num;
  return wc;
}

const EmuMr* VerbsEmulation::Fabric::Find(uint32_t key, EmuPd* pd, uint64_t addr, size_t len,
                                          int access, bool remote) const {
  auto it = mrs_.find(key);
  if (it == mrs_.end()) return nullptr;
  const EmuMr* m = it->second;
  if (Of<EmuPd>(m->mr.pd) != pd) return nullptr;
  if ((remote ? m->mr.rkey : m->mr.lkey) != key) return nullptr;
  if ((m->access & access) != access) return nullptr;
  const uint64_t base = reinterpret_cast<uintptr_t>(m->mr.addr);
  if (addr < base || len > m->mr.length || addr - base > m->mr.length - len) return nullptr;
  return m;
}

void VerbsEmulation::Fabric::Complete(EmuQp* r, const ibv_wc& wc) {
  CqEntry e;
  e.wc = wc;
  Push(Of<EmuCq>(r->qp.recv_cq), e);
}

void VerbsEmulation::Fabric::PopRecv(EmuQp* r) {
  r->rq.pop_front();
  r->rq_sges.pop_front();
}

int VerbsEmulation::Fabric::PeerNode(const EmuQp* q) const {
  if (q->global) return (q->dgid.raw[13] << 8) | q->dgid.raw[14];
  return NodeOfLid(q->dlid);
}

bool VerbsEmulation::Fabric::Reaches(const EmuQp* r, uint16_t dlid, bool global,
                                     const ibv_gid& dgid) {
  const EmuDevice* d = Of<EmuContext>(r->qp.context)->device;
  if (!global) return d->lid == dlid;
  for (const ibv_gid_entry& g : d->gids) {
    if (std::memcmp(g.gid.raw, dgid.raw, 16) == 0) return true;
  }
  return false;
}

EmuQp* VerbsEmulation::Fabric::Remote(EmuQp* q) {
  auto it = qps_.find(q->dest_qpn);
  if (it == qps_.end()) return nullptr;
  return Reaches(it->second, q->dlid, q->global, q->dgid) ? it->second : nullptr;
}

void VerbsEmulation::Fabric::Push(EmuCq* cq, const CqEntry& e) {
  if (cq->entries.size() >= cq->capacity) {
    cq->overrun = true;  // the entry is lost; the CQ and its QPs are in error
    for (auto& [qpn, q] : qps_) {
      if (q->qp.send_cq == &cq->cq || q->qp.recv_cq == &cq->cq) q->qp.state = IBV_QPS_ERR;
    }
  } else {
    cq->entries.push_back(e);
  }
  if (cq->armed && cq->channel != nullptr) {
    cq->armed = false;
    cq->channel->events.push_back(&cq->cq);
    const uint64_t one = 1;
    if (::write(cq->channel->ch.fd, &one, sizeof(one)) != sizeof(one)) {
      GS_LOG(WARNING) << "verbs emulation: completion channel write failed";
    }
  }
}

void VerbsEmulation::Fabric::Fail(EmuQp* q, ibv_wc_status st) {
  CompleteSend(q, q->sq.front(), st);
  q->sq.pop_front();
  ToError(q);
}

void VerbsEmulation::Fabric::ToError(EmuQp* q) {
  q->qp.state = IBV_QPS_ERR;
  Flush(q);
}

void VerbsEmulation::Fabric::Flush(EmuQp* q) {
  for (std::deque<PendingWr>* d : {&q->inflight, &q->sq}) {
    while (!d->empty()) {
      CompleteSend(q, d->front(), IBV_WC_WR_FLUSH_ERR);
      d->pop_front();
    }
  }
  while (!q->rq.empty()) {
    Complete(q, RecvEntry(q, q->rq.front().wr_id, IBV_WC_WR_FLUSH_ERR, IBV_WC_RECV, 0));
    PopRecv(q);
  }
}

void VerbsEmulation::Fabric::TimerLoop() {
  std::unique_lock<std::mutex> l(mu_);
  while (!stop_) {
    absl::Time next = absl::InfiniteFuture();
    for (auto& [qpn, q] : qps_) {
      if (!q->sq.empty() && q->sq.front().due < next) next = q->sq.front().due;
    }
    if (next == absl::InfiniteFuture()) {
      cv_.wait(l);
    } else {
      cv_.wait_for(l,
                   absl::ToChronoNanoseconds(std::max(next - absl::Now(), absl::ZeroDuration())));
    }
    if (!stop_) PumpLocked(absl::Now());
  }
}
}  // namespace gradsync::rdma
