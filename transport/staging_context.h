// A context that moves device (CUDA) memory over a transport that moves only
// host memory (TCP; RDMA without GPUDirect), staging each message through a
// page-locked host block:
//
//   send:     device --copy (async, in order)--> block --inner send--> peer
//   receive:  peer --inner receive--> block --copy (async)--> device
//
// Each message is staged on its own, so with several messages in flight (the
// algorithms post up to max_in_flight() per peer; the ring's segments) the
// device-to-host copy of one overlaps the network of another and the
// host-to-device copy of a third, and the algorithm reduces a received
// segment (with the device's Reducer) while later ones travel. No device-wide
// synchronization: completions are polled per copy (CUDA events).
//
// Host memory passes straight through to the inner context (a send queued
// behind staged sends to the same peer, to keep their order). Blocks are pooled
// by size class (power of two), registered once with the inner context, and
// bounded by what is in flight. Threading: as any context (one driving
// thread; Abort and Interrupt from any thread).
#ifndef GRADSYNC_TRANSPORT_STAGING_CONTEXT_H_
#define GRADSYNC_TRANSPORT_STAGING_CONTEXT_H_

#include <atomic>
#include <cstdint>
#include <list>
#include <map>
#include <memory>
#include <vector>

#include "absl/status/statusor.h"
#include "transport/transport.h"

namespace gradsync::transport {

// Asynchronous copies between one GPU's memory and page-locked host memory.
// Production: CudaCopier (worker/device_path.h; CUDA streams and events); tests: a host
// emulation. Copies of one direction complete in the order they were made.
class DeviceCopier {
 public:
  enum class Direction { kToHost, kToDevice };
  virtual ~DeviceCopier() = default;
  virtual MemKind kind() const = 0;  // the device memory it copies
  // Page-locked host memory for staging blocks.
  virtual absl::StatusOr<void*> AllocateHost(size_t bytes) = 0;
  virtual void FreeHost(void* ptr, size_t bytes) = 0;
  // Enqueues a copy of `bytes`; a ticket for Done.
  virtual absl::StatusOr<uint64_t> Copy(Direction direction, void* dst, const void* src,
                                        size_t bytes) = 0;
  // Whether copy `ticket` finished; its error if it failed.
  virtual absl::StatusOr<bool> Done(uint64_t ticket) = 0;
};

class StagingContext final : public Context {
 public:
  // `inner` and `copier` outlive this context.
  StagingContext(Context& inner, DeviceCopier& copier);
  ~StagingContext() override;

  int rank() const override { return inner_.rank(); }
  int size() const override { return inner_.size(); }
  using Context::RegisterMemory;
  // Host memory: the inner context's registration. The copier's device
  // memory: a region of this context (nothing to register); other device
  // memory is FailedPrecondition.
  absl::StatusOr<std::unique_ptr<MemoryRegion>> RegisterMemory(void* data, size_t size,
                                                               MemKind kind) override;
  absl::Status PostSend(int peer, const MemoryRegion& mr, size_t offset, size_t len,
                        const MessageTag& tag, Request* req) override;
  absl::Status PostRecv(int peer, const MemoryRegion& mr, size_t offset, size_t capacity,
                        bool exact, const MessageTag& tag, Request* req) override;
  absl::Status Progress(absl::Time deadline) override;
  void Abort(const absl::Status& reason) override { inner_.Abort(reason); }
  void Interrupt() override;
  absl::Status Fail(const absl::Status& reason) override { return inner_.Fail(reason); }
  void BeginOp(uint64_t op_seq) override { inner_.BeginOp(op_seq); }
  absl::Status health() const override { return inner_.health(); }
  absl::Status CheckPeers() override { return inner_.CheckPeers(); }
  PeerFault fault() const override { return inner_.fault(); }
  bool PeerClosed(int peer) const override { return inner_.PeerClosed(peer); }
  uint64_t BytesSentTo(int peer) const override { return inner_.BytesSentTo(peer); }
  uint64_t BytesReceivedFrom(int peer) const override { return inner_.BytesReceivedFrom(peer); }
  int max_in_flight() const override { return inner_.max_in_flight(); }
  TcpControls* tcp() override { return inner_.tcp(); }

  // Staging counters (tests and benchmarks).
  struct Counters {
    uint64_t staged_sends = 0;
    uint64_t staged_recvs = 0;
    uint64_t blocks_allocated = 0;  // blocks made (the rest were reused)
    int max_copies_in_flight = 0;   // copies enqueued and not yet done, at most
  };
  const Counters& counters() const { return counters_; }

 private:
  struct Block {
    char* data = nullptr;
    size_t size = 0;
    std::unique_ptr<MemoryRegion> region;  // on the inner context
  };
  // A send: kCopying (device -> block), kReady (waiting for the sends to the
  // same peer posted before it: the inner context delivers a peer's messages
  // in posting order and the receiver may expect that order), kTransferring.
  // A receive: kTransferring (on the inner context), kCopying (block -> device).
  enum class Stage { kCopying, kReady, kTransferring };
  struct Staged {
    bool send = false;
    int peer = 0;
    Request* user = nullptr;
    Request inner;
    char* device = nullptr;  // the device memory of the message
    size_t bytes = 0;        // send: the length; receive: the capacity
    bool exact = false;
    MessageTag tag;
    std::unique_ptr<Block> block;
    // A host-memory send queued behind staged ones to the same peer: sent
    // from [direct, +bytes) of `direct_region` (no block, no copy).
    const MemoryRegion* direct_region = nullptr;
    size_t direct_offset = 0;
    Stage stage = Stage::kCopying;
    uint64_t ticket = 0;
  };

  absl::StatusOr<std::unique_ptr<Block>> TakeBlock(size_t bytes);
  void GiveBack(std::unique_ptr<Block> block);
  // Moves every staged message along; *completed when a user request finished.
  absl::Status Advance(bool* completed);
  // Whether a send to `peer` waits to be posted to the inner context.
  bool SendsWaiting(int peer) const;
  absl::Status FailWith(const absl::Status& reason);
  bool Copying() const;

  Context& inner_;
  DeviceCopier& copier_;
  std::list<Staged> staged_;  // stable addresses: the inner requests live here
  std::map<size_t, std::vector<std::unique_ptr<Block>>> free_;  // by size class
  Counters counters_;
  int copies_in_flight_ = 0;
  std::atomic<bool> interrupted_{false};
};

}  // namespace gradsync::transport

#endif  // GRADSYNC_TRANSPORT_STAGING_CONTEXT_H_
