// One step of a step-synchronous algorithm (recursive halving/doubling,
// binomial trees, chains, pairwise exchange): a set of tagged sends and
// receives that are posted together and waited for together, with a deadline
// (internal to //collective).
//
// Pieces: a message of `count` elements is cut into pieces of at most
// `piece_bytes` (whole elements; never more than the transport's frame limit),
// each sent as its own transport message. A piece of a receive is handed to
// its PieceFn (to be reduced, say) as soon as it lands, while the rest stream
// in. A send can forward a receive of the same count: its piece k is posted as
// soon as piece k of that receive was processed, which pipelines chains and
// trees.
//
// Tags: slot = step << 20 | k, where k counts the pieces queued to (or from)
// the same peer in this exchange, in queue order; offset = the message's
// `tag_offset` (the byte offset of the payload in the op's buffer) plus the
// piece's byte offset. Both ends derive the same tags as long as they queue
// the same messages to each other in the same order, which is what every
// algorithm here does. Messages of 0 elements are skipped (both ends skip
// them), except in control exchanges, where every message is empty.
//
// Ordering: receives from one peer are posted in queue order, and sends to
// one peer too (a forwarded send holds back later sends to its peer).
//
// Bounded posting: at most Context::max_in_flight() requests per peer and
// direction are posted at a time; later pieces are posted as earlier ones
// complete (completions come in posting order per peer and direction).
#ifndef GRADSYNC_COLLECTIVE_EXCHANGE_H_
#define GRADSYNC_COLLECTIVE_EXCHANGE_H_

#include <cstddef>
#include <cstdint>
#include <functional>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "common/types.h"
#include "transport/transport.h"

namespace gradsync::internal {

inline constexpr int kPieceBits = 20;
inline constexpr uint32_t kMaxSteps = 1u << (32 - kPieceBits);

class Exchange {
 public:
  // Called when elements [begin, begin+count) of a receive (relative to the
  // message) have landed.
  using PieceFn = std::function<void(size_t begin, size_t count)>;

  // A data exchange: messages of `dtype` elements, cut into pieces of at most
  // `piece_bytes`. `step` < kMaxSteps, distinct for every exchange of an op.
  Exchange(transport::Context& ctx, uint64_t seq, DType dtype, uint32_t step, size_t piece_bytes);
  // A control exchange (barriers): every message is empty, with dtype 0.
  static Exchange Control(transport::Context& ctx, uint64_t seq, uint32_t step);

  Exchange(const Exchange&) = delete;
  Exchange& operator=(const Exchange&) = delete;
  Exchange(Exchange&&) = default;

  // Queues a send of `count` elements from mr at `byte_offset`. With
  // `forward_of` = the id of a receive of this exchange with the same count,
  // piece k leaves only once that receive's piece k was processed. Returns
  // the message's id (-1 when skipped because it is empty).
  int Send(int peer, const transport::MemoryRegion& mr, size_t byte_offset, size_t count,
           uint64_t tag_offset, int forward_of = -1);
  // Queues a receive of exactly `count` elements into mr at `byte_offset`.
  // `on_piece` runs as pieces land, or, with `after_sends`, only once every
  // send of this exchange has completed (for reductions into memory that this
  // exchange is sending from). A receive that is forwarded must not use
  // `after_sends`.
  int Recv(int peer, const transport::MemoryRegion& mr, size_t byte_offset, size_t count,
           uint64_t tag_offset, PieceFn on_piece = nullptr, bool after_sends = false);

  // Posts everything and waits until every send completed and every receive
  // was processed. DeadlineExceeded says "timed out at rank R in <where>:
  // waiting for rank(s) ...". Transport errors are returned as they are.
  absl::Status Run(absl::Time deadline, absl::string_view where);

 private:
  struct Piece {
    size_t begin = 0;  // elements, relative to the message
    size_t count = 0;
    uint32_t slot = 0;
    transport::Request req;
  };
  struct Message {
    bool send = false;
    int peer = 0;
    const transport::MemoryRegion* mr = nullptr;
    size_t byte_offset = 0;
    uint64_t tag_offset = 0;
    PieceFn on_piece;
    bool after_sends = false;
    int forward_of = -1;
    std::vector<Piece> pieces;
    size_t posted = 0;     // pieces posted
    size_t completed = 0;  // pieces the transport completed
    size_t done = 0;       // sends: pieces completed; receives: pieces processed
  };

  int Queue(bool send, int peer, const transport::MemoryRegion& mr, size_t byte_offset,
            size_t count, uint64_t tag_offset);
  transport::MessageTag Tag(const Message& m, const Piece& p) const;
  absl::Status Post(bool sends, bool* posted_any);
  // Counts the completions of posted pieces (frees their posting window).
  void CountCompletions();
  std::string DescribeWait() const;

  transport::Context& ctx_;
  uint64_t seq_;
  uint8_t tag_dtype_;
  size_t esize_;
  bool control_;
  uint32_t step_;
  size_t piece_elems_;
  std::vector<Message> msgs_;
  std::vector<uint32_t> sent_pieces_, recv_pieces_;  // per peer, for the slot numbers
  std::vector<int> sends_posted_, recvs_posted_;     // per peer: posted, not completed
  absl::Status error_;                               // a queueing error, returned by Run
};

}  // namespace gradsync::internal

#endif  // GRADSYNC_COLLECTIVE_EXCHANGE_H_
