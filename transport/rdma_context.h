// The RDMA implementation of transport::Context: one reliable-connected
// queue pair per peer, receiver-driven as NCCL's net_ib is.
//
//   PostRecv  sends the peer a clear-to-send entry (CTS: sequence number,
//             tag, address, rkey, capacity, exact) as a 48-byte inline SEND.
//   PostSend  waits (in Progress) for the CTS with its tag, then RDMA-WRITEs
//             the payload straight from the registered source into the
//             receiver's memory: parts of at most 1 GiB, the last one
//             WRITE_WITH_IMM, immediate = CTS sequence (24 bits) | parts-1
//             (8 bits). The send completes on the write's completion, the
//             receive on the immediate's (its byte_len is the last part's).
//   Progress  polls the one completion queue of the context, sleeping on its
//             completion channel (and an eventfd Abort and Interrupt signal),
//             and checks the bootstrap connections.
//
// Client and server contexts (Device::ConnectToServers / AcceptClient, the
// parameter server): a server learns what a client sends before it posts a
// receive, so the client announces each send with an RTS entry (tag,
// length; rdma_control.h) before its data; the server's Probe reports it and
// the receive it then posts sends the CTS. One more control message per
// message on that path only. PostAbort goes over the bootstrap connection.
//
// Per peer and direction at most max_in_flight() requests are posted (more:
// ResourceExhausted, as every context), so the send queue holds at most
// max_in_flight CTS entries plus the writes of max_in_flight messages, and
// the receive queue is pre-posted with enough small slots for every CTS and
// immediate that can arrive (receives are re-posted as they complete).
//
// Sends to a peer are written in posting order: the head send waits for its
// CTS even when a later one's is there (the TCP context delivers in order
// too). A CTS whose capacity cannot take the message (or, exact, is not its
// size) is a protocol error (DataLoss) at the sender.
//
// Bootstrap and faults: the context owns a TCP context of the same job (one
// connection per peer, authenticated with the job key, transport/wire.h)
// that carried the queue pairs' endpoints. It stays open: a peer's ABORT
// arrives on it and a peer process that dies closes it, so failures are
// reported as the TCP context reports them ("aborted by rank R: ...",
// "connection to rank R lost"). A failed work completion (retry exceeded, a
// remote access error, ...) fails the context with Unavailable naming the
// peer and the verbs status, and the bootstrap tells every peer.
#ifndef GRADSYNC_TRANSPORT_RDMA_CONTEXT_H_
#define GRADSYNC_TRANSPORT_RDMA_CONTEXT_H_

#include <atomic>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "common/net.h"
#include "rdma/verbs.h"
#include "transport/rdma_control.h"
#include "transport/transport.h"

namespace gradsync::transport {

enum class GpuDirect { kNone, kPeerMem, kDmaBuf };
// Exports the dma-buf of the allocation holding a device range (production:
// cuda::ExportDmaBuf): the caller owns the descriptor.
struct DmaBuf {
  int fd = -1;
  uint64_t offset = 0;  // of the range's first byte in the dma-buf
};
using DmaBufExporter = std::function<absl::StatusOr<DmaBuf>(const void* ptr, size_t size)>;

// The verbs resources the contexts of one RDMA device share.
struct RdmaPort {
  rdma::Context* verbs_context = nullptr;  // owned by the device
  rdma::ConnectOptions connect;  // port, GID index, MTU
  // How device (CUDA) memory registers with the NIC, if it can: GPUDirect
  // RDMA by ibv_reg_mr on the device pointer (the nvidia_peermem module) or
  // by a dma-buf of the allocation (ibv_reg_dmabuf_mr).
  GpuDirect gpudirect = GpuDirect::kNone;
  DmaBufExporter export_dmabuf;  // kDmaBuf
};

struct RdmaContextOptions {
  int max_in_flight = 32;
  int max_inline_data = 64;
  // A client's context toward servers (Device::ConnectToServers): every send
  // is announced to the peer (an RTS entry: tag and length) before its data.
  bool announce_sends = false;
  // A server's context (Device::AcceptClient): announced messages no posted
  // receive expects are reported by Probe, and Progress returns for them.
  bool report_unexpected = false;
  // How errors name peer k ("rank k" when missing) and this context.
  std::vector<std::string> peer_names;
  std::string self_name;
};

class RdmaContext final : public Context {
 public:
  // The largest part one RDMA WRITE carries, and the most parts a message has.
  static constexpr size_t kMaxWrite = size_t{1} << 30;
  static constexpr size_t kMaxParts = 256;

