#include "transport/staging_context.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/status_macros.h"

namespace gradsync::transport {
namespace {

// While copies are in flight the inner context is driven in slices this
// short, so a finished copy is seen within them (copies have no wake-up fd).
constexpr absl::Duration kCopyPoll = absl::Microseconds(20);

size_t SizeClass(size_t bytes) {
  size_t c = 4096;
  while (c < bytes) c <<= 1;
  return c;
}

}  // namespace

StagingContext::StagingContext(Context& inner, DeviceCopier& copier)
    : inner_(inner), copier_(copier) {}

StagingContext::~StagingContext() {
  for (auto& [size, blocks] : free_) {
    for (auto& b : blocks) {
      b->region.reset();
      copier_.FreeHost(b->data, b->size);
    }
  }
  for (Staged& s : staged_) {  // only after the inner context failed or let go of them
    if (s.block != nullptr) {
      s.block->region.reset();
      copier_.FreeHost(s.block->data, s.block->size);
    }
  }
}

absl::StatusOr<std::unique_ptr<MemoryRegion>> StagingContext::RegisterMemory(void* data,
                                                                            size_t size,
                                                                            MemKind kind) {
  if (kind.type == MemKind::kHost) return inner_.RegisterMemory(data, size, kind);
  if (!(kind == copier_.kind())) {
    return absl::FailedPreconditionError(absl::StrCat(
        "this context stages ", copier_.kind().ToString(), " memory, not ", kind.ToString()));
  }
  return std::make_unique<MemoryRegion>(static_cast<char*>(data), size, kind);
}

absl::StatusOr<std::unique_ptr<StagingContext::Block>> StagingContext::TakeBlock(size_t bytes) {
  const size_t size = SizeClass(bytes);
  auto& free = free_[size];
  if (!free.empty()) {
    std::unique_ptr<Block> b = std::move(free.back());
    free.pop_back();
    return b;
  }
  auto b = std::make_unique<Block>();
  ASSIGN_OR_RETURN(void* p, copier_.AllocateHost(size));
  b->data = static_cast<char*>(p);
  b->size = size;
  absl::StatusOr<std::unique_ptr<MemoryRegion>> region = inner_.RegisterMemory(p, size);
  if (!region.ok()) {
    copier_.FreeHost(p, size);
    return region.status();
  }
  b->region = std::move(*region);
  ++counters_.blocks_allocated;
  return b;
}

void StagingContext::GiveBack(std::unique_ptr<Block> block) {
  if (block != nullptr) free_[block->size].push_back(std::move(block));
}

bool StagingContext::SendsWaiting(int peer) const {
  for (const Staged& s : staged_) {
    if (s.send && s.peer == peer && s.stage != Stage::kTransferring) return true;
  }
  return false;
}

absl::Status StagingContext::PostSend(int peer, const MemoryRegion& mr, size_t offset, size_t len,
                                      const MessageTag& tag, Request* req) {
  const bool host = mr.kind().type == MemKind::kHost;
  if (host && !SendsWaiting(peer)) return inner_.PostSend(peer, mr, offset, len, tag, req);
  RETURN_IF_ERROR(inner_.health());
  if ((!host && !(mr.kind() == copier_.kind())) || offset > mr.size() ||
      len > mr.size() - offset) {
    return absl::InvalidArgumentError(absl::StrCat("send of [", offset, ", +", len, ") of a ",
                                                   mr.size(), "-byte ", mr.kind().ToString(),
                                                   " region this context cannot stage"));
  }
  Staged s;
  s.send = true;
  s.peer = peer;
  s.user = req;
  s.bytes = len;
  s.tag = tag;
  s.stage = Stage::kReady;
  if (host) {  // queued behind staged sends to the peer, sent from its own memory
    s.direct_region = &mr;
    s.direct_offset = offset;
  } else {
    ASSIGN_OR_RETURN(s.block, TakeBlock(len));
    s.device = mr.data() + offset;
    if (len > 0) {
      absl::StatusOr<uint64_t> ticket =
          copier_.Copy(DeviceCopier::Direction::kToHost, s.block->data, s.device, len);
      if (!ticket.ok()) {
        GiveBack(std::move(s.block));
        return FailWith(ticket.status());
      }
      s.ticket = *ticket;
      s.stage = Stage::kCopying;
      ++copies_in_flight_;
      counters_.max_copies_in_flight =
          std::max(counters_.max_copies_in_flight, copies_in_flight_);
    }
    ++counters_.staged_sends;
  }
  req->done = false;
  req->bytes = 0;
  staged_.push_back(std::move(s));
  bool completed = false;
  return Advance(&completed);  // a ready one goes out now (its completion is seen in Progress)
}

absl::Status StagingContext::PostRecv(int peer, const MemoryRegion& mr, size_t offset,
                                      size_t capacity, bool exact, const MessageTag& tag,
                                      Request* req) {
  if (mr.kind().type == MemKind::kHost) {
    return inner_.PostRecv(peer, mr, offset, capacity, exact, tag, req);
  }
  RETURN_IF_ERROR(inner_.health());
  if (!(mr.kind() == copier_.kind()) || offset > mr.size() || capacity > mr.size() - offset) {
    return absl::InvalidArgumentError(absl::StrCat("receive into [", offset, ", +", capacity,
                                                   ") of a ", mr.size(), "-byte ",
                                                   mr.kind().ToString(),
                                                   " region this context cannot stage"));
  }
  ASSIGN_OR_RETURN(std::unique_ptr<Block> block, TakeBlock(capacity));
  Staged s;
  s.peer = peer;
  s.user = req;
  s.device = mr.data() + offset;
  s.bytes = capacity;
  s.exact = exact;
  s.tag = tag;
  s.stage = Stage::kTransferring;
  s.block = std::move(block);
  req->done = false;
  req->bytes = 0;
  staged_.push_back(std::move(s));
  Staged& last = staged_.back();
  absl::Status posted =
      inner_.PostRecv(peer, *last.block->region, 0, capacity, exact, tag, &last.inner);
  if (!posted.ok()) {
    GiveBack(std::move(last.block));
    staged_.pop_back();
    return posted;
  }
  ++counters_.staged_recvs;
  return absl::OkStatus();
}

absl::Status StagingContext::Advance(bool* completed) {
  // Peers with a send not yet posted, in posting order: later sends wait.
  std::vector<int> held;
  auto is_held = [&](int peer) { return std::find(held.begin(), held.end(), peer) != held.end(); };
  for (auto it = staged_.begin(); it != staged_.end();) {
    Staged& s = *it;
    if (s.stage == Stage::kCopying) {
      absl::StatusOr<bool> done = copier_.Done(s.ticket);
      if (!done.ok()) return FailWith(done.status());
      if (!*done) {
        if (s.send) held.push_back(s.peer);
        ++it;
        continue;
      }
      --copies_in_flight_;
      if (s.send) {
        s.stage = Stage::kReady;
      } else {  // received and copied to the device: the receive is done
        s.user->bytes = s.inner.bytes;
        s.user->done = true;
        *completed = true;
        GiveBack(std::move(s.block));
        it = staged_.erase(it);
        continue;
      }
    }
    if (s.stage == Stage::kReady) {
      if (is_held(s.peer)) {
        ++it;
        continue;
      }
      s.stage = Stage::kTransferring;  // the post may complete it at once: looked at below
      const MemoryRegion& from = s.direct_region != nullptr ? *s.direct_region : *s.block->region;
      RETURN_IF_ERROR(inner_.PostSend(s.peer, from, s.direct_region != nullptr ? s.direct_offset : 0,
                                      s.bytes, s.tag, &s.inner));
    }
    // kTransferring.
    if (!s.inner.done) {
      ++it;
      continue;
    }
    if (s.send || s.inner.bytes == 0) {
      s.user->bytes = s.inner.bytes;
      s.user->done = true;
      *completed = true;
      GiveBack(std::move(s.block));
      it = staged_.erase(it);
      continue;
    }
    absl::StatusOr<uint64_t> ticket = copier_.Copy(DeviceCopier::Direction::kToDevice, s.device,
                                                   s.block->data, s.inner.bytes);
    if (!ticket.ok()) return FailWith(ticket.status());
    s.ticket = *ticket;
    s.stage = Stage::kCopying;
    ++copies_in_flight_;
    counters_.max_copies_in_flight = std::max(counters_.max_copies_in_flight, copies_in_flight_);
    // Looked at again: a copy may finish at once.
  }
  return absl::OkStatus();
}

bool StagingContext::Copying() const { return copies_in_flight_ > 0; }

absl::Status StagingContext::Progress(absl::Time deadline) {
  while (true) {
    bool completed = false;
    RETURN_IF_ERROR(Advance(&completed));
    if (completed) return absl::OkStatus();
    if (interrupted_.exchange(false)) return absl::DeadlineExceededError("interrupted");
    const absl::Time now = absl::Now();
    if (now >= deadline) return absl::DeadlineExceededError("staging progress deadline");
    const absl::Status s = inner_.Progress(Copying() ? std::min(deadline, now + kCopyPoll)
                                                      : deadline);
    if (s.ok()) {
      RETURN_IF_ERROR(Advance(&completed));
      return absl::OkStatus();  // a staged or a passed-through request moved
    }
    if (!absl::IsDeadlineExceeded(s)) return s;
    if (interrupted_.exchange(false)) return s;
  }
}

void StagingContext::Interrupt() {
  interrupted_.store(true);
  inner_.Interrupt();
}

absl::Status StagingContext::FailWith(const absl::Status& reason) {
  return inner_.Fail(absl::Status(reason.code(), absl::StrCat("staging ",
                                                              copier_.kind().ToString(),
                                                              " memory: ", reason.message())));
}

}  // namespace gradsync::transport
