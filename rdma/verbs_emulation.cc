#include "rdma/verbs_emulation.h"

#include <arpa/inet.h>
#include <endian.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <cerrno>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <map>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/logging.h"

namespace gradsync::rdma {

// Every emulated object embeds the libibverbs struct as its first member; the
// table's functions get the libibverbs pointer back and cast to the object.
struct EmuDevice {
  ibv_device dev;
  int index = 0;
  uint16_t lid = 0;
  std::vector<ibv_gid_entry> gids;
};
struct EmuContext {
  ibv_context ctx;
  EmuDevice* device = nullptr;
};
struct EmuPd {
  ibv_pd pd;
};
struct EmuMr {
  ibv_mr mr;
  int access = 0;
};
struct EmuChannel {
  ibv_comp_channel ch;
  std::deque<ibv_cq*> events;
};
struct EmuQp;
struct CqEntry {
  ibv_wc wc;
  EmuQp* sq_owner = nullptr;  // send completions: the QP whose slots it frees
  int covers = 0;             // work requests it frees (itself and unsignaled ones before)
};
struct EmuCq {
  ibv_cq cq;
  std::deque<CqEntry> entries;
  size_t capacity = 0;
  bool armed = false;
  bool overrun = false;
  EmuChannel* channel = nullptr;
};
struct PendingWr {
  uint64_t wr_id = 0;
  ibv_wr_opcode opcode = IBV_WR_SEND;
  bool signaled = false;
  std::vector<ibv_sge> sges;
  std::string inline_data;
  bool is_inline = false;
  uint32_t imm = 0;  // network byte order, as posted
  uint64_t remote_addr = 0;
  uint32_t rkey = 0;
  absl::Time due;
  int covers = 1;
  bool waited = false;  // counted in rnr_waits
};
struct EmuQp {
  ibv_qp qp;
  EmuPd* pd = nullptr;
  ibv_qp_cap cap{};
  uint32_t dest_qpn = 0;
  uint16_t dlid = 0;
  bool global = false;
  ibv_gid dgid{};
  uint8_t rnr_retry = 7;
  std::deque<PendingWr> sq;        // posted, not yet delivered
  std::deque<ibv_recv_wr> rq;      // posted receives (sg_list points into rq_sges)
  std::deque<std::vector<ibv_sge>> rq_sges;
  int sq_outstanding = 0;          // posted and not yet freed by a polled completion
  int unsignaled_run = 0;          // delivered unsignaled WRs not yet covered
};

template <class E, class I>
E* Of(I* p) {
  return reinterpret_cast<E*>(p);
}

class VerbsEmulation::Fabric {
 public:
  explicit Fabric(const EmulationOptions& o) : options_(o) {
    for (int i = 0; i < o.devices; ++i) {
      auto d = std::make_unique<EmuDevice>();
      std::memset(&d->dev, 0, sizeof(d->dev));
      const bool eth = o.link_layer == LinkLayer::kEthernet;
      std::snprintf(d->dev.name, sizeof(d->dev.name), "%s%d", eth ? "emu_roce" : "emu_ib", i);
      d->dev.node_type = IBV_NODE_CA;
      d->dev.transport_type = IBV_TRANSPORT_IB;
      d->index = i;
      d->lid = eth ? 0 : static_cast<uint16_t>(i + 1);
      // fe80::<guid> (RoCE v1 and v2 on Ethernet, IB on InfiniBand), then on
      // Ethernet the IPv4-mapped address 10.0.0.<i+1> as v1 and v2: the table
      // a RoCE NIC with one IPv4 address shows.
      auto entry = [&](int idx, bool mapped, ibv_gid_type type) {
        ibv_gid_entry e;
        std::memset(&e, 0, sizeof(e));
        if (mapped) {
          e.gid.raw[10] = 0xff;
          e.gid.raw[11] = 0xff;
          e.gid.raw[12] = 10;
          e.gid.raw[15] = static_cast<uint8_t>(i + 1);
        } else {
          e.gid.raw[0] = 0xfe;
          e.gid.raw[1] = 0x80;
          e.gid.raw[15] = static_cast<uint8_t>(i + 1);
        }
        e.gid_index = idx;
        e.port_num = 1;
        e.gid_type = type;
        d->gids.push_back(e);
      };
      if (eth) {
        entry(0, false, IBV_GID_TYPE_ROCE_V1);
        entry(1, false, IBV_GID_TYPE_ROCE_V2);
        entry(2, true, IBV_GID_TYPE_ROCE_V1);
        entry(3, true, IBV_GID_TYPE_ROCE_V2);
      } else {
        entry(0, false, IBV_GID_TYPE_IB);
      }
      devices_.push_back(std::move(d));
    }
    timer_ = std::thread([this] { TimerLoop(); });
  }

