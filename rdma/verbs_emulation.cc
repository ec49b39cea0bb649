#include "rdma/verbs_emulation.h"

#include <arpa/inet.h>
#include <endian.h>
#include <fcntl.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "common/logging.h"
#include "rdma/verbs_emulation_fabric.h"

namespace gradsync::rdma {

VerbsEmulation::Fabric::Fabric(const EmulationOptions& o, int node) : options_(o), node_(node) {
  for (int i = 0; i < o.devices && i < kDevicesPerNode; ++i) {
    auto d = std::make_unique<EmuDevice>();
    std::memset(&d->dev, 0, sizeof(d->dev));
    const bool eth = o.link_layer == LinkLayer::kEthernet;
    std::snprintf(d->dev.name, sizeof(d->dev.name), "%s%d", eth ? "emu_roce" : "emu_ib", i);
    d->dev.node_type = IBV_NODE_CA;
    d->dev.transport_type = IBV_TRANSPORT_IB;
    d->node = node;
    d->index = i;
    d->lid = eth ? 0 : static_cast<uint16_t>(node * kDevicesPerNode + i + 1);
    // fe80::<node>:<i+1> (RoCE v1 and v2 on Ethernet, IB on InfiniBand),
    // then on Ethernet the IPv4-mapped address 10.<node>.<i+1> as v1 and v2:
    // the table a RoCE NIC with one IPv4 address shows. Bytes 13-14 name the
    // node on a linked fabric.
    auto entry = [&](int idx, bool mapped, ibv_gid_type type) {
      ibv_gid_entry e;
      std::memset(&e, 0, sizeof(e));
      if (mapped) {
        e.gid.raw[10] = 0xff;
        e.gid.raw[11] = 0xff;
        e.gid.raw[12] = 10;
      } else {
        e.gid.raw[0] = 0xfe;
        e.gid.raw[1] = 0x80;
      }
      e.gid.raw[13] = static_cast<uint8_t>(node >> 8);
      e.gid.raw[14] = static_cast<uint8_t>(node & 0xff);
      e.gid.raw[15] = static_cast<uint8_t>(i + 1);
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

VerbsEmulation::Fabric::~Fabric() {
  link_.reset();  // no more requests, replies or losses from other processes
  {
    std::lock_guard<std::mutex> l(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  timer_.join();
}

ibv_device** VerbsEmulation::Fabric::GetDeviceList(int* n) {
  auto* list = new ibv_device*[devices_.size() + 1];
  for (size_t i = 0; i < devices_.size(); ++i) list[i] = &devices_[i]->dev;
  list[devices_.size()] = nullptr;
  *n = static_cast<int>(devices_.size());
  return list;
}

int VerbsEmulation::Fabric::QueryPort(ibv_context* c, uint8_t port, ibv_port_attr* a) {
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

int VerbsEmulation::Fabric::QueryGidEx(ibv_context* c, uint32_t port, uint32_t index,
                                       ibv_gid_entry* e) {
  EmuDevice* d = Of<EmuContext>(c)->device;
  if (port != 1 || index >= d->gids.size()) return ENODATA;
  *e = d->gids[index];
  return 0;
}

ibv_mr* VerbsEmulation::Fabric::RegMr(ibv_pd* pd, void* addr, size_t len, int access) {
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

int VerbsEmulation::Fabric::DeregMr(ibv_mr* mr) {
  std::lock_guard<std::mutex> l(mu_);
  mrs_.erase(mr->lkey);
  mrs_.erase(mr->rkey);
  ++stats_.dereg_mr;
  --stats_.live_mrs;
  delete Of<EmuMr>(mr);
  return 0;
}

ibv_comp_channel* VerbsEmulation::Fabric::CreateChannel(ibv_context* c) {
  const int fd = eventfd(0, EFD_CLOEXEC | EFD_SEMAPHORE);
  if (fd < 0) return nullptr;
  auto* ch = new EmuChannel();
  ch->ch.context = c;
  ch->ch.fd = fd;
  return &ch->ch;
}

int VerbsEmulation::Fabric::DestroyChannel(ibv_comp_channel* ch) {
  ::close(ch->fd);
  delete Of<EmuChannel>(ch);
  return 0;
}

ibv_cq* VerbsEmulation::Fabric::CreateCq(ibv_context* c, int cqe, void* cq_context,
                                         ibv_comp_channel* ch) {
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

int VerbsEmulation::Fabric::DestroyCq(ibv_cq* cq) {
  std::lock_guard<std::mutex> l(mu_);
  delete Of<EmuCq>(cq);
  return 0;
}

int VerbsEmulation::Fabric::PollCq(ibv_cq* cq, int n, ibv_wc* wc) {
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

int VerbsEmulation::Fabric::ReqNotify(ibv_cq* cq) {
  std::lock_guard<std::mutex> l(mu_);
  Of<EmuCq>(cq)->armed = true;
  return 0;
}

int VerbsEmulation::Fabric::GetCqEvent(ibv_comp_channel* ch, ibv_cq** cq, void** ctx) {
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

ibv_qp* VerbsEmulation::Fabric::CreateQp(ibv_pd* pd, ibv_qp_init_attr* a) {
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

int VerbsEmulation::Fabric::DestroyQp(ibv_qp* qp) {
  std::lock_guard<std::mutex> l(mu_);
  EmuQp* q = Of<EmuQp>(qp);
  qps_.erase(qp->qp_num);
  if (!q->inbound.empty()) AnswerInbound(q);
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

int VerbsEmulation::Fabric::ModifyQp(ibv_qp* qp, ibv_qp_attr* a, int mask) {
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

int VerbsEmulation::Fabric::PostRecv(ibv_qp* qp, ibv_recv_wr* wr, ibv_recv_wr** bad) {
  std::lock_guard<std::mutex> l(mu_);
  EmuQp* q = Of<EmuQp>(qp);
  for (; wr != nullptr; wr = wr->next) {
    if (qp->state == IBV_QPS_RESET || q->rq.size() >= static_cast<size_t>(q->cap.max_recv_wr)) {
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

int VerbsEmulation::Fabric::PostSend(ibv_qp* qp, ibv_send_wr* wr, ibv_send_wr** bad) {
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
      return EINVAL;  // READ and atomics are not emulated (the transport uses
                      // neither)
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

void VerbsEmulation::Fabric::SetFaults(const EmulatedFaults& f) {
  std::lock_guard<std::mutex> l(mu_);
  faults_ = f;
  wr_posts_ = 0;
  write_posts_ = 0;
  cv_.notify_all();
}

EmulationStats VerbsEmulation::Fabric::stats() const {
  std::lock_guard<std::mutex> l(mu_);
  return stats_;
}

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
      const EmuDevice* e = Of<EmuDevice>(d);
      return htobe64(0x0002c90300000000ull + (uint64_t{static_cast<uint32_t>(e->node)} << 16) +
                     e->index + 1);
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
      if (fd < 0 || ::fcntl(fd, F_GETFD) < 0) {  // the NIC takes a reference to an open dma-buf
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
    : fabric_(std::make_unique<Fabric>(options, 0)) {
  GS_CHECK(options.fabric.empty()) << "a linked verbs emulation is made by VerbsEmulation::Open";
  GS_CHECK(g_fabric == nullptr) << "one VerbsEmulation at a time";
  g_fabric = fabric_.get();
}

VerbsEmulation::VerbsEmulation(std::unique_ptr<Fabric> fabric) : fabric_(std::move(fabric)) {
  GS_CHECK(g_fabric == nullptr) << "one VerbsEmulation at a time";
  g_fabric = fabric_.get();
}

absl::StatusOr<std::unique_ptr<VerbsEmulation>> VerbsEmulation::Open(EmulationOptions options) {
  if (options.fabric.empty()) return std::make_unique<VerbsEmulation>(options);
  if (g_fabric != nullptr) return absl::FailedPreconditionError("one VerbsEmulation at a time");
  absl::StatusOr<std::unique_ptr<EmulationLink>> link = EmulationLink::Open(options.fabric);
  if (!link.ok()) return link.status();
  auto fabric = std::make_unique<Fabric>(options, (*link)->node());
  fabric->Attach(*std::move(link));
  return std::unique_ptr<VerbsEmulation>(new VerbsEmulation(std::move(fabric)));
}

int VerbsEmulation::node() const { return fabric_->node(); }

VerbsEmulation::~VerbsEmulation() { g_fabric = nullptr; }

const VerbsTable& VerbsEmulation::verbs() const { return kEmulatedVerbs; }
void VerbsEmulation::SetFaults(const EmulatedFaults& faults) { fabric_->SetFaults(faults); }
EmulationStats VerbsEmulation::stats() const { return fabric_->stats(); }

}  // namespace gradsync::rdma
