// The node-local arena: one shared-memory segment per job epoch whose ranks
// all use one gradsyncd. Every rank's client SDK maps it, and so does the
// daemon. It carries two things:
//
//   1. Every op's signature. A client publishes the signature of each op it
//      submits (its position k in the session's op stream, collective, dtype,
//      count, reduce op, root, name, forced algorithm) in frame k of its own
//      slot before anything else happens to the op. Whoever checks that the
//      ranks agree on op k (a client for a local op, the daemon for every
//      other op) reads frame k of every slot, so all of them compare the same
//      n signatures and build the same error on a mismatch.
//   2. The data of small ops the clients run among themselves ("local" ops:
//      small allreduces and barriers). The client copies its contribution
//      into the frame with the signature; once all n frames of op k are
//      there, every client reduces them in rank order into its own buffer.
//      No daemon thread is involved, so such an op costs what the clients'
//      own shared-memory traffic costs (client/local_path.h).
//
// Layout (offsets from the start, little-endian, fixed by kArenaVersion):
//
//   ArenaHeader                               (header_bytes, a multiple of 64)
//   slot r at slots_offset + r * slot_bytes, r in [0, world_size):
//     ArenaSlotHeader                         (slot_header_bytes)
//     frame f at + slot_header_bytes + f * frame_bytes, f in [0, frames):
//       ArenaFrameHeader                      (kArenaFrameHeaderBytes)
//       data                                  (data_bytes, padded to 64)
//
// Frames. Op k of rank r lives in frame k % frames of slot r. The writer
// fills the frame, then stores k into its `seq` (release); a reader that
// loads seq == k (acquire) sees the whole frame. Only rank r's client writes
// slot r's frames.
//
// Reuse. Rank r's `consumed` is the highest k such that rank r is done with
// every op <= k (for a local op: it has read every rank's frame k; for an op
// the daemon ran: the daemon reported it done, and the daemon reads the
// frames before it runs an op). A client may write frame k only when every
// rank's consumed >= k - frames (ArenaView::FrameFree), so a frame is never
// overwritten while anyone may still read it.
//
// Failure. Any side may fail the arena (Fail): the first reason wins, and is
// readable by all. A client that hits a deadline in the middle of the stream
// does (the ranks are then out of step), and the daemon does when a session
// of the job closes, its epoch fails or the daemon stops. Waiters see it at
// once (the bell rings). An op whose n frames are all present can still be
// completed from them after a failure: the frames are immutable until
// consumed, so the result is right; what fails is waiting.
//
// Leaving. A rank whose session closes (its training process finished) will
// publish nothing more, but the ops it did publish can still complete on the
// others. The daemon marks it left (Leave) instead of failing the arena: an
// op stops waiting, and fails, only once a rank whose frame it lacks has left.
//
// The bell. Every publication and every failure rings the arena's one
// doorbell (ipc/doorbell.h); a waiter snapshots it, re-checks, then spins or
// sleeps with a timeout.
//
// Untrusted memory. A client may scribble on the segment. Everything read
// from it is bounds-checked (lengths, counts) before use, and signatures are
// copied out before they are compared. A bad client can only break its own
// job (each job epoch has its own arena), never the daemon.
//
// Thread-safety: ArenaView is a view over the mapping; its methods may be
// called from any thread. The protocol above says who may write what.
#ifndef GRADSYNC_IPC_ARENA_H_
#define GRADSYNC_IPC_ARENA_H_

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <type_traits>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "ipc/doorbell.h"
#include "ipc/op_counters.h"

