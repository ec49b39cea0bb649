// Internal to the verbs emulation (verbs_emulation.cc: the verbs calls;
// verbs_emulation_delivery.cc: delivery, completions and errors). Every
// emulated object embeds the libibverbs struct as its first member; the
// table's functions get the libibverbs pointer back and cast to the object.
#ifndef GRADSYNC_RDMA_VERBS_EMULATION_FABRIC_H_
#define GRADSYNC_RDMA_VERBS_EMULATION_FABRIC_H_

#include <infiniband/verbs.h>

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "rdma/verbs_emulation.h"
#include "rdma/verbs_emulation_link.h"

namespace gradsync::rdma {

struct EmuDevice {
  ibv_device dev;
  int node = 0;  // the process's node on a linked fabric (0: unlinked)
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
// A work request that came from another process's QP (linked fabric),
// waiting at its destination QP for a receive.
struct InboundWr {
  uint64_t conn = 0;  // the link connection to answer on
  uint32_t src_qpn = 0;
  ibv_wr_opcode opcode = IBV_WR_SEND;
  uint32_t imm = 0;
  uint64_t remote_addr = 0;
  uint32_t rkey = 0;
  uint8_t rnr_retry = 7;
  std::string data;
  bool waited = false;
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
  std::deque<PendingWr> sq;    // posted, not yet delivered
  // Sent to another process (linked fabric), waiting for its answer; they
  // complete in order, before anything still in sq.
  std::deque<PendingWr> inflight;
  int remote_node = 0;             // the node of the peer QP (from the address vector)
  std::deque<InboundWr> inbound;   // from other processes, waiting for a receive
  std::deque<ibv_recv_wr> rq;  // posted receives (sg_list points into rq_sges)
  std::deque<std::vector<ibv_sge>> rq_sges;
  int sq_outstanding = 0;  // posted and not yet freed by a polled completion
  int unsignaled_run = 0;  // delivered unsignaled WRs not yet covered
};

template <class E, class I>
E* Of(I* p) {
  return reinterpret_cast<E*>(p);
}

class VerbsEmulation::Fabric : public EmulationLink::Handler {
 public:
  // `node` 0: this process only; else this process's node on a linked fabric
  // (devices get LIDs and GIDs that name the node).
  Fabric(const EmulationOptions& o, int node);
  ~Fabric() override;
  // Starts carrying work requests to other processes (linked fabrics).
  void Attach(std::unique_ptr<EmulationLink> link);
  int node() const { return node_; }

  // --- devices --------------------------------------------------------------
  ibv_device** GetDeviceList(int* n);
  EmuDevice* DeviceOf(ibv_device* d) { return Of<EmuDevice>(d); }
  int QueryPort(ibv_context* c, uint8_t port, ibv_port_attr* a);
  int QueryGidEx(ibv_context* c, uint32_t port, uint32_t index, ibv_gid_entry* e);

  // --- memory regions -------------------------------------------------------
  ibv_mr* RegMr(ibv_pd* pd, void* addr, size_t len, int access);
  int DeregMr(ibv_mr* mr);

  // --- completion queues and channels ---------------------------------------
  ibv_comp_channel* CreateChannel(ibv_context* c);
  int DestroyChannel(ibv_comp_channel* ch);
  ibv_cq* CreateCq(ibv_context* c, int cqe, void* cq_context, ibv_comp_channel* ch);
  int DestroyCq(ibv_cq* cq);
  int PollCq(ibv_cq* cq, int n, ibv_wc* wc);
  int ReqNotify(ibv_cq* cq);
  int GetCqEvent(ibv_comp_channel* ch, ibv_cq** cq, void** ctx);

