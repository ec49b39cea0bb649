// Internal to the RDMA context (rdma_context.cc: the data path;
// rdma_context_setup.cc: queue pairs, bootstrap, registrations).
#ifndef GRADSYNC_TRANSPORT_RDMA_CONTEXT_INTERNAL_H_
#define GRADSYNC_TRANSPORT_RDMA_CONTEXT_INTERNAL_H_

#include <deque>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "rdma/verbs.h"
#include "transport/rdma_context.h"
#include "transport/rdma_control.h"

namespace gradsync::transport {

struct RdmaContext::Peer {
  int rank = 0;
  std::unique_ptr<rdma::QueuePair> qp;
  std::vector<char> slots;  // rq_depth receive slots
  std::unique_ptr<rdma::MemoryRegion> slots_mr;
  int rq_depth = 0;
  int sq_depth = 0;
  int sq_used = 0;  // work requests posted, not yet completed

  struct Send {
    Request* req;
    const rdma::MemoryRegion* mr;  // null for an empty message
    size_t mr_offset;
    size_t len;
    MessageTag tag;
    bool announced = false;  // its RTS went out (announce_sends)
  };
  std::deque<Send> waiting;  // posted, waiting for their CTS (in posting order)
  struct Writing {
    Request* req;
    size_t len;
    int parts;
  };
  std::deque<Writing> writing;             // written, waiting for the completion
  std::deque<rdma_control::Entry> cts_in;  // CTS entries no send has used yet

  struct Recv {
    Request* req;
    size_t capacity;
    bool exact;
    MessageTag tag;
  };
  std::map<uint32_t, Recv> recvs;       // by CTS sequence
  std::deque<std::string> control_out;  // encoded entries waiting for send-queue room
  std::deque<Incoming> unexpected;      // announced (RTS), no receive posted yet
  uint32_t next_seq = 0;
  uint64_t bytes_sent = 0;
  uint64_t bytes_received = 0;
  int sends_posted() const { return static_cast<int>(waiting.size() + writing.size()); }
};

namespace rdma_internal {

inline bool SameTag(const MessageTag& a, const MessageTag& b) {
  return a.op_seq == b.op_seq && a.slot == b.slot && a.dtype == b.dtype && a.offset == b.offset;
}

inline std::string TagText(const MessageTag& t) {
  return absl::StrCat("op ", t.op_seq, " message ", t.slot, " (offset ", t.offset, ")");
}

inline size_t PartsOf(size_t len) {
  return len == 0 ? 1 : (len + RdmaContext::kMaxWrite - 1) / RdmaContext::kMaxWrite;
}

// A registration of this context: the verbs region and the context's id.
class RdmaRegion final : public MemoryRegion {
 public:
  RdmaRegion(char* data, size_t size, MemKind kind, uint64_t context_id,
             std::shared_ptr<rdma::ProtectionDomain> pd, std::unique_ptr<rdma::MemoryRegion> mr)
      : MemoryRegion(data, size, kind),
        context_id_(context_id),
        pd_(std::move(pd)),
        mr_(std::move(mr)) {}
  uint64_t context_id() const { return context_id_; }
  const rdma::MemoryRegion* mr() const { return mr_.get(); }  // null when empty

 private:
  const uint64_t context_id_;
  std::shared_ptr<rdma::ProtectionDomain> pd_;  // outlives mr_
  std::unique_ptr<rdma::MemoryRegion> mr_;
};

}  // namespace rdma_internal
}  // namespace gradsync::transport

#endif  // GRADSYNC_TRANSPORT_RDMA_CONTEXT_INTERNAL_H_
