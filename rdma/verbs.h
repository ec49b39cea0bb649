// RAII building blocks over libibverbs, used by the RDMA transport
// (transport/rdma_context.h). Every verb goes through a VerbsTable
// (verbs_table.h): libibverbs, or the in-process emulation in tests; a
// Context is opened on one and its children use the same.
//
// The transport's use: one reliable-connected (RC) QueuePair per peer,
// one-sided RDMA WRITE, receiver-driven like NCCL's net_ib:
//   1. Both sides open a Context, allocate a ProtectionDomain, create
//      CompletionQueues and a QueuePair, and exchange QpEndpoint values
//      (QpEndpoint::Encode/Decode: 28 bytes) over the existing TCP connection.
//      Each side then calls QueuePair::Connect (INIT -> RTR -> RTS).
//   2. For every message, the receiver sends a clear-to-send entry {address,
//      rkey, length, tag, sequence} to the sender (an inline SEND).
//   3. The sender RDMA-WRITEs the data straight into the receiver's buffer
//      (PostWrite, with an immediate value so the receiver gets a
//      completion), and both sides reap completions from their CQs.
// Nothing here knows about collectives; buffers and keys are all it deals in.
//
// Availability: hosts without an RDMA NIC (or whose kernel has no RDMA support)
// are normal. ListVerbsDevices and Context::Open then return kUnavailable with
// the reason (e.g. ibv_get_device_list failing with ENOSYS), and callers fall
// back to TCP. No function here aborts; every failure is an absl::Status naming
// the verb, its arguments and errno.
//
// Ownership and lifetime: factories return std::unique_ptr. A child keeps a raw
// (non-owning) pointer to its parent, so the parent must outlive it:
//   Context > ProtectionDomain > MemoryRegion, QueuePair;  Context > CompletionQueue
//   (a QueuePair must also be destroyed before its CompletionQueues).
// Thread-safety: the objects are immutable after creation apart from the verbs
// calls, which libibverbs makes thread-safe; one thread per QP/CQ is the intended
// use (the transport's progress thread).
#ifndef GRADSYNC_RDMA_VERBS_H_
#define GRADSYNC_RDMA_VERBS_H_

#include <array>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

// libibverbs types, kept out of this header (include <infiniband/verbs.h> to use get()).
struct ibv_context;
struct ibv_pd;
struct ibv_mr;
struct ibv_cq;
struct ibv_qp;
struct ibv_comp_channel;

namespace gradsync {
namespace rdma {

struct VerbsTable;
const VerbsTable& RealVerbs();

enum class PortState { kNop, kDown, kInit, kArmed, kActive, kActiveDefer, kUnknown };
enum class LinkLayer { kUnspecified, kInfiniBand, kEthernet };

const char* PortStateName(PortState s);  // "DOWN", "ACTIVE", ...
const char* LinkLayerName(LinkLayer l);  // "InfiniBand", "Ethernet", "unspecified"

struct PortInfo {
  int port_num = 0;  // 1-based, as in verbs
  PortState state = PortState::kUnknown;
  uint16_t lid = 0;    // 0 on Ethernet (RoCE)
  int active_mtu = 0;  // bytes: 256 .. 4096
  LinkLayer link_layer = LinkLayer::kUnspecified;
  int active_width = 0;  // lanes: 1, 2, 4, 8, 12 (0 = unknown)
  double lane_gbps = 0;  // signalling rate per lane (e.g. 50 for HDR)
  double speed_gbps() const { return lane_gbps * active_width; }
  std::string speed;  // e.g. "4x HDR (200 Gb/s)"
};

struct VerbsDeviceInfo {
  std::string name;   // e.g. "mlx5_0"
  uint64_t guid = 0;  // node GUID, host byte order
  int num_ports = 0;
  std::vector<PortInfo> ports;
  // Non-empty when the device is listed but could not be opened or queried; the
  // fields above are then partial.
  std::string error;
};

struct GidEntry {
  int index = 0;
  std::array<uint8_t, 16> gid{};
  std::string type;  // "IB", "RoCE v1", "RoCE v2"
  std::string text;  // "fe80:0000:...", IPv4-mapped as "::ffff:10.0.0.1"
  bool ipv4_mapped() const;
};
// The GID index RoCE traffic should use: the first RoCE v2 entry with an
// IPv4-mapped address (routable, what a RoCEv2 fabric with PFC/ECN is set up
// for), else the first RoCE v2 entry, else 0.
int ChooseGidIndex(const std::vector<GidEntry>& table);

// The devices libibverbs sees. kUnavailable when there are none:
// "no RDMA devices: ibv_get_device_list failed: Function not implemented (errno 38)"
// (kernel without RDMA support) or "no RDMA devices found" (empty list).
absl::StatusOr<std::vector<VerbsDeviceInfo>> ListVerbsDevices(const VerbsTable& verbs = RealVerbs());

// "Function not implemented (errno 38)".
std::string ErrnoText(int err);

// --- Context: an opened device (ibv_open_device / ibv_close_device) ---------
class Context {
 public:
  // kUnavailable when no RDMA device exists, kNotFound when `device_name` is not
  // among them (the message lists the names), kUnavailable/kPermissionDenied when
  // opening fails; every message names the device.
  static absl::StatusOr<std::unique_ptr<Context>> Open(absl::string_view device_name,
                                                       const VerbsTable& verbs = RealVerbs());
  ~Context();
  Context(const Context&) = delete;
  Context& operator=(const Context&) = delete;

