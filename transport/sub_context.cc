#include "transport/sub_context.h"

#include <utility>

#include "absl/strings/str_cat.h"

namespace gradsync::transport {

SubContext::SubContext(Context& parent, std::vector<int> members)
    : parent_(parent), members_(std::move(members)) {
  for (size_t i = 0; i < members_.size(); ++i) {
    if (members_[i] == parent_.rank()) rank_ = static_cast<int>(i);
  }
}

int SubContext::ParentRank(int peer) const {
  return peer >= 0 && peer < size() ? members_[peer] : -1;
}

absl::Status SubContext::PostSend(int peer, const MemoryRegion& mr, size_t offset, size_t len,
                                  const MessageTag& tag, Request* req) {
  const int p = ParentRank(peer);
  if (p < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("send to sub-rank ", peer, " of a group of ", size()));
  }
  return parent_.PostSend(p, mr, offset, len, tag, req);
}

absl::Status SubContext::PostRecv(int peer, const MemoryRegion& mr, size_t offset,
                                  size_t capacity, bool exact, const MessageTag& tag,
                                  Request* req) {
  const int p = ParentRank(peer);
  if (p < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("receive from sub-rank ", peer, " of a group of ", size()));
  }
  return parent_.PostRecv(p, mr, offset, capacity, exact, tag, req);
}

bool SubContext::PeerClosed(int peer) const {
  const int p = ParentRank(peer);
  return p >= 0 && parent_.PeerClosed(p);
}

uint64_t SubContext::BytesSentTo(int peer) const {
  const int p = ParentRank(peer);
  return p >= 0 ? parent_.BytesSentTo(p) : 0;
}

uint64_t SubContext::BytesReceivedFrom(int peer) const {
  const int p = ParentRank(peer);
  return p >= 0 ? parent_.BytesReceivedFrom(p) : 0;
}

}  // namespace gradsync::transport
