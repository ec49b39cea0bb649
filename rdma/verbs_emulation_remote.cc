// The verbs emulation across processes (linked fabrics): a work request to a
// QP of another process travels on the EmulationLink with its data, lands
// there (the same checks and completions as in one process) and comes back
// as the sender's completion status. Per QP, requests land and complete in
// posting order; one waiting for a receive holds the later ones back.
#include <cstring>

#include "absl/strings/str_cat.h"
#include "common/logging.h"
#include "rdma/verbs_emulation_fabric.h"

namespace gradsync::rdma {
namespace {

// The head of a request on the link; the data follows it.
struct WireRequest {
  uint32_t src_qpn;
  uint32_t dst_qpn;
  uint32_t opcode;
  uint32_t imm;
  uint64_t remote_addr;
  uint32_t rkey;
  uint16_t dlid;
  uint8_t global;
  uint8_t rnr_retry;
  uint8_t dgid[16];
};
struct WireReply {
  uint32_t src_qpn;
  uint32_t status;
};

std::string EncodeReply(uint32_t src_qpn, ibv_wc_status st) {
  const WireReply r{src_qpn, static_cast<uint32_t>(st)};
  return std::string(reinterpret_cast<const char*>(&r), sizeof(r));
}

}  // namespace

void VerbsEmulation::Fabric::Attach(std::unique_ptr<EmulationLink> link) {
  link_ = std::move(link);
  link_->Start(this);
}

void VerbsEmulation::Fabric::SendRemote(EmuQp* q, const PendingWr& p, const std::string& data) {
  WireRequest w;
  std::memset(&w, 0, sizeof(w));
  w.src_qpn = q->qp.qp_num;
  w.dst_qpn = q->dest_qpn;
  w.opcode = p.opcode;
  w.imm = p.imm;
  w.remote_addr = p.remote_addr;
  w.rkey = p.rkey;
  w.dlid = q->dlid;
  w.global = q->global ? 1 : 0;
  w.rnr_retry = q->rnr_retry;
  std::memcpy(w.dgid, q->dgid.raw, sizeof(w.dgid));
  std::string body(reinterpret_cast<const char*>(&w), sizeof(w));
  body += data;
  link_->Send(PeerNode(q), std::move(body));
}

void VerbsEmulation::Fabric::OnRequest(uint64_t conn, absl::string_view body) {
  WireRequest w;
  if (body.size() < sizeof(w)) {
    GS_LOG(WARNING) << "verbs emulation: a request of " << body.size() << " bytes";
    return;
  }
  std::memcpy(&w, body.data(), sizeof(w));
  InboundWr in;
  in.conn = conn;
  in.src_qpn = w.src_qpn;
  in.opcode = static_cast<ibv_wr_opcode>(w.opcode);
  in.imm = w.imm;
  in.remote_addr = w.remote_addr;
  in.rkey = w.rkey;
  in.rnr_retry = w.rnr_retry;
  in.data.assign(body.data() + sizeof(w), body.size() - sizeof(w));
  ibv_gid dgid;
  std::memcpy(dgid.raw, w.dgid, sizeof(w.dgid));
  std::lock_guard<std::mutex> l(mu_);
  auto it = qps_.find(w.dst_qpn);
  if (it == qps_.end() || !Reaches(it->second, w.dlid, w.global != 0, dgid)) {
    link_->Reply(conn, EncodeReply(w.src_qpn, IBV_WC_RETRY_EXC_ERR));  // nobody answers
    return;
  }
  it->second->inbound.push_back(std::move(in));
  PumpInbound(it->second);
}

bool VerbsEmulation::Fabric::PumpInbound(EmuQp* r) {
  bool progressed = false;
  while (!r->inbound.empty()) {
    InboundWr& w = r->inbound.front();
    ibv_wc_status st;
    if (!Land(r, w.opcode, w.data, w.remote_addr, w.rkey, w.imm, w.rnr_retry, &st)) {
      if (!w.waited) ++stats_.rnr_waits;
      w.waited = true;
      break;
    }
    link_->Reply(w.conn, EncodeReply(w.src_qpn, st));
    r->inbound.pop_front();
    progressed = true;
  }
  return progressed;
}

void VerbsEmulation::Fabric::OnReply(int node, absl::string_view body) {
  WireReply r;
  if (body.size() != sizeof(r)) {
    GS_LOG(WARNING) << "verbs emulation: a reply of " << body.size() << " bytes from node "
                    << node;
    return;
  }
  std::memcpy(&r, body.data(), sizeof(r));
  std::lock_guard<std::mutex> l(mu_);
  auto it = qps_.find(r.src_qpn);
  if (it == qps_.end() || it->second->inflight.empty()) return;  // destroyed or flushed
  EmuQp* q = it->second;
  const auto st = static_cast<ibv_wc_status>(r.status);
  CompleteSend(q, q->inflight.front(), st);
  q->inflight.pop_front();
  if (st != IBV_WC_SUCCESS) ToError(q);
}

void VerbsEmulation::Fabric::OnNodeLost(int node, const std::string& why) {
  std::lock_guard<std::mutex> l(mu_);
  for (auto& [qpn, q] : qps_) {
    if (q->remote_node != node || q->inflight.empty()) continue;
    GS_LOG(INFO) << "verbs emulation: " << absl::StrCat("QP 0x", absl::Hex(qpn)) << " lost its peer: " << why;
    CompleteSend(q, q->inflight.front(), IBV_WC_RETRY_EXC_ERR);
    q->inflight.pop_front();
    ToError(q);
  }
}

void VerbsEmulation::Fabric::AnswerInbound(EmuQp* r) {
  while (!r->inbound.empty()) {
    link_->Reply(r->inbound.front().conn,
                 EncodeReply(r->inbound.front().src_qpn, IBV_WC_RETRY_EXC_ERR));
    r->inbound.pop_front();
  }
}

}  // namespace gradsync::rdma