  // Creates the queue pairs on `port`, exchanges endpoints with every peer
  // over `bootstrap` (a connected context of the same job, rank and world)
  // and connects them, by `deadline`.
  static absl::StatusOr<std::unique_ptr<RdmaContext>> Connect(const RdmaPort& port,
                                                              std::unique_ptr<Context> bootstrap,
                                                              const RdmaContextOptions& options,
                                                              absl::Time deadline);
  ~RdmaContext() override;

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  using Context::RegisterMemory;
  absl::StatusOr<std::unique_ptr<MemoryRegion>> RegisterMemory(void* data, size_t size,
                                                               MemKind kind) override;
  absl::Status PostSend(int peer, const MemoryRegion& mr, size_t offset, size_t len,
                        const MessageTag& tag, Request* req) override;
  absl::Status PostRecv(int peer, const MemoryRegion& mr, size_t offset, size_t capacity,
                        bool exact, const MessageTag& tag, Request* req) override;
  absl::Status Progress(absl::Time deadline) override;
  bool Probe(int peer, Incoming* in) override;
  // Over the bootstrap connection (the peer reads ABORTs there).
  absl::Status PostAbort(int peer, uint64_t op_seq, const absl::Status& why,
                         Request* req) override;
  void Abort(const absl::Status& reason) override;
  void Interrupt() override;
  absl::Status Fail(const absl::Status& reason) override;
  void BeginOp(uint64_t op_seq) override { bootstrap_->BeginOp(op_seq); }
  absl::Status health() const override { return status_; }
  // Looks at the bootstrap connections only (TcpContext::CheckPeers: a
  // peer's ABORT, a lost or closed connection); the completion queue is left
  // to Progress (a peer cannot write before this rank's clear-to-send, and
  // an early CTS waits in its queue either way).
  absl::Status CheckPeers() override;
  PeerFault fault() const override;
  bool PeerClosed(int peer) const override { return bootstrap_->PeerClosed(peer); }
  uint64_t BytesSentTo(int peer) const override;
  uint64_t BytesReceivedFrom(int peer) const override;
  int max_in_flight() const override { return options_.max_in_flight; }

  // Protocol counters (tests and the emulation bench): CTS entries sent and
  // received, RDMA WRITEs posted, for every peer together.
  struct Counters {
    uint64_t control_sent = 0;  // CTS and RTS entries
    uint64_t cts_received = 0;
    uint64_t rts_sent = 0;
    uint64_t rts_received = 0;
    uint64_t writes = 0;
    uint64_t messages_sent = 0;
    uint64_t messages_received = 0;
    uint64_t send_queue_waits = 0;  // a message or CTS waited for send-queue room
  };
  const Counters& counters() const { return counters_; }

  struct Peer;  // rdma_context.cc

 private:
  RdmaContext(const RdmaPort& port, std::unique_ptr<Context> bootstrap,
              const RdmaContextOptions& options);
  absl::Status SetUp(absl::Time deadline);
  absl::Status Drain(bool* completed);
  absl::Status OnCompletion(const rdma::WorkCompletion& wc, bool* completed);
  // A client announced a message (RTS): held for Probe unless a receive for
  // it is posted already.
  absl::Status OnAnnounced(Peer& p, const rdma_control::Entry& rts, bool* completed);
  std::string PeerName(int peer) const;
  std::string SelfName() const;
  absl::Status PumpPeer(Peer& p);
  // A peer's ABORT or lost connection on the bootstrap fails the context
  // with the bootstrap's error; a peer that closed its connections while
  // requests wait on it fails it with Unavailable naming the peer.
  absl::Status CheckBootstrap();
  absl::Status CheckPeersLeft();
  absl::Status FailWith(const absl::Status& reason, const PeerFault& fault);
  absl::StatusOr<Peer*> PeerFor(int peer, const char* what);

  const RdmaPort port_;
  const RdmaContextOptions options_;
  // This context's own protection domain: its queue pairs reach only the
  // memory registered on it (another job's rkeys mean nothing here). Shared
  // with its regions, which may outlive the context.
  std::shared_ptr<rdma::ProtectionDomain> pd_;
  std::unique_ptr<Context> bootstrap_;
  const int rank_;
  const int size_;
  std::unique_ptr<rdma::CompletionChannel> channel_;
  std::unique_ptr<rdma::CompletionQueue> cq_;
  std::vector<std::unique_ptr<Peer>> peers_;  // by rank; null for this rank
  std::map<uint32_t, int> peer_of_qpn_;
  UniqueFd wake_fd_;
  absl::Status status_;
  PeerFault fault_;
  bool own_fault_ = false;
  Counters counters_;
  std::vector<rdma::WorkCompletion> wcs_;

  absl::Mutex abort_mu_;
  absl::Status abort_reason_ ABSL_GUARDED_BY(abort_mu_);
  std::atomic<bool> aborted_{false};
  std::atomic<bool> interrupted_{false};
};

}  // namespace gradsync::transport

#endif  // GRADSYNC_TRANSPORT_RDMA_CONTEXT_H_
