// The RDMA context's set-up: queue pairs, the endpoint exchange over the
// bootstrap, registrations, and what it reports of itself.
#include <fcntl.h>
#include <sys/eventfd.h>

#include <cstring>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "transport/rdma_context_internal.h"

namespace gradsync::transport {

using rdma_internal::RdmaRegion;

namespace {
// Tags of the bootstrap exchange on the TCP context (no op has these).
constexpr uint64_t kBootstrapOp = ~0ull - 1;
}  // namespace

RdmaContext::RdmaContext(const RdmaPort& port, std::unique_ptr<Context> bootstrap,
                         const RdmaContextOptions& options)
    : port_(port),
      options_(options),
      bootstrap_(std::move(bootstrap)),
      rank_(bootstrap_->rank()),
      size_(bootstrap_->size()),
      wake_fd_(eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK)) {}

RdmaContext::~RdmaContext() = default;

absl::StatusOr<std::unique_ptr<RdmaContext>> RdmaContext::Connect(
    const RdmaPort& port, std::unique_ptr<Context> bootstrap, const RdmaContextOptions& options,
    absl::Time deadline) {
  std::unique_ptr<RdmaContext> ctx(new RdmaContext(port, std::move(bootstrap), options));
  absl::Status s = ctx->SetUp(deadline);
  if (!s.ok()) {
    (void)ctx->bootstrap_->Fail(s);  // the peers learn why at once
    return absl::Status(s.code(), absl::StrCat(ctx->SelfName(), ": RDMA set-up on ",
                                               port.verbs_context->name(), ": ", s.message()));
  }
  return ctx;
}

absl::Status RdmaContext::SetUp(absl::Time deadline) {
  if (!wake_fd_.valid()) return absl::InternalError("eventfd failed");
  rdma::Context& vc = *port_.verbs_context;
  ASSIGN_OR_RETURN(std::unique_ptr<rdma::ProtectionDomain> pd, rdma::ProtectionDomain::Create(vc));
  pd_ = std::move(pd);
  ASSIGN_OR_RETURN(channel_, rdma::CompletionChannel::Create(vc));
  const int flags = fcntl(channel_->fd(), F_GETFL);
  if (flags < 0 || fcntl(channel_->fd(), F_SETFL, flags | O_NONBLOCK) != 0) {
    return absl::InternalError("cannot make the completion channel non-blocking");
  }
  const int rq_depth = 2 * options_.max_in_flight + 4;
  const int sq_depth = options_.max_in_flight + static_cast<int>(kMaxParts);
  const int peers = std::max(1, size_ - 1);
  ASSIGN_OR_RETURN(cq_, rdma::CompletionQueue::Create(vc, peers * (rq_depth + sq_depth),
                                                      channel_.get()));
  peers_.resize(size_);
  std::string local(size_ * rdma::QpEndpoint::kEncodedSize, '\0');
  for (int r = 0; r < size_; ++r) {
    if (r == rank_) continue;
    auto p = std::make_unique<Peer>();
    p->rank = r;
    p->rq_depth = rq_depth;
    p->sq_depth = sq_depth;
    rdma::QueuePairOptions qo;
    qo.max_send_wr = sq_depth;
    qo.max_recv_wr = rq_depth;
    qo.max_inline_data = options_.max_inline_data;
    ASSIGN_OR_RETURN(p->qp, rdma::QueuePair::Create(*pd_, *cq_, *cq_, qo));
    if (p->qp->max_inline_data() < rdma_control::kEntryBytes) {
      return absl::FailedPreconditionError(
          absl::StrCat("the device grants ", p->qp->max_inline_data(),
                       " bytes of inline data; a control entry needs ", rdma_control::kEntryBytes));
    }
    p->slots.assign(rq_depth * rdma_control::kSlotBytes, '\0');
    ASSIGN_OR_RETURN(p->slots_mr,
                     rdma::MemoryRegion::Register(*pd_, p->slots.data(), p->slots.size()));
    ASSIGN_OR_RETURN(rdma::QpEndpoint e, p->qp->LocalEndpoint(port_.connect));
    const std::string enc = e.Encode();
    std::memcpy(local.data() + r * enc.size(), enc.data(), enc.size());
    peer_of_qpn_[p->qp->qpn()] = r;
    peers_[r] = std::move(p);
  }
  // Endpoints out and in over the bootstrap, then the queue pairs connect
  // and pre-post their receives, then a one-byte "ready" each way, so no CTS
  // reaches a queue pair that cannot take it yet.
  std::string remote(local.size(), '\0');
  std::string ready_out(size_, 'R'), ready_in(size_, '\0');
  auto exchange = [&](std::string& out, std::string& in, size_t each,
                      uint32_t slot) -> absl::Status {
    ASSIGN_OR_RETURN(auto out_mr, bootstrap_->RegisterMemory(out.data(), out.size()));
    ASSIGN_OR_RETURN(auto in_mr, bootstrap_->RegisterMemory(in.data(), in.size()));
    std::vector<Request> reqs(2 * size_);
    MessageTag tag;
    tag.op_seq = kBootstrapOp;
    tag.slot = slot;
    // Every receive before any send: a peer's message never finds none posted.
    for (int r = 0; r < size_; ++r) {
      if (r == rank_) continue;
      RETURN_IF_ERROR(bootstrap_->PostRecv(r, *in_mr, r * each, each, true, tag, &reqs[2 * r]));
    }
    for (int r = 0; r < size_; ++r) {
      if (r == rank_) continue;
      RETURN_IF_ERROR(
          bootstrap_->PostSend(r, *out_mr, r * each, each, tag, &reqs[2 * r + 1]));
    }
    for (int r = 0; r < size_; ++r) {
      if (r == rank_) continue;
      for (int k = 0; k < 2; ++k) {
        while (!reqs[2 * r + k].done) RETURN_IF_ERROR(bootstrap_->Progress(deadline));
      }
    }
    return absl::OkStatus();
  };
  RETURN_IF_ERROR(exchange(local, remote, rdma::QpEndpoint::kEncodedSize, 0));
  for (int r = 0; r < size_; ++r) {
    if (r == rank_) continue;
    Peer& p = *peers_[r];
    const size_t n = rdma::QpEndpoint::kEncodedSize;
    ASSIGN_OR_RETURN(rdma::QpEndpoint mine,
                     rdma::QpEndpoint::Decode(absl::string_view(local.data() + r * n, n)));
    absl::StatusOr<rdma::QpEndpoint> theirs =
        rdma::QpEndpoint::Decode(absl::string_view(remote.data() + r * n, n));
    if (!theirs.ok()) {
      return absl::DataLossError(absl::StrCat(PeerName(r), " sent a bad endpoint: ",
                                              theirs.status().message()));
    }
    absl::Status s = p.qp->Connect(mine, *theirs, port_.connect);
    if (!s.ok()) {
      return absl::Status(s.code(), absl::StrCat("connecting to ", PeerName(r), ": ", s.message()));
    }
    for (int i = 0; i < p.rq_depth; ++i) {
      RETURN_IF_ERROR(p.qp->PostRecv(*p.slots_mr, i * rdma_control::kSlotBytes,
                                     rdma_control::kSlotBytes,
                                     rdma_control::WrId(rdma_control::kWrRecv, r,
                                                        static_cast<uint32_t>(i))));
    }
  }
  return exchange(ready_out, ready_in, 1, 1);
}

