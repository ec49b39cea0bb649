#include "ipc/arena.h"

#include <sched.h>

#include <cstring>
#include <new>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/clock.h"

namespace gradsync {
namespace ipc {
namespace {

constexpr uint64_t RoundUp(uint64_t n, uint64_t to) { return (n + to - 1) / to * to; }
constexpr uint64_t kHeaderBytes = RoundUp(sizeof(ArenaHeader), 64);
constexpr uint64_t kSlotHeaderBytes = RoundUp(sizeof(ArenaSlotHeader), 64);

bool IsPowerOfTwo(uint64_t v) { return v != 0 && (v & (v - 1)) == 0; }

absl::Status CheckGeometry(const ArenaGeometry& g) {
  if (g.world_size < 1 || g.world_size > kArenaMaxWorld) {
    return absl::InvalidArgumentError(
        absl::StrCat("arena world size ", g.world_size, " is outside [1, ", kArenaMaxWorld, "]"));
  }
  if (!IsPowerOfTwo(g.frames) || g.frames < kArenaMinFrames || g.frames > kArenaMaxFrames) {
    return absl::InvalidArgumentError(absl::StrCat("arena frames ", g.frames,
                                                   " is not a power of two in [", kArenaMinFrames,
                                                   ", ", kArenaMaxFrames, "]"));
  }
  if (g.data_bytes > kArenaMaxDataBytes) {
    return absl::InvalidArgumentError(absl::StrCat("arena data bytes ", g.data_bytes,
                                                   " exceed the limit of ", kArenaMaxDataBytes));
  }
  return absl::OkStatus();
}

ArenaFixedHeader FixedFor(const ArenaGeometry& g) {
  ArenaFixedHeader f{};
  f.magic = kArenaMagic;
  f.version = kArenaVersion;
  f.world_size = g.world_size;
  f.frames = g.frames;
  f.data_bytes = g.data_bytes;
  f.frame_bytes = kArenaFrameHeaderBytes + RoundUp(g.data_bytes, 64);
  f.slot_header_bytes = kSlotHeaderBytes;
  f.slot_bytes = kSlotHeaderBytes + uint64_t{g.frames} * f.frame_bytes;
  f.slots_offset = kHeaderBytes;
  f.total_bytes = RoundUp(f.slots_offset + uint64_t{g.world_size} * f.slot_bytes, 4096);
  return f;
}

absl::StatusCode CodeFromWire(int32_t code) {
  if (code <= 0 || code > static_cast<int32_t>(absl::StatusCode::kUnauthenticated)) {
    return absl::StatusCode::kUnknown;
  }
  return static_cast<absl::StatusCode>(code);
}

}  // namespace

absl::StatusOr<size_t> ArenaBytes(const ArenaGeometry& g) {
  absl::Status s = CheckGeometry(g);
  if (!s.ok()) return s;
  return static_cast<size_t>(FixedFor(g).total_bytes);
}

ArenaView::ArenaView(ArenaHeader* h, char* base) : h_(h), base_(base), fixed_(h->fixed) {}

absl::StatusOr<ArenaView> ArenaView::Format(void* mem, size_t size, const ArenaGeometry& g,
                                            uint64_t job_tag, uint64_t epoch) {
  absl::Status s = CheckGeometry(g);
  if (!s.ok()) return s;
  ArenaFixedHeader fixed = FixedFor(g);
  if (mem == nullptr || size < fixed.total_bytes) {
    return absl::InvalidArgumentError(absl::StrCat("arena needs ", fixed.total_bytes,
                                                   " bytes, got ", size));
  }
  fixed.job_tag = job_tag;
  fixed.epoch = epoch;
  auto* h = new (mem) ArenaHeader();
  h->fixed = fixed;
  char* base = static_cast<char*>(mem);
  for (uint32_t r = 0; r < g.world_size; ++r) {
    char* slot = base + fixed.slots_offset + uint64_t{r} * fixed.slot_bytes;
    new (slot) ArenaSlotHeader();
    for (uint32_t f = 0; f < g.frames; ++f) {
      new (slot + fixed.slot_header_bytes + uint64_t{f} * fixed.frame_bytes) ArenaFrameHeader();
    }
  }
  std::atomic_thread_fence(std::memory_order_release);
  return ArenaView(h, base);
}

absl::StatusOr<ArenaView> ArenaView::Attach(void* mem, size_t size) {
  if (mem == nullptr || size < kHeaderBytes) {
    return absl::FailedPreconditionError(
        absl::StrCat("arena segment of ", size, " bytes is smaller than its header"));
  }
  auto* h = static_cast<ArenaHeader*>(mem);
  ArenaFixedHeader f;
  std::memcpy(&f, &h->fixed, sizeof(f));
  if (f.magic != kArenaMagic) {
    return absl::FailedPreconditionError(absl::StrCat("not a gradsync arena (magic 0x",
                                                      absl::Hex(f.magic), ")"));
  }
  if (f.version != kArenaVersion) {
    return absl::FailedPreconditionError(absl::StrCat("arena version ", f.version,
                                                      " is not the supported ", kArenaVersion));
  }
  ArenaGeometry g;
  g.world_size = f.world_size;
  g.frames = f.frames;
  g.data_bytes = f.data_bytes;
  absl::Status s = CheckGeometry(g);
  if (!s.ok()) return absl::FailedPreconditionError(std::string(s.message()));
  ArenaFixedHeader want = FixedFor(g);
  if (f.frame_bytes != want.frame_bytes || f.slot_bytes != want.slot_bytes ||
      f.slot_header_bytes != want.slot_header_bytes || f.slots_offset != want.slots_offset ||
      f.total_bytes != want.total_bytes) {
    return absl::FailedPreconditionError("arena header has an inconsistent layout");
  }
  if (size < f.total_bytes) {
    return absl::FailedPreconditionError(absl::StrCat("arena segment has ", size,
                                                      " bytes; its header says ", f.total_bytes));
  }
  std::atomic_thread_fence(std::memory_order_acquire);
  return ArenaView(h, static_cast<char*>(mem));
}

absl::Status ArenaView::CheckHeader() const {
  ArenaFixedHeader now;
  std::memcpy(&now, &h_->fixed, sizeof(now));
  if (std::memcmp(&now, &fixed_, sizeof(now)) != 0) {
    return absl::DataLossError(absl::StrCat(
        "arena header changed (world ", now.world_size, " vs ", fixed_.world_size, ", frames ",
        now.frames, " vs ", fixed_.frames, ", data bytes ", now.data_bytes, " vs ",
        fixed_.data_bytes, ")"));
  }
  return absl::OkStatus();
}

ArenaSlotHeader* ArenaView::slot(int rank) const {
  return reinterpret_cast<ArenaSlotHeader*>(base_ + fixed_.slots_offset +
                                            static_cast<uint64_t>(rank) * fixed_.slot_bytes);
}

ArenaFrameHeader* ArenaView::frame(int rank, uint64_t seq) const {
  char* s = reinterpret_cast<char*>(slot(rank));
  return reinterpret_cast<ArenaFrameHeader*>(s + fixed_.slot_header_bytes +
                                             (seq & (fixed_.frames - 1)) * fixed_.frame_bytes);
}

bool ArenaView::FrameFree(uint64_t seq) const {
  if (seq <= fixed_.frames) return true;
  const uint64_t need = seq - fixed_.frames;
  for (int r = 0; r < world_size(); ++r) {
    if (slot(r)->consumed.load(std::memory_order_acquire) < need) return false;
  }
  return true;
}

std::vector<int> ArenaView::RanksHolding(uint64_t seq) const {
  std::vector<int> out;
  if (seq <= fixed_.frames) return out;
  const uint64_t need = seq - fixed_.frames;
  for (int r = 0; r < world_size(); ++r) {
    if (slot(r)->consumed.load(std::memory_order_acquire) < need) out.push_back(r);
  }
  return out;
}

absl::Status ArenaView::Publish(int rank, uint64_t seq, absl::string_view signature,
                                const void* data, size_t data_len) {
  if (rank < 0 || rank >= world_size() || seq == 0) {
    return absl::InvalidArgumentError(absl::StrCat("arena: bad rank ", rank, " or op ", seq));
  }
  if (signature.size() > kArenaMaxSignatureBytes) {
    return absl::InvalidArgumentError(absl::StrCat("op signature of ", signature.size(),
                                                   " bytes exceeds the arena's ",
                                                   kArenaMaxSignatureBytes));
  }
  if (data_len > fixed_.data_bytes) {
    return absl::InvalidArgumentError(absl::StrCat("local op data of ", data_len,
                                                   " bytes exceeds the arena's ",
                                                   fixed_.data_bytes));
  }
  ArenaFrameHeader* f = frame(rank, seq);
  f->signature_len = static_cast<uint32_t>(signature.size());
  std::memcpy(f->signature, signature.data(), signature.size());
  f->data_len = data_len;
  f->published_us = absl::ToUnixMicros(FastNow());
  f->outcome.store(0, std::memory_order_relaxed);
  if (data_len > 0) std::memcpy(reinterpret_cast<char*>(f) + kArenaFrameHeaderBytes, data, data_len);
  f->seq.store(seq, std::memory_order_release);
  bell().Ring();
  return absl::OkStatus();
}

void ArenaView::SetConsumed(int rank, uint64_t seq) {
  slot(rank)->consumed.store(seq, std::memory_order_release);
}

ArenaCounters& ArenaView::counters(int rank, int kind) const { return slot(rank)->counters[kind]; }

bool ArenaView::Published(int rank, uint64_t seq) const {
  return frame(rank, seq)->seq.load(std::memory_order_acquire) == seq;
}

absl::StatusOr<ArenaFrame> ArenaView::Read(int rank, uint64_t seq) const {
  const ArenaFrameHeader* f = frame(rank, seq);
  const uint32_t sig_len = f->signature_len;
  const uint64_t data_len = f->data_len;
  if (sig_len > kArenaMaxSignatureBytes || data_len > fixed_.data_bytes) {
    return absl::DataLossError(absl::StrCat("rank ", rank, "'s arena frame of op ", seq,
                                            " is corrupted (signature ", sig_len, " bytes, data ",
                                            data_len, " bytes; limits ", kArenaMaxSignatureBytes,
                                            " and ", fixed_.data_bytes, ")"));
  }
  ArenaFrame out;
  out.signature = absl::string_view(f->signature, sig_len);
  out.data = reinterpret_cast<const char*>(f) + kArenaFrameHeaderBytes;
  out.data_len = static_cast<size_t>(data_len);
  out.published_us = f->published_us;
  const uint32_t outcome = f->outcome.load(std::memory_order_acquire);
  if (outcome > 0 && outcome <= 17) out.outcome = static_cast<absl::StatusCode>(outcome - 1);
  return out;
}

void ArenaView::SetOutcome(int rank, uint64_t seq, absl::StatusCode code) {
  if (rank < 0 || rank >= world_size() || !Published(rank, seq)) return;
  frame(rank, seq)->outcome.store(1 + static_cast<uint32_t>(code), std::memory_order_release);
}

uint64_t ArenaView::consumed(int rank) const {
  return slot(rank)->consumed.load(std::memory_order_acquire);
}

void ArenaView::Leave(int rank) {
  if (rank < 0 || rank >= world_size()) return;
  ArenaSlotHeader* s = slot(rank);
  uint64_t expected = 0;
  s->left.compare_exchange_strong(expected, 1 + s->consumed.load(std::memory_order_acquire),
                                  std::memory_order_acq_rel);
  bell().Ring();
}

bool ArenaView::Left(int rank, uint64_t* done_up_to) const {
  const uint64_t v = slot(rank)->left.load(std::memory_order_acquire);
  if (v == 0) return false;
  if (done_up_to != nullptr) *done_up_to = v - 1;
  return true;
}

void ArenaView::Fail(const absl::Status& reason) {
  uint32_t expected = 0;
  if (!h_->failed.compare_exchange_strong(expected, 1, std::memory_order_acq_rel)) return;
  absl::string_view msg = reason.message();
  const std::string cut =
      msg.size() <= kArenaMaxFailureBytes ? std::string(msg)
                                          : absl::StrCat(msg.substr(0, kArenaMaxFailureBytes - 32),
                                                         " ... [truncated]");
  h_->fail_code = static_cast<int32_t>(reason.ok() ? absl::StatusCode::kUnknown : reason.code());
  h_->fail_len = static_cast<uint32_t>(cut.size());
  std::memcpy(h_->fail_message, cut.data(), cut.size());
  h_->failed.store(2, std::memory_order_release);
  bell().Ring();
}

absl::Status ArenaView::failure() const {
  uint32_t state = h_->failed.load(std::memory_order_acquire);
  if (state == 0) return absl::OkStatus();
  // A writer is between its two stores: a copy of at most 1 KiB away, unless
  // it died there (or scribbles): look for at most 1 ms.
  const absl::Time give_up = FastNow() + absl::Milliseconds(1);
  while (state == 1 && FastNow() < give_up) {
    ::sched_yield();
    state = h_->failed.load(std::memory_order_acquire);
  }
  if (state != 2) return absl::AbortedError("the job's arena failed (no reason recorded)");
  const uint32_t len = h_->fail_len;
  if (len > kArenaMaxFailureBytes) return absl::DataLossError("the job's arena failure is corrupted");
  return absl::Status(CodeFromWire(h_->fail_code), std::string(h_->fail_message, len));
}

}  // namespace ipc
}  // namespace gradsync
