#include "collective/exchange.h"

#include <algorithm>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace gradsync::internal {

Exchange::Exchange(transport::Context& ctx, uint64_t seq, DType dtype, uint32_t step,
                   size_t piece_bytes)
    : ctx_(ctx),
      seq_(seq),
      tag_dtype_(static_cast<uint8_t>(dtype)),
      esize_(DTypeSize(dtype)),
      control_(false),
      step_(step),
      sent_pieces_(ctx.size(), 0),
      recv_pieces_(ctx.size(), 0) {
  const size_t bytes = std::clamp<size_t>(piece_bytes, 1, transport::kMaxMessageBytes);
  piece_elems_ = std::max<size_t>(1, bytes / esize_);
  if (step >= kMaxSteps) {
    error_ = absl::InvalidArgumentError(absl::StrCat("collective step ", step, " out of range"));
  }
}

Exchange Exchange::Control(transport::Context& ctx, uint64_t seq, uint32_t step) {
  Exchange e(ctx, seq, DType::kU8, step, 1);
  e.tag_dtype_ = 0;
  e.control_ = true;
  return e;
}

int Exchange::Queue(bool send, int peer, const transport::MemoryRegion& mr, size_t byte_offset,
                    size_t count, uint64_t tag_offset) {
  if (control_) count = 0;
  if (count == 0 && !control_) return -1;
  Message m;
  m.send = send;
  m.peer = peer;
  m.mr = &mr;
  m.byte_offset = byte_offset;
  m.tag_offset = tag_offset;
  uint32_t& next = (send ? sent_pieces_ : recv_pieces_)[std::clamp(peer, 0, ctx_.size() - 1)];
  const size_t pieces = control_ ? 1 : (count + piece_elems_ - 1) / piece_elems_;
  if (next + pieces > (1u << kPieceBits)) {
    if (error_.ok()) {
      error_ = absl::InvalidArgumentError(
          absl::StrCat("message of ", count, " elements needs more than ", 1u << kPieceBits,
                       " pieces of at most ", piece_elems_, " elements (raise the segment size)"));
    }
    return -1;
  }
  m.pieces.resize(pieces);
  for (size_t k = 0; k < pieces; ++k) {
    Piece& p = m.pieces[k];
    p.begin = k * piece_elems_;
    p.count = std::min(piece_elems_, count - std::min(count, p.begin));
    p.slot = (step_ << kPieceBits) | next++;
  }
  msgs_.push_back(std::move(m));
  return static_cast<int>(msgs_.size()) - 1;
}

int Exchange::Send(int peer, const transport::MemoryRegion& mr, size_t byte_offset, size_t count,
                   uint64_t tag_offset, int forward_of) {
  const int id = Queue(/*send=*/true, peer, mr, byte_offset, count, tag_offset);
  if (id >= 0 && forward_of >= 0) {
    if (msgs_[forward_of].send || msgs_[forward_of].pieces.size() != msgs_[id].pieces.size()) {
      if (error_.ok()) error_ = absl::InternalError("forwarded send does not match its receive");
    }
    msgs_[id].forward_of = forward_of;
  }
  return id;
}

int Exchange::Recv(int peer, const transport::MemoryRegion& mr, size_t byte_offset, size_t count,
                   uint64_t tag_offset, PieceFn on_piece, bool after_sends) {
  const int id = Queue(/*send=*/false, peer, mr, byte_offset, count, tag_offset);
  if (id >= 0) {
    msgs_[id].on_piece = std::move(on_piece);
    msgs_[id].after_sends = after_sends;
  }
  return id;
}

transport::MessageTag Exchange::Tag(const Message& m, const Piece& p) const {
  return transport::MessageTag{seq_, p.slot, tag_dtype_, m.tag_offset + p.begin * esize_};
}

