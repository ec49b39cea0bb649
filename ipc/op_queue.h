// The per-op path between a client and gradsyncd: one shared-memory segment
// per session holding a submission ring (client -> daemon), a completion ring
// (daemon -> client), two futex doorbells and two heartbeat words. gRPC
// creates the segment (Worker.OpenOpQueue) and carries everything else; an op
// costs two ring entries and at most two futex wakes, not two RPCs.
//
// Segment layout (all offsets from the start of the segment, little-endian,
// fixed by kOpQueueVersion):
//
//   OpQueueHeader                       (header_bytes, a multiple of 64)
//   SubmissionEntry[capacity]           at submission_offset
//   CompletionEntry[capacity]           at completion_offset
//
// Every index (sq_head, sq_tail, cq_head, cq_tail) is a 64-bit count of
// entries ever pushed/popped; slot = index & (capacity - 1). Each index has
// one writer (sq_tail and cq_head: the client; sq_head and cq_tail: the
// daemon), which keeps its own private copy and only publishes it; the other
// side only reads it, and checks that 0 <= tail - head <= capacity before
// using it. Entries are copied out of shared memory before they are looked
// at, so a peer scribbling on the segment cannot change what was validated.
//
// Doorbells (ipc/doorbell.h): a futex word plus a waiter count; ringing a
// bell nobody sleeps on costs no system call, and every wait has a timeout.
//
//   sq_bell: the client rings it after pushing submissions; the daemon's
//            poller waits on it (with a ~100 ms timeout to do housekeeping).
//   cq_bell: the daemon rings it after pushing completions, and after popping
//            submissions when the client has set sq_space_wanted (a client
//            waiting for room in a full submission ring). The client waits on
//            it in slices of at most 50 ms.
//
// Liveness. The daemon's poller bumps daemon_heartbeat about every 100 ms; a
// client that sees it unchanged for seconds knows the daemon is gone. The
// client bumps client_heartbeat whenever it submits or waits, so the daemon
// counts a client blocked in a long wait as using its session.
//
// Refusal. Once the session takes no new ops (draining, its epoch failed) the
// daemon writes why into the header, once; the client's health check reads it.
//
// Close. When the daemon stops serving a queue (session closed, daemon
// stopping, corrupted header) it writes close_code/close_message, sets
// closed = 1 and rings cq_bell. Completions already in the ring stay readable.
//
// Thread-safety: ClientEnd and DaemonEnd are single-threaded per ring (one
// producer, one consumer); callers serialize their own threads.
#ifndef GRADSYNC_IPC_OP_QUEUE_H_
#define GRADSYNC_IPC_OP_QUEUE_H_

#include <algorithm>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <string>
#include <type_traits>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "common/op_desc.h"
#include "common/types.h"
#include "ipc/doorbell.h"

