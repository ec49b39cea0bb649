// TCP implementation of transport::Context.
//
// `streams` persistent, non-blocking sockets per peer (created by Connect()). Sends
// are written with writev straight from the registered memory (header +
// payload, no copy); receives read the 48-byte header, check it against the
// tag the receive was posted with, then read the payload straight into the
// destination. Progress() polls every peer socket plus an eventfd that
// Abort() signals, so a failure anywhere wakes the op thread at once.
#ifndef GRADSYNC_TRANSPORT_TCP_CONTEXT_H_
#define GRADSYNC_TRANSPORT_TCP_CONTEXT_H_

#include <poll.h>
#include <sys/types.h>

#include <atomic>
#include <deque>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "common/net.h"
#include "transport/tcp_listener.h"
#include "transport/tcp_tls.h"
#include "transport/transport.h"
#include "transport/wire.h"

namespace gradsync::transport {

struct TcpContextOptions {
  std::string job_id;
  uint64_t epoch = 0;
  int rank = 0;
  int world_size = 1;
  std::vector<HostPort> peers;  // data endpoints, indexed by rank
  absl::Time deadline;          // for the whole connection set-up
  // Connect: how long a claimed connection has for each step of its
  // handshake (its nonce; its proof after our answer) before it is dropped
  // and the next one with the same Hello is tried.
  absl::Duration handshake_step_timeout = absl::Seconds(3);
  int socket_buffer_bytes = 0;  // SO_SNDBUF/SO_RCVBUF; 0: the kernel's autotuned buffers
  // TCP connections per peer pair. Message i of an op travels on stream
  // i % streams (control messages on stream 0), so one flow's window is not
  // the ceiling; each stream keeps its own order.
  int streams = 1;
  // Microseconds Progress() polls without blocking (yielding the CPU) before
  // it sleeps in poll(2). 0 = sleep at once.
  int spin_us = 0;
  // Context::max_in_flight(); 0: unbounded.
  int max_in_flight = kDefaultMaxInFlight;
  static constexpr int kDefaultMaxInFlight = 64;
  // How errors name this rank and peer p: default "rank R", "rank p".
  std::string self_name;
  std::vector<std::string> peer_names;
  // A peer's ABORT fails the context with the peer's code and message
  // verbatim, instead of Aborted("aborted by <peer>: <message>").
  bool verbatim_aborts = false;
  // A peer's fault (loss, ABORT, protocol error) is told to the other peers
  // at once, in the context's words. Off: the owner's Fail(reason) tells them
  // in its own words (the PS worker names the shard, step and partition).
  bool relay_faults = true;
  // The job's key (Connect): both ends of every connection prove they hold
  // it at the handshake (wire.h); a connection whose peer cannot is closed
  // and, on the accepting side, the next connection with the same Hello is
  // tried. Empty: the proof proves nothing (tests).
  std::string job_key;
  // ConnectToServers: the key server k must prove (and this client proves
  // back) for the connection; missing entries are empty keys.
  std::vector<std::string> server_keys;
  // ConnectToServers: the Hello's stream field (ServerSetSpec::hello_stream).
  uint32_t hello_stream = 0;
  // Hears each connection refused for a missing or wrong proof ("bad_proof",
  // "no_proof"); may be empty.
  std::function<void(absl::string_view reason)> on_auth_failure;
  // TLS 1.3 on every connection after the job-key handshake (tcp_tls.h),
  // bound to the key the handshake proved: Connect's job_key, Adopt's
  // job_key (the shard's key of the job; the client must be a node), or
  // ConnectToServers' server_keys (each server must be a PS shard). Null:
  // plaintext frames.
  std::shared_ptr<const DataTls> tls;
  // Server contexts (Adopt): Progress also returns OK when a message no
  // posted receive expects arrives (Probe) or the peer closes; the context's
  // own ABORT names kConnectionOp.
  bool server = false;
  // A peer-to-peer context (Connect) whose driver posts a receive only for a
  // message it has seen (Probe): Progress also returns OK when a message no
  // posted receive expects arrives or a peer closes, as for a server
  // (worker/point_to_point.h). Nothing else of a server changes.
  bool announce_arrivals = false;
};

class TcpContext : public Context, public TcpControls {
 public:
  // Connects to every peer: lower ranks connect to higher ranks (handshake
  // through the higher rank's TcpListener), higher ranks claim those
  // connections from `listener`. The connecting side runs on a thread of its
  // own, so no cycle of waits can form and every proof comes within a round
  // trip. Fails with the first peer that could not be reached by the deadline.
  static absl::StatusOr<std::unique_ptr<TcpContext>> Connect(const TcpContextOptions& options,
                                                             TcpListener* listener);
  // A client context (Device::ConnectToServers): dials every address of
  // `options.peers` (server k = peer k, one stream each), Hello src_rank =
  // options.rank, dst_rank = k, world_size = options.world_size (the
  // clients). rank() is -1 and size() the number of servers. Errors:
  // "<peer name>: cannot connect: <cause>" with the cause's code.
  static absl::StatusOr<std::unique_ptr<TcpContext>> ConnectToServers(
      const TcpContextOptions& options);
  // A server context (Device::AcceptClient) over one handshaken connection:
  // peer 0 is the client, rank() -1; options.server is implied.
  static absl::StatusOr<std::unique_ptr<TcpContext>> Adopt(UniqueFd fd,
                                                           const TcpContextOptions& options);
  ~TcpContext() override;

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
  void Abort(const absl::Status& reason) override;
  absl::Status Fail(const absl::Status& reason) override;
  void BeginOp(uint64_t op_seq) override { last_op_seq_ = op_seq; }
  absl::Status health() const override;
  // Polls every idle connection once (no posted receive on it): ABORT
  // frames, breaks and closes fail the context; data frames that arrive
  // before their receive is posted are read into memory of the context's
  // own (at most kMaxEarlyBytes per connection; a larger one stays parked
  // in the socket, and what follows it unseen) and complete that receive
  // when it is posted. Server contexts read no data early.
  absl::Status CheckPeers() override;
  static constexpr size_t kMaxEarlyBytes = 4 << 20;
  PeerFault fault() const override { return fault_; }
  bool Probe(int peer, Incoming* in) override;
  absl::Status PostAbort(int peer, uint64_t op_seq, const absl::Status& why,
                         Request* req) override;
  bool PeerClosed(int peer) const override;
  uint64_t BytesSentTo(int peer) const override;
  uint64_t BytesReceivedFrom(int peer) const override;
  TcpControls* tcp() override { return this; }
  uint64_t Retransmits(int peer) const override;
  int max_in_flight() const override { return max_in_flight_; }
  int streams() const override { return streams_; }
  int active_streams() const override { return active_streams_; }
  void UseStreams(int n) override { active_streams_ = n < 1 ? 1 : (n > streams_ ? streams_ : n); }

