// TcpContext's failures: a peer's fault or the owner's Fail/Abort fails the
// context once, and every peer is told with an ABORT frame (after the frame
// each was in the middle of, so none misparses).
#include <linux/sockios.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/clock.h"
#include "transport/tcp_context.h"

namespace gradsync::transport {
namespace {
constexpr size_t kHeaderBytes = sizeof(FrameHeader);
constexpr absl::Duration kFlushBeforeClose = absl::Milliseconds(250);
}  // namespace

void TcpContext::FailBy(PeerFault f, const absl::Status& reason) {
  if (!failed_ && fault_.kind == PeerFault::kNone) fault_ = std::move(f);
  if (relay_faults_) {
    (void)Fail(reason);
    return;
  }
  {
    absl::MutexLock l(&mu_);
    if (error_.ok()) error_ = reason;
  }
  failed_ = true;
}

void TcpContext::Abort(const absl::Status& reason) {
  {
    absl::MutexLock l(&mu_);
    if (error_.ok()) error_ = reason.ok() ? absl::AbortedError("aborted") : reason;
  }
  failed_ = true;
  uint64_t one = 1;
  (void)!::write(wake_fd_.get(), &one, sizeof(one));
}

absl::Status TcpContext::Fail(const absl::Status& reason) {
  {
    absl::MutexLock l(&mu_);
    if (error_.ok()) error_ = reason.ok() ? absl::AbortedError("aborted") : reason;
  }
  failed_ = true;
  if (!told_peers_) {
    told_peers_ = true;
    // Without relaying, a peer's fault is told in the words of the owner's
    // first Fail().
    BroadcastAbort(relay_faults_ || reason.ok() ? health() : reason);
  }
  return health();
}

void TcpContext::BroadcastAbort(const absl::Status& reason) {
  const std::string msg(reason.message().substr(0, kMaxAbortBytes));
  const absl::Time deadline = FastNow() + absl::Milliseconds(300);
  for (Peer& p : peers_) {
    if (p.rank == rank_ || !p.fd.valid()) continue;
    // Finish a frame that is half on the wire, or the peer would misparse
    // (with TLS, a header record OpenSSL holds after WANT_WRITE counts too).
    const bool half_sent =
        !p.sends.empty() &&
        (p.sends.front().done > 0 || (p.ssl != nullptr && SSL_want_write(p.ssl.get())));
    if (half_sent) {
      SendItem& s = p.sends.front();
      absl::Status st;
      if (s.done < kHeaderBytes) {
        st = PeerWriteFull(p, reinterpret_cast<char*>(&s.header) + s.done, kHeaderBytes - s.done,
                           deadline);
        s.done = kHeaderBytes;
      }
      if (st.ok()) st = PeerWriteFull(p, s.data + (s.done - kHeaderBytes),
                                      s.len - (s.done - kHeaderBytes), deadline);
      if (!st.ok()) continue;
    }
    FrameHeader h = MakeHeader(FrameType::kAbort,
                               MessageTag{server_ ? kConnectionOp : last_op_seq_, kControlSlot,
                                          0, static_cast<uint64_t>(reason.code())},
                               static_cast<uint32_t>(msg.size()));
    if (PeerWriteFull(p, &h, sizeof(h), deadline).ok()) {
      (void)PeerWriteFull(p, msg.data(), msg.size(), deadline);
    }
  }
  for (Peer& p : peers_) {
    p.sends.clear();
    p.recvs.clear();
  }
}

void TcpContext::FlushBeforeClose() {
  std::vector<int> open;
  for (Peer& p : peers_) {
    if (p.rank == rank_ || !p.fd.valid()) continue;
    ::shutdown(p.fd.get(), SHUT_WR);
    open.push_back(p.fd.get());
  }
  const absl::Time deadline = FastNow() + kFlushBeforeClose;
  char sink[4096];
  while (!open.empty()) {
    for (size_t i = 0; i < open.size();) {
      ssize_t r;
      while ((r = ::recv(open[i], sink, sizeof(sink), MSG_DONTWAIT)) > 0) {
      }
      int unacked = 0;
      const bool done = r == 0 || (r < 0 && errno != EAGAIN && errno != EINTR) ||
                        (::ioctl(open[i], SIOCOUTQ, &unacked) == 0 && unacked == 0);
      if (done) {
        open[i] = open.back();
        open.pop_back();
      } else {
        ++i;
      }
    }
    if (open.empty() || FastNow() >= deadline) break;
    absl::SleepFor(absl::Milliseconds(1));
  }
}

}  // namespace gradsync::transport
