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
#include "rdma/verbs_internal.h"
#include "rdma/verbs_table.h"

namespace gradsync {
namespace rdma {
using namespace verbs_internal;  // NOLINT(build/namespaces): this module's helpers
namespace {

struct DeviceListDeleter {
  const VerbsTable* verbs;
  void operator()(ibv_device** list) const { verbs->free_device_list(list); }
};
using DeviceList = std::unique_ptr<ibv_device*[], DeviceListDeleter>;

// ibv_get_device_list, or kUnavailable with the reason.
absl::StatusOr<DeviceList> GetDeviceList(const VerbsTable& v, int* count) {
  *count = 0;
  errno = 0;
  ibv_device** list = v.get_device_list(count);
  if (list == nullptr) {
    const int err = LastErrno();
    *count = 0;
    return absl::UnavailableError(
        absl::StrCat("no RDMA devices: ibv_get_device_list failed: ", ErrnoText(err)));
  }
  DeviceList owned(list, DeviceListDeleter{&v});
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

absl::StatusOr<PortInfo> QueryPortOf(const VerbsTable& v, ibv_context* ctx, const std::string& dev,
                                     int port_num) {
  if (port_num < 1 || port_num > 255) {
    return absl::InvalidArgumentError(
        absl::StrCat("port ", port_num, " of RDMA device ", dev, " is out of range"));
  }
  ibv_port_attr attr;
  std::memset(&attr, 0, sizeof(attr));
  errno = 0;
  const int rc = v.query_port(ctx, static_cast<uint8_t>(port_num), &attr);
  if (rc != 0) {
    return VerbError(absl::StrCat("ibv_query_port(", dev, ", port ", port_num, ")"), ErrFromRc(rc));
  }
  return ToPortInfo(port_num, attr);
}

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

absl::StatusOr<std::vector<VerbsDeviceInfo>> ListVerbsDevices(const VerbsTable& v) {
  int count = 0;
  absl::StatusOr<DeviceList> list = GetDeviceList(v, &count);
  if (!list.ok()) return list.status();
  std::vector<VerbsDeviceInfo> out;
  out.reserve(count);
  for (int i = 0; i < count; ++i) {
    ibv_device* dev = (*list)[i];
    VerbsDeviceInfo info;
    info.name = v.get_device_name(dev);
    info.guid = be64toh(v.get_device_guid(dev));
    errno = 0;
    ibv_context* ctx = v.open_device(dev);
    if (ctx == nullptr) {
      info.error =
          VerbError(absl::StrCat("ibv_open_device(", info.name, ")"), LastErrno()).ToString();
      out.push_back(std::move(info));
      continue;
    }
    ibv_device_attr attr;
    std::memset(&attr, 0, sizeof(attr));
    const int rc = v.query_device(ctx, &attr);
    if (rc != 0) {
      info.error =
          VerbError(absl::StrCat("ibv_query_device(", info.name, ")"), ErrFromRc(rc)).ToString();
    } else {
      info.num_ports = attr.phys_port_cnt;
      for (int port = 1; port <= info.num_ports; ++port) {
        absl::StatusOr<PortInfo> p = QueryPortOf(v, ctx, info.name, port);
        if (p.ok()) {
          info.ports.push_back(*std::move(p));
        } else if (info.error.empty()) {
          info.error = p.status().ToString();
        }
      }
    }
    v.close_device(ctx);
    out.push_back(std::move(info));
  }
  return out;
}

// --- Context -------------------------------------------------------------------

absl::StatusOr<std::unique_ptr<Context>> Context::Open(absl::string_view device_name,
                                                      const VerbsTable& v) {
  const std::string name(device_name);
  int count = 0;
  absl::StatusOr<DeviceList> list = GetDeviceList(v, &count);
  if (!list.ok()) {
    return absl::Status(list.status().code(), absl::StrCat("cannot open RDMA device '", name,
                                                           "': ", list.status().message()));
  }
  ibv_device* found = nullptr;
  std::vector<std::string> names;
  for (int i = 0; i < count; ++i) {
    names.emplace_back(v.get_device_name((*list)[i]));
    if (names.back() == name) found = (*list)[i];
  }
  if (found == nullptr) {
    return absl::NotFoundError(absl::StrCat(
        "RDMA device '", name, "' not found (devices: ", absl::StrJoin(names, ", "), ")"));
  }
  errno = 0;
  ibv_context* ctx = v.open_device(found);
  if (ctx == nullptr) {
    return VerbError(absl::StrCat("ibv_open_device(", name, ")"), LastErrno());
  }
  ibv_device_attr attr;
  std::memset(&attr, 0, sizeof(attr));
  const int rc = v.query_device(ctx, &attr);
  if (rc != 0) {
    const int err = ErrFromRc(rc);
    v.close_device(ctx);
    return VerbError(absl::StrCat("ibv_query_device(", name, ")"), err);
  }
  return std::unique_ptr<Context>(new Context(&v, name, ctx, attr.phys_port_cnt));
}

Context::~Context() {
  if (verbs_->close_device(ctx_) != 0) {
    GS_LOG(WARNING) << "ibv_close_device(" << name_ << ") failed: " << ErrnoText(LastErrno());
  }
}

absl::StatusOr<PortInfo> Context::QueryPort(int port_num) const {
  return QueryPortOf(*verbs_, ctx_, name_, port_num);
}

absl::StatusOr<std::array<uint8_t, 16>> Context::QueryGid(int port_num, int gid_index) const {
  if (port_num < 1 || port_num > 255 || gid_index < 0) {
    return absl::InvalidArgumentError(absl::StrCat("bad port ", port_num, " / GID index ",
                                                   gid_index, " for RDMA device ", name_));
  }
  ibv_gid gid;
  std::memset(&gid, 0, sizeof(gid));
  errno = 0;
  const int rc = verbs_->query_gid(ctx_, static_cast<uint8_t>(port_num), gid_index, &gid);
  if (rc != 0) {
    return VerbError(
        absl::StrCat("ibv_query_gid(", name_, ", port ", port_num, ", index ", gid_index, ")"),
        ErrFromRc(rc));
  }
  std::array<uint8_t, 16> out;
  std::memcpy(out.data(), gid.raw, out.size());
  return out;
}

absl::StatusOr<std::vector<GidEntry>> Context::GidTable(int port_num) const {
  ibv_port_attr attr;
  std::memset(&attr, 0, sizeof(attr));
  const int rc = verbs_->query_port(ctx_, static_cast<uint8_t>(port_num), &attr);
  if (rc != 0) {
    return VerbError(absl::StrCat("ibv_query_port(", name_, ", port ", port_num, ")"),
                     ErrFromRc(rc));
  }
  std::vector<GidEntry> out;
  for (int i = 0; i < attr.gid_tbl_len; ++i) {
    ibv_gid_entry e;
    std::memset(&e, 0, sizeof(e));
    if (verbs_->query_gid_ex(ctx_, port_num, i, &e, 0) != 0) continue;  // an empty entry
    GidEntry g;
    g.index = i;
    std::memcpy(g.gid.data(), e.gid.raw, 16);
    bool zero = true;
    for (uint8_t b : g.gid) zero = zero && b == 0;
    if (zero) continue;
    g.type = e.gid_type == IBV_GID_TYPE_ROCE_V2   ? "RoCE v2"
             : e.gid_type == IBV_GID_TYPE_ROCE_V1 ? "RoCE v1"
                                                  : "IB";
    g.text = g.ipv4_mapped() ? absl::StrFormat("::ffff:%d.%d.%d.%d", g.gid[12], g.gid[13],
                                               g.gid[14], g.gid[15])
                             : GidText(g.gid);
    out.push_back(std::move(g));
  }
  return out;
}

bool GidEntry::ipv4_mapped() const {
  for (int i = 0; i < 10; ++i) {
    if (gid[i] != 0) return false;
  }
  return gid[10] == 0xff && gid[11] == 0xff;
}

int ChooseGidIndex(const std::vector<GidEntry>& table) {
  for (const GidEntry& g : table) {
    if (g.type == "RoCE v2" && g.ipv4_mapped()) return g.index;
  }
  for (const GidEntry& g : table) {
    if (g.type == "RoCE v2") return g.index;
  }
  return 0;
}

// --- ProtectionDomain ------------------------------------------------------------

absl::StatusOr<std::unique_ptr<ProtectionDomain>> ProtectionDomain::Create(Context& context) {
  errno = 0;
  ibv_pd* pd = context.verbs().alloc_pd(context.get());
  if (pd == nullptr) {
    return VerbError(absl::StrCat("ibv_alloc_pd(", context.name(), ")"), LastErrno());
  }
  return std::unique_ptr<ProtectionDomain>(new ProtectionDomain(&context, pd));
}

ProtectionDomain::~ProtectionDomain() {
  const int rc = context_->verbs().dealloc_pd(pd_);
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
  ibv_mr* mr = pd.context().verbs().reg_mr(pd.get(), addr, length, kAccessFlags);
  if (mr == nullptr) {
    const int err = LastErrno();
    absl::Status s = VerbError(what, err);
    if (err == ENOMEM) {
      s = absl::ResourceExhaustedError(
          absl::StrCat(s.message(), "; is the locked-memory limit (ulimit -l) too low?"));
    }
    return s;
  }
  return std::unique_ptr<MemoryRegion>(new MemoryRegion(&pd.context().verbs(), mr, addr, length));
}

absl::StatusOr<std::unique_ptr<MemoryRegion>> MemoryRegion::RegisterDmabuf(
    ProtectionDomain& pd, int fd, uint64_t fd_offset, void* addr, size_t length) {
  const std::string what =
      absl::StrCat("ibv_reg_dmabuf_mr(fd ", fd, ", offset ", fd_offset, ", iova=0x",
                   absl::Hex(addr), ", length=", length, ") on ", pd.context().name());
  if (addr == nullptr || length == 0 || fd < 0) {
    return absl::InvalidArgumentError(absl::StrCat(what, ": no dma-buf or an empty range"));
  }
  errno = 0;
  ibv_mr* mr = pd.context().verbs().reg_dmabuf_mr(pd.get(), fd_offset, length,
                                                  reinterpret_cast<uintptr_t>(addr), fd,
                                                  kAccessFlags);
  if (mr == nullptr) return VerbError(what, LastErrno());
  return std::unique_ptr<MemoryRegion>(new MemoryRegion(&pd.context().verbs(), mr, addr, length));
}

MemoryRegion::~MemoryRegion() {
  const int rc = verbs_->dereg_mr(mr_);
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

absl::StatusOr<std::unique_ptr<CompletionChannel>> CompletionChannel::Create(Context& context) {
  errno = 0;
  ibv_comp_channel* ch = context.verbs().create_comp_channel(context.get());
  if (ch == nullptr) {
    return VerbError(absl::StrCat("ibv_create_comp_channel(", context.name(), ")"), LastErrno());
  }
  return std::unique_ptr<CompletionChannel>(new CompletionChannel(&context.verbs(), ch));
}

CompletionChannel::~CompletionChannel() {
  const int rc = verbs_->destroy_comp_channel(channel_);
  if (rc != 0) {
    GS_LOG(WARNING) << "ibv_destroy_comp_channel failed: " << ErrnoText(ErrFromRc(rc));
  }
}

int CompletionChannel::fd() const { return channel_->fd; }

absl::Status CompletionChannel::TakeEvents() {
  ibv_cq* cq = nullptr;
  void* cq_context = nullptr;
  errno = 0;
  if (verbs_->get_cq_event(channel_, &cq, &cq_context) != 0) {
    const int err = LastErrno();
    if (err == EAGAIN) return absl::OkStatus();
    return VerbError("ibv_get_cq_event", err);
  }
  verbs_->ack_cq_events(cq, 1);
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<CompletionQueue>> CompletionQueue::Create(
    Context& context, int depth, CompletionChannel* channel) {
  if (depth < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("completion queue depth must be >= 1, got ", depth));
  }
  errno = 0;
  ibv_cq* cq = context.verbs().create_cq(context.get(), depth, /*cq_context=*/nullptr,
                                         channel != nullptr ? channel->get() : nullptr,
                                         /*comp_vector=*/0);
  if (cq == nullptr) {
    return VerbError(absl::StrCat("ibv_create_cq(", context.name(), ", depth ", depth, ")"),
                     LastErrno());
  }
  return std::unique_ptr<CompletionQueue>(new CompletionQueue(&context.verbs(), cq, cq->cqe));
}

CompletionQueue::~CompletionQueue() {
  const int rc = verbs_->destroy_cq(cq_);
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
    errno = 0;
    const int n = verbs_->poll_cq(cq_, want, wc);
    if (n < 0) return VerbError("ibv_poll_cq", LastErrno());
    for (int i = 0; i < n; ++i) {
      WorkCompletion c;
      c.wr_id = wc[i].wr_id;
      c.status = wc[i].status;
      c.ok = wc[i].status == IBV_WC_SUCCESS;
      if (!c.ok) c.status_text = verbs_->wc_status_str(wc[i].status);
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

absl::Status CompletionQueue::RequestNotify() {
  const int rc = verbs_->req_notify_cq(cq_, /*solicited_only=*/0);
  if (rc != 0) return VerbError("ibv_req_notify_cq", ErrFromRc(rc));
  return absl::OkStatus();
}

}  // namespace rdma
}  // namespace gradsync