namespace gradsync {
namespace ipc {

inline constexpr uint32_t kOpQueueMagic = 0x51505347;  // "GSPQ" little-endian
inline constexpr uint32_t kOpQueueVersion = 6;
inline constexpr size_t kMaxRefusalBytes = 512;
inline constexpr uint32_t kMinQueueCapacity = 2;
inline constexpr uint32_t kMaxQueueCapacity = 4096;
inline constexpr uint32_t kDefaultQueueCapacity = 256;
inline constexpr size_t kMaxAlgorithmChars = 15;
// The longest codec request an entry carries ("auto:bf16,fp16,int8" fits).
inline constexpr size_t kMaxCodecChars = 23;
inline constexpr size_t kMaxOpNameChars = 256;  // = collective/op_signature.h kMaxOpNameBytes
inline constexpr size_t kMaxErrorMessageBytes = 1024;

// Futex words must be plain, lock-free, address-free 32-bit words to be
// shared between processes; the indices must be lock-free 64-bit atomics.
// (Lock-free atomics are address-free on every platform we build for.)
static_assert(std::atomic<uint32_t>::is_always_lock_free, "futex words must be lock-free");
static_assert(std::atomic<uint64_t>::is_always_lock_free, "ring indices must be lock-free");
static_assert(sizeof(std::atomic<uint32_t>) == sizeof(uint32_t), "futex word is 32 bits");
static_assert(sizeof(std::atomic<uint64_t>) == sizeof(uint64_t), "index is 64 bits");
static_assert(alignof(std::atomic<uint64_t>) == 8, "index alignment");

// One op, as the client writes it. Strings are length-prefixed and need no
// terminator; a length beyond its field is refused.
struct SubmissionEntry {
  uint64_t token;         // client-chosen, strictly increasing per queue, >= 1
  uint64_t buffer_id;     // 0 with count 0: a barrier without a buffer
  uint64_t offset_bytes;
  uint64_t count;
  int64_t timeout_ms;     // 0: the job's op timeout
  int32_t root;           // rooted collectives; send and recv: the peer (recv -1: any)
  uint8_t collective;     // common/types.h CollectiveKind value
  uint8_t dtype;          // DType value
  uint8_t reduce_op;      // ReduceOp value
  uint8_t algorithm_len;  // <= kMaxAlgorithmChars
  uint16_t name_len;      // <= kMaxOpNameChars
  uint8_t codec_len;      // <= kMaxCodecChars
  uint8_t reserved0;
  int32_t tag;            // send, recv
  double premul_factor;   // premul_sum: this rank's multiplier
  char algorithm[16];
  char codec[kMaxCodecChars + 1];  // OpDesc::codec ("" = the job's)
  char name[kMaxOpNameChars];
};
static_assert(std::is_trivially_copyable_v<SubmissionEntry>);
static_assert(sizeof(SubmissionEntry) == 360);

// The outcome of one op, as the daemon writes it.
struct CompletionEntry {
  uint64_t token;     // the submission's token
  uint64_t op_id;     // the daemon's op id (= sequence); 0 if refused at submission
  int64_t queued_us;
  int64_t run_us;
  int32_t code;       // absl::StatusCode; 0 = OK
  int32_t source;     // OpResult::source: a recv's sender, a send's peer; -1 otherwise
  uint16_t message_len;  // <= kMaxErrorMessageBytes
  uint8_t algorithm_len;
  uint8_t truncated;  // 1: the message was cut to fit (and says so at its end)
  char algorithm[16];
  char message[kMaxErrorMessageBytes];
};
static_assert(std::is_trivially_copyable_v<CompletionEntry>);
static_assert(sizeof(CompletionEntry) == 1088);

// The bytes of an entry that carry anything: the header and the name (or
// message) as long as its length says (clamped to the field). The rings copy
// only these, so a small op moves a few cache lines between the processes,
// not the whole entry.
inline size_t UsedBytes(const SubmissionEntry& e) {
  return offsetof(SubmissionEntry, name) + std::min<size_t>(e.name_len, sizeof(e.name));
}
inline size_t UsedBytes(const CompletionEntry& e) {
  return offsetof(CompletionEntry, message) + std::min<size_t>(e.message_len, sizeof(e.message));
}

// The header's fixed part, written once by the daemon before the client
// learns the segment's name.
struct OpQueueFixedHeader {
  uint32_t magic;
  uint32_t version;
  uint32_t capacity;  // entries per ring, a power of two
  uint32_t header_bytes;
  uint32_t submission_entry_bytes;
  uint32_t completion_entry_bytes;
  uint64_t submission_offset;
  uint64_t completion_offset;
  uint64_t total_bytes;
};
static_assert(std::is_trivially_copyable_v<OpQueueFixedHeader>);

struct OpQueueHeader {
  OpQueueFixedHeader fixed;