  ~Fabric() {
    {
      std::lock_guard<std::mutex> l(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    timer_.join();
  }

  // --- devices --------------------------------------------------------------
  ibv_device** GetDeviceList(int* n) {
    auto* list = new ibv_device*[devices_.size() + 1];
    for (size_t i = 0; i < devices_.size(); ++i) list[i] = &devices_[i]->dev;
    list[devices_.size()] = nullptr;
    *n = static_cast<int>(devices_.size());
    return list;
  }
  EmuDevice* DeviceOf(ibv_device* d) { return Of<EmuDevice>(d); }
  int QueryPort(ibv_context* c, uint8_t port, ibv_port_attr* a) {
    if (port != 1) return EINVAL;
    EmuDevice* d = Of<EmuContext>(c)->device;
    std::memset(a, 0, sizeof(*a));
    a->state = IBV_PORT_ACTIVE;
    a->max_mtu = IBV_MTU_4096;
    a->active_mtu = options_.active_mtu >= 4096   ? IBV_MTU_4096
                    : options_.active_mtu >= 2048 ? IBV_MTU_2048
                                                  : IBV_MTU_1024;
    a->lid = d->lid;
    a->gid_tbl_len = static_cast<int>(d->gids.size());
    a->link_layer = options_.link_layer == LinkLayer::kEthernet ? IBV_LINK_LAYER_ETHERNET
                                                                 : IBV_LINK_LAYER_INFINIBAND;
    a->active_width = 2;   // 4x
    a->active_speed = 64;  // HDR
    return 0;
  }
  int QueryGidEx(ibv_context* c, uint32_t port, uint32_t index, ibv_gid_entry* e) {
    EmuDevice* d = Of<EmuContext>(c)->device;
    if (port != 1 || index >= d->gids.size()) return ENODATA;
    *e = d->gids[index];
    return 0;
  }

  // --- memory regions -------------------------------------------------------
  ibv_mr* RegMr(ibv_pd* pd, void* addr, size_t len, int access) {
    std::lock_guard<std::mutex> l(mu_);
    if (addr == nullptr || len == 0) {
      errno = EINVAL;
      return nullptr;
    }
    auto* m = new EmuMr();
    m->mr.context = pd->context;
    m->mr.pd = pd;
    m->mr.addr = addr;
    m->mr.length = len;
    m->mr.lkey = next_key_++;
    m->mr.rkey = next_key_++;
    m->access = access;
    mrs_[m->mr.lkey] = m;
    mrs_[m->mr.rkey] = m;
    ++stats_.reg_mr;
    ++stats_.live_mrs;
    return &m->mr;
  }
  int DeregMr(ibv_mr* mr) {
    std::lock_guard<std::mutex> l(mu_);
    mrs_.erase(mr->lkey);
    mrs_.erase(mr->rkey);
    ++stats_.dereg_mr;
    --stats_.live_mrs;
    delete Of<EmuMr>(mr);
    return 0;
  }

  // --- completion queues and channels ---------------------------------------
  ibv_comp_channel* CreateChannel(ibv_context* c) {
    const int fd = eventfd(0, EFD_CLOEXEC | EFD_SEMAPHORE);
    if (fd < 0) return nullptr;
    auto* ch = new EmuChannel();
    ch->ch.context = c;
    ch->ch.fd = fd;
    return &ch->ch;
  }
  int DestroyChannel(ibv_comp_channel* ch) {
    ::close(ch->fd);
    delete Of<EmuChannel>(ch);
    return 0;
  }
  ibv_cq* CreateCq(ibv_context* c, int cqe, void* cq_context, ibv_comp_channel* ch) {
    std::lock_guard<std::mutex> l(mu_);
    if (cqe < 1) {
      errno = EINVAL;
      return nullptr;
    }
    auto* q = new EmuCq();
    q->cq.context = c;
    q->cq.channel = ch;
    q->cq.cq_context = cq_context;
    q->cq.cqe = cqe;
    q->capacity = faults_.cq_capacity > 0 && faults_.cq_capacity < cqe ? faults_.cq_capacity : cqe;
    q->channel = ch != nullptr ? Of<EmuChannel>(ch) : nullptr;
    return &q->cq;
  }
  int DestroyCq(ibv_cq* cq) {
    std::lock_guard<std::mutex> l(mu_);
    delete Of<EmuCq>(cq);
    return 0;
  }
  int PollCq(ibv_cq* cq, int n, ibv_wc* wc) {
    std::lock_guard<std::mutex> l(mu_);
    EmuCq* q = Of<EmuCq>(cq);
    if (q->overrun) {
      errno = EOVERFLOW;
      return -1;
    }
    PumpLocked(absl::Now());
    int got = 0;
    while (got < n && !q->entries.empty()) {
      CqEntry& e = q->entries.front();
      wc[got++] = e.wc;
      if (e.sq_owner != nullptr) e.sq_owner->sq_outstanding -= e.covers;
      q->entries.pop_front();
    }
    return got;
  }
  int ReqNotify(ibv_cq* cq) {
    std::lock_guard<std::mutex> l(mu_);
    Of<EmuCq>(cq)->armed = true;
    return 0;
  }
  int GetCqEvent(ibv_comp_channel* ch, ibv_cq** cq, void** ctx) {
    uint64_t v = 0;
    if (::read(ch->fd, &v, sizeof(v)) != sizeof(v)) return -1;  // errno from read (EAGAIN)
    std::lock_guard<std::mutex> l(mu_);
    EmuChannel* c = Of<EmuChannel>(ch);
    if (c->events.empty()) {
      errno = EAGAIN;
      return -1;
    }
    *cq = c->events.front();
    *ctx = (*cq)->cq_context;
    c->events.pop_front();
    return 0;
  }

  // --- queue pairs ----------------------------------------------------------
  ibv_qp* CreateQp(ibv_pd* pd, ibv_qp_init_attr* a) {
    std::lock_guard<std::mutex> l(mu_);
    if (a->qp_type != IBV_QPT_RC || a->send_cq == nullptr || a->recv_cq == nullptr ||
        a->cap.max_send_wr < 1 || a->cap.max_recv_wr < 1) {
      errno = EINVAL;
      return nullptr;
    }
    auto* q = new EmuQp();
    q->qp.context = pd->context;
    q->qp.pd = pd;
    q->qp.send_cq = a->send_cq;
    q->qp.recv_cq = a->recv_cq;
    q->qp.qp_num = next_qpn_++;
    q->qp.state = IBV_QPS_RESET;
    q->qp.qp_type = IBV_QPT_RC;
    q->pd = Of<EmuPd>(pd);
    if (a->cap.max_inline_data > static_cast<uint32_t>(options_.max_inline_data)) {
      a->cap.max_inline_data = options_.max_inline_data;
    }
    q->cap = a->cap;
    qps_[q->qp.qp_num] = q;
    return &q->qp;
  }
  int DestroyQp(ibv_qp* qp) {
    std::lock_guard<std::mutex> l(mu_);
    EmuQp* q = Of<EmuQp>(qp);
    qps_.erase(qp->qp_num);
    // Completions still queued must not free slots of a QP that is gone.
    for (ibv_cq* cq : {qp->send_cq, qp->recv_cq}) {
      for (CqEntry& e : Of<EmuCq>(cq)->entries) {
        if (e.sq_owner == q) e.sq_owner = nullptr;
      }
    }
    delete q;
    PumpLocked(absl::Now());  // writes waiting on it fail now
    return 0;
  }
  int ModifyQp(ibv_qp* qp, ibv_qp_attr* a, int mask) {
    std::lock_guard<std::mutex> l(mu_);
    EmuQp* q = Of<EmuQp>(qp);
    if (!(mask & IBV_QP_STATE)) return EINVAL;
    const ibv_qp_state from = qp->state;
    const ibv_qp_state to = a->qp_state;
    if (to == IBV_QPS_ERR) {
      ToError(q);
      return 0;
    }
    if (to == IBV_QPS_RESET) {
      q->sq.clear();
      q->rq.clear();
      q->rq_sges.clear();
      qp->state = IBV_QPS_RESET;
      return 0;
    }
    const bool ok = (from == IBV_QPS_RESET && to == IBV_QPS_INIT) ||
                    (from == IBV_QPS_INIT && to == IBV_QPS_RTR) ||
                    (from == IBV_QPS_RTR && to == IBV_QPS_RTS);
    if (!ok) return EINVAL;
    if (to == IBV_QPS_INIT && (!(mask & IBV_QP_PORT) || a->port_num != 1)) return EINVAL;
    if (to == IBV_QPS_RTR) {
      if (!(mask & IBV_QP_DEST_QPN) || !(mask & IBV_QP_AV)) return EINVAL;
      q->dest_qpn = a->dest_qp_num;
      q->dlid = a->ah_attr.dlid;
      q->global = a->ah_attr.is_global != 0;
      q->dgid = a->ah_attr.grh.dgid;
      const bool eth = options_.link_layer == LinkLayer::kEthernet;
      if (eth && !q->global) return EINVAL;  // RoCE needs a GRH
    }
    if (to == IBV_QPS_RTS && (mask & IBV_QP_RNR_RETRY)) q->rnr_retry = a->rnr_retry;
    qp->state = to;
    return 0;
  }

  int PostRecv(ibv_qp* qp, ibv_recv_wr* wr, ibv_recv_wr** bad) {
    std::lock_guard<std::mutex> l(mu_);
    EmuQp* q = Of<EmuQp>(qp);
    for (; wr != nullptr; wr = wr->next) {
      if (qp->state == IBV_QPS_RESET ||
          q->rq.size() >= static_cast<size_t>(q->cap.max_recv_wr)) {
        *bad = wr;
        return qp->state == IBV_QPS_RESET ? EINVAL : ENOMEM;
      }
      ibv_recv_wr copy = *wr;
      q->rq_sges.emplace_back(wr->sg_list, wr->sg_list + wr->num_sge);
      copy.sg_list = q->rq_sges.back().data();
      copy.next = nullptr;
      q->rq.push_back(copy);
      if (qp->state == IBV_QPS_ERR) Flush(q);
    }
    PumpLocked(absl::Now());  // senders waiting for a receive (RNR) go on
    return 0;
  }

  int PostSend(ibv_qp* qp, ibv_send_wr* wr, ibv_send_wr** bad) {
    std::lock_guard<std::mutex> l(mu_);
    EmuQp* q = Of<EmuQp>(qp);
    const absl::Time now = absl::Now();
    for (; wr != nullptr; wr = wr->next) {
      if (qp->state != IBV_QPS_RTS && qp->state != IBV_QPS_ERR) {
        *bad = wr;
        return EINVAL;
      }
      if (q->sq_outstanding >= static_cast<int>(q->cap.max_send_wr)) {
        ++stats_.sq_full;
        *bad = wr;
        return ENOMEM;
      }
      PendingWr p;
      p.wr_id = wr->wr_id;
      p.opcode = wr->opcode;
      p.signaled = (wr->send_flags & IBV_SEND_SIGNALED) != 0;
      p.is_inline = (wr->send_flags & IBV_SEND_INLINE) != 0;
      size_t total = 0;
      for (int i = 0; i < wr->num_sge; ++i) total += wr->sg_list[i].length;
      if (p.is_inline) {
        if (total > q->cap.max_inline_data) {
          *bad = wr;
          return EINVAL;
        }
        for (int i = 0; i < wr->num_sge; ++i) {
          p.inline_data.append(reinterpret_cast<const char*>(wr->sg_list[i].addr),
                               wr->sg_list[i].length);
        }
        ++stats_.inline_sends;
      } else {
        p.sges.assign(wr->sg_list, wr->sg_list + wr->num_sge);
      }
      p.imm = wr->imm_data;
      if (wr->opcode == IBV_WR_RDMA_WRITE || wr->opcode == IBV_WR_RDMA_WRITE_WITH_IMM) {
        p.remote_addr = wr->wr.rdma.remote_addr;
        p.rkey = wr->wr.rdma.rkey;
        ++write_posts_;
        if (faults_.bad_rkey_at != 0 && write_posts_ == faults_.bad_rkey_at) p.rkey ^= 0x5a5a5a5a;
      } else if (wr->opcode != IBV_WR_SEND) {
        *bad = wr;
        return EINVAL;  // READ and atomics are not emulated (the transport uses neither)
      }
      ++wr_posts_;
      p.due = now + faults_.delay;
      if (faults_.drop_at != 0 && wr_posts_ == faults_.drop_at) p.due = absl::InfiniteFuture();
      q->sq.push_back(std::move(p));
      ++q->sq_outstanding;
      if (q->sq_outstanding > stats_.max_sq_outstanding) {
        stats_.max_sq_outstanding = q->sq_outstanding;
      }
      if (qp->state == IBV_QPS_ERR) Flush(q);
    }
    PumpLocked(now);
    if (faults_.delay > absl::ZeroDuration()) cv_.notify_all();
    return 0;
  }

  void SetFaults(const EmulatedFaults& f) {
    std::lock_guard<std::mutex> l(mu_);
    faults_ = f;
    wr_posts_ = 0;
    write_posts_ = 0;
    cv_.notify_all();
  }
  EmulationStats stats() const {
    std::lock_guard<std::mutex> l(mu_);
    return stats_;
  }

 private:
  // Delivers what is due on every QP, in order per QP.
  void PumpLocked(absl::Time now) {
    bool progressed = true;
    while (progressed) {
      progressed = false;
      for (auto& [qpn, q] : qps_) {
        while (!q->sq.empty() && q->qp.state == IBV_QPS_RTS) {
          PendingWr& p = q->sq.front();
          if (p.due == absl::InfiniteFuture()) {  // dropped: retries exhausted
            Fail(q, p, IBV_WC_RETRY_EXC_ERR);
            break;
          }
          if (p.due > now) break;
          if (!Deliver(q, p)) break;  // receiver not ready: wait
          progressed = true;
        }
      }
    }
  }

  // Delivers the head work request of `q` and pops it (failed or not); false
  // when it waits for a receive.
  bool Deliver(EmuQp* q, PendingWr& p) {
    EmuQp* r = Remote(q);
    if (r == nullptr || r->qp.state == IBV_QPS_ERR || r->qp.state == IBV_QPS_RESET) {
      Fail(q, p, IBV_WC_RETRY_EXC_ERR);
      return true;
    }
    // The local data, checked against the sender's keys.
    std::string data;
    if (p.is_inline) {
      data = p.inline_data;
    } else {
      for (const ibv_sge& s : p.sges) {
        const EmuMr* m = Find(s.lkey, q->pd, s.addr, s.length, 0, /*remote=*/false);
        if (m == nullptr) {
          Fail(q, p, IBV_WC_LOC_PROT_ERR);
          return true;
        }
        data.append(reinterpret_cast<const char*>(s.addr), s.length);
      }
    }
    const bool needs_recv = p.opcode != IBV_WR_RDMA_WRITE;
    if (needs_recv && r->rq.empty()) {
      if (r->qp.state != IBV_QPS_RTR && r->qp.state != IBV_QPS_RTS) return false;
      if (q->rnr_retry < 7) {
        Fail(q, p, IBV_WC_RNR_RETRY_EXC_ERR);
        return true;
      }
      if (!p.waited) ++stats_.rnr_waits;
      p.waited = true;
      return false;
    }
    ibv_wc rwc;
    std::memset(&rwc, 0, sizeof(rwc));
    if (p.opcode == IBV_WR_SEND) {
      ibv_recv_wr& rw = r->rq.front();
      size_t room = 0;
      for (int i = 0; i < rw.num_sge; ++i) room += rw.sg_list[i].length;
      if (room < data.size()) {
        Complete(r, RecvEntry(r, rw.wr_id, IBV_WC_LOC_LEN_ERR, IBV_WC_RECV, 0));
        PopRecv(r);
        ToError(r);
        Fail(q, p, IBV_WC_REM_INV_REQ_ERR);
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
          Fail(q, p, IBV_WC_REM_OP_ERR);
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
          Find(p.rkey, r->pd, p.remote_addr, data.size(), IBV_ACCESS_REMOTE_WRITE, true) ==
              nullptr) {
        ToError(r);
        Fail(q, p, IBV_WC_REM_ACCESS_ERR);
        return true;
      }
      if (!data.empty()) {
        std::memcpy(reinterpret_cast<void*>(p.remote_addr), data.data(), data.size());
      }
      ++stats_.writes;
      stats_.write_bytes += data.size();
      if (p.opcode == IBV_WR_RDMA_WRITE_WITH_IMM) {
        rwc = RecvEntry(r, r->rq.front().wr_id, IBV_WC_SUCCESS, IBV_WC_RECV_RDMA_WITH_IMM,
                        data.size());
        rwc.wc_flags = IBV_WC_WITH_IMM;
        rwc.imm_data = p.imm;
      }
    }
    if (needs_recv) {
      PopRecv(r);
      Complete(r, rwc);
    }
    // The sender's completion.
    if (p.signaled) {
      CqEntry e;
      std::memset(&e.wc, 0, sizeof(e.wc));
      e.wc.wr_id = p.wr_id;
      e.wc.status = IBV_WC_SUCCESS;
      e.wc.opcode = p.opcode == IBV_WR_SEND ? IBV_WC_SEND : IBV_WC_RDMA_WRITE;
      e.wc.qp_num = q->qp.qp_num;
      e.sq_owner = q;
      e.covers = q->unsignaled_run + 1;
      q->unsignaled_run = 0;
      Push(Of<EmuCq>(q->qp.send_cq), e);
    } else {
      ++q->unsignaled_run;
    }
    q->sq.pop_front();
    return true;
  }

  static ibv_wc RecvEntry(EmuQp* r, uint64_t wr_id, ibv_wc_status st, ibv_wc_opcode op,
                          size_t len) {
    ibv_wc wc;
    std::memset(&wc, 0, sizeof(wc));
    wc.wr_id = wr_id;
    wc.status = st;
    wc.opcode = op;
    wc.byte_len = static_cast<uint32_t>(len);
    wc.qp_num = r->qp.qp_num;
    return wc;
  }
  void Complete(EmuQp* r, const ibv_wc& wc) {
    CqEntry e;
    e.wc = wc;
    Push(Of<EmuCq>(r->qp.recv_cq), e);
  }
  static void PopRecv(EmuQp* r) {
    r->rq.pop_front();
    r->rq_sges.pop_front();
  }

  // The connected peer QP, if it exists and the address reaches it.
  EmuQp* Remote(EmuQp* q) {
    auto it = qps_.find(q->dest_qpn);
    if (it == qps_.end()) return nullptr;
    EmuQp* r = it->second;
    EmuDevice* d = Of<EmuContext>(r->qp.context)->device;
    if (q->global) {
      bool found = false;
      for (const ibv_gid_entry& g : d->gids) {
        found = found || std::memcmp(g.gid.raw, q->dgid.raw, 16) == 0;
      }
      return found ? r : nullptr;
    }
    return d->lid == q->dlid ? r : nullptr;
  }

  // The region `key` names in `pd` when it covers [addr, +len) with `access`.
  const EmuMr* Find(uint32_t key, EmuPd* pd, uint64_t addr, size_t len, int access,
                    bool remote) const {
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

  void Push(EmuCq* cq, const CqEntry& e) {
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

  // The head work request failed with `st`: its QP enters ERR.
  void Fail(EmuQp* q, PendingWr& p, ibv_wc_status st) {
    CqEntry e;
    std::memset(&e.wc, 0, sizeof(e.wc));
    e.wc.wr_id = p.wr_id;
    e.wc.status = st;
    e.wc.qp_num = q->qp.qp_num;
    e.sq_owner = q;
    e.covers = q->unsignaled_run + 1;
    q->unsignaled_run = 0;
    q->sq.pop_front();
    Push(Of<EmuCq>(q->qp.send_cq), e);
    ToError(q);
  }

  void ToError(EmuQp* q) {
    q->qp.state = IBV_QPS_ERR;
    Flush(q);
  }

  // Everything posted on a QP in error completes with WR_FLUSH_ERR.
  void Flush(EmuQp* q) {
    while (!q->sq.empty()) {
      CqEntry e;
      std::memset(&e.wc, 0, sizeof(e.wc));
      e.wc.wr_id = q->sq.front().wr_id;
      e.wc.status = IBV_WC_WR_FLUSH_ERR;
      e.wc.qp_num = q->qp.qp_num;
      e.sq_owner = q;
      e.covers = q->unsignaled_run + 1;
      q->unsignaled_run = 0;
      q->sq.pop_front();
      Push(Of<EmuCq>(q->qp.send_cq), e);
    }
    while (!q->rq.empty()) {
      Complete(q, RecvEntry(q, q->rq.front().wr_id, IBV_WC_WR_FLUSH_ERR, IBV_WC_RECV, 0));
      PopRecv(q);
    }
  }

  // Delivers delayed work requests when they are due.
  void TimerLoop() {
    std::unique_lock<std::mutex> l(mu_);
    while (!stop_) {
      absl::Time next = absl::InfiniteFuture();
      for (auto& [qpn, q] : qps_) {
        if (!q->sq.empty() && q->sq.front().due < next) next = q->sq.front().due;
      }
      if (next == absl::InfiniteFuture()) {
        cv_.wait(l);
      } else {
        cv_.wait_for(l, absl::ToChronoNanoseconds(std::max(next - absl::Now(),
                                                           absl::ZeroDuration())));
      }
      if (!stop_) PumpLocked(absl::Now());
    }
  }

  const EmulationOptions options_;
  std::vector<std::unique_ptr<EmuDevice>> devices_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  bool stop_ = false;
  std::map<uint32_t, EmuQp*> qps_;
  std::map<uint32_t, EmuMr*> mrs_;  // by lkey and by rkey
  uint32_t next_key_ = 0x100;
  uint32_t next_qpn_ = 0x40;
  EmulatedFaults faults_;
  uint64_t wr_posts_ = 0;
  uint64_t write_posts_ = 0;
  EmulationStats stats_;
  std::thread timer_;
};

namespace {

VerbsEmulation::Fabric* g_fabric = nullptr;

VerbsEmulation::Fabric& F() {
  GS_CHECK(g_fabric != nullptr) << "verbs emulation table used without a VerbsEmulation";
  return *g_fabric;
}

const VerbsTable kEmulatedVerbs = {
    "emulation",
    [](int* n) { return F().GetDeviceList(n); },
    [](ibv_device** list) { delete[] list; },
    [](ibv_device* d) -> const char* { return d->name; },
    [](ibv_device* d) -> uint64_t {
      return htobe64(0x0002c90300000000ull + Of<EmuDevice>(d)->index + 1);
    },
    [](ibv_device* d) -> ibv_context* {
      auto* c = new EmuContext();
      c->ctx.device = d;
      c->device = Of<EmuDevice>(d);
      return &c->ctx;
    },
    [](ibv_context* c) {
      delete Of<EmuContext>(c);
      return 0;
    },
    [](ibv_context*, ibv_device_attr* a) {
      std::memset(a, 0, sizeof(*a));
      a->phys_port_cnt = 1;
      a->max_qp_wr = 16384;
      a->max_cqe = 1 << 22;
      a->max_mr_size = ~0ull;
      return 0;
    },
    [](ibv_context* c, uint8_t port, ibv_port_attr* a) { return F().QueryPort(c, port, a); },
    [](ibv_context* c, uint8_t port, int index, ibv_gid* gid) {
      ibv_gid_entry e;
      const int rc = F().QueryGidEx(c, port, static_cast<uint32_t>(index), &e);
      if (rc == 0) *gid = e.gid;
      return rc;
    },
    [](ibv_context* c, uint32_t port, uint32_t index, ibv_gid_entry* e, uint32_t) {
      return F().QueryGidEx(c, port, index, e);
    },
    [](ibv_context* c) -> ibv_pd* {
      auto* p = new EmuPd();
      p->pd.context = c;
      return &p->pd;
    },
    [](ibv_pd* pd) {
      delete Of<EmuPd>(pd);
      return 0;
    },
    [](ibv_pd* pd, void* addr, size_t len, int access) { return F().RegMr(pd, addr, len, access); },
    [](ibv_pd* pd, uint64_t, size_t len, uint64_t iova, int fd, int access) -> ibv_mr* {
      if (fd < 0) {
        errno = EBADF;
        return nullptr;
      }
      return F().RegMr(pd, reinterpret_cast<void*>(iova), len, access);
    },
    [](ibv_mr* mr) { return F().DeregMr(mr); },
    [](ibv_context* c) { return F().CreateChannel(c); },
    [](ibv_comp_channel* ch) { return F().DestroyChannel(ch); },
    [](ibv_context* c, int cqe, void* ctx, ibv_comp_channel* ch, int) {
      return F().CreateCq(c, cqe, ctx, ch);
    },
    [](ibv_cq* cq) { return F().DestroyCq(cq); },
    [](ibv_cq* cq, int n, ibv_wc* wc) { return F().PollCq(cq, n, wc); },
    [](ibv_cq* cq, int) { return F().ReqNotify(cq); },
    [](ibv_comp_channel* ch, ibv_cq** cq, void** ctx) { return F().GetCqEvent(ch, cq, ctx); },
    [](ibv_cq*, unsigned int) {},
    [](ibv_pd* pd, ibv_qp_init_attr* a) { return F().CreateQp(pd, a); },
    [](ibv_qp* qp, ibv_qp_attr* a, int mask) { return F().ModifyQp(qp, a, mask); },
    [](ibv_qp* qp) { return F().DestroyQp(qp); },
    [](ibv_qp* qp, ibv_send_wr* wr, ibv_send_wr** bad) { return F().PostSend(qp, wr, bad); },
    [](ibv_qp* qp, ibv_recv_wr* wr, ibv_recv_wr** bad) { return F().PostRecv(qp, wr, bad); },
    &ibv_wc_status_str,
};

}  // namespace

VerbsEmulation::VerbsEmulation(EmulationOptions options)
    : fabric_(std::make_unique<Fabric>(options)) {
  GS_CHECK(g_fabric == nullptr) << "one VerbsEmulation at a time";
  g_fabric = fabric_.get();
}

VerbsEmulation::~VerbsEmulation() { g_fabric = nullptr; }

const VerbsTable& VerbsEmulation::verbs() const { return kEmulatedVerbs; }
void VerbsEmulation::SetFaults(const EmulatedFaults& faults) { fabric_->SetFaults(faults); }
EmulationStats VerbsEmulation::stats() const { return fabric_->stats(); }

}  // namespace gradsync::rdma
