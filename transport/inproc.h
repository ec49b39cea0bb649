// The in-process device: the contexts of one job connected inside a single
// process through memory queues, with faults to inject. It exists to test
// what the collectives and the signature exchange do with a lost peer, a
// truncated message or a slow peer, deterministically and without sockets;
// what it cannot show is anything about real links (timing, kernel buffers).
//
// Semantics match the TCP context where algorithms can tell: sends to a peer
// arrive in posting order, each receive must match the next message's tag
// exactly, a message longer than the receive (or not exactly its size for an
// exact one) is a protocol error (DataLoss), a failed context tells its peers
// (they fail with Aborted "aborted by rank R: ..."), and a lost peer fails
// the others with Unavailable naming it. A send completes when it is posted
// (its bytes are copied into the peer's queue). fault() names the peer that
// failed a context; CheckPeers reads nothing (early messages stay queued)
// and fails the context with a failed or lost peer, as Progress does.
//
// It checks registrations as an RDMA NIC checks keys: a send or receive on a
// region that this context did not register, or whose registration is gone,
// fails with InvalidArgument. Posting is bounded (kMaxInFlight receives per
// peer), so callers' windowing runs in every test.
#ifndef GRADSYNC_TRANSPORT_INPROC_H_
#define GRADSYNC_TRANSPORT_INPROC_H_

#include <cstdint>
#include <memory>

#include "absl/time/time.h"
#include "transport/device.h"

namespace gradsync::transport {

struct InProcFaults {
  // Rank `lost_rank` vanishes when it posts its send number `lost_after` + 1
  // (counting every peer): that post fails, the rank's context fails, and
  // every peer's fails with Unavailable "connection to rank R lost".
  int lost_rank = -1;
  uint64_t lost_after = 0;
  // Send number `truncate_at` (from 1, counting every peer) of
  // `truncate_rank` arrives with half its bytes.
  int truncate_rank = -1;
  uint64_t truncate_at = 0;
  // Every message `slow_rank` sends is delivered `slow_delay` after it was posted.
  int slow_rank = -1;
  absl::Duration slow_delay = absl::ZeroDuration();
};

class InProcDevice final : public Device {
 public:
  static constexpr int kMaxInFlight = 4;

  explicit InProcDevice(int world_size, InProcFaults faults = {});
  ~InProcDevice() override;

  const DeviceProperties& properties() const override { return properties_; }
  // The context of spec.rank (once per rank; spec.world_size must be the
  // device's). Never blocks: the fabric needs no handshake.
  absl::StatusOr<std::unique_ptr<Context>> CreateContext(const ContextSpec& spec) override;

  // Regions registered by this device's contexts since creation.
  uint64_t registrations() const;

  class Fabric;  // inproc.cc

 private:
  DeviceProperties properties_;
  std::shared_ptr<Fabric> fabric_;
};

}  // namespace gradsync::transport

#endif  // GRADSYNC_TRANSPORT_INPROC_H_