  const std::string& name() const { return name_; }
  ibv_context* get() const { return ctx_; }
  const VerbsTable& verbs() const { return *verbs_; }
  int num_ports() const { return num_ports_; }

  absl::StatusOr<PortInfo> QueryPort(int port_num) const;
  // GID table entry (RoCE needs one; on InfiniBand index 0 is the port GID).
  absl::StatusOr<std::array<uint8_t, 16>> QueryGid(int port_num, int gid_index) const;
  // The port's GID table: the entries that are set, with their types.
  absl::StatusOr<std::vector<GidEntry>> GidTable(int port_num) const;

 private:
  Context(const VerbsTable* verbs, std::string name, ibv_context* ctx, int num_ports)
      : verbs_(verbs), name_(std::move(name)), ctx_(ctx), num_ports_(num_ports) {}

  const VerbsTable* verbs_;
  std::string name_;
  ibv_context* ctx_;  // owned
  int num_ports_;
};

// --- ProtectionDomain (ibv_alloc_pd / ibv_dealloc_pd) ------------------------
class ProtectionDomain {
 public:
  static absl::StatusOr<std::unique_ptr<ProtectionDomain>> Create(Context& context);
  ~ProtectionDomain();
  ProtectionDomain(const ProtectionDomain&) = delete;
  ProtectionDomain& operator=(const ProtectionDomain&) = delete;

  ibv_pd* get() const { return pd_; }
  Context& context() const { return *context_; }

 private:
  ProtectionDomain(Context* context, ibv_pd* pd) : context_(context), pd_(pd) {}
  Context* context_;  // not owned
  ibv_pd* pd_;        // owned
};

// Where a peer may RDMA-WRITE/READ: exchanged out of band (e.g. in a
// clear-to-send entry). Plain data.
struct RemoteMemory {
  uint64_t addr = 0;
  uint64_t length = 0;
  uint32_t rkey = 0;
};

// --- MemoryRegion (ibv_reg_mr / ibv_dereg_mr) --------------------------------
class MemoryRegion {
 public:
  // Registers [addr, addr + length) with LOCAL_WRITE | REMOTE_WRITE | REMOTE_READ.
  // The memory is not owned and must stay allocated until the region is destroyed.
  // Failure (e.g. ENOMEM past the memlock limit) is kResourceExhausted or
  // kInternal naming the address, length and errno; it never aborts.
  static absl::StatusOr<std::unique_ptr<MemoryRegion>> Register(ProtectionDomain& pd, void* addr,
                                                                size_t length);
  // Registers device memory exported as a dma-buf (GPUDirect RDMA without
  // nvidia-peermem): [fd_offset, +length) of dma-buf `fd`, addressed by the
  // peer as [addr, addr + length).
  static absl::StatusOr<std::unique_ptr<MemoryRegion>> RegisterDmabuf(ProtectionDomain& pd, int fd,
                                                                      uint64_t fd_offset,
                                                                      void* addr, size_t length);
  ~MemoryRegion();
  MemoryRegion(const MemoryRegion&) = delete;
  MemoryRegion& operator=(const MemoryRegion&) = delete;