  // How long Progress polls (yielding the CPU) before it sleeps in poll(2),
  // from the next call on (TcpContextOptions::spin_us). Driving thread only.
  void SetSpin(absl::Duration spin) { spin_ = spin; }
  // From any thread: the Progress running now, or the next one, returns
  // DeadlineExceeded at once (as if its deadline had passed), without
  // failing the context: a thread that waits in Progress can hand the
  // context over to another.
  void Interrupt() override;

  // Bytes moved since creation (for metrics and the link probe).
  uint64_t bytes_sent() const { return bytes_sent_; }
  uint64_t bytes_received() const { return bytes_received_; }

 private:
  struct SendItem {
    FrameHeader header;
    const char* data;
    size_t len;
    size_t done;  // bytes of header+payload written
    Request* req;
    std::shared_ptr<const std::string> owned;  // the payload of a PostAbort
  };
  struct RecvItem {
    char* data;
    size_t capacity;
    bool exact;
    MessageTag tag;
    Request* req;
    bool Expects(const FrameHeader& h) const {
      return h.op_seq == tag.op_seq && h.slot == tag.slot && h.offset == tag.offset &&
             h.dtype == tag.dtype;
    }
  };
  // A data frame read before its receive was posted (CheckPeers); `got`
  // bytes of its payload are in.
  struct EarlyFrame {
    FrameHeader header;
    std::vector<char> payload;
    size_t got = 0;
    bool complete() const { return got == payload.size(); }
  };
  struct Peer {
    int rank = -1;
    UniqueFd fd;
    SslPtr ssl;  // TLS over fd (data TLS), else null; freed before fd closes
    // A TLS read failed after it had returned data: the cause, told at the next read.
    std::string tls_error;
    bool tls_eof = false;  // ... or the peer's close
    std::deque<SendItem> sends;
    std::deque<RecvItem> recvs;
    FrameHeader in_header;
    size_t in_header_got = 0;
    size_t in_payload_got = 0;
    size_t in_match = 0;  // the receive (index in `recvs`) the frame being read completes
    // Frames read early, in arrival order (before in_header): they complete
    // receives first. The last one may still be filling.
    std::deque<EarlyFrame> early;
    size_t early_bytes = 0;
    uint64_t sent = 0;
    uint64_t received = 0;
    // Receive staging: one recv() takes a small frame's header and payload
    // (and whatever follows) at once, instead of a recv() each. Payloads of
    // kStageBytes/2 or more are read straight into their destination.
    std::unique_ptr<char[]> stage;  // kStageBytes, allocated on first use
    size_t stage_begin = 0, stage_end = 0;
    // The last recv() filled all it asked for: the socket may hold more.
    // After a short read the next bytes wait for poll() to report them.
    bool maybe_more = true;
    // The peer closed the connection at a frame boundary while nothing was
    // expected from it (e.g. it finished the job and left). Not an error
    // until something is posted to or from it.
    bool closed = false;
    // Server contexts: this parked header / this close was reported by Progress.
    bool announced = false;
    bool close_announced = false;
  };
  // Server contexts: a parked header or a close Progress has not reported yet
  // (marks it reported).
  bool AnnounceArrivals();

