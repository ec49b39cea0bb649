// JobExecutor's exchanges among the job's daemons (the signature exchange
// with this daemon's share, and every rank's signature when they differ) and
// its per-peer metrics. See job_executor.h.
#include <algorithm>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "collective/collectives.h"
#include "common/clock.h"
#include "worker/job_executor.h"
#include "worker/session.h"

namespace gradsync {
namespace {

constexpr uint64_t kPeerBandwidthMinBytes = 1u << 20;
constexpr absl::Duration kPeerBytesPeriod = absl::Milliseconds(100);

}  // namespace

absl::Status JobExecutor::Exchange(const std::vector<QueuedOp*>& ops, const Plan& mine,
                                   bool local_mismatch, uint8_t* agreed_code,
                                   uint8_t* agreed_streams) {
  const QueuedOp& lead = *ops[0];
  const JobPlacement& place = options_.placement;
  OpSignature rep = lead.sig;
  rep.proposal = mine.Code();
  rep.streams = mine.streams;
  if (local_mismatch) {
    // Differs from every other daemon's signature: the exchange reports a
    // mismatch everywhere, and every rank's signature is compared next.
    rep.name = absl::StrCat("\x01ranks of daemon ", place.node_index, " disagree");
  }
  absl::Time deadline = lead.deadline;
  for (const QueuedOp* op : ops) deadline = std::min(deadline, op->deadline);
  FusedAllreduce small;
  const bool with_data = mine.fused && lead.sig.kind == CollectiveKind::kAllreduce;
  const size_t data_bytes = lead.sig.count * DTypeSize(lead.sig.dtype);
  // With one rank per daemon the client's buffer rides as it is (avg
  // divides by the participants, which are the ranks); else this daemon's
  // partial result, in rank order, summed for avg.
  const bool partial = with_data && mine.local_stage;
  const Reducer& red = CpuReducer();  // the clients' buffers are host shared memory
  if (with_data && !partial) {
    small = {lead.data(), lead.sig.dtype, lead.sig.op, lead.sig.count, &red};
  } else if (partial) {
    absl::StatusOr<transport::Buffer> acc = scratch_.Reserve(data_bytes);
    if (!acc.ok()) return acc.status();
    red.Copy(acc->ptr, ops[0]->data(), data_bytes);
    for (size_t i = 1; i < ops.size(); ++i) {
      red.Reduce(lead.sig.dtype, CombineOp(lead.sig.op), acc->ptr, ops[i]->data(), lead.sig.count);
    }
    small = {acc->ptr, lead.sig.dtype, CombineOp(lead.sig.op), lead.sig.count, &red};
  }
  auto arrived = [this, &place](int node) {
    for (int r : place.ranks_of_node[node]) NoteArrived(r);
  };
  uint8_t agreed = OpSignature::kNoAlgorithm;
  absl::Status s = CheckSignatures(*node_ctx_, rep, options_.link.signatures, deadline, arrived,
                                   &agreed, with_data ? &small : nullptr, &sig_scratch_,
                                   agreed_streams,
                                   one_rank_per_daemon_ ? nullptr : &place.ranks_of_node);
  if (absl::IsInvalidArgument(s) && !one_rank_per_daemon_) s = CompareEverywhere(ops);
  if (!s.ok()) return s;
  // Every daemon switches alike, after the exchange (which uses stream 0).
  if (*agreed_streams > 0 && node_ctx_->tcp() != nullptr) node_ctx_->tcp()->UseStreams(*agreed_streams);
  *agreed_code = agreed;
  if (partial) {
    if (lead.sig.op == ReduceOp::kAvg) red.Divide(lead.sig.dtype, scratch_.data(), lead.sig.count, place.world);
    for (QueuedOp* op : ops) red.Copy(op->data(), scratch_.data(), data_bytes);
  }
  return absl::OkStatus();
}

absl::Status JobExecutor::CompareEverywhere(const std::vector<QueuedOp*>& ops) {
  const JobPlacement& place = options_.placement;
  const uint64_t seq = ops[0]->seq;
  const int n = place.nodes(), me = place.node_index;
  // [n][rank, length, signature]... of this daemon's ranks.
  std::vector<char> out;
  auto put32 = [](std::vector<char>* v, uint32_t x) {
    const size_t at = v->size();
    v->resize(at + 4);
    std::memcpy(v->data() + at, &x, 4);
  };
  put32(&out, static_cast<uint32_t>(ops.size()));
  for (size_t i = 0; i < ops.size(); ++i) {
    const std::string sig = ops[i]->sig.Encode();
    put32(&out, static_cast<uint32_t>(local_[i]));
    put32(&out, static_cast<uint32_t>(sig.size()));
    out.insert(out.end(), sig.begin(), sig.end());
  }
  std::vector<std::vector<char>> in(n);
  std::vector<std::unique_ptr<transport::MemoryRegion>> mrs;
  std::vector<transport::Request> sends(n), recvs(n);
  transport::MessageTag tag;
  tag.op_seq = seq;
  tag.slot = 2;
  const absl::Time deadline = std::max(ops[0]->deadline, FastNow() + absl::Seconds(5));
  for (int q = 0; q < n; ++q) {
    if (q == me) continue;
    in[q].resize(4 + place.ranks_of_node[q].size() * (8 + kMaxEncodedSignatureBytes));
    auto mr = node_ctx_->RegisterMemory(in[q].data(), in[q].size());
    if (!mr.ok()) return mr.status();
    absl::Status st = node_ctx_->PostRecv(q, **mr, 0, in[q].size(), /*exact=*/false, tag, &recvs[q]);
    if (!st.ok()) return st;
    mrs.push_back(std::move(*mr));
  }
  auto omr = node_ctx_->RegisterMemory(out.data(), out.size());
  if (!omr.ok()) return omr.status();
  for (int q = 0; q < n; ++q) {
    if (q == me) continue;
    absl::Status st = node_ctx_->PostSend(q, **omr, 0, out.size(), tag, &sends[q]);
    if (!st.ok()) return st;
  }
  for (int q = 0; q < n; ++q) {
    while (q != me && (!sends[q].done || !recvs[q].done)) {
      absl::Status st = node_ctx_->Progress(deadline);
      if (!st.ok()) return st;
    }
  }
  std::vector<std::string> all(place.world);
  for (size_t i = 0; i < ops.size(); ++i) all[local_[i]] = ops[i]->sig.Encode();
  for (int q = 0; q < n; ++q) {
    if (q == me) continue;
    const char* m = in[q].data();
    const size_t len = recvs[q].bytes;
    auto get32 = [&](size_t at, uint32_t* x) {
      if (at + 4 > len) return false;
      std::memcpy(x, m + at, 4);
      return true;
    };
    uint32_t count = 0, rank = 0, sig_len = 0;
    size_t at = 4;
    bool ok = get32(0, &count) && count == place.ranks_of_node[q].size();
    for (uint32_t j = 0; ok && j < count; ++j) {
      ok = get32(at, &rank) && get32(at + 4, &sig_len) && rank < static_cast<uint32_t>(place.world) &&
           place.node_of_rank[rank] == q && sig_len <= kMaxEncodedSignatureBytes &&
           at + 8 + sig_len <= len;
      if (ok) all[rank].assign(m + at + 8, sig_len);
      at += 8 + sig_len;
    }
    if (!ok) {
      return absl::DataLossError(absl::StrCat("op ", seq, ": daemon ", place.node_names[q],
                                              " sent a malformed list of its ranks' signatures"));
    }
  }
  absl::Status s = CompareSignatures(seq, all);
  if (s.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "op ", seq, " does not match across daemons, though every rank's signature is equal"));
  }
  return s;
}

