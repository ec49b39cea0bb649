#include "worker/peer_traffic.h"

namespace gradsync {

PeerTraffic::PeerTraffic(const JobPlacement& placement, std::string transport,
                         transport::Context* node_ctx, DaemonObserver* observer)
    : place_(placement),
      transport_(std::move(transport)),
      node_ctx_(node_ctx),
      observer_(observer),
      sent_(placement.nodes(), 0),
      received_(placement.nodes(), 0),
      retrans_(placement.nodes(), 0) {}

void PeerTraffic::Account(size_t bytes, absl::Duration run, absl::Time end) {
  if (observer_ == nullptr || node_ctx_ == nullptr) return;
  if (bytes >= kBandwidthMinBytes || end >= next_flush_) {
    Flush(run, end);
  } else {
    dirty_ = true;
  }
  // Retransmit counters cost a getsockopt(TCP_INFO) per connection: at most once a second.
  const transport::TcpControls* tcp = node_ctx_->tcp();
  if (tcp == nullptr || end < next_retrans_sample_) return;
  next_retrans_sample_ = end + absl::Seconds(1);
  for (int p = 0; p < place_.nodes(); ++p) {
    if (p == place_.node_index) continue;
    const uint64_t retrans = tcp->Retransmits(p);
    if (retrans > retrans_[p]) {
      observer_->OnPeerRetransmits(place_.node_names[p], retrans - retrans_[p]);
      retrans_[p] = retrans;
    }
  }
}

void PeerTraffic::FlushIfDirty(absl::Time now) {
  if (dirty_ && observer_ != nullptr) Flush(absl::ZeroDuration(), now);
}

void PeerTraffic::Flush(absl::Duration op_run, absl::Time now) {
  dirty_ = false;
  next_flush_ = now + kBytesPeriod;
  if (node_ctx_ == nullptr || observer_ == nullptr) return;
  const double secs = absl::ToDoubleSeconds(op_run);
  for (int p = 0; p < place_.nodes(); ++p) {
    if (p == place_.node_index) continue;
    const uint64_t sent = node_ctx_->BytesSentTo(p), recv = node_ctx_->BytesReceivedFrom(p);
    if (sent == sent_[p] && recv == received_[p]) continue;
    const std::string& peer = place_.node_names[p];
    observer_->OnPeerBytes(peer, transport_, sent - sent_[p], recv - received_[p]);
    // Since the last flush: the op just finished, plus at most a period of small ops.
    if (sent - sent_[p] >= kBandwidthMinBytes && secs > 0) {
      observer_->OnPeerBandwidth(peer, transport_, (sent - sent_[p]) / secs);
    }
    sent_[p] = sent;
    received_[p] = recv;
  }
}

}  // namespace gradsync