  // `peers` contexts (connections) per stream; `self` this rank's index, or
  // -1 for a client of servers.
  TcpContext(const TcpContextOptions& options, int peers, int self);
  // The context with its wake-up eventfd, no connections yet.
  static absl::StatusOr<std::unique_ptr<TcpContext>> Create(const TcpContextOptions& options,
                                                            int peers, int self);
  const std::string& PeerName(int peer) const { return peer_names_[peer]; }
  // Records what `peer` did (the first fault wins) and fails the context.
  void FailBy(PeerFault f, const absl::Status& reason);
  std::vector<::pollfd> pfds_;  // Progress' poll set (reused)
  std::vector<Peer*> owners_;
  // The connection that carries messages with this tag to/from `peer`.
  Peer& Conn(int peer, const MessageTag& tag);
  FrameHeader MakeHeader(FrameType type, const MessageTag& tag, uint32_t length) const;
  // Return false when the peer failed the context (then `health()` says why).
  bool DoSend(Peer& p, bool* completed);
  // Accounts n more bytes of p's first send; completes it when all are out.
  void Sent(Peer& p, size_t n, bool* completed);
  // `absorb` (CheckPeers): a data frame no posted receive waits for is read
  // into p.early (within kMaxEarlyBytes) instead of parked in the socket.
  bool DoRecv(Peer& p, bool* completed, bool absorb = false);
  // The posted receive (index in p.recvs) a frame with header h completes;
  // false after failing the context with a protocol error naming the peer.
  bool MatchRecv(Peer& p, const FrameHeader& h, size_t* index);
  // recv() into dst: bytes read (> 0), kWouldBlock, or kLost after failing
  // the context ("connection to rank R lost<where>: ...").
  static constexpr ssize_t kWouldBlock = -1;
  static constexpr ssize_t kLost = -2;
  static constexpr ssize_t kClosed = -3;  // orderly EOF and eof_ok
  ssize_t ReadSome(Peer& p, char* dst, size_t n, const char* where, bool eof_ok = false);
  // ReadSome and the send of DoSend over TLS.
  ssize_t TlsReadSome(Peer& p, char* dst, size_t n, const char* where, bool eof_ok);
  // Bytes written (>= 0, 0 = would block), or -1 after failing the context.
  ssize_t TlsWriteSome(Peer& p, const char* src, size_t n);
  // Blocking (poll) exact reads and writes on a connection, plain or TLS,
  // for ABORT frames.
  static absl::Status PeerReadFull(Peer& p, char* dst, size_t n, absl::Time deadline);
  static absl::Status PeerWriteFull(Peer& p, const void* src, size_t n, absl::Time deadline);
  // TLS on every connection (options.tls), after the job-key handshake.
  absl::Status SecurePeers(const TcpContextOptions& options);
  // Copies up to n staged bytes to dst, else refills the stage (or, for
  // `direct` reads of n >= kStageBytes/2, reads into dst): bytes copied (> 0),
  // or ReadSome's kWouldBlock/kLost/kClosed. kWouldBlock without a system call
  // when the last read was short.
  ssize_t Take(Peer& p, char* dst, size_t n, const char* where, bool eof_ok, bool direct);
  static constexpr size_t kStageBytes = 16 << 10;
  absl::Status ClosedPeerError(int peer);
  // Tells every peer (an ABORT frame: reason's code in `offset`, the latest
  // posted op in `op_seq`, its message) and drops what is posted.
  void BroadcastAbort(const absl::Status& reason);
  // Before the connections close after an ABORT: each is half-closed and
  // read until the peer has acknowledged everything sent (bounded). Closing
  // with unread bytes would reset the connection and drop an ABORT still in
  // the send queue.
  void FlushBeforeClose();

  const std::string job_id_;
  const uint64_t job_tag_;
  const std::string self_name_;
  std::vector<std::string> peer_names_;
  const bool verbatim_aborts_;
  const bool relay_faults_;
  const bool server_;
  const bool announce_;  // Progress returns for arrivals no receive expects, and closes
  PeerFault fault_;          // driving thread only
  uint64_t last_op_seq_ = 0;  // of the latest post; ABORT frames name it
  const uint64_t epoch_;
  const int rank_;
  const int size_;
  const int streams_;
  const int max_in_flight_;
  // Posted and not yet completed, over the peer's streams.
  size_t PostedSends(int peer) const;
  size_t PostedRecvs(int peer) const;
  int active_streams_;  // driving thread only
  absl::Duration spin_;  // driving thread only (SetSpin)
  static constexpr int kPollEvery = 8;  // spinning: poll every connection every 8th turn
  std::vector<Peer> peers_;  // connection (rank, stream) at rank * streams_ + stream
  UniqueFd wake_fd_;         // eventfd signalled by Abort() and Interrupt()
  std::atomic<bool> interrupted_{false};

  mutable absl::Mutex mu_;
  absl::Status error_ ABSL_GUARDED_BY(mu_);
  std::atomic<bool> failed_{false};
  bool told_peers_ = false;  // op thread only

  uint64_t bytes_sent_ = 0;
  uint64_t bytes_received_ = 0;
};

}  // namespace gradsync::transport

#endif  // GRADSYNC_TRANSPORT_TCP_CONTEXT_H_