absl::StatusOr<std::unique_ptr<MemoryRegion>> RdmaContext::RegisterMemory(void* data, size_t size,
                                                                         MemKind kind) {
  const bool device = kind.type == MemKind::kCuda;
  if (device && port_.gpudirect == GpuDirect::kNone) {
    return absl::FailedPreconditionError(absl::StrCat(
        "the RDMA device ", port_.verbs_context->name(), " cannot register ", kind.ToString(),
        " memory: GPUDirect RDMA is not available (device buffers are staged through host "
        "memory)"));
  }
  std::unique_ptr<rdma::MemoryRegion> mr;
  if (data != nullptr && size > 0) {
    if (device && port_.gpudirect == GpuDirect::kDmaBuf) {
      // The NIC maps the GPU pages through a dma-buf of the allocation; the
      // registration keeps its own reference, the descriptor is closed here.
      ASSIGN_OR_RETURN(DmaBuf buf, port_.export_dmabuf(data, size));
      UniqueFd fd(buf.fd);
      ASSIGN_OR_RETURN(mr, rdma::MemoryRegion::RegisterDmabuf(*pd_, fd.get(), buf.offset,
                                                              data, size));
    } else {
      ASSIGN_OR_RETURN(mr, rdma::MemoryRegion::Register(*pd_, data, size));
    }
  }
  return std::unique_ptr<MemoryRegion>(
      new RdmaRegion(static_cast<char*>(data), size, kind, id(), pd_, std::move(mr)));
}

std::string RdmaContext::PeerName(int peer) const {
  if (peer >= 0 && static_cast<size_t>(peer) < options_.peer_names.size()) {
    return options_.peer_names[peer];
  }
  return absl::StrCat("rank ", peer);
}

std::string RdmaContext::SelfName() const {
  return options_.self_name.empty() ? absl::StrCat("rank ", rank_) : options_.self_name;
}

PeerFault RdmaContext::fault() const { return own_fault_ ? fault_ : bootstrap_->fault(); }

uint64_t RdmaContext::BytesSentTo(int peer) const {
  return peer >= 0 && peer < size_ && peers_[peer] ? peers_[peer]->bytes_sent : 0;
}
uint64_t RdmaContext::BytesReceivedFrom(int peer) const {
  return peer >= 0 && peer < size_ && peers_[peer] ? peers_[peer]->bytes_received : 0;
}

}  // namespace gradsync::transport
