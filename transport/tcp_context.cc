#include "transport/tcp_context.h"

#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sched.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "common/clock.h"
#include "common/logging.h"

namespace gradsync::transport {

namespace {
constexpr size_t kHeaderBytes = sizeof(FrameHeader);
}  // namespace

static absl::Status PostingBoundError(const char* what, int peer, int bound) {
  return absl::ResourceExhaustedError(absl::StrCat(bound, " ", what, " rank ", peer,
                                                   " already posted (the context's bound); post "
                                                   "again once one completed"));
}

TcpContext::TcpContext(const TcpContextOptions& options, int peers, int self)
    : job_id_(options.job_id),
      job_tag_(JobTag(options.job_id)),
      self_name_(options.self_name.empty() ? absl::StrCat("rank ", options.rank)
                                           : options.self_name),
      verbatim_aborts_(options.verbatim_aborts),
      relay_faults_(options.relay_faults),
      server_(options.server),
      announce_(options.server || options.announce_arrivals),
      epoch_(options.epoch),
      rank_(self),
      size_(peers),
      streams_(std::max(1, options.streams)),
      max_in_flight_(std::max(0, options.max_in_flight)),
      active_streams_(streams_),
      spin_(absl::Microseconds(std::max(0, options.spin_us))),
      peers_(static_cast<size_t>(peers) * std::max(1, options.streams)) {
  for (size_t i = 0; i < peers_.size(); ++i) peers_[i].rank = static_cast<int>(i / streams_);
  for (int p = 0; p < peers; ++p) {
    peer_names_.push_back(static_cast<size_t>(p) < options.peer_names.size() &&
                                  !options.peer_names[p].empty()
                              ? options.peer_names[p]
                              : absl::StrCat("rank ", p));
  }
}


bool TcpContext::Probe(int peer, Incoming* in) {
  for (Peer& p : peers_) {
    if (p.rank != peer || p.in_header_got != kHeaderBytes || !p.recvs.empty()) continue;
    const FrameHeader& h = p.in_header;
    in->tag = MessageTag{h.op_seq, h.slot, h.dtype, h.offset};
    in->bytes = h.length;
    return true;
  }
  return false;
}

bool TcpContext::AnnounceArrivals() {
  bool any = false;
  for (Peer& p : peers_) {
    if (p.rank == rank_) continue;
    if (p.in_header_got == kHeaderBytes && p.recvs.empty() && !p.announced) {
      p.announced = true;
      any = true;
    }
    if (p.closed && !p.close_announced) {
      p.close_announced = true;
      any = true;
    }
  }
  return any;
}

absl::Status TcpContext::PostAbort(int peer, uint64_t op_seq, const absl::Status& why,
                                   Request* req) {
  if (failed_) return health();
  if (peer < 0 || peer >= size_ || peer == rank_) {
    return absl::InvalidArgumentError(absl::StrCat("bad peer rank ", peer));
  }
  if (max_in_flight_ > 0 && PostedSends(peer) >= static_cast<size_t>(max_in_flight_)) {
    return PostingBoundError("sends to", peer, max_in_flight_);
  }
  Peer& p = peers_[static_cast<size_t>(peer) * streams_];
  if (p.closed) return ClosedPeerError(peer);
  req->done = false;
  auto msg = std::make_shared<const std::string>(why.message().substr(0, kMaxAbortBytes));
  const absl::StatusCode code = why.ok() ? absl::StatusCode::kAborted : why.code();
  p.sends.push_back(SendItem{
      MakeHeader(FrameType::kAbort,
                 MessageTag{op_seq, kControlSlot, 0, static_cast<uint64_t>(code)},
                 static_cast<uint32_t>(msg->size())),
      msg->data(), msg->size(), 0, req, msg});
  if (p.sends.size() == 1) {
    bool completed = false;
    if (!DoSend(p, &completed)) return health();
  }
  return absl::OkStatus();
}

bool TcpContext::PeerClosed(int peer) const {
  for (const Peer& p : peers_) {
    if (p.rank == peer && p.closed) return true;
  }
  return false;
}

size_t TcpContext::PostedSends(int peer) const {
  size_t n = 0;
  for (int s = 0; s < streams_; ++s) n += peers_[static_cast<size_t>(peer) * streams_ + s].sends.size();
  return n;
}

size_t TcpContext::PostedRecvs(int peer) const {
  size_t n = 0;
  for (int s = 0; s < streams_; ++s) n += peers_[static_cast<size_t>(peer) * streams_ + s].recvs.size();
  return n;
}


TcpContext::Peer& TcpContext::Conn(int peer, const MessageTag& tag) {
  const int stream = tag.slot == kControlSlot ? 0 : static_cast<int>(tag.slot % active_streams_);
  return peers_[static_cast<size_t>(peer) * streams_ + stream];
}

TcpContext::~TcpContext() {
  if (told_peers_) FlushBeforeClose();
}

absl::StatusOr<std::unique_ptr<MemoryRegion>> TcpContext::RegisterMemory(void* data, size_t size,
                                                                         MemKind kind) {
  if (kind.type != MemKind::kHost) {
    return absl::FailedPreconditionError(absl::StrCat(
        "the TCP device moves host memory only; ", kind.ToString(),
        " memory must be staged through host memory"));
  }
  if (data == nullptr && size != 0) return absl::InvalidArgumentError("null memory region");
  return std::make_unique<MemoryRegion>(static_cast<char*>(data), size);
}

FrameHeader TcpContext::MakeHeader(FrameType type, const MessageTag& tag, uint32_t length) const {
  FrameHeader h;
  h.magic = kFrameMagic;
  h.version = kWireVersion;
  h.type = static_cast<uint8_t>(type);
  h.dtype = tag.dtype;
  h.length = length;
  h.slot = tag.slot;
  h.job_tag = job_tag_;
  h.epoch = epoch_;
  h.op_seq = tag.op_seq;
  h.offset = tag.offset;
  return h;
}

absl::Status TcpContext::PostSend(int peer, const MemoryRegion& mr, size_t offset, size_t len,
                                  const MessageTag& tag, Request* req) {
  if (failed_) return health();
  if (peer < 0 || peer >= size_ || peer == rank_) {
    return absl::InvalidArgumentError(absl::StrCat("bad peer rank ", peer));
  }
  if (offset > mr.size() || len > mr.size() - offset || len > kMaxFrameBytes) {
    return absl::InvalidArgumentError(absl::StrCat("send range [", offset, ", +", len,
                                                   ") outside region of ", mr.size(), " bytes"));
  }
  if (max_in_flight_ > 0 && PostedSends(peer) >= static_cast<size_t>(max_in_flight_)) {
    return PostingBoundError("sends to", peer, max_in_flight_);
  }
  req->done = false;
  last_op_seq_ = tag.op_seq;
  Peer& p = Conn(peer, tag);
  if (p.closed) return ClosedPeerError(peer);
  p.sends.push_back(SendItem{MakeHeader(FrameType::kData, tag, static_cast<uint32_t>(len)),
                             mr.data() + offset, len, 0, req});
  if (p.sends.size() == 1) {  // eager: most small messages leave right here
    bool completed = false;
    if (!DoSend(p, &completed)) return health();
  }
  return absl::OkStatus();
}

absl::Status TcpContext::PostRecv(int peer, const MemoryRegion& mr, size_t offset,
                                  size_t capacity, bool exact, const MessageTag& tag,
                                  Request* req) {
  if (failed_) return health();
  if (peer < 0 || peer >= size_ || peer == rank_) {
    return absl::InvalidArgumentError(absl::StrCat("bad peer rank ", peer));
  }
  if (offset > mr.size() || capacity > mr.size() - offset) {
    return absl::InvalidArgumentError(absl::StrCat("receive range [", offset, ", +", capacity,
                                                   ") outside region of ", mr.size(), " bytes"));
  }
  if (max_in_flight_ > 0 && PostedRecvs(peer) >= static_cast<size_t>(max_in_flight_)) {
    return PostingBoundError("receives from", peer, max_in_flight_);
  }
  req->done = false;
  last_op_seq_ = tag.op_seq;
  if (Conn(peer, tag).closed) return ClosedPeerError(peer);
  Conn(peer, tag).recvs.push_back(RecvItem{mr.data() + offset, capacity, exact, tag, req});
  return absl::OkStatus();
}

bool TcpContext::DoSend(Peer& p, bool* completed) {
  while (!p.sends.empty()) {
    SendItem& s = p.sends.front();
    if (p.ssl != nullptr) {  // a record for the header, then the payload's
      const bool header = s.done < kHeaderBytes;
      const char* src = header ? reinterpret_cast<const char*>(&s.header) + s.done
                               : s.data + (s.done - kHeaderBytes);
      const size_t len = header ? kHeaderBytes - s.done : s.len - (s.done - kHeaderBytes);
      const ssize_t w = len == 0 ? 0 : TlsWriteSome(p, src, len);
      if (w < 0) return false;
      if (w == 0 && len > 0) return true;
      Sent(p, static_cast<size_t>(w), completed);
      continue;
    }
    struct iovec iov[2];
    int n = 0;
    if (s.done < kHeaderBytes) {
      iov[n++] = {reinterpret_cast<char*>(&s.header) + s.done, kHeaderBytes - s.done};
      if (s.len > 0) iov[n++] = {const_cast<char*>(s.data), s.len};
    } else {
      const size_t off = s.done - kHeaderBytes;
      iov[n++] = {const_cast<char*>(s.data) + off, s.len - off};
    }
    struct msghdr m = {};
    m.msg_iov = iov;
    m.msg_iovlen = n;
    ssize_t w = ::sendmsg(p.fd.get(), &m, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (w < 0) {
      if (errno == EAGAIN || errno == EWOULDBLOCK) return true;
      if (errno == EINTR) continue;
      const std::string cause = ErrnoString(errno);
      FailBy(PeerFault{PeerFault::kLost, p.rank, true, cause},
             absl::UnavailableError(absl::StrCat(self_name_, ": connection to ", PeerName(p.rank),
                                                 " lost while sending: ", cause)));
      return false;
    }
    Sent(p, static_cast<size_t>(w), completed);
  }
  return true;
}

void TcpContext::Sent(Peer& p, size_t n, bool* completed) {
  SendItem& s = p.sends.front();
  s.done += n;
  bytes_sent_ += n;
  p.sent += n;
  if (s.done == kHeaderBytes + s.len) {
    s.req->bytes = s.len;
    s.req->done = true;
    p.sends.pop_front();
    *completed = true;
  }
}

ssize_t TcpContext::ReadSome(Peer& p, char* dst, size_t n, const char* where, bool eof_ok) {
  if (p.ssl != nullptr) return TlsReadSome(p, dst, n, where, eof_ok);
  while (true) {
    const ssize_t r = ::recv(p.fd.get(), dst, n, MSG_DONTWAIT);
    if (r == 0 && eof_ok) return kClosed;
    p.maybe_more = r == static_cast<ssize_t>(n);
    if (r > 0) {
      p.received += static_cast<size_t>(r);
      bytes_received_ += static_cast<size_t>(r);
      return r;
    }
    if (r < 0 && errno == EINTR) continue;
    if (r < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return kWouldBlock;
    const std::string cause = r == 0 ? std::string("closed by peer") : ErrnoString(errno);
    FailBy(PeerFault{PeerFault::kLost, p.rank, false, cause},
           absl::UnavailableError(absl::StrCat(self_name_, ": connection to ", PeerName(p.rank),
                                               " lost", where, ": ", cause)));
    return kLost;
  }
}

ssize_t TcpContext::Take(Peer& p, char* dst, size_t n, const char* where, bool eof_ok,
                         bool direct) {
  if (p.stage_begin == p.stage_end) {
    if (!p.maybe_more) {
      p.maybe_more = true;  // once poll() reports the socket readable again
      return kWouldBlock;
    }
    if (direct && n >= kStageBytes / 2) return ReadSome(p, dst, n, where, eof_ok);
    if (p.stage == nullptr) p.stage.reset(new char[kStageBytes]);
    const ssize_t r = ReadSome(p, p.stage.get(), kStageBytes, where, eof_ok);
    if (r <= 0) return r;
    p.stage_begin = 0;
    p.stage_end = static_cast<size_t>(r);
  }
  const size_t k = std::min(n, p.stage_end - p.stage_begin);
  std::memcpy(dst, p.stage.get() + p.stage_begin, k);
  p.stage_begin += k;
  return static_cast<ssize_t>(k);
}

bool TcpContext::MatchRecv(Peer& p, const FrameHeader& h, size_t* index) {
  // The posted receive this message completes: the first with its tag.
  size_t i = 0;
  while (i < p.recvs.size() && !p.recvs[i].Expects(h)) ++i;
  const RecvItem& rv = p.recvs[i < p.recvs.size() ? i : 0];
  const bool len_ok = rv.exact ? h.length == rv.capacity : h.length <= rv.capacity;
  if (i == p.recvs.size() || !len_ok) {
    const std::string what = absl::StrCat(
        "expected op ", rv.tag.op_seq, " slot ",
        static_cast<int64_t>(rv.tag.slot == kControlSlot ? -1 : rv.tag.slot), " offset ",
        rv.tag.offset, " (", rv.exact ? "" : "up to ", rv.capacity, " bytes)",
        p.recvs.size() > 1 ? absl::StrCat(" or one of ", p.recvs.size() - 1, " more") : "",
        ", got ", DescribeFrame(h));
    FailBy(PeerFault{PeerFault::kProtocol, p.rank, false, what},
           absl::DataLossError(absl::StrCat(self_name_, ": protocol error from ",
                                            PeerName(p.rank), ": ", what)));
    return false;
  }
  *index = i;
  return true;
}

bool TcpContext::DoRecv(Peer& p, bool* completed, bool absorb) {
  while (true) {
    if (!p.early.empty()) {
      EarlyFrame& last = p.early.back();
      if (!last.complete()) {  // a frame read early is read whole first
        const ssize_t r = Take(p, last.payload.data() + last.got, last.payload.size() - last.got,
                               " mid-frame", /*eof_ok=*/false, /*direct=*/true);
        if (r < 0) return r == kWouldBlock;
        last.got += static_cast<size_t>(r);
        continue;
      }
      if (!p.recvs.empty()) {  // frames read early complete receives first, in order
        EarlyFrame& e = p.early.front();
        size_t i = 0;
        if (!MatchRecv(p, e.header, &i)) return false;
        RecvItem& rv = p.recvs[i];
        if (!e.payload.empty()) std::memcpy(rv.data, e.payload.data(), e.payload.size());
        rv.req->bytes = e.payload.size();
        rv.req->done = true;
        p.recvs.erase(p.recvs.begin() + static_cast<std::ptrdiff_t>(i));
        p.early_bytes -= e.payload.size();
        p.early.pop_front();
        *completed = true;
        continue;
      }
    }
    if (p.in_header_got < kHeaderBytes) {
      // At a frame boundary with nothing expected, EOF is an orderly close.
      const bool idle = p.in_header_got == 0 && p.recvs.empty();
      const ssize_t r = Take(p, reinterpret_cast<char*>(&p.in_header) + p.in_header_got,
                             kHeaderBytes - p.in_header_got, "", idle, /*direct=*/false);
      if (r == kClosed) {
        p.closed = true;
        return true;
      }
      if (r < 0) return r == kWouldBlock;
      p.in_header_got += static_cast<size_t>(r);
      if (p.in_header_got < kHeaderBytes) continue;
      const FrameHeader& h = p.in_header;
      absl::Status s = ValidateFrameHeader(h);
      if (s.ok() && (h.job_tag != job_tag_ || h.epoch != epoch_)) {
        s = absl::DataLossError(absl::StrCat("frame for another job or epoch (epoch ", h.epoch,
                                             ", this is job '", job_id_, "' epoch ", epoch_, ")"));
      }
      if (!s.ok()) {
        FailBy(PeerFault{PeerFault::kProtocol, p.rank, false, std::string(s.message())},
               absl::DataLossError(absl::StrCat(self_name_, ": protocol error from ",
                                                PeerName(p.rank), ": ", s.message())));
        return false;
      }
      if (h.type == static_cast<uint8_t>(FrameType::kAbort)) {
        std::string msg(h.length, '\0');
        const size_t staged = std::min<size_t>(msg.size(), p.stage_end - p.stage_begin);
        if (staged > 0) std::memcpy(msg.data(), p.stage.get() + p.stage_begin, staged);
        p.stage_begin += staged;
        (void)PeerReadFull(p, msg.data() + staged, msg.size() - staged,
                           FastNow() + absl::Seconds(1));
        PeerFault f{PeerFault::kAborted, p.rank, false, msg};
        if (h.offset > 0 && h.offset <= static_cast<uint64_t>(absl::StatusCode::kUnauthenticated)) {
          f.code = static_cast<absl::StatusCode>(h.offset);
        }
        f.op_seq = h.op_seq;
        const absl::Status why =
            verbatim_aborts_ ? absl::Status(f.code, msg)
                             : absl::AbortedError(absl::StrCat("aborted by ", PeerName(p.rank),
                                                               ": ", msg));
        FailBy(std::move(f), why);
        return false;
      }
      p.in_payload_got = 0;
    }
    const FrameHeader& h = p.in_header;
    if (p.recvs.empty()) {
      if (!absorb || server_ || h.length > kMaxEarlyBytes - p.early_bytes) {
        return true;  // parked until a receive is posted
      }
      // Read it into memory of our own, to see what follows (CheckPeers).
      p.early.push_back(EarlyFrame{h, std::vector<char>(h.length), 0});
      p.early_bytes += h.length;
      p.in_header_got = 0;
      continue;
    }
    if (p.in_payload_got == 0 && !MatchRecv(p, h, &p.in_match)) return false;
    RecvItem& rv = p.recvs[p.in_match];
    while (p.in_payload_got < h.length) {
      const ssize_t r = Take(p, rv.data + p.in_payload_got, h.length - p.in_payload_got,
                             " mid-frame", /*eof_ok=*/false, /*direct=*/true);
      if (r < 0) return r == kWouldBlock;
      p.in_payload_got += static_cast<size_t>(r);
    }
    rv.req->bytes = h.length;
    rv.req->done = true;
    p.recvs.erase(p.recvs.begin() + static_cast<std::ptrdiff_t>(p.in_match));
    p.in_header_got = 0;
    p.in_payload_got = 0;
    p.announced = false;
    *completed = true;
  }
}

absl::Status TcpContext::CheckPeers() {
  if (failed_) return health();  // an Abort() from another thread is told by Progress
  std::vector<::pollfd>& pfds = pfds_;
  std::vector<Peer*>& owners = owners_;
  pfds.clear();
  owners.clear();
  bool completed = false;  // no receive is posted on the connections read here
  for (Peer& p : peers_) {
    // Connections with posted receives are Progress's: nothing is read there.
    if (p.rank == rank_ || !p.fd.valid() || p.closed || !p.recvs.empty()) continue;
    // A parked header, or bytes already off the socket (the stage; TLS
    // records OpenSSL holds) that poll would not report.
    const bool buffered = p.in_header_got == kHeaderBytes || p.stage_begin != p.stage_end ||
                          (p.ssl != nullptr && SSL_has_pending(p.ssl.get()) == 1);
    if (buffered) {
      if (!DoRecv(p, &completed, /*absorb=*/true)) return health();
      if (p.closed) continue;
    }
    pfds.push_back({p.fd.get(), POLLIN, 0});
    owners.push_back(&p);
  }
  int n = 0;
  if (!pfds.empty()) {
    do {
      n = ::poll(pfds.data(), pfds.size(), 0);
    } while (n < 0 && errno == EINTR);
  }
  for (size_t i = 0; n > 0 && i < pfds.size(); ++i) {
    if (pfds[i].revents == 0) continue;
    Peer& p = *owners[i];
    p.maybe_more = true;
    if (!DoRecv(p, &completed, /*absorb=*/true)) return health();
  }
  for (const Peer& p : peers_) {
    if (p.rank != rank_ && p.closed) return ClosedPeerError(p.rank);
  }
  return health();
}

absl::Status TcpContext::Progress(absl::Time deadline) {
  std::vector<::pollfd>& pfds = pfds_;
  std::vector<Peer*>& owners = owners_;
  while (true) {
    if (failed_) return Fail(health());
    // A header that arrived before its receive was posted is already here:
    // its payload may be complete in the socket buffer (or empty), so poll
    // would never report it.
    bool completed_early = false;
    for (Peer& p : peers_) {
      const bool staged = p.in_header_got == kHeaderBytes || p.stage_begin != p.stage_end ||
                          !p.early.empty();
      // TLS: bytes OpenSSL already took off the socket (poll would not see
      // them); a header among them is parked as if read now.
      const bool tls_buffered = p.ssl != nullptr && !p.closed && SSL_has_pending(p.ssl.get()) == 1;
      if (p.rank != rank_ &&
          ((staged && !p.recvs.empty()) || (tls_buffered && p.in_header_got < kHeaderBytes)) &&
          !DoRecv(p, &completed_early)) {
        return health();
      }
    }
    if (completed_early || (announce_ && AnnounceArrivals())) return absl::OkStatus();
    pfds.clear();
    owners.clear();
    pfds.push_back({wake_fd_.get(), POLLIN, 0});
    owners.push_back(nullptr);
    for (Peer& p : peers_) {
      if (p.rank == rank_ || !p.fd.valid() || p.closed) continue;
      short events = 0;
      if (!p.sends.empty()) events |= POLLOUT;
      const bool header_parked = p.in_header_got == kHeaderBytes && p.recvs.empty();
      if (!header_parked) events |= POLLIN;
      if (events == 0) continue;
      pfds.push_back({p.fd.get(), events, 0});
      owners.push_back(&p);
    }
    // Spin briefly (yielding the CPU) before sleeping: a wake-up from a
    // blocking poll costs tens of microseconds, more than a small message's
    // whole round trip on a fast link. While spinning, most turns go
    // straight at the connections the posted requests wait on (a
    // non-blocking recv or send on each: what a small message needs is
    // usually there already, and then no poll is made at all); every
    // kPollEvery-th turn polls every connection, so an abort or a close from
    // a peer nobody waits on is still seen within a few turns.
    int n = 0;
    const absl::Time spin_until = std::min(FastNow() + spin_, deadline);  // never past the deadline
    for (int turn = 0;; ++turn) {
      if (spin_ > absl::ZeroDuration() && turn % kPollEvery != kPollEvery - 1) {
        bool completed = false;
        for (Peer& p : peers_) {
          if (p.rank == rank_ || !p.fd.valid() || p.closed) continue;
          if (!p.sends.empty() && !DoSend(p, &completed)) return health();
          if (!p.recvs.empty()) {
            p.maybe_more = true;  // ask the socket, not poll()
            if (!DoRecv(p, &completed)) return health();
          }
        }
        if (completed || (announce_ && AnnounceArrivals())) return absl::OkStatus();
        if (failed_) return Fail(health());  // Abort() from another thread
        if (interrupted_.load(std::memory_order_relaxed)) break;  // poll() sees the eventfd
      } else {
        n = ::poll(pfds.data(), pfds.size(), 0);
        if (n != 0) break;
      }
      if (spin_ <= absl::ZeroDuration() || FastNow() >= spin_until) break;
      sched_yield();
    }
    if (n == 0) n = ::poll(pfds.data(), pfds.size(), PollTimeoutMs(deadline, 1000));
    if (n < 0) {
      if (errno == EINTR) continue;
      return Fail(absl::InternalError("poll: " + ErrnoString(errno)));
    }
    if (n == 0) {
      if (FastNow() >= deadline) return absl::DeadlineExceededError("deadline exceeded");
      continue;
    }
    if (pfds[0].revents != 0) {
      if (failed_) return Fail(health());  // Abort() from another thread
      uint64_t count;
      (void)!::read(wake_fd_.get(), &count, sizeof(count));  // drained either way
      if (interrupted_.exchange(false)) {  // Interrupt(): hand over, as at a deadline
        return absl::DeadlineExceededError("interrupted");
      }
    }
    bool completed = false;
    for (size_t i = 1; i < pfds.size(); ++i) {
      const short ev = pfds[i].revents;
      if (ev == 0) continue;
      Peer& p = *owners[i];
      if ((ev & (POLLOUT | POLLERR | POLLHUP)) && !p.sends.empty() && !DoSend(p, &completed)) {
        return health();
      }
      if (ev & (POLLIN | POLLERR | POLLHUP)) {
        p.maybe_more = true;
        if (!DoRecv(p, &completed)) return health();
      }
    }
    if (completed || (announce_ && AnnounceArrivals())) return absl::OkStatus();
  }
}

void TcpContext::Interrupt() {
  interrupted_.store(true);
  uint64_t one = 1;
  (void)!::write(wake_fd_.get(), &one, sizeof(one));
}



uint64_t TcpContext::BytesSentTo(int peer) const {
  uint64_t total = 0;
  for (const Peer& p : peers_) {
    if (p.rank == peer) total += p.sent;
  }
  return total;
}

absl::Status TcpContext::ClosedPeerError(int peer) {
  const std::string cause = "closed by peer (it left or stopped)";
  FailBy(PeerFault{PeerFault::kLost, peer, false, cause},
         absl::UnavailableError(
             absl::StrCat(self_name_, ": connection to ", PeerName(peer), " lost: ", cause)));
  return health();
}

uint64_t TcpContext::Retransmits(int peer) const {
  uint64_t total = 0;
  for (const Peer& p : peers_) {
    if (p.rank != peer || !p.fd.valid()) continue;
    struct tcp_info info;
    socklen_t len = sizeof(info);
    if (::getsockopt(p.fd.get(), IPPROTO_TCP, TCP_INFO, &info, &len) == 0) {
      total += info.tcpi_total_retrans;
    }
  }
  return total;
}

uint64_t TcpContext::BytesReceivedFrom(int peer) const {
  uint64_t total = 0;
  for (const Peer& p : peers_) {
    if (p.rank == peer) total += p.received;
  }
  return total;
}

absl::Status TcpContext::health() const {
  absl::MutexLock l(&mu_);
  return error_;
}


}  // namespace gradsync::transport