  // --- queue pairs ----------------------------------------------------------
  ibv_qp* CreateQp(ibv_pd* pd, ibv_qp_init_attr* a);
  int DestroyQp(ibv_qp* qp);
  int ModifyQp(ibv_qp* qp, ibv_qp_attr* a, int mask);
  int PostRecv(ibv_qp* qp, ibv_recv_wr* wr, ibv_recv_wr** bad);
  int PostSend(ibv_qp* qp, ibv_send_wr* wr, ibv_send_wr** bad);

  void SetFaults(const EmulatedFaults& f);
  EmulationStats stats() const;

  // EmulationLink::Handler (the link's thread).
  void OnRequest(uint64_t conn, absl::string_view body) override;
  void OnReply(int node, absl::string_view body) override;
  void OnNodeLost(int node, const std::string& why) override;

  // The node a device with this LID / GID belongs to, and its index there.
  static int NodeOfLid(uint16_t lid) { return lid == 0 ? -1 : (lid - 1) / kDevicesPerNode; }
  static constexpr int kDevicesPerNode = 16;

 private:
  // Delivers what is due on every QP, in order per QP.
  void PumpLocked(absl::Time now);

  // Delivers the head work request of `q` and pops it (failed or not); false
  // when it waits for a receive. To a QP of another process it is sent and
  // waits in q->inflight for the answer.
  bool Deliver(EmuQp* q, PendingWr& p);
  // The sender's local data of `p`, checked against its lkeys; false: a
  // protection error.
  bool Gather(EmuQp* q, const PendingWr& p, std::string* data);
  // The receiving half of a delivery into `r` (null: no such QP): the
  // status for the sender, or false (nothing done) while `r` has no receive
  // for a message that needs one.
  bool Land(EmuQp* r, ibv_wr_opcode opcode, const std::string& data, uint64_t remote_addr,
            uint32_t rkey, uint32_t imm, uint8_t rnr_retry, ibv_wc_status* status);
  // The sender's completion of `p` with `st` (an entry when signaled or an
  // error; else it joins the unsignaled run). The caller pops `p`.
  void CompleteSend(EmuQp* q, const PendingWr& p, ibv_wc_status st);
  // Work requests from other processes that wait at `r`, in order.
  bool PumpInbound(EmuQp* r);
  // Answers every waiting one with RETRY_EXC_ERR (`r` is going away).
  void AnswerInbound(EmuQp* r);
  // The node of `q`'s peer, from its address vector.
  int PeerNode(const EmuQp* q) const;

  static ibv_wc RecvEntry(EmuQp* r, uint64_t wr_id, ibv_wc_status st, ibv_wc_opcode op, size_t len);
  void Complete(EmuQp* r, const ibv_wc& wc);
  static void PopRecv(EmuQp* r);

  // The connected peer QP, if it is in this process and the address reaches it.
  EmuQp* Remote(EmuQp* q);
  // Whether an address vector (dlid, or dgid when global) reaches `r`'s port.
  static bool Reaches(const EmuQp* r, uint16_t dlid, bool global, const ibv_gid& dgid);
  // Sends `p` with its gathered data to the peer QP's process (linked fabrics).
  void SendRemote(EmuQp* q, const PendingWr& p, const std::string& data);

  // The region `key` names in `pd` when it covers [addr, +len) with `access`.
  const EmuMr* Find(uint32_t key, EmuPd* pd, uint64_t addr, size_t len, int access,
                    bool remote) const;

  void Push(EmuCq* cq, const CqEntry& e);

  // The head work request (of sq) failed with `st`: its QP enters ERR.
  void Fail(EmuQp* q, ibv_wc_status st);

  void ToError(EmuQp* q);

  // Everything posted on a QP in error completes with WR_FLUSH_ERR.
  void Flush(EmuQp* q);

  // Delivers delayed work requests when they are due.
  void TimerLoop();

  const EmulationOptions options_;
  const int node_;
  std::unique_ptr<EmulationLink> link_;  // linked fabrics; set before any QP exists
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

}  // namespace gradsync::rdma

#endif  // GRADSYNC_RDMA_VERBS_EMULATION_FABRIC_H_
