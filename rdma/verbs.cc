#include "rdma/verbs.h"

#include <arpa/inet.h>
#include <endian.h>
#include <infiniband/verbs.h>

#include <cerrno>
#include <cstring>
#include <random>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "common/logging.h"

namespace gradsync {
namespace rdma {
namespace {

// A failed verb: `what` names the call and its arguments, `err` is the errno
// value. The code follows the errno (ENOMEM -> kResourceExhausted, ...).
absl::Status VerbError(absl::string_view what, int err) {
  std::string msg = absl::StrCat(what, " failed: ", ErrnoText(err));
  switch (err) {
    case ENOMEM: return absl::ResourceExhaustedError(msg);
    case EINVAL:
    case EFAULT: return absl::InvalidArgumentError(msg);
    case EACCES:
    case EPERM: return absl::PermissionDeniedError(msg);
    case ENOSYS:
    case ENODEV:
    case ENXIO: return absl::UnavailableError(msg);
    default: return absl::InternalError(msg);
  }
}

// The value of errno after a verb returned NULL / -1, never 0.
int LastErrno() { return errno != 0 ? errno : EIO; }
// For verbs that return an errno value (0 on success) but may also set errno.
int ErrFromRc(int rc) { return rc > 0 ? rc : LastErrno(); }

struct DeviceListDeleter {
  void operator()(ibv_device** list) const { ibv_free_device_list(list); }
};
using DeviceList = std::unique_ptr<ibv_device*[], DeviceListDeleter>;

// ibv_get_device_list, or kUnavailable with the reason.
absl::StatusOr<DeviceList> GetDeviceList(int* count) {
  *count = 0;
  errno = 0;
  ibv_device** list = ibv_get_device_list(count);
  if (list == nullptr) {
    const int err = LastErrno();
    *count = 0;
    return absl::UnavailableError(
        absl::StrCat("no RDMA devices: ibv_get_device_list failed: ", ErrnoText(err)));
  }
  DeviceList owned(list);
  if (*count <= 0) return absl::UnavailableError("no RDMA devices found");
  return owned;
}

PortState ToPortState(ibv_port_state s) {
  switch (s) {
    case IBV_PORT_NOP: return PortState::kNop;
    case IBV_PORT_DOWN: return PortState::kDown;
    case IBV_PORT_INIT: return PortState::kInit;
    case IBV_PORT_ARMED: return PortState::kArmed;
    case IBV_PORT_ACTIVE: return PortState::kActive;
    case IBV_PORT_ACTIVE_DEFER: return PortState::kActiveDefer;
  }
  return PortState::kUnknown;
}

LinkLayer ToLinkLayer(uint8_t l) {
  switch (l) {
    case IBV_LINK_LAYER_INFINIBAND: return LinkLayer::kInfiniBand;
    case IBV_LINK_LAYER_ETHERNET: return LinkLayer::kEthernet;
    default: return LinkLayer::kUnspecified;
  }
}

int MtuBytes(ibv_mtu mtu) {
  switch (mtu) {
    case IBV_MTU_256: return 256;
    case IBV_MTU_512: return 512;
    case IBV_MTU_1024: return 1024;
    case IBV_MTU_2048: return 2048;
    case IBV_MTU_4096: return 4096;
  }
  return 0;
}

// The largest verbs MTU <= bytes (at least 256).
ibv_mtu MtuEnum(int bytes) {
  if (bytes >= 4096) return IBV_MTU_4096;
  if (bytes >= 2048) return IBV_MTU_2048;
  if (bytes >= 1024) return IBV_MTU_1024;
  if (bytes >= 512) return IBV_MTU_512;
  return IBV_MTU_256;
}

// ibv_port_attr.active_width -> lanes.
int WidthLanes(uint8_t w) {
  switch (w) {
    case 1: return 1;
    case 2: return 4;
    case 4: return 8;
    case 8: return 12;
    case 16: return 2;
    default: return 0;
  }
}

// ibv_port_attr.active_speed -> (name, nominal Gb/s per lane), as ibstat prints.
void LaneSpeed(uint8_t s, const char** name, double* gbps) {
  switch (s) {
    case 1:
      *name = "SDR";
      *gbps = 2.5;
      return;
    case 2:
      *name = "DDR";
      *gbps = 5;
      return;
    case 4:
      *name = "QDR";
      *gbps = 10;
      return;
    case 8:
      *name = "FDR10";
      *gbps = 10;
      return;
    case 16:
      *name = "FDR";
      *gbps = 14;
      return;
    case 32:
      *name = "EDR";
      *gbps = 25;
      return;
    case 64:
      *name = "HDR";
      *gbps = 50;
      return;
    case 128:
      *name = "NDR";
      *gbps = 100;
      return;
    default:
      *name = "unknown speed";
      *gbps = 0;
      return;
  }
}

PortInfo ToPortInfo(int port_num, const ibv_port_attr& attr) {
  PortInfo p;
  p.port_num = port_num;
  p.state = ToPortState(attr.state);
  p.lid = attr.lid;
  p.active_mtu = MtuBytes(attr.active_mtu);
  p.link_layer = ToLinkLayer(attr.link_layer);
  p.active_width = WidthLanes(attr.active_width);
  const char* speed_name = "";
  LaneSpeed(attr.active_speed, &speed_name, &p.lane_gbps);
  p.speed = absl::StrFormat("%dx %s (%g Gb/s)", p.active_width, speed_name, p.speed_gbps());
  return p;
}

absl::StatusOr<PortInfo> QueryPortOf(ibv_context* ctx, const std::string& dev, int port_num) {
  if (port_num < 1 || port_num > 255) {
    return absl::InvalidArgumentError(
        absl::StrCat("port ", port_num, " of RDMA device ", dev, " is out of range"));
  }
  ibv_port_attr attr;
  std::memset(&attr, 0, sizeof(attr));
  errno = 0;
  const int rc = ibv_query_port(ctx, static_cast<uint8_t>(port_num), &attr);
  if (rc != 0) {
    return VerbError(absl::StrCat("ibv_query_port(", dev, ", port ", port_num, ")"), ErrFromRc(rc));
  }
  return ToPortInfo(port_num, attr);
}

std::string GidText(const std::array<uint8_t, 16>& gid) {
  std::string out;
  for (int i = 0; i < 16; i += 2) {
    if (i > 0) out += ':';
    absl::StrAppend(&out, absl::Hex((gid[i] << 8) | gid[i + 1], absl::kZeroPad4));
  }
  return out;
}

void PutBe16(uint8_t* p, uint16_t v) {
  p[0] = static_cast<uint8_t>(v >> 8);
  p[1] = static_cast<uint8_t>(v);
}
void PutBe32(uint8_t* p, uint32_t v) {
  for (int i = 0; i < 4; ++i) p[i] = static_cast<uint8_t>(v >> (24 - 8 * i));
}
uint16_t GetBe16(const uint8_t* p) { return static_cast<uint16_t>((p[0] << 8) | p[1]); }
uint32_t GetBe32(const uint8_t* p) {
  return (uint32_t{p[0]} << 24) | (uint32_t{p[1]} << 16) | (uint32_t{p[2]} << 8) | p[3];
}

constexpr uint32_t k24Bits = 0xffffff;
constexpr int kAccessFlags =
    IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ;

}  // namespace

std::string ErrnoText(int err) {
  char buf[256];
  // GNU strerror_r (g++ defines _GNU_SOURCE): returns the message, maybe not in buf.
  const char* text = strerror_r(err, buf, sizeof(buf));
  return absl::StrCat(text, " (errno ", err, ")");
}

const char* PortStateName(PortState s) {
  switch (s) {
    case PortState::kNop: return "NOP";
    case PortState::kDown: return "DOWN";
    case PortState::kInit: return "INIT";
    case PortState::kArmed: return "ARMED";
    case PortState::kActive: return "ACTIVE";
    case PortState::kActiveDefer: return "ACTIVE_DEFER";
    case PortState::kUnknown: break;
  }
  return "UNKNOWN";
}

const char* LinkLayerName(LinkLayer l) {
  switch (l) {
    case LinkLayer::kInfiniBand: return "InfiniBand";
    case LinkLayer::kEthernet: return "Ethernet";
    case LinkLayer::kUnspecified: break;
  }
  return "unspecified";
}

absl::StatusOr<std::vector<VerbsDeviceInfo>> ListVerbsDevices() {
  int count = 0;
  absl::StatusOr<DeviceList> list = GetDeviceList(&count);
  if (!list.ok()) return list.status();
  std::vector<VerbsDeviceInfo> out;
  out.reserve(count);
  for (int i = 0; i < count; ++i) {
    ibv_device* dev = (*list)[i];
    VerbsDeviceInfo info;
    info.name = ibv_get_device_name(dev);
    info.guid = be64toh(ibv_get_device_guid(dev));
    errno = 0;
    ibv_context* ctx = ibv_open_device(dev);
    if (ctx == nullptr) {
      info.error =
          VerbError(absl::StrCat("ibv_open_device(", info.name, ")"), LastErrno()).ToString();
      out.push_back(std::move(info));
      continue;
    }
    ibv_device_attr attr;
    std::memset(&attr, 0, sizeof(attr));
    const int rc = ibv_query_device(ctx, &attr);
    if (rc != 0) {
      info.error =
          VerbError(absl::StrCat("ibv_query_device(", info.name, ")"), ErrFromRc(rc)).ToString();
    } else {
      info.num_ports = attr.phys_port_cnt;
      for (int port = 1; port <= info.num_ports; ++port) {
        absl::StatusOr<PortInfo> p = QueryPortOf(ctx, info.name, port);
        if (p.ok()) {
          info.ports.push_back(*std::move(p));
        } else if (info.error.empty()) {
          info.error = p.status().ToString();
        }
      }
    }
    ibv_close_device(ctx);
    out.push_back(std::move(info));
  }
  return out;
}

// --- Context -------------------------------------------------------------------

absl::StatusOr<std::unique_ptr<Context>> Context::Open(absl::string_view device_name) {
  const std::string name(device_name);
  int count = 0;
  absl::StatusOr<DeviceList> list = GetDeviceList(&count);
  if (!list.ok()) {
    return absl::Status(list.status().code(), absl::StrCat("cannot open RDMA device '", name,
                                                           "': ", list.status().message()));
  }
  ibv_device* found = nullptr;
  std::vector<std::string> names;
  for (int i = 0; i < count; ++i) {
    names.emplace_back(ibv_get_device_name((*list)[i]));
    if (names.back() == name) found = (*list)[i];
  }
  if (found == nullptr) {
    return absl::NotFoundError(absl::StrCat(
        "RDMA device '", name, "' not found (devices: ", absl::StrJoin(names, ", "), ")"));
  }
  errno = 0;
  ibv_context* ctx = ibv_open_device(found);
  if (ctx == nullptr) {
    return VerbError(absl::StrCat("ibv_open_device(", name, ")"), LastErrno());
  }
  ibv_device_attr attr;
  std::memset(&attr, 0, sizeof(attr));
  const int rc = ibv_query_device(ctx, &attr);
  if (rc != 0) {
    const int err = ErrFromRc(rc);
    ibv_close_device(ctx);
    return VerbError(absl::StrCat("ibv_query_device(", name, ")"), err);
  }
  return std::unique_ptr<Context>(new Context(name, ctx, attr.phys_port_cnt));
}

Context::~Context() {
  if (ibv_close_device(ctx_) != 0) {
    GS_LOG(WARNING) << "ibv_close_device(" << name_ << ") failed: " << ErrnoText(LastErrno());
  }
}

absl::StatusOr<PortInfo> Context::QueryPort(int port_num) const {
  return QueryPortOf(ctx_, name_, port_num);
}

absl::StatusOr<std::array<uint8_t, 16>> Context::QueryGid(int port_num, int gid_index) const {
  if (port_num < 1 || port_num > 255 || gid_index < 0) {
    return absl::InvalidArgumentError(absl::StrCat("bad port ", port_num, " / GID index ",
                                                   gid_index, " for RDMA device ", name_));
  }
  ibv_gid gid;
  std::memset(&gid, 0, sizeof(gid));
  errno = 0;
  const int rc = ibv_query_gid(ctx_, static_cast<uint8_t>(port_num), gid_index, &gid);
  if (rc != 0) {
    return VerbError(
        absl::StrCat("ibv_query_gid(", name_, ", port ", port_num, ", index ", gid_index, ")"),
        ErrFromRc(rc));
  }
  std::array<uint8_t, 16> out;
  std::memcpy(out.data(), gid.raw, out.size());
  return out;
}

// --- ProtectionDomain ------------------------------------------------------------

absl::StatusOr<std::unique_ptr<ProtectionDomain>> ProtectionDomain::Create(Context& context) {
  errno = 0;
  ibv_pd* pd = ibv_alloc_pd(context.get());
  if (pd == nullptr) {
    return VerbError(absl::StrCat("ibv_alloc_pd(", context.name(), ")"), LastErrno());
  }
  return std::unique_ptr<ProtectionDomain>(new ProtectionDomain(&context, pd));
}

ProtectionDomain::~ProtectionDomain() {
  const int rc = ibv_dealloc_pd(pd_);
  if (rc != 0) {
    GS_LOG(WARNING) << "ibv_dealloc_pd(" << context_->name()
                    << ") failed (regions or QPs still alive?): " << ErrnoText(ErrFromRc(rc));
  }
}

// --- MemoryRegion ----------------------------------------------------------------

absl::StatusOr<std::unique_ptr<MemoryRegion>> MemoryRegion::Register(ProtectionDomain& pd,
                                                                     void* addr, size_t length) {
  const std::string what = absl::StrCat("ibv_reg_mr(addr=0x", absl::Hex(addr), ", length=", length,
                                        ") on ", pd.context().name());
  if (addr == nullptr || length == 0) {
    return absl::InvalidArgumentError(absl::StrCat(what, ": empty or null buffer"));
  }
  errno = 0;
  ibv_mr* mr = ibv_reg_mr(pd.get(), addr, length, kAccessFlags);
  if (mr == nullptr) {
    const int err = LastErrno();
    absl::Status s = VerbError(what, err);
    if (err == ENOMEM) {
      s = absl::ResourceExhaustedError(
          absl::StrCat(s.message(), "; is the locked-memory limit (ulimit -l) too low?"));
    }
    return s;
  }
  return std::unique_ptr<MemoryRegion>(new MemoryRegion(mr, addr, length));
}

MemoryRegion::~MemoryRegion() {
  const int rc = ibv_dereg_mr(mr_);
  if (rc != 0) {
    GS_LOG(WARNING) << "ibv_dereg_mr(addr=" << addr_ << ") failed: " << ErrnoText(ErrFromRc(rc));
  }
}

uint32_t MemoryRegion::lkey() const { return mr_->lkey; }
uint32_t MemoryRegion::rkey() const { return mr_->rkey; }

RemoteMemory MemoryRegion::Remote(size_t offset) const {
  RemoteMemory r;
  if (offset > length_) offset = length_;
  r.addr = reinterpret_cast<uintptr_t>(addr_) + offset;
  r.length = length_ - offset;
  r.rkey = mr_->rkey;
  return r;
}

// --- CompletionQueue -------------------------------------------------------------

absl::StatusOr<std::unique_ptr<CompletionQueue>> CompletionQueue::Create(Context& context,
                                                                         int depth) {
  if (depth < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("completion queue depth must be >= 1, got ", depth));
  }
  errno = 0;
  ibv_cq* cq = ibv_create_cq(context.get(), depth, /*cq_context=*/nullptr,
                             /*channel=*/nullptr, /*comp_vector=*/0);
  if (cq == nullptr) {
    return VerbError(absl::StrCat("ibv_create_cq(", context.name(), ", depth ", depth, ")"),
                     LastErrno());
  }
  return std::unique_ptr<CompletionQueue>(new CompletionQueue(cq, cq->cqe));
}

CompletionQueue::~CompletionQueue() {
  const int rc = ibv_destroy_cq(cq_);
  if (rc != 0) {
    GS_LOG(WARNING) << "ibv_destroy_cq failed: " << ErrnoText(ErrFromRc(rc));
  }
}

absl::StatusOr<int> CompletionQueue::Poll(int max, std::vector<WorkCompletion>* out) {
  constexpr int kBatch = 16;
  ibv_wc wc[kBatch];
  int total = 0;
  while (total < max) {
    const int want = max - total < kBatch ? max - total : kBatch;
    const int n = ibv_poll_cq(cq_, want, wc);
    if (n < 0) return absl::InternalError(absl::StrCat("ibv_poll_cq failed (", n, ")"));
    for (int i = 0; i < n; ++i) {
      WorkCompletion c;
      c.wr_id = wc[i].wr_id;
      c.status = wc[i].status;
      c.ok = wc[i].status == IBV_WC_SUCCESS;
      if (!c.ok) c.status_text = ibv_wc_status_str(wc[i].status);
      c.opcode = wc[i].opcode;
      c.byte_len = wc[i].byte_len;
      c.has_imm = (wc[i].wc_flags & IBV_WC_WITH_IMM) != 0;
      c.imm_data = c.has_imm ? ntohl(wc[i].imm_data) : 0;
      c.qp_num = wc[i].qp_num;
      out->push_back(std::move(c));
    }
    total += n;
    if (n < want) break;
  }
  return total;
}

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
  ibv_qp* qp = ibv_create_qp(pd.get(), &attr);
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
  const int rc = ibv_destroy_qp(qp_);
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
absl::Status ModifyQp(ibv_qp* qp, ibv_qp_attr* attr, int mask, absl::string_view transition,
                      const std::string& dev) {
  errno = 0;
  const int rc = ibv_modify_qp(qp, attr, mask);
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
  return ModifyQp(qp_, &attr, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS,
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
  return ModifyQp(qp_, &attr,
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
  return ModifyQp(qp_, &attr,
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
  const int rc = ibv_post_send(qp_, &wr, &bad);
  if (rc != 0) {
    return VerbError(absl::StrCat("ibv_post_send(RDMA_WRITE", imm ? "_WITH_IMM" : "", ", qpn 0x",
                                  absl::Hex(qpn()), ", ", length, " bytes to 0x",
                                  absl::Hex(wr.wr.rdma.remote_addr), ")"),
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
  const int rc = ibv_post_recv(qp_, &wr, &bad);
  if (rc != 0) {
    return VerbError(
        absl::StrCat("ibv_post_recv(qpn 0x", absl::Hex(qpn()), ", ", length, " bytes)"),
        ErrFromRc(rc));
  }
  return absl::OkStatus();
}

}  // namespace rdma
}  // namespace gradsync