  alignas(64) std::atomic<uint64_t> sq_head;  // daemon
  alignas(64) std::atomic<uint64_t> sq_tail;  // client
  alignas(64) std::atomic<uint64_t> cq_head;  // client
  alignas(64) std::atomic<uint64_t> cq_tail;  // daemon

  alignas(64) DoorbellWords sq_bell;          // client rings, daemon waits
  std::atomic<uint32_t> sq_space_wanted;      // client: waiting for room in the submission ring
  alignas(64) DoorbellWords cq_bell;          // daemon rings, client waits
  std::atomic<uint32_t> cq_overflow;          // daemon: completions wait for room in the ring

  alignas(64) std::atomic<uint64_t> daemon_heartbeat;
  alignas(64) std::atomic<uint64_t> client_heartbeat;

  // The daemon: the session takes no new ops (draining, its epoch failed),
  // with an absl::StatusCode (0 while it takes them) and why. Written once.
  alignas(64) std::atomic<int32_t> refusal_code;
  uint32_t refusal_len;
  char refusal_message[kMaxRefusalBytes];

  alignas(64) std::atomic<uint32_t> closed;   // daemon: 1 = no longer served
  int32_t close_code;                         // absl::StatusCode, valid once closed
  uint32_t close_message_len;
  char close_message[kMaxErrorMessageBytes];
};
static_assert(std::is_standard_layout_v<OpQueueHeader>);
static_assert(std::is_trivially_destructible_v<OpQueueHeader>);

// Bytes of a segment holding rings of `capacity` entries.
size_t OpQueueBytes(uint32_t capacity);
// 0 -> kDefaultQueueCapacity; else rounded up to a power of two.
// InvalidArgument outside [kMinQueueCapacity, kMaxQueueCapacity].
absl::StatusOr<uint32_t> NormalizeCapacity(uint32_t requested);

// ---------------------------------------------------------------- entries

// Client side: `op` (already checked by ValidateOp) with the client's
// `token` into *out; timeout as TimeoutMillis. InvalidArgument (naming the
// value and the limit) if the name or algorithm does not fit its field, the
// token is 0 or the timeout negative.
absl::Status EncodeSubmission(uint64_t token, const OpDesc& op, SubmissionEntry* out);
// Daemon side: what the entry's layout requires (lengths within their
// fields, token >= 1), InvalidArgument otherwise; the op's own checks are
// ValidateOp's (Session::Submit), as for an op that came over gRPC. The
// token is entry.token.
absl::Status DecodeSubmission(const SubmissionEntry& entry, OpDesc* op);

// One outcome on the queue: the op's OpResult, the submission's token and
// the daemon's op id.
struct OpCompletion : OpResult {
  uint64_t token = 0;
  uint64_t op_id = 0;
};

// Daemon side. A message longer than kMaxErrorMessageBytes is cut and ends
// with " ... [truncated from N bytes]"; a longer algorithm name is cut; the
// times in whole microseconds.
void EncodeCompletion(const OpCompletion& c, CompletionEntry* out);
// Client side. DataLoss if lengths are out of range; an unknown code becomes
// kUnknown.
absl::StatusOr<OpCompletion> DecodeCompletion(const CompletionEntry& entry);

// ---------------------------------------------------------------- ends

// The daemon's end of a queue: formats the segment, consumes submissions,
// produces completions, bumps its heartbeat and closes the queue.
class DaemonEnd {
 public:
  // Formats `mem` (zero-filled, >= OpQueueBytes(capacity) bytes) as an empty
  // queue. `capacity` must already be normalized.
  static absl::StatusOr<DaemonEnd> Format(void* mem, size_t size, uint32_t capacity);

  uint32_t capacity() const { return capacity_; }
  OpQueueHeader* header() const { return h_; }

  // DataLoss (with the values) if the header's fixed part changed.
  absl::Status CheckHeader() const;

