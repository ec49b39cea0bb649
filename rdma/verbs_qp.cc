// rdma/verbs.h: the endpoint exchange format and the RC queue pair.
#include <arpa/inet.h>

#include <cstring>
#include <random>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/logging.h"
#include "rdma/verbs.h"
#include "rdma/verbs_internal.h"
#include "rdma/verbs_table.h"

namespace gradsync {
namespace rdma {
using namespace verbs_internal;  // NOLINT(build/namespaces): this module's helpers

// --- QpEndpoint --------------------------------------------------------------------

std::string QpEndpoint::Encode() const {
  uint8_t b[kEncodedSize] = {};
  b[0] = 1;  // version
  b[1] = 0;  // reserved
  PutBe16(b + 2, lid);
  PutBe32(b + 4, qpn);
  PutBe32(b + 8, psn);
  std::memcpy(b + 12, gid.data(), gid.size());
  return std::string(reinterpret_cast<const char*>(b), sizeof(b));
}

absl::StatusOr<QpEndpoint> QpEndpoint::Decode(absl::string_view bytes) {
  if (bytes.size() != kEncodedSize) {
    return absl::InvalidArgumentError(
        absl::StrCat("QP endpoint must be ", kEncodedSize, " bytes, got ", bytes.size()));
  }
  const uint8_t* b = reinterpret_cast<const uint8_t*>(bytes.data());
  if (b[0] != 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("unsupported QP endpoint version ", static_cast<int>(b[0])));
  }
  QpEndpoint e;
  e.lid = GetBe16(b + 2);
  e.qpn = GetBe32(b + 4);
  e.psn = GetBe32(b + 8);
  std::memcpy(e.gid.data(), b + 12, e.gid.size());
  if (e.qpn > k24Bits || e.psn > k24Bits) {
    return absl::InvalidArgumentError(
        absl::StrCat("QP endpoint has a qpn/psn beyond 24 bits: ", e.DebugString()));
  }
  return e;
}

std::string QpEndpoint::DebugString() const {
  return absl::StrCat("lid 0x", absl::Hex(lid), " qpn 0x", absl::Hex(qpn), " psn 0x",
                      absl::Hex(psn), " gid ", GidText(gid));
}

// --- QueuePair ---------------------------------------------------------------------

absl::StatusOr<std::unique_ptr<QueuePair>> QueuePair::Create(ProtectionDomain& pd,
                                                             CompletionQueue& send_cq,
                                                             CompletionQueue& recv_cq,
                                                             const QueuePairOptions& options) {
  ibv_qp_init_attr attr;
  std::memset(&attr, 0, sizeof(attr));
  attr.send_cq = send_cq.get();
  attr.recv_cq = recv_cq.get();
  attr.qp_type = IBV_QPT_RC;
  attr.sq_sig_all = 0;  // completions only for IBV_SEND_SIGNALED work requests
  attr.cap.max_send_wr = options.max_send_wr;
  attr.cap.max_recv_wr = options.max_recv_wr;
  attr.cap.max_send_sge = options.max_send_sge;
  attr.cap.max_recv_sge = options.max_recv_sge;
  attr.cap.max_inline_data = options.max_inline_data;
  errno = 0;
  ibv_qp* qp = pd.context().verbs().create_qp(pd.get(), &attr);
  if (qp == nullptr) {
    return VerbError(absl::StrCat("ibv_create_qp(RC, ", pd.context().name(), ", send_wr ",
                                  options.max_send_wr, ", recv_wr ", options.max_recv_wr, ")"),
                     LastErrno());
  }
  auto out = std::unique_ptr<QueuePair>(new QueuePair(&pd, qp));
  out->max_inline_data_ = attr.cap.max_inline_data;  // what the device granted
  return out;
}

QueuePair::~QueuePair() {
  const int rc = pd_->context().verbs().destroy_qp(qp_);
  if (rc != 0) {
    GS_LOG(WARNING) << "ibv_destroy_qp failed: " << ErrnoText(ErrFromRc(rc));
  }
}

uint32_t QueuePair::qpn() const { return qp_->qp_num; }

absl::StatusOr<QpEndpoint> QueuePair::LocalEndpoint(const ConnectOptions& options) const {
  Context& ctx = pd_->context();
  absl::StatusOr<PortInfo> port = ctx.QueryPort(options.port_num);
  if (!port.ok()) return port.status();
  absl::StatusOr<std::array<uint8_t, 16>> gid = ctx.QueryGid(options.port_num, options.gid_index);
  if (!gid.ok()) return gid.status();
  QpEndpoint e;
  e.lid = port->lid;
  e.gid = *gid;
  e.qpn = qpn();
  std::random_device rd;
  e.psn = rd() & k24Bits;
  return e;
}

namespace {
absl::Status ModifyQp(const VerbsTable& v, ibv_qp* qp, ibv_qp_attr* attr, int mask,
                      absl::string_view transition, const std::string& dev) {
  errno = 0;
  const int rc = v.modify_qp(qp, attr, mask);
  if (rc != 0) {
    return VerbError(
        absl::StrCat("ibv_modify_qp(qpn 0x", absl::Hex(qp->qp_num), ", ", transition, ") on ", dev),
        ErrFromRc(rc));
  }
  return absl::OkStatus();
}
}  // namespace

absl::Status QueuePair::ModifyToInit(const ConnectOptions& options) {
  ibv_qp_attr attr;
  std::memset(&attr, 0, sizeof(attr));
  attr.qp_state = IBV_QPS_INIT;
  attr.pkey_index = 0;
  attr.port_num = static_cast<uint8_t>(options.port_num);
  attr.qp_access_flags = kAccessFlags;
  return ModifyQp(pd_->context().verbs(), qp_, &attr, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS,
                  "RESET->INIT", pd_->context().name());
}

absl::Status QueuePair::ModifyToRtr(const QpEndpoint& remote, const ConnectOptions& options) {
  absl::StatusOr<PortInfo> port = pd_->context().QueryPort(options.port_num);
  if (!port.ok()) return port.status();
  const int mtu = options.path_mtu < port->active_mtu ? options.path_mtu : port->active_mtu;

  ibv_qp_attr attr;
  std::memset(&attr, 0, sizeof(attr));
  attr.qp_state = IBV_QPS_RTR;
  attr.path_mtu = MtuEnum(mtu);
  attr.dest_qp_num = remote.qpn & k24Bits;
  attr.rq_psn = remote.psn & k24Bits;
  attr.max_dest_rd_atomic = options.max_rd_atomic;
  attr.min_rnr_timer = options.min_rnr_timer;
  attr.ah_attr.dlid = remote.lid;
  attr.ah_attr.sl = options.service_level;
  attr.ah_attr.src_path_bits = 0;
  attr.ah_attr.port_num = static_cast<uint8_t>(options.port_num);
  // RoCE always routes by GID; InfiniBand uses the LID unless the peer has none.
  if (port->link_layer == LinkLayer::kEthernet || remote.lid == 0) {
    attr.ah_attr.is_global = 1;
    std::memcpy(attr.ah_attr.grh.dgid.raw, remote.gid.data(), remote.gid.size());
    attr.ah_attr.grh.sgid_index = static_cast<uint8_t>(options.gid_index);
    attr.ah_attr.grh.hop_limit = 255;
    attr.ah_attr.grh.traffic_class = 0;
    attr.ah_attr.grh.flow_label = 0;
  }
  return ModifyQp(pd_->context().verbs(), qp_, &attr,
                  IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN |
                      IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER,
                  absl::StrCat("INIT->RTR to ", remote.DebugString()), pd_->context().name());
}

absl::Status QueuePair::ModifyToRts(const QpEndpoint& local, const ConnectOptions& options) {
  ibv_qp_attr attr;
  std::memset(&attr, 0, sizeof(attr));
  attr.qp_state = IBV_QPS_RTS;
  attr.sq_psn = local.psn & k24Bits;
  attr.timeout = options.timeout;
  attr.retry_cnt = options.retry_count;
  attr.rnr_retry = options.rnr_retry;
  attr.max_rd_atomic = options.max_rd_atomic;
  return ModifyQp(pd_->context().verbs(), qp_, &attr,
                  IBV_QP_STATE | IBV_QP_SQ_PSN | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT |
                      IBV_QP_RNR_RETRY | IBV_QP_MAX_QP_RD_ATOMIC,
                  "RTR->RTS", pd_->context().name());
}

absl::Status QueuePair::Connect(const QpEndpoint& local, const QpEndpoint& remote,
                                const ConnectOptions& options) {
  if (local.qpn != qpn()) {
    return absl::InvalidArgumentError(absl::StrCat("local endpoint qpn 0x", absl::Hex(local.qpn),
                                                   " is not this QP's (0x", absl::Hex(qpn()), ")"));
  }
  absl::Status s = ModifyToInit(options);
  if (s.ok()) s = ModifyToRtr(remote, options);
  if (s.ok()) s = ModifyToRts(local, options);
  return s;
}

absl::Status QueuePair::PostWrite(const MemoryRegion& mr, size_t offset, size_t length,
                                  const RemoteMemory& remote, uint64_t remote_offset,
                                  uint64_t wr_id, bool signaled, const uint32_t* imm) {
  if (offset > mr.length() || length > mr.length() - offset) {
    return absl::OutOfRangeError(absl::StrCat("RDMA write source [", offset, ", +", length,
                                              ") exceeds the ", mr.length(), "-byte region"));
  }
  if (remote_offset > remote.length || length > remote.length - remote_offset) {
    return absl::OutOfRangeError(absl::StrCat("RDMA write target [", remote_offset, ", +", length,
                                              ") exceeds the ", remote.length,
                                              "-byte remote region"));
  }
  if (length > 0x80000000u) {
    return absl::InvalidArgumentError(
        absl::StrCat("RDMA write of ", length, " bytes exceeds the 2 GiB message limit"));
  }
  ibv_sge sge;
  sge.addr = reinterpret_cast<uintptr_t>(mr.addr()) + offset;
  sge.length = static_cast<uint32_t>(length);
  sge.lkey = mr.lkey();

  ibv_send_wr wr;
  std::memset(&wr, 0, sizeof(wr));
  wr.wr_id = wr_id;
  wr.sg_list = length > 0 ? &sge : nullptr;
  wr.num_sge = length > 0 ? 1 : 0;
  wr.opcode = imm != nullptr ? IBV_WR_RDMA_WRITE_WITH_IMM : IBV_WR_RDMA_WRITE;
  if (imm != nullptr) wr.imm_data = htonl(*imm);
  wr.send_flags = signaled ? IBV_SEND_SIGNALED : 0;
  if (length > 0 && length <= max_inline_data_) wr.send_flags |= IBV_SEND_INLINE;
  wr.wr.rdma.remote_addr = remote.addr + remote_offset;
  wr.wr.rdma.rkey = remote.rkey;

  ibv_send_wr* bad = nullptr;
  errno = 0;
  const int rc = pd_->context().verbs().post_send(qp_, &wr, &bad);
  if (rc != 0) {
    return VerbError(absl::StrCat("ibv_post_send(RDMA_WRITE", imm ? "_WITH_IMM" : "", ", qpn 0x",
                                  absl::Hex(qpn()), ", ", length, " bytes to 0x",
                                  absl::Hex(wr.wr.rdma.remote_addr), ")"),
                     ErrFromRc(rc));
  }
  return absl::OkStatus();
}

absl::Status QueuePair::PostSendInline(const void* data, size_t length, uint64_t wr_id,
                                       bool signaled) {
  if (length > max_inline_data_) {
    return absl::InvalidArgumentError(absl::StrCat("inline send of ", length, " bytes exceeds the ",
                                                   max_inline_data_, " the QP allows"));
  }
  ibv_sge sge;
  sge.addr = reinterpret_cast<uintptr_t>(data);
  sge.length = static_cast<uint32_t>(length);
  sge.lkey = 0;  // inline data needs no key
  ibv_send_wr wr;
  std::memset(&wr, 0, sizeof(wr));
  wr.wr_id = wr_id;
  wr.sg_list = &sge;
  wr.num_sge = 1;
  wr.opcode = IBV_WR_SEND;
  wr.send_flags = IBV_SEND_INLINE | (signaled ? IBV_SEND_SIGNALED : 0);
  ibv_send_wr* bad = nullptr;
  errno = 0;
  const int rc = pd_->context().verbs().post_send(qp_, &wr, &bad);
  if (rc != 0) {
    return VerbError(
        absl::StrCat("ibv_post_send(SEND inline, qpn 0x", absl::Hex(qpn()), ", ", length, " bytes)"),
        ErrFromRc(rc));
  }
  return absl::OkStatus();
}

absl::Status QueuePair::PostRecv(const MemoryRegion& mr, size_t offset, size_t length,
                                 uint64_t wr_id) {
  if (offset > mr.length() || length > mr.length() - offset || length > 0x80000000u) {
    return absl::OutOfRangeError(absl::StrCat("receive buffer [", offset, ", +", length,
                                              ") exceeds the ", mr.length(), "-byte region"));
  }
  ibv_sge sge;
  sge.addr = reinterpret_cast<uintptr_t>(mr.addr()) + offset;
  sge.length = static_cast<uint32_t>(length);
  sge.lkey = mr.lkey();
  ibv_recv_wr wr;
  std::memset(&wr, 0, sizeof(wr));
  wr.wr_id = wr_id;
  wr.sg_list = length > 0 ? &sge : nullptr;
  wr.num_sge = length > 0 ? 1 : 0;
  ibv_recv_wr* bad = nullptr;
  errno = 0;
  const int rc = pd_->context().verbs().post_recv(qp_, &wr, &bad);
  if (rc != 0) {
    return VerbError(
        absl::StrCat("ibv_post_recv(qpn 0x", absl::Hex(qpn()), ", ", length, " bytes)"),
        ErrFromRc(rc));
  }
  return absl::OkStatus();
}

}  // namespace rdma
}  // namespace gradsync
