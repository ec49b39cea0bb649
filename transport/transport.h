// The transport interface the collective algorithms are written against.
//
// It carries no collective meaning (like NCCL's net plugins): a Context is one
// rank's set of connections to every peer of one job epoch; algorithms
// register memory, post tagged sends and receives of byte ranges of that
// memory, and drive completion with Progress(). The shape fits RDMA: a
// MemoryRegion is what ibv_reg_mr returns (lkey/rkey live in the subclass);
// PostRecv is where a receiver-driven RDMA transport writes its clear-to-send
// entry (address, rkey) into the sender's memory; PostSend becomes an RDMA
// WRITE once the CTS arrived; Progress polls the completion queue. The TCP
// transport (tcp_context.h) implements the same calls over framed streams.
//
// Ordering: sends to one peer complete in posting order. Each receive states
// the tag it expects; an incoming message completes the posted receive from
// its peer with the same tag (receives with equal tags in posting order), so
// a server may answer a client's requests in any order. A message that no
// posted receive expects, while receives from that peer are posted, fails
// the context (a protocol error, never silently wrong data); one that
// arrives while none is posted waits for one.
//
// Threading: a Context is driven by one thread at a time (the job's op
// thread). Only Abort() may be called from any thread.
//
// Contexts come from a Device (device.h), which says what memory it can move
// and what its links are like.
#ifndef GRADSYNC_TRANSPORT_TRANSPORT_H_
#define GRADSYNC_TRANSPORT_TRANSPORT_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace gradsync::transport {

// Where a buffer lives: host memory, or the memory of CUDA device `device`.
struct MemKind {
  enum Type : uint8_t { kHost = 0, kCuda = 1 };
  Type type = kHost;
  int device = -1;  // kCuda: the CUDA device ordinal

  static MemKind Host() { return MemKind{}; }
  static MemKind Cuda(int device) { return MemKind{kCuda, device}; }
  bool operator==(const MemKind& o) const { return type == o.type && device == o.device; }
  // "host", "cuda:0".
  std::string ToString() const {
    return type == kHost ? "host" : "cuda:" + std::to_string(device);
  }
};

// Memory the transport may read or write. Created by Context::RegisterMemory
// (or as a RegionView of part of such a region, memory.h); the caller keeps
// [data, data+size) alive while the region exists and while any request on it
// is pending.
class MemoryRegion {
 public:
  MemoryRegion(char* data, size_t size, MemKind kind = MemKind::Host())
      : data_(data), size_(size), kind_(kind) {}
  virtual ~MemoryRegion() = default;
  char* data() const { return data_; }
  size_t size() const { return size_; }
  MemKind kind() const { return kind_; }
  // The region the context registered that this one lies in: itself, or the
  // parent of a view. Transports with keys (RDMA lkey/rkey) read them there,
  // at offset data() - registered().data().
  virtual const MemoryRegion& registered() const { return *this; }

 private:
  char* data_;
  size_t size_;
  MemKind kind_;
};

// What only TCP contexts have: several connections per peer (streams) that
// messages are spread over, and the kernel's retransmission counters.
// Context::tcp() returns it (null for other devices).
class TcpControls {
 public:
  virtual ~TcpControls() = default;
  // Connections per peer, and how many of them messages are spread over
  // (message i uses connection i % in-use; control messages connection 0).
  // Every rank must switch at the same point, between ops.
  virtual int streams() const = 0;
  virtual int active_streams() const = 0;
  virtual void UseStreams(int n) = 0;
  // Retransmitted segments on the connections to `peer` (TCP_INFO), 0 if unknown.
  virtual uint64_t Retransmits(int peer) const = 0;
};

// MessageTag::slot of an op's control messages (signatures, ABORTs), as
// opposed to its data messages 0, 1, ...
inline constexpr uint32_t kControlSlot = 0xffffffffu;
// The largest message any context carries in one piece; larger payloads are
// split by the algorithm.
inline constexpr uint32_t kMaxMessageBytes = 64u << 20;

// Identifies one message within a job epoch.
struct MessageTag {
  uint64_t op_seq = 0;
  uint32_t slot = 0;    // message index within the op, or kControlSlot
  uint8_t dtype = 0;    // element type of the payload (0 for control)
  uint64_t offset = 0;  // byte offset of the payload within the op's buffer
};

// op_seq of an ABORT about the whole connection rather than one op.
inline constexpr uint64_t kConnectionOp = ~0ull;

// A message that arrived while no posted receive expected it (Context::Probe).
struct Incoming {
  MessageTag tag;
  size_t bytes = 0;
};

// A posted send or receive; owned by the caller, who keeps it alive until it
// is done or the context failed. Written only by the thread calling Progress.
struct Request {
  bool done = false;
  size_t bytes = 0;  // bytes transferred (the actual length of a received message)
};

// What a peer did to fail a context (Context::fault()).
struct PeerFault {
  enum Kind : uint8_t { kNone = 0, kLost, kAborted, kProtocol };
  Kind kind = kNone;
  int peer = -1;
  bool while_sending = false;  // kLost: the connection broke while sending to the peer
  // kLost: "closed by peer" or the socket error; kAborted: the reason the
  // peer's ABORT carried; kProtocol: what was wrong with its message.
  std::string cause;
  // kAborted: the status code and the op sequence number its ABORT carried.
  absl::StatusCode code = absl::StatusCode::kAborted;
  uint64_t op_seq = 0;
};

class Context {
 public:
  virtual ~Context() = default;

  // Unique among the contexts of this process (never reused), so caches of
  // registrations can tell a new context from a destroyed one at the same address.
  uint64_t id() const { return id_; }