  // Copies the next submission into *out. false: the ring is empty. DataLoss
  // if the client's tail is impossible (the queue must then be closed).
  absl::StatusOr<bool> PopSubmission(SubmissionEntry* out);
  // Submissions waiting (0 if the tail is impossible; PopSubmission says why).
  uint64_t PendingSubmissions() const;
  // Pushes a completion. false: the ring is full. DataLoss if the client's
  // head is impossible.
  absl::StatusOr<bool> PushCompletion(const CompletionEntry& entry);

  Doorbell submission_bell() const { return Doorbell(&h_->sq_bell); }
  Doorbell completion_bell() const { return Doorbell(&h_->cq_bell); }
  // After popping: wakes a client waiting for room in the submission ring.
  void NotifySpaceIfWanted();
  void SetOverflow(bool overflow);

  void BumpHeartbeat() { h_->daemon_heartbeat.fetch_add(1, std::memory_order_relaxed); }
  uint64_t client_heartbeat() const { return h_->client_heartbeat.load(std::memory_order_relaxed); }

  // Tells the client that the session takes no new ops, with why (once:
  // later calls change nothing; OK: nothing to say).
  void SetRefusal(const absl::Status& why);

  // Marks the queue closed with `reason` (not OK) and wakes the client.
  void Close(const absl::Status& reason);

 private:
  DaemonEnd(OpQueueHeader* h, char* base, uint32_t capacity);
  SubmissionEntry* sq_slot(uint64_t i) const;
  CompletionEntry* cq_slot(uint64_t i) const;

  OpQueueHeader* h_;
  char* base_;
  uint32_t capacity_;
  uint64_t sq_offset_;
  uint64_t cq_offset_;
  uint64_t sq_head_ = 0;  // private copies of the indices this end owns
  uint64_t cq_tail_ = 0;
};

// The client's end: produces submissions, consumes completions.
class ClientEnd {
 public:
  // Checks the header the daemon wrote (magic, version, capacity, offsets
  // within `size`, empty rings) and attaches. FailedPrecondition otherwise.
  static absl::StatusOr<ClientEnd> Attach(void* mem, size_t size);

  uint32_t capacity() const { return capacity_; }
  OpQueueHeader* header() const { return h_; }

  // false: the ring is full. DataLoss if the daemon's head is impossible.
  absl::StatusOr<bool> PushSubmission(const SubmissionEntry& entry);
  // false: the ring is empty. DataLoss if the daemon's tail is impossible.
  absl::StatusOr<bool> PopCompletion(CompletionEntry* out);
  bool SubmissionFull() const;

  Doorbell submission_bell() const { return Doorbell(&h_->sq_bell); }
  Doorbell completion_bell() const { return Doorbell(&h_->cq_bell); }
  void SetSpaceWanted(bool wanted) {
    h_->sq_space_wanted.store(wanted ? 1 : 0, std::memory_order_seq_cst);
  }
  bool overflow() const { return h_->cq_overflow.load(std::memory_order_acquire) != 0; }

  void BumpHeartbeat() { h_->client_heartbeat.fetch_add(1, std::memory_order_relaxed); }
  uint64_t daemon_heartbeat() const { return h_->daemon_heartbeat.load(std::memory_order_relaxed); }

  // OK while the daemon takes new ops for the session; else why not.
  absl::Status refusal() const;

  // OK while served; else the daemon's close reason.
  absl::Status closed_status() const;

 private:
  ClientEnd(OpQueueHeader* h, char* base, uint32_t capacity);
  SubmissionEntry* sq_slot(uint64_t i) const;
  CompletionEntry* cq_slot(uint64_t i) const;

  OpQueueHeader* h_;
  char* base_;
  uint32_t capacity_;
  uint64_t sq_offset_;
  uint64_t cq_offset_;
  uint64_t sq_tail_ = 0;
  uint64_t cq_head_ = 0;
};

}  // namespace ipc
}  // namespace gradsync

#endif  // GRADSYNC_IPC_OP_QUEUE_H_