  void* addr() const { return addr_; }
  size_t length() const { return length_; }
  uint32_t lkey() const;
  uint32_t rkey() const;
  // What a peer needs to write into [addr + offset, addr + offset + length).
  RemoteMemory Remote(size_t offset = 0) const;
  ibv_mr* get() const { return mr_; }

 private:
  MemoryRegion(const VerbsTable* verbs, ibv_mr* mr, void* addr, size_t length)
      : verbs_(verbs), mr_(mr), addr_(addr), length_(length) {}
  const VerbsTable* verbs_;
  ibv_mr* mr_;  // owned
  void* addr_;
  size_t length_;
};

// One reaped work completion (a subset of ibv_wc).
struct WorkCompletion {
  uint64_t wr_id = 0;
  bool ok = false;
  int status = 0;           // enum ibv_wc_status
  std::string status_text;  // ibv_wc_status_str, set when !ok
  int opcode = 0;           // enum ibv_wc_opcode
  uint32_t byte_len = 0;
  bool has_imm = false;
  uint32_t imm_data = 0;  // host byte order
  uint32_t qp_num = 0;
};

// --- CompletionChannel (ibv_create_comp_channel): a file descriptor that
// turns readable when an armed CompletionQueue gets a completion -------------
class CompletionChannel {
 public:
  static absl::StatusOr<std::unique_ptr<CompletionChannel>> Create(Context& context);
  ~CompletionChannel();
  CompletionChannel(const CompletionChannel&) = delete;
  CompletionChannel& operator=(const CompletionChannel&) = delete;

  int fd() const;  // for poll(2); the channel is non-blocking only if the caller makes it so
  // Reads and acknowledges one event (ibv_get_cq_event + ibv_ack_cq_events);
  // OK when none was pending on a non-blocking fd.
  absl::Status TakeEvents();
  ibv_comp_channel* get() const { return channel_; }

 private:
  CompletionChannel(const VerbsTable* verbs, ibv_comp_channel* channel)
      : verbs_(verbs), channel_(channel) {}
  const VerbsTable* verbs_;
  ibv_comp_channel* channel_;  // owned
};

// --- CompletionQueue (ibv_create_cq / ibv_destroy_cq), polled; with a
// channel, RequestNotify arms it ----------------------------------------------
class CompletionQueue {
 public:
  static absl::StatusOr<std::unique_ptr<CompletionQueue>> Create(
      Context& context, int depth, CompletionChannel* channel = nullptr);
  ~CompletionQueue();
  CompletionQueue(const CompletionQueue&) = delete;
  CompletionQueue& operator=(const CompletionQueue&) = delete;

  // Non-blocking: appends up to `max` completions to `out`; returns how many.
  // A failed *completion* is reported in WorkCompletion::ok, not as an error;
  // an error means ibv_poll_cq itself failed.
  absl::StatusOr<int> Poll(int max, std::vector<WorkCompletion>* out);
  // Arms the channel: the next completion makes its fd readable (once).
  absl::Status RequestNotify();

  ibv_cq* get() const { return cq_; }
  int depth() const { return depth_; }

 private:
  CompletionQueue(const VerbsTable* verbs, ibv_cq* cq, int depth)
      : verbs_(verbs), cq_(cq), depth_(depth) {}
  const VerbsTable* verbs_;
  ibv_cq* cq_;  // owned
  int depth_;
};

// Connection data for one side of an RC queue pair; exchanged over TCP.
struct QpEndpoint {
  uint16_t lid = 0;               // InfiniBand LID (0 on RoCE)
  std::array<uint8_t, 16> gid{};  // GID (needed on RoCE and across subnets)
  uint32_t qpn = 0;               // queue pair number (24 bits)
  uint32_t psn = 0;               // initial packet sequence number (24 bits)