void JobExecutor::Account(size_t bytes, absl::Duration run, absl::Time end) {
  if (node_ctx_ == nullptr) return;
  if (bytes >= kPeerBandwidthMinBytes || end >= next_peer_flush_) {
    FlushPeerBytes(run, end);
  } else {
    peer_bytes_dirty_ = true;
  }
  // Retransmit counters cost a getsockopt(TCP_INFO) per connection: at most once a second.
  const transport::TcpControls* tcp = node_ctx_->tcp();
  if (tcp == nullptr || end < next_retrans_sample_) return;
  next_retrans_sample_ = end + absl::Seconds(1);
  const JobPlacement& place = options_.placement;
  for (int p = 0; p < place.nodes(); ++p) {
    if (p == place.node_index) continue;
    const uint64_t retrans = tcp->Retransmits(p);
    if (retrans > peer_retrans_[p]) {
      options_.observer->OnPeerRetransmits(place.node_names[p], retrans - peer_retrans_[p]);
      peer_retrans_[p] = retrans;
    }
  }
}

void JobExecutor::FlushPeerBytes(absl::Duration op_run, absl::Time now) {
  peer_bytes_dirty_ = false;
  next_peer_flush_ = now + kPeerBytesPeriod;
  if (node_ctx_ == nullptr) return;
  const JobPlacement& place = options_.placement;
  const double secs = absl::ToDoubleSeconds(op_run);
  for (int p = 0; p < place.nodes(); ++p) {
    if (p == place.node_index) continue;
    const uint64_t sent = node_ctx_->BytesSentTo(p), recv = node_ctx_->BytesReceivedFrom(p);
    if (sent == peer_sent_[p] && recv == peer_received_[p]) continue;
    const std::string& peer = place.node_names[p];
    options_.observer->OnPeerBytes(peer, options_.transport, sent - peer_sent_[p],
                                   recv - peer_received_[p]);
    // Since the last flush: the op just finished, plus at most a period of small ops.
    if (sent - peer_sent_[p] >= kPeerBandwidthMinBytes && secs > 0) {
      options_.observer->OnPeerBandwidth(peer, options_.transport, (sent - peer_sent_[p]) / secs);
    }
    peer_sent_[p] = sent;
    peer_received_[p] = recv;
  }
}

}  // namespace gradsync
