#include "ipc/op_queue.h"


#include <algorithm>
#include <cstring>
#include <new>

#include "absl/strings/str_cat.h"

namespace gradsync {
namespace ipc {
namespace {

constexpr size_t RoundUp(size_t n, size_t to) { return (n + to - 1) / to * to; }

constexpr size_t kHeaderBytes = RoundUp(sizeof(OpQueueHeader), 64);

struct Layout {
  uint64_t submission_offset;
  uint64_t completion_offset;
  uint64_t total_bytes;
};

Layout LayoutFor(uint32_t capacity) {
  Layout l;
  l.submission_offset = kHeaderBytes;
  l.completion_offset =
      RoundUp(l.submission_offset + uint64_t{capacity} * sizeof(SubmissionEntry), 64);
  l.total_bytes = RoundUp(l.completion_offset + uint64_t{capacity} * sizeof(CompletionEntry), 4096);
  return l;
}

bool IsPowerOfTwo(uint32_t v) { return v != 0 && (v & (v - 1)) == 0; }

bool ValidCapacity(uint32_t c) {
  return IsPowerOfTwo(c) && c >= kMinQueueCapacity && c <= kMaxQueueCapacity;
}

absl::StatusCode CodeFromWire(int32_t code) {
  if (code < 0 || code > static_cast<int32_t>(absl::StatusCode::kUnauthenticated)) {
    return absl::StatusCode::kUnknown;
  }
  return static_cast<absl::StatusCode>(code);
}

// Cuts `msg` to `limit` bytes; if it had to, the end says so (without
// splitting a UTF-8 sequence).
std::string FitMessage(absl::string_view msg, size_t limit, bool* truncated) {
  *truncated = false;
  if (msg.size() <= limit) return std::string(msg);
  *truncated = true;
  const std::string suffix = absl::StrCat(" ... [truncated from ", msg.size(), " bytes]");
  size_t keep = limit > suffix.size() ? limit - suffix.size() : 0;
  while (keep > 0 && (static_cast<unsigned char>(msg[keep]) & 0xC0) == 0x80) --keep;
  return absl::StrCat(msg.substr(0, keep), suffix);
}

}  // namespace

size_t OpQueueBytes(uint32_t capacity) { return LayoutFor(capacity).total_bytes; }

absl::StatusOr<uint32_t> NormalizeCapacity(uint32_t requested) {
  if (requested == 0) return kDefaultQueueCapacity;
  if (requested < kMinQueueCapacity || requested > kMaxQueueCapacity) {
    return absl::InvalidArgumentError(absl::StrCat("op queue capacity ", requested,
                                                   " is outside [", kMinQueueCapacity, ", ",
                                                   kMaxQueueCapacity, "] (0 = default ",
                                                   kDefaultQueueCapacity, ")"));
  }
  uint32_t c = 1;
  while (c < requested) c <<= 1;
  return c;
}

// ---------------------------------------------------------------- entries

absl::Status EncodeSubmission(uint64_t token, const OpDesc& op, SubmissionEntry* out) {
  if (op.name.size() > kMaxOpNameChars) {
    return absl::InvalidArgumentError(absl::StrCat("op name is ", op.name.size(),
                                                   " bytes; the limit is ", kMaxOpNameChars));
  }
  if (op.algorithm.size() > kMaxAlgorithmChars) {
    return absl::InvalidArgumentError(absl::StrCat("algorithm name '", op.algorithm, "' is ",
                                                   op.algorithm.size(),
                                                   " characters; the limit is ", kMaxAlgorithmChars));
  }
  if (op.codec.size() > kMaxCodecChars) {
    return absl::InvalidArgumentError(absl::StrCat("codec '", op.codec, "' is ", op.codec.size(),
                                                   " characters; the limit is ", kMaxCodecChars));
  }
  if (token == 0) return absl::InvalidArgumentError("op token must be >= 1");
  const int64_t timeout_ms = TimeoutMillis(op.timeout);
  if (timeout_ms < 0) {
    return absl::InvalidArgumentError(absl::StrCat("negative op timeout ", timeout_ms, " ms"));
  }
  // Only the header and the name's bytes are used (and copied into the ring).
  std::memset(out, 0, offsetof(SubmissionEntry, name));
  out->token = token;
  out->buffer_id = op.buffer_id;
  out->offset_bytes = op.offset_bytes;
  out->count = op.count;
  out->timeout_ms = timeout_ms;
  out->root = op.root;
  out->tag = op.tag;
  out->premul_factor = op.premul_factor;
  out->collective = static_cast<uint8_t>(op.kind);
  out->dtype = static_cast<uint8_t>(op.dtype);
  out->reduce_op = static_cast<uint8_t>(op.op);
  out->algorithm_len = static_cast<uint8_t>(op.algorithm.size());
  out->name_len = static_cast<uint16_t>(op.name.size());
  std::memcpy(out->algorithm, op.algorithm.data(), op.algorithm.size());
  out->codec_len = static_cast<uint8_t>(op.codec.size());
  std::memcpy(out->codec, op.codec.data(), op.codec.size());
  std::memcpy(out->name, op.name.data(), op.name.size());
  return absl::OkStatus();
}

absl::Status DecodeSubmission(const SubmissionEntry& e, OpDesc* op) {
  if (e.name_len > kMaxOpNameChars) {
    return absl::InvalidArgumentError(absl::StrCat("submission entry (token ", e.token,
                                                   "): op name length ", e.name_len,
                                                   " exceeds the limit of ", kMaxOpNameChars));
  }
  const absl::string_view name(e.name, e.name_len);
  if (e.algorithm_len > kMaxAlgorithmChars) {
    return absl::InvalidArgumentError(absl::StrCat(
        "submission entry (token ", e.token, ", op '", name, "'): algorithm name length ",
        e.algorithm_len, " exceeds the limit of ", kMaxAlgorithmChars));
  }
  if (e.codec_len > kMaxCodecChars) {
    return absl::InvalidArgumentError(absl::StrCat("submission entry (token ", e.token, ", op '",
                                                   name, "'): codec length ", e.codec_len,
                                                   " exceeds the limit of ", kMaxCodecChars));
  }
  if (e.token == 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("submission entry (op '", name, "'): token 0 (tokens start at 1)"));
  }
  // The enum bytes are kept as they came: ValidateOp names a bad one.
  op->kind = static_cast<CollectiveKind>(e.collective);
  op->dtype = static_cast<DType>(e.dtype);
  op->op = static_cast<ReduceOp>(e.reduce_op);
  op->root = e.root;
  op->tag = e.tag;
  op->premul_factor = e.premul_factor;
  op->count = e.count;
  op->buffer_id = e.buffer_id;
  op->offset_bytes = e.offset_bytes;
  op->name.assign(name.data(), name.size());
  op->algorithm.assign(e.algorithm, e.algorithm_len);
  op->codec.assign(e.codec, e.codec_len);
  op->timeout = absl::Milliseconds(e.timeout_ms);
  return absl::OkStatus();
}

void EncodeCompletion(const OpCompletion& c, CompletionEntry* out) {
  // Only the header and the message's bytes are used (and copied into the ring).
  std::memset(out, 0, offsetof(CompletionEntry, message));
  out->token = c.token;
  out->op_id = c.op_id;
  out->queued_us = absl::ToInt64Microseconds(c.queued_time);
  out->run_us = absl::ToInt64Microseconds(c.run_time);
  out->code = static_cast<int32_t>(c.status.code());
  out->source = c.source;
  const size_t alen = std::min(c.algorithm.size(), kMaxAlgorithmChars);
  out->algorithm_len = static_cast<uint8_t>(alen);
  std::memcpy(out->algorithm, c.algorithm.data(), alen);
  if (!c.status.ok()) {
    bool truncated = false;
    const std::string msg = FitMessage(c.status.message(), kMaxErrorMessageBytes, &truncated);
    out->message_len = static_cast<uint16_t>(msg.size());
    out->truncated = truncated ? 1 : 0;
    std::memcpy(out->message, msg.data(), msg.size());
  }
}

absl::StatusOr<OpCompletion> DecodeCompletion(const CompletionEntry& e) {
  if (e.message_len > kMaxErrorMessageBytes || e.algorithm_len > kMaxAlgorithmChars) {
    return absl::DataLossError(absl::StrCat("completion entry (token ", e.token,
                                            ") has message length ", e.message_len,
                                            " and algorithm length ", e.algorithm_len,
                                            "; the limits are ", kMaxErrorMessageBytes, " and ",
                                            kMaxAlgorithmChars));
  }
  OpCompletion c;
  c.token = e.token;
  c.op_id = e.op_id;
  c.queued_time = absl::Microseconds(e.queued_us);
  c.run_time = absl::Microseconds(e.run_us);
  c.algorithm.assign(e.algorithm, e.algorithm_len);
  c.source = e.source;
  if (e.code != 0) {
    c.status = absl::Status(CodeFromWire(e.code), absl::string_view(e.message, e.message_len));
  }
  return c;
}

// ---------------------------------------------------------------- DaemonEnd

DaemonEnd::DaemonEnd(OpQueueHeader* h, char* base, uint32_t capacity)
    : h_(h), base_(base), capacity_(capacity) {
  const Layout l = LayoutFor(capacity);
  sq_offset_ = l.submission_offset;
  cq_offset_ = l.completion_offset;
}

absl::StatusOr<DaemonEnd> DaemonEnd::Format(void* mem, size_t size, uint32_t capacity) {
  if (!ValidCapacity(capacity)) {
    return absl::InvalidArgumentError(absl::StrCat("op queue capacity ", capacity,
                                                   " is not a power of two in [",
                                                   kMinQueueCapacity, ", ", kMaxQueueCapacity, "]"));
  }
  const Layout l = LayoutFor(capacity);
  if (mem == nullptr || size < l.total_bytes || reinterpret_cast<uintptr_t>(mem) % 64 != 0) {
    return absl::InvalidArgumentError(absl::StrCat("op queue of capacity ", capacity, " needs ",
                                                   l.total_bytes, " bytes, 64-byte aligned; got ",
                                                   size));
  }
  std::memset(mem, 0, l.total_bytes);
  auto* h = new (mem) OpQueueHeader();
  OpQueueFixedHeader& f = h->fixed;
  f.version = kOpQueueVersion;
  f.capacity = capacity;
  f.header_bytes = static_cast<uint32_t>(kHeaderBytes);
  f.submission_entry_bytes = sizeof(SubmissionEntry);
  f.completion_entry_bytes = sizeof(CompletionEntry);
  f.submission_offset = l.submission_offset;
  f.completion_offset = l.completion_offset;
  f.total_bytes = l.total_bytes;
  std::atomic_thread_fence(std::memory_order_release);
  f.magic = kOpQueueMagic;
  return DaemonEnd(h, static_cast<char*>(mem), capacity);
}

absl::Status DaemonEnd::CheckHeader() const {
  OpQueueFixedHeader snapshot;  // a copy: the client may be writing it
  std::memcpy(&snapshot, &h_->fixed, sizeof(snapshot));
  const Layout l = LayoutFor(capacity_);
  if (snapshot.magic != kOpQueueMagic || snapshot.version != kOpQueueVersion ||
      snapshot.capacity != capacity_ || snapshot.header_bytes != kHeaderBytes ||
      snapshot.submission_entry_bytes != sizeof(SubmissionEntry) ||
      snapshot.completion_entry_bytes != sizeof(CompletionEntry) ||
      snapshot.submission_offset != l.submission_offset ||
      snapshot.completion_offset != l.completion_offset || snapshot.total_bytes != l.total_bytes) {
    return absl::DataLossError(absl::StrCat(
        "op queue header was overwritten: magic 0x", absl::Hex(snapshot.magic), " version ",
        snapshot.version, " capacity ", snapshot.capacity, " (expected magic 0x",
        absl::Hex(kOpQueueMagic), " version ", kOpQueueVersion, " capacity ", capacity_, ")"));
  }
  return absl::OkStatus();
}

SubmissionEntry* DaemonEnd::sq_slot(uint64_t i) const {
  return reinterpret_cast<SubmissionEntry*>(base_ + sq_offset_) + (i & (capacity_ - 1));
}

CompletionEntry* DaemonEnd::cq_slot(uint64_t i) const {
  return reinterpret_cast<CompletionEntry*>(base_ + cq_offset_) + (i & (capacity_ - 1));
}

uint64_t DaemonEnd::PendingSubmissions() const {
  const uint64_t n = h_->sq_tail.load(std::memory_order_acquire) - sq_head_;
  return n > capacity_ ? 0 : n;
}

absl::StatusOr<bool> DaemonEnd::PopSubmission(SubmissionEntry* out) {
  const uint64_t tail = h_->sq_tail.load(std::memory_order_acquire);
  const uint64_t n = tail - sq_head_;
  if (n > capacity_) {
    return absl::DataLossError(absl::StrCat("submission ring tail ", tail,
                                            " is impossible: head ", sq_head_, ", capacity ",
                                            capacity_));
  }
  if (n == 0) return false;
  // The header, then as much of the name as it says (a length beyond the
  // limit copies none; DecodeSubmission refuses it from the private copy).
  const char* slot = reinterpret_cast<const char*>(sq_slot(sq_head_));
  std::memcpy(out, slot, offsetof(SubmissionEntry, name));
  if (out->name_len <= kMaxOpNameChars) {
    std::memcpy(out->name, slot + offsetof(SubmissionEntry, name), out->name_len);
  }
  ++sq_head_;
  // seq_cst: pairs with the client's store to sq_space_wanted (see NotifySpaceIfWanted).
  h_->sq_head.store(sq_head_, std::memory_order_seq_cst);
  return true;
}

void DaemonEnd::NotifySpaceIfWanted() {
  if (h_->sq_space_wanted.load(std::memory_order_seq_cst) != 0) completion_bell().Ring();
}

void DaemonEnd::SetOverflow(bool overflow) {
  h_->cq_overflow.store(overflow ? 1 : 0, std::memory_order_release);
}

absl::StatusOr<bool> DaemonEnd::PushCompletion(const CompletionEntry& entry) {
  const uint64_t head = h_->cq_head.load(std::memory_order_acquire);
  const uint64_t used = cq_tail_ - head;
  if (used > capacity_) {
    return absl::DataLossError(absl::StrCat("completion ring head ", head,
                                            " is impossible: tail ", cq_tail_, ", capacity ",
                                            capacity_));
  }
  if (used == capacity_) return false;
  std::memcpy(cq_slot(cq_tail_), &entry, UsedBytes(entry));
  ++cq_tail_;
  h_->cq_tail.store(cq_tail_, std::memory_order_release);
  return true;
}

void DaemonEnd::Close(const absl::Status& reason) {
  const absl::Status r = reason.ok() ? absl::UnavailableError("op queue closed") : reason;
  bool truncated = false;
  const std::string msg = FitMessage(r.message(), kMaxErrorMessageBytes, &truncated);
  h_->close_code = static_cast<int32_t>(r.code());
  h_->close_message_len = static_cast<uint32_t>(msg.size());
  std::memcpy(h_->close_message, msg.data(), msg.size());
  h_->closed.store(1, std::memory_order_release);
  completion_bell().Ring();  // sleepers in Wait and in a full-ring Submit wake up
}

void DaemonEnd::SetRefusal(const absl::Status& why) {
  if (why.ok() || h_->refusal_code.load(std::memory_order_relaxed) != 0) return;
  bool truncated = false;
  const std::string msg = FitMessage(why.message(), kMaxRefusalBytes, &truncated);
  h_->refusal_len = static_cast<uint32_t>(msg.size());
  std::memcpy(h_->refusal_message, msg.data(), msg.size());
  h_->refusal_code.store(static_cast<int32_t>(why.code()), std::memory_order_release);
}

// ---------------------------------------------------------------- ClientEnd

ClientEnd::ClientEnd(OpQueueHeader* h, char* base, uint32_t capacity)
    : h_(h), base_(base), capacity_(capacity) {
  const Layout l = LayoutFor(capacity);
  sq_offset_ = l.submission_offset;
  cq_offset_ = l.completion_offset;
  sq_tail_ = h->sq_tail.load(std::memory_order_acquire);
  cq_head_ = h->cq_head.load(std::memory_order_acquire);
}

absl::StatusOr<ClientEnd> ClientEnd::Attach(void* mem, size_t size) {
  if (mem == nullptr || size < kHeaderBytes || reinterpret_cast<uintptr_t>(mem) % 64 != 0) {
    return absl::FailedPreconditionError(
        absl::StrCat("op queue segment of ", size, " bytes is too small for its header"));
  }
  auto* h = static_cast<OpQueueHeader*>(mem);
  OpQueueFixedHeader fixed;
  std::memcpy(&fixed, &h->fixed, sizeof(fixed));
  std::atomic_thread_fence(std::memory_order_acquire);
  if (fixed.magic != kOpQueueMagic || fixed.version != kOpQueueVersion) {
    return absl::FailedPreconditionError(absl::StrCat(
        "op queue segment has magic 0x", absl::Hex(fixed.magic), " version ", fixed.version,
        "; expected magic 0x", absl::Hex(kOpQueueMagic), " version ", kOpQueueVersion));
  }
  if (!ValidCapacity(fixed.capacity)) {
    return absl::FailedPreconditionError(
        absl::StrCat("op queue segment has an invalid capacity ", fixed.capacity));
  }
  const Layout l = LayoutFor(fixed.capacity);
  if (fixed.header_bytes != kHeaderBytes ||
      fixed.submission_entry_bytes != sizeof(SubmissionEntry) ||
      fixed.completion_entry_bytes != sizeof(CompletionEntry) ||
      fixed.submission_offset != l.submission_offset ||
      fixed.completion_offset != l.completion_offset || fixed.total_bytes != l.total_bytes ||
      size < l.total_bytes) {
    return absl::FailedPreconditionError(absl::StrCat(
        "op queue segment layout does not match this client (capacity ", fixed.capacity,
        ", ", fixed.total_bytes, " bytes, mapped ", size, ")"));
  }
  return ClientEnd(h, static_cast<char*>(mem), fixed.capacity);
}

SubmissionEntry* ClientEnd::sq_slot(uint64_t i) const {
  return reinterpret_cast<SubmissionEntry*>(base_ + sq_offset_) + (i & (capacity_ - 1));
}

CompletionEntry* ClientEnd::cq_slot(uint64_t i) const {
  return reinterpret_cast<CompletionEntry*>(base_ + cq_offset_) + (i & (capacity_ - 1));
}

bool ClientEnd::SubmissionFull() const {
  const uint64_t head = h_->sq_head.load(std::memory_order_seq_cst);
  return sq_tail_ - head >= capacity_;
}

absl::StatusOr<bool> ClientEnd::PushSubmission(const SubmissionEntry& entry) {
  const uint64_t head = h_->sq_head.load(std::memory_order_seq_cst);
  const uint64_t used = sq_tail_ - head;
  if (used > capacity_) {
    return absl::DataLossError(absl::StrCat("submission ring head ", head,
                                            " is impossible: tail ", sq_tail_, ", capacity ",
                                            capacity_));
  }
  if (used == capacity_) return false;
  std::memcpy(sq_slot(sq_tail_), &entry, UsedBytes(entry));
  ++sq_tail_;
  h_->sq_tail.store(sq_tail_, std::memory_order_release);
  return true;
}

absl::StatusOr<bool> ClientEnd::PopCompletion(CompletionEntry* out) {
  const uint64_t tail = h_->cq_tail.load(std::memory_order_acquire);
  const uint64_t n = tail - cq_head_;
  if (n > capacity_) {
    return absl::DataLossError(absl::StrCat("completion ring tail ", tail,
                                            " is impossible: head ", cq_head_, ", capacity ",
                                            capacity_));
  }
  if (n == 0) return false;
  const char* slot = reinterpret_cast<const char*>(cq_slot(cq_head_));
  std::memcpy(out, slot, offsetof(CompletionEntry, message));
  if (out->message_len <= kMaxErrorMessageBytes) {
    std::memcpy(out->message, slot + offsetof(CompletionEntry, message), out->message_len);
  }
  ++cq_head_;
  h_->cq_head.store(cq_head_, std::memory_order_release);
  return true;
}

absl::Status ClientEnd::refusal() const {
  const int32_t code = h_->refusal_code.load(std::memory_order_acquire);
  if (code == 0) return absl::OkStatus();
  const size_t len = std::min<size_t>(h_->refusal_len, kMaxRefusalBytes);
  absl::StatusCode c = CodeFromWire(code);
  if (c == absl::StatusCode::kOk) c = absl::StatusCode::kUnavailable;
  return absl::Status(c, std::string(h_->refusal_message, len));
}

absl::Status ClientEnd::closed_status() const {
  if (h_->closed.load(std::memory_order_acquire) == 0) return absl::OkStatus();
  const size_t len = std::min<size_t>(h_->close_message_len, kMaxErrorMessageBytes);
  absl::StatusCode code = CodeFromWire(h_->close_code);
  if (code == absl::StatusCode::kOk) code = absl::StatusCode::kUnavailable;
  return absl::Status(code, std::string(h_->close_message, len));
}

}  // namespace ipc
}  // namespace gradsync