namespace gradsync {
namespace ipc {

inline constexpr uint32_t kArenaMagic = 0x414C5347;  // "GSLA" little-endian
inline constexpr uint32_t kArenaVersion = 1;
inline constexpr uint32_t kArenaMaxWorld = 1024;
inline constexpr uint32_t kArenaMinFrames = 2;
inline constexpr uint32_t kArenaMaxFrames = 1024;
inline constexpr uint64_t kArenaMaxDataBytes = 16 << 20;
// An encoded op signature (collective/op_signature.h: 32 bytes + a name of
// at most 256) fits.
inline constexpr size_t kArenaMaxSignatureBytes = 320;
inline constexpr size_t kArenaMaxFailureBytes = 1024;
// What the client counts per collective it runs locally (index into
// ArenaSlotHeader::counters; ipc/op_counters.h).
inline constexpr int kArenaCounterAllreduce = kOpCounterAllreduce;
inline constexpr int kArenaCounterBarrier = kOpCounterBarrier;
inline constexpr int kArenaCounterKinds = kOpCounterKinds;

static_assert(std::atomic<uint64_t>::is_always_lock_free, "arena words must be lock-free");
static_assert(sizeof(std::atomic<uint64_t>) == sizeof(uint64_t), "arena word is 64 bits");

struct ArenaFixedHeader {
  uint32_t magic;
  uint32_t version;
  uint32_t world_size;
  uint32_t frames;  // per slot, a power of two
  uint64_t data_bytes;  // per frame: the largest local op
  uint64_t frame_bytes;
  uint64_t slot_header_bytes;
  uint64_t slot_bytes;
  uint64_t slots_offset;
  uint64_t total_bytes;
  uint64_t job_tag;  // FNV-1a of the job id (for diagnostics)
  uint64_t epoch;
};
static_assert(std::is_trivially_copyable_v<ArenaFixedHeader>);

struct ArenaHeader {
  ArenaFixedHeader fixed;
  alignas(64) DoorbellWords bell;
  // 0: usable; 1: a failure is being written; 2: failed (code/message valid).
  alignas(64) std::atomic<uint32_t> failed;
  int32_t fail_code;  // absl::StatusCode
  uint32_t fail_len;
  char fail_message[kArenaMaxFailureBytes];
};
static_assert(std::is_standard_layout_v<ArenaHeader>);

// Plain counters a client keeps for the daemon's metrics (ipc/op_counters.h).
inline constexpr int kArenaStatusCodes = kOpStatusCodes;
using ArenaCounters = OpCounters;

struct ArenaSlotHeader {
  alignas(64) std::atomic<uint64_t> consumed;  // see "Reuse"
  // 0 while the rank's session is open; 1 + its consumed when it closed
  // (see "Leaving"). Written by the daemon.
  std::atomic<uint64_t> left;
  alignas(64) ArenaCounters counters[kArenaCounterKinds];
};
static_assert(std::is_standard_layout_v<ArenaSlotHeader>);

struct ArenaFrameHeader {
  std::atomic<uint64_t> seq;  // the op this frame holds; written last
  uint32_t signature_len;     // <= kArenaMaxSignatureBytes
  // 0 until the op finished at this frame's rank, then 1 + its
  // absl::StatusCode (for status; written by that rank's client).
  std::atomic<uint32_t> outcome;
  uint64_t data_len;          // <= data_bytes
  int64_t published_us;       // when it was published (Unix microseconds; for status)
  char signature[kArenaMaxSignatureBytes];
};
static_assert(std::is_standard_layout_v<ArenaFrameHeader>);
inline constexpr size_t kArenaFrameHeaderBytes = 384;
static_assert(sizeof(ArenaFrameHeader) <= kArenaFrameHeaderBytes);

struct ArenaGeometry {
  uint32_t world_size = 1;
  uint32_t frames = 32;
  uint64_t data_bytes = 64 << 10;
};

// Bytes of an arena of `g`; InvalidArgument (naming the field and its range)
// if `g` is out of range.
absl::StatusOr<size_t> ArenaBytes(const ArenaGeometry& g);

// One rank's frame of one op, as read (pointers into the mapping).
struct ArenaFrame {
  absl::string_view signature;
  // How the op ended at the frame's rank; nullopt while it has not.
  std::optional<absl::StatusCode> outcome;
  const char* data = nullptr;
  size_t data_len = 0;
  int64_t published_us = 0;
};

class ArenaView {
 public:
  // Formats `mem` (zero-filled, >= ArenaBytes(g) bytes). Daemon side.
  static absl::StatusOr<ArenaView> Format(void* mem, size_t size, const ArenaGeometry& g,
                                          uint64_t job_tag, uint64_t epoch);
  // Checks the header a daemon wrote (magic, version, geometry, sizes within
  // `size`) and attaches. FailedPrecondition naming the problem otherwise.
  static absl::StatusOr<ArenaView> Attach(void* mem, size_t size);

  int world_size() const { return static_cast<int>(fixed_.world_size); }
  uint32_t frames() const { return fixed_.frames; }
  uint64_t data_bytes() const { return fixed_.data_bytes; }
  uint64_t epoch() const { return fixed_.epoch; }
  // DataLoss (with the values) if the header's fixed part changed.
  absl::Status CheckHeader() const;

  // ---- publishing (rank `rank`'s client only)
  // True when frame `seq` may be written: every rank is done with op
  // seq - frames (or seq <= frames).
  bool FrameFree(uint64_t seq) const;
  // The ranks that still hold frame `seq` back (consumed < seq - frames).
  std::vector<int> RanksHolding(uint64_t seq) const;
  // Writes op `seq` (>= 1) into this rank's frame, stamped with the time,
  // and rings the bell.
  // InvalidArgument if a length is over its limit. The caller checked
  // FrameFree.
  absl::Status Publish(int rank, uint64_t seq, absl::string_view signature, const void* data,
                       size_t data_len);
  void SetConsumed(int rank, uint64_t seq);
  ArenaCounters& counters(int rank, int kind) const;

  // ---- reading (anyone)
  bool Published(int rank, uint64_t seq) const;
  // Rank `rank`'s frame of op `seq`. Call only after Published(rank, seq).
  // DataLoss naming the rank if its lengths are impossible.
  absl::StatusOr<ArenaFrame> Read(int rank, uint64_t seq) const;
  // Records how op `seq`, published by `rank`, ended there (no-op if the
  // frame holds another op).
  void SetOutcome(int rank, uint64_t seq, absl::StatusCode code);
  uint64_t consumed(int rank) const;

  // ---- leaving (the daemon, when rank `rank`'s session closes)
  // Marks the rank left after the ops it finished, and rings the bell.
  void Leave(int rank);
  // Whether the rank left, and after which op it was done (its consumed).
  bool Left(int rank, uint64_t* done_up_to = nullptr) const;

  // ---- failure (anyone)
  // Fails the arena with `reason` (not OK) unless it has failed already
  // (the first reason wins), and rings the bell.
  void Fail(const absl::Status& reason);
  bool has_failed() const { return h_->failed.load(std::memory_order_acquire) != 0; }
  // OK while usable, else the first failure's status.
  absl::Status failure() const;

  Doorbell bell() const { return Doorbell(&h_->bell); }

 private:
  ArenaView(ArenaHeader* h, char* base);
  ArenaSlotHeader* slot(int rank) const;
  ArenaFrameHeader* frame(int rank, uint64_t seq) const;

  ArenaHeader* h_;
  char* base_;
  ArenaFixedHeader fixed_;  // private copy, checked against the segment by CheckHeader
};

}  // namespace ipc
}  // namespace gradsync

#endif  // GRADSYNC_IPC_ARENA_H_