  static constexpr size_t kEncodedSize = 28;
  // Fixed 28-byte wire form: version (1) = 1, reserved (1), lid (2, big-endian),
  // qpn (4, BE), psn (4, BE), gid (16).
  std::string Encode() const;
  // kInvalidArgument on a wrong size, version or out-of-range qpn/psn.
  static absl::StatusOr<QpEndpoint> Decode(absl::string_view bytes);
  std::string DebugString() const;  // "lid 0x1 qpn 0x123 psn 0x456 gid fe80:..."
  bool operator==(const QpEndpoint& o) const {
    return lid == o.lid && gid == o.gid && qpn == o.qpn && psn == o.psn;
  }
};

struct QueuePairOptions {
  int max_send_wr = 256;
  int max_recv_wr = 256;
  int max_send_sge = 1;
  int max_recv_sge = 1;
  int max_inline_data = 64;  // bytes; clear-to-send entries fit inline
};

struct ConnectOptions {
  int port_num = 1;
  int gid_index = 0;    // RoCE: the GID table index to use (RoCEv2 often 3)
  int path_mtu = 4096;  // bytes; clamped to the port's active MTU
  uint8_t service_level = 0;
  uint8_t timeout = 14;  // 4.096 us * 2^14 = 67 ms local ACK timeout
  uint8_t retry_count = 7;
  uint8_t rnr_retry = 7;  // 7 = retry forever on receiver-not-ready
  uint8_t min_rnr_timer = 12;
  uint8_t max_rd_atomic = 1;  // outstanding RDMA READs (initiator / responder)
};

// --- QueuePair: reliable connected (IBV_QPT_RC) ------------------------------
class QueuePair {
 public:
  static absl::StatusOr<std::unique_ptr<QueuePair>> Create(ProtectionDomain& pd,
                                                           CompletionQueue& send_cq,
                                                           CompletionQueue& recv_cq,
                                                           const QueuePairOptions& options = {});
  ~QueuePair();
  QueuePair(const QueuePair&) = delete;
  QueuePair& operator=(const QueuePair&) = delete;

  uint32_t qpn() const;
  ibv_qp* get() const { return qp_; }

  // This side's endpoint (LID and GID from `options`' port and GID index, a
  // random 24-bit PSN), to send to the peer.
  absl::StatusOr<QpEndpoint> LocalEndpoint(const ConnectOptions& options = {}) const;

  // The three state transitions; Connect does all of them in order. `local` is
  // the value LocalEndpoint returned (its PSN is the send PSN), `remote` the peer's.
  absl::Status ModifyToInit(const ConnectOptions& options);
  absl::Status ModifyToRtr(const QpEndpoint& remote, const ConnectOptions& options);
  absl::Status ModifyToRts(const QpEndpoint& local, const ConnectOptions& options);
  absl::Status Connect(const QpEndpoint& local, const QpEndpoint& remote,
                       const ConnectOptions& options = {});

  // Posts an RDMA WRITE of mr[offset, offset + length) to remote.addr
  // (+ remote_offset). With `imm`, uses RDMA_WRITE_WITH_IMM, which consumes a
  // posted receive at the peer and gives it a completion carrying `imm`.
  // Non-blocking; the completion (if `signaled`) arrives on the send CQ.
  absl::Status PostWrite(const MemoryRegion& mr, size_t offset, size_t length,
                         const RemoteMemory& remote, uint64_t remote_offset, uint64_t wr_id,
                         bool signaled, const uint32_t* imm = nullptr);
  // Posts a SEND of `length` bytes copied from `data` at posting (inline: no
  // registration; length <= max_inline_data()). It consumes a posted receive
  // at the peer.
  absl::Status PostSendInline(const void* data, size_t length, uint64_t wr_id, bool signaled);
  size_t max_inline_data() const { return max_inline_data_; }
  // Posts a receive of mr[offset, offset + length) (length may be 0 when it only
  // collects RDMA_WRITE_WITH_IMM notifications).
  absl::Status PostRecv(const MemoryRegion& mr, size_t offset, size_t length, uint64_t wr_id);

 private:
  QueuePair(ProtectionDomain* pd, ibv_qp* qp) : pd_(pd), qp_(qp) {}
  ProtectionDomain* pd_;          // not owned
  ibv_qp* qp_;                    // owned
  uint32_t max_inline_data_ = 0;  // granted by the device; smaller writes go inline
};

}  // namespace rdma
}  // namespace gradsync

#endif  // GRADSYNC_RDMA_VERBS_H_
