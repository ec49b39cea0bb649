// A subset of a context's ranks as a context of its own: sub-rank i is the
// parent's rank members[i]. Everything is forwarded to the parent (which
// keeps its connections, registrations, progress and failure state), with the
// ranks translated; so an algorithm written for a whole context runs among
// some of its ranks, e.g. the daemons of one host (collective/two_level.cc).
// The members must use distinct MessageTag.op_seq values for anything they
// run at once on the parent. Threading: as the parent's.
#ifndef GRADSYNC_TRANSPORT_SUB_CONTEXT_H_
#define GRADSYNC_TRANSPORT_SUB_CONTEXT_H_

#include <memory>
#include <vector>

#include "transport/transport.h"

namespace gradsync::transport {

class SubContext final : public Context {
 public:
  // `members`: distinct parent ranks, this process's among them; `parent`
  // outlives this context.
  SubContext(Context& parent, std::vector<int> members);

  int rank() const override { return rank_; }
  int size() const override { return static_cast<int>(members_.size()); }
  absl::StatusOr<std::unique_ptr<MemoryRegion>> RegisterMemory(void* data, size_t size,
                                                               MemKind kind) override {
    return parent_.RegisterMemory(data, size, kind);
  }
  absl::Status PostSend(int peer, const MemoryRegion& mr, size_t offset, size_t len,
                        const MessageTag& tag, Request* req) override;
  absl::Status PostRecv(int peer, const MemoryRegion& mr, size_t offset, size_t capacity,
                        bool exact, const MessageTag& tag, Request* req) override;
  absl::Status Progress(absl::Time deadline) override { return parent_.Progress(deadline); }
  void Abort(const absl::Status& reason) override { parent_.Abort(reason); }
  void Interrupt() override { parent_.Interrupt(); }
  absl::Status Fail(const absl::Status& reason) override { return parent_.Fail(reason); }
  void BeginOp(uint64_t op_seq) override { parent_.BeginOp(op_seq); }
  absl::Status health() const override { return parent_.health(); }
  absl::Status CheckPeers() override { return parent_.CheckPeers(); }
  // The parent's fault; its peer is a parent rank (-1 if none).
  PeerFault fault() const override { return parent_.fault(); }
  bool PeerClosed(int peer) const override;
  uint64_t BytesSentTo(int peer) const override;
  uint64_t BytesReceivedFrom(int peer) const override;
  int max_in_flight() const override { return parent_.max_in_flight(); }
  TcpControls* tcp() override { return parent_.tcp(); }

 private:
  // The parent's rank of sub-rank `peer`, or -1 when out of range.
  int ParentRank(int peer) const;

  Context& parent_;
  std::vector<int> members_;
  int rank_ = -1;
};

}  // namespace gradsync::transport

#endif  // GRADSYNC_TRANSPORT_SUB_CONTEXT_H_
