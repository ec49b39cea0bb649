// The RDMA transport's control entries (rdma_context.h): 48-byte inline
// SENDs into the peer's pre-posted receive slots.
//
//   CTS  (clear to send, kind 1): the receiver's posted receive: where to
//        write it (address, rkey), how much it takes, its tag.
//   RTS  (ready to send, kind 2): a client's announcement of a message to a
//        server (Device::ConnectToServers contexts): its tag and length, so
//        the server can Probe it and post the receive that sends the CTS.
//
// Layout, little-endian: kind (1), exact (1), dtype (1), reserved (1),
// sequence (4), address (8), capacity or length (8), rkey (4), slot (4),
// op_seq (8), offset (8).
#ifndef GRADSYNC_TRANSPORT_RDMA_CONTROL_H_
#define GRADSYNC_TRANSPORT_RDMA_CONTROL_H_

#include <cstddef>
#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "transport/transport.h"

namespace gradsync::transport::rdma_control {

inline constexpr size_t kEntryBytes = 48;
inline constexpr size_t kSlotBytes = 64;  // a receive slot (an entry fits; immediates use none)

enum class Kind : uint8_t { kCts = 1, kRts = 2 };

struct Entry {
  Kind kind = Kind::kCts;
  uint32_t seq = 0;        // CTS: the receive's sequence (the write's immediate names it)
  uint64_t addr = 0;       // CTS
  uint64_t capacity = 0;   // CTS: bytes the receive takes; RTS: the message's length
  uint32_t rkey = 0;       // CTS
  bool exact = false;      // CTS: the message must be exactly `capacity`
  MessageTag tag;
};

std::string Encode(const Entry& e);
// DataLoss naming what is wrong with `n` bytes at `p`.
absl::StatusOr<Entry> Decode(const char* p, size_t n);

// Work request ids: kind (8 bits), peer (24 bits), index (32 bits).
enum WrKind : uint64_t { kWrControl = 1, kWrWrite = 2, kWrRecv = 3 };
inline uint64_t WrId(WrKind kind, int peer, uint32_t index) {
  return (uint64_t{kind} << 56) | (uint64_t(peer) << 32) | index;
}

}  // namespace gradsync::transport::rdma_control

#endif  // GRADSYNC_TRANSPORT_RDMA_CONTROL_H_