  // This rank, and the number of ranks (peers are 0..size()-1 but rank()).
  // A context that connects a client to a set of servers
  // (Device::ConnectToServers) has rank() -1: every peer is a server.
  virtual int rank() const = 0;
  virtual int size() const = 0;

  // Registers [data, data+size) of `kind` for sends and receives.
  // FailedPrecondition naming the kind if the device cannot move it.
  virtual absl::StatusOr<std::unique_ptr<MemoryRegion>> RegisterMemory(void* data, size_t size,
                                                                       MemKind kind) = 0;
  absl::StatusOr<std::unique_ptr<MemoryRegion>> RegisterMemory(void* data, size_t size) {
    return RegisterMemory(data, size, MemKind::Host());
  }

  // Posts a send of mr[offset, offset+len) to `peer`. Non-blocking.
  // InvalidArgument for a bad peer or range; the context's error if it failed.
  virtual absl::Status PostSend(int peer, const MemoryRegion& mr, size_t offset, size_t len,
                                const MessageTag& tag, Request* req) = 0;

  // Posts a receive from `peer` into mr[offset, offset+capacity). With
  // `exact`, the message must be exactly `capacity` bytes. Non-blocking.
  virtual absl::Status PostRecv(int peer, const MemoryRegion& mr, size_t offset, size_t capacity,
                                bool exact, const MessageTag& tag, Request* req) = 0;

  // Advances posted requests until at least one completes (OK), the deadline
  // passes (DeadlineExceeded; the context stays usable), or the context fails
  // (its error: Unavailable for a lost peer, Aborted for an abort from a peer
  // or Abort(), DataLoss for a protocol error). A failed context tells every
  // peer (an ABORT frame with the reason) and stays failed.
  virtual absl::Status Progress(absl::Time deadline) = 0;

  // Fails the context from any thread; wakes Progress. The first reason wins.
  virtual void Abort(const absl::Status& reason) = 0;

  // From any thread: the Progress running now, or the next one, returns
  // DeadlineExceeded at once without failing the context (a server's
  // connection thread is woken so to post what other threads queued).
  virtual void Interrupt() = 0;

  // Servers: whether a message from `peer` waits that no posted receive
  // expects (its tag and length in *in); post a receive with that tag to
  // take it. Contexts from Device::AcceptClient make Progress return OK when
  // such a message arrives, or when the peer closes its connection.
  virtual bool Probe(int peer, Incoming* in) { (void)peer; (void)in; return false; }

  // Tells `peer` that op `op_seq` failed with `why` (an ABORT frame with the
  // code), without failing the context; completes like a send. Servers use it
  // to fail one request of a client that goes on using the connection.
  virtual absl::Status PostAbort(int peer, uint64_t op_seq, const absl::Status& why, Request* req) {
    (void)peer; (void)op_seq; (void)why; (void)req;
    return absl::UnimplementedError("this transport has no op-scoped aborts");
  }

  // Fails the context from the driving thread and tells the peers. The first
  // reason wins; returns the context's error.
  virtual absl::Status Fail(const absl::Status& reason) = 0;
  // The op the driver starts now, before it posts anything for it: a
  // failure's ABORT names it even when the op failed before its first post
  // (devices whose ABORT names no op ignore it). Driving thread only.
  virtual void BeginOp(uint64_t op_seq) { (void)op_seq; }

  // OK, or the error the context failed with.
  virtual absl::Status health() const = 0;

  // Whether a peer failed the context while its driver posts nothing (it
  // waits for work of its own). Driving thread only; never blocks; meant to
  // be called at a bounded interval, not per message. Looks at what the
  // peers did since the last Progress without taking any message a receive
  // may be posted for later: an ABORT from a peer, or a connection that
  // broke or closed (a peer that closed counts as lost here, even at a
  // message boundary: the caller is about to need every peer), fails the
  // context as Progress would (fault() names the peer; the failure is
  // relayed to the other peers as Progress relays it). Data that arrived
  // early stays queued for the receive posted later (TCP reads such frames
  // into memory of its own, up to a bound per connection, to see an ABORT
  // behind them). A context failed by Abort() from another thread
  // is not failed further here (nothing is told to the peers). Returns
  // health() after looking. The default, for a device that cannot look
  // without progressing, only returns health().
  virtual absl::Status CheckPeers() { return health(); }

  // The peer that failed the context and how (kind kNone when no peer did:
  // a deadline, Abort(), Fail()). Driving thread only.
  virtual PeerFault fault() const { return {}; }
  // Whether `peer` closed its connections at a message boundary while
  // nothing was expected from it (it left); posting to or from it then fails.
  virtual bool PeerClosed(int peer) const { (void)peer; return false; }

  // Payload and header bytes moved to / from `peer` since creation (driving
  // thread only; for metrics).
  virtual uint64_t BytesSentTo(int peer) const { (void)peer; return 0; }
  virtual uint64_t BytesReceivedFrom(int peer) const { (void)peer; return 0; }
  // Requests that may be posted and not yet completed per peer and direction
  // (sends to a peer; receives from a peer); a post beyond it fails with
  // ResourceExhausted, and the caller posts again once one completed
  // (collective/exchange.h does). 0: unbounded.
  virtual int max_in_flight() const { return 0; }
  // The TCP-only knobs (TcpControls), or null for other devices.
  virtual TcpControls* tcp() { return nullptr; }
  const TcpControls* tcp() const { return const_cast<Context*>(this)->tcp(); }

 protected:
  Context();

 private:
  const uint64_t id_;
};

}  // namespace gradsync::transport

#endif  // GRADSYNC_TRANSPORT_TRANSPORT_H_