absl::Status Exchange::Post(bool sends, bool* posted_any) {
  // Messages to (or from) one peer are posted in queue order: the first one
  // that cannot post all its pieces (window full, or a forwarded send still
  // waiting for its data) holds back the later ones.
  const size_t window = ctx_.max_in_flight() > 0 ? static_cast<size_t>(ctx_.max_in_flight())
                                                 : ~size_t{0};
  std::vector<int>& in_flight = sends ? sends_posted_ : recvs_posted_;
  std::vector<char> held(ctx_.size(), 0);
  for (Message& m : msgs_) {
    if (m.send != sends || held[m.peer]) continue;
    while (m.posted < m.pieces.size() && static_cast<size_t>(in_flight[m.peer]) < window) {
      if (m.forward_of >= 0 && msgs_[m.forward_of].done <= m.posted) break;
      Piece& p = m.pieces[m.posted];
      const size_t offset = m.byte_offset + p.begin * esize_;
      absl::Status s = sends ? ctx_.PostSend(m.peer, *m.mr, offset, p.count * esize_, Tag(m, p),
                                             &p.req)
                             : ctx_.PostRecv(m.peer, *m.mr, offset, p.count * esize_,
                                             /*exact=*/true, Tag(m, p), &p.req);
      if (!s.ok()) return s;
      ++m.posted;
      ++in_flight[m.peer];
      *posted_any = true;
    }
    if (m.posted < m.pieces.size()) held[m.peer] = 1;
  }
  return absl::OkStatus();
}

void Exchange::CountCompletions() {
  for (Message& m : msgs_) {
    while (m.completed < m.posted && m.pieces[m.completed].req.done) {
      ++m.completed;
      --(m.send ? sends_posted_ : recvs_posted_)[m.peer];
    }
  }
}

std::string Exchange::DescribeWait() const {
  std::vector<int> from, to;
  size_t recv_total = 0, recv_done = 0, send_total = 0, send_done = 0;
  for (const Message& m : msgs_) {
    std::vector<int>& peers = m.send ? to : from;
    size_t done = 0;
    for (const Piece& p : m.pieces) done += p.req.done ? 1 : 0;
    (m.send ? send_total : recv_total) += m.pieces.size();
    (m.send ? send_done : recv_done) += done;
    if (done < m.pieces.size() && std::find(peers.begin(), peers.end(), m.peer) == peers.end()) {
      peers.push_back(m.peer);
    }
  }
  std::sort(from.begin(), from.end());
  std::sort(to.begin(), to.end());
  auto ranks = [](const std::vector<int>& v) {
    return absl::StrCat(v.size() == 1 ? "rank " : "ranks ", absl::StrJoin(v, ","));
  };
  if (!from.empty()) {
    std::string out = absl::StrCat("waiting for ", ranks(from), " (received ", recv_done, " of ",
                                   recv_total, " messages of this step");
    if (!to.empty()) {
      absl::StrAppend(&out, ", sent ", send_done, " of ", send_total, " to ", ranks(to));
    }
    return out + ")";
  }
  return absl::StrCat("waiting for ", ranks(to), " to take messages (sent ", send_done, " of ",
                      send_total, " of this step)");
}

absl::Status Exchange::Run(absl::Time deadline, absl::string_view where) {
  if (!error_.ok()) return error_;
  sends_posted_.assign(ctx_.size(), 0);
  recvs_posted_.assign(ctx_.size(), 0);
  while (true) {
    bool progressed = false;
    CountCompletions();
    absl::Status s = Post(/*sends=*/false, &progressed);
    if (s.ok()) s = Post(/*sends=*/true, &progressed);
    if (!s.ok()) return s;
    bool sends_done = true;
    for (Message& m : msgs_) {
      if (!m.send) continue;
      while (m.done < m.posted && m.pieces[m.done].req.done) {
        ++m.done;
        progressed = true;
      }
      sends_done = sends_done && m.done == m.pieces.size();
    }
    bool recvs_done = true;
    for (Message& m : msgs_) {
      if (m.send) continue;
      while (m.done < m.pieces.size() && m.pieces[m.done].req.done &&
             (!m.after_sends || sends_done)) {
        const Piece& p = m.pieces[m.done];
        if (m.on_piece) m.on_piece(p.begin, p.count);
        ++m.done;
        progressed = true;
      }
      recvs_done = recvs_done && m.done == m.pieces.size();
    }
    if (sends_done && recvs_done) return absl::OkStatus();
    if (progressed) continue;
    s = ctx_.Progress(deadline);
    if (absl::IsDeadlineExceeded(s)) {
      return absl::DeadlineExceededError(
          absl::StrCat("timed out at rank ", ctx_.rank(), " in ", where, ": ", DescribeWait()));
    }
    if (!s.ok()) return s;
  }
}

}  // namespace gradsync::internal
