#include "collective/op_signature.h"

#include <cstddef>
#include <cstring>
#include <map>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "transport/wire.h"

namespace gradsync {

std::string OpSignature::Describe() const {
  std::string out = absl::StrCat(CollectiveName(kind), " '", name, "'");
  if (kind != CollectiveKind::kBarrier) {
    absl::StrAppend(&out, " ", DTypeName(dtype), "[", count, "]");
  }
  if (IsReducingCollective(kind)) absl::StrAppend(&out, " ", ReduceOpName(op));
  if (IsRootedCollective(kind)) absl::StrAppend(&out, " root ", root);
  if (forced != kNoAlgorithm) absl::StrAppend(&out, " algo ", AlgorithmCodeName(forced));
  return out;
}

namespace {
// The encoded form: this header, then the name bytes (at most kMaxOpNameBytes).
struct PackedSignature {
  uint64_t seq;
  uint64_t count;
  uint8_t kind;
  uint8_t dtype;
  uint8_t op;
  uint8_t forced;  // compared
  uint32_t name_len;
  int32_t root;
  uint8_t proposal;  // not compared (CompareSignatures masks it)
  uint8_t reserved[3];
};
constexpr size_t kProposalOffset = offsetof(PackedSignature, proposal);
static_assert(sizeof(PackedSignature) == 32, "packed signature layout");
}  // namespace

std::string OpSignature::Encode() const {
  PackedSignature p{seq,
                    count,
                    static_cast<uint8_t>(kind),
                    static_cast<uint8_t>(dtype),
                    static_cast<uint8_t>(op),
                    forced,
                    static_cast<uint32_t>(name.size()),
                    root,
                    proposal,
                    {0, 0, 0}};
  std::string out(sizeof(p), '\0');
  std::memcpy(out.data(), &p, sizeof(p));
  out += name;
  return out;
}

absl::StatusOr<OpSignature> OpSignature::Decode(const std::string& bytes) {
  PackedSignature p;
  if (bytes.size() < sizeof(p)) return absl::DataLossError("short op signature");
  std::memcpy(&p, bytes.data(), sizeof(p));
  if (p.name_len > kMaxOpNameBytes || bytes.size() != sizeof(p) + p.name_len ||
      !IsValidDType(p.dtype) || !IsValidReduceOp(p.op) || !IsValidCollective(p.kind)) {
    return absl::DataLossError("malformed op signature");
  }
  OpSignature s;
  s.seq = p.seq;
  s.count = p.count;
  s.kind = static_cast<CollectiveKind>(p.kind);
  s.dtype = static_cast<DType>(p.dtype);
  s.op = static_cast<ReduceOp>(p.op);
  s.root = p.root;
  s.forced = p.forced;
  s.proposal = p.proposal;
  s.name = bytes.substr(sizeof(p));
  return s;
}

bool OpSignature::operator==(const OpSignature& o) const {
  return seq == o.seq && kind == o.kind && dtype == o.dtype && op == o.op && count == o.count &&
         root == o.root && name == o.name && forced == o.forced;
}

uint8_t SignatureProposal(const std::string& encoded) {
  if (encoded.size() < sizeof(PackedSignature)) return OpSignature::kNoAlgorithm;
  return static_cast<uint8_t>(encoded[kProposalOffset]);
}

namespace {
// Eager data starts at the next multiple of 16 after the signature, so the
// reduction reads aligned elements (the inbox slots are 16-byte aligned).
constexpr size_t kDataAlign = 16;
size_t AlignUp(size_t x) { return (x + kDataAlign - 1) / kDataAlign * kDataAlign; }

// Length of the encoded signature at the start of a message (the rest is eager
// data); the whole message if it is too short to say, so that the comparison
// reports it as malformed.
size_t EncodedLength(const char* msg, size_t len) {
  if (len < sizeof(PackedSignature)) return len;
  PackedSignature p;
  std::memcpy(&p, msg, sizeof(p));
  if (p.name_len > kMaxOpNameBytes || sizeof(p) + p.name_len > len) return len;
  return sizeof(p) + p.name_len;
}
}  // namespace

absl::Status CheckSignatures(transport::Context& ctx, const OpSignature& mine,
                             absl::Time deadline, const std::function<void(int rank)>& on_arrival,
                             uint8_t* agreed, EagerData* eager, std::vector<char>* inbox) {
  const int n = ctx.size();
  const int me = ctx.rank();
  if (eager != nullptr) {
    if (eager->bytes > kOneShotMaxBytes || inbox == nullptr) {
      return absl::InvalidArgumentError(absl::StrCat(
          "op ", mine.seq, ": ", eager->bytes, " bytes cannot ride with the signature (at most ",
          kOneShotMaxBytes, ", with an inbox)"));
    }
    eager->received.assign(n, nullptr);
  }
  if (n == 1) {
    if (agreed != nullptr) *agreed = mine.proposal;
    return absl::OkStatus();
  }
  std::string outbox = mine.Encode();
  const size_t sig_len = outbox.size();
  if (eager != nullptr && eager->bytes > 0) {
    outbox.resize(AlignUp(sig_len), '\0');
    outbox.append(static_cast<const char*>(eager->data), eager->bytes);
  }
  constexpr size_t kCap = sizeof(PackedSignature) + kMaxOpNameBytes + kOneShotMaxBytes;
  static_assert(kCap % kDataAlign == 0, "inbox slots stay aligned");
  static_assert((sizeof(PackedSignature) + kMaxOpNameBytes) % kDataAlign == 0,
                "the padded signature plus the largest payload fit a slot");
  std::vector<char> local_inbox;
  std::vector<char>& in = inbox != nullptr ? *inbox : local_inbox;
  if (in.size() < kCap * n) in.resize(kCap * n);
  auto in_mr = ctx.RegisterMemory(in.data(), kCap * n);
  if (!in_mr.ok()) return in_mr.status();
  auto out_mr = ctx.RegisterMemory(outbox.data(), outbox.size());
  if (!out_mr.ok()) return out_mr.status();
  std::vector<transport::Request> sends(n), recvs(n);
  const transport::MessageTag tag{mine.seq, transport::kControlSlot, 0, 0};
  for (int p = 0; p < n; ++p) {
    if (p == me) continue;
    absl::Status s = ctx.PostRecv(p, **in_mr, kCap * p, kCap, /*exact=*/false, tag, &recvs[p]);
    if (!s.ok()) return s;
  }
  for (int p = 0; p < n; ++p) {
    if (p == me) continue;
    absl::Status s = ctx.PostSend(p, **out_mr, 0, outbox.size(), tag, &sends[p]);
    if (!s.ok()) return s;
  }
  auto all_done = [&] {
    for (int p = 0; p < n; ++p) {
      if (p != me && (!sends[p].done || !recvs[p].done)) return false;
    }
    return true;
  };
  std::vector<bool> reported(n, false);
  auto report = [&] {
    if (!on_arrival) return;
    for (int p = 0; p < n; ++p) {
      if (p != me && recvs[p].done && !reported[p]) {
        reported[p] = true;
        on_arrival(p);
      }
    }
  };
  report();
  while (!all_done()) {
    absl::Status s = ctx.Progress(deadline);
    report();
    if (absl::IsDeadlineExceeded(s)) {
      std::vector<int> missing;
      for (int p = 0; p < n; ++p) {
        if (p != me && !recvs[p].done) missing.push_back(p);
      }
      return absl::DeadlineExceededError(absl::StrCat(
          "timed out at rank ", me, " waiting for rank(s) ", absl::StrJoin(missing, ","),
          " to submit op ", mine.seq, " (", mine.Describe(), ")"));
    }
    if (!s.ok()) return s;
  }
  std::vector<std::string> by_rank(n);
  std::vector<size_t> data_len(n, 0), data_at(n, 0);
  for (int p = 0; p < n; ++p) {
    if (p == me) {
      by_rank[p] = outbox.substr(0, sig_len);
      continue;
    }
    const char* msg = in.data() + kCap * p;
    const size_t len = EncodedLength(msg, recvs[p].bytes);
    by_rank[p] = std::string(msg, len);
    data_at[p] = recvs[p].bytes > len ? AlignUp(len) : len;
    data_len[p] = recvs[p].bytes > data_at[p] ? recvs[p].bytes - data_at[p] : 0;
  }
  absl::Status s = CompareSignatures(mine.seq, by_rank);
  if (!s.ok()) return s;
  // Equal signatures: every rank decided the same way whether data rides
  // along, unless the ranks disagree on something outside the signature
  // (their link figures, or mixed daemon versions). Every message was read
  // whole, so the streams are intact: a clean error, and the job goes on.
  const size_t want = eager != nullptr ? eager->bytes : 0;
  for (int p = 0; p < n; ++p) {
    if (p == me) continue;
    if (data_len[p] != want) {
      return absl::InvalidArgumentError(absl::StrCat(
          "op ", mine.seq, " (", mine.Describe(), "): rank ", p, " sent ", data_len[p],
          " bytes of data with its signature; rank ", me, " expected ", want,
          " (the ranks disagree on whether the op runs oneshot)"));
    }
    if (eager != nullptr) eager->received[p] = in.data() + kCap * p + data_at[p];
  }
  if (agreed != nullptr) *agreed = SignatureProposal(by_rank[0]);
  return absl::OkStatus();
}

absl::Status CompareSignatures(uint64_t seq, const std::vector<std::string>& encoded_by_rank) {
  // Group ranks by signature; every rank computes the same message.
  std::map<std::string, std::vector<int>> groups;
  for (int p = 0; p < static_cast<int>(encoded_by_rank.size()); ++p) {
    std::string key = encoded_by_rank[p];
    if (key.size() > kProposalOffset) key[kProposalOffset] = 0;  // proposals may differ
    groups[key].push_back(p);
  }
  if (groups.size() <= 1) return absl::OkStatus();
  std::vector<std::pair<std::string, std::vector<int>>> ordered(groups.begin(), groups.end());
  std::stable_sort(ordered.begin(), ordered.end(), [](const auto& a, const auto& b) {
    if (a.second.size() != b.second.size()) return a.second.size() < b.second.size();
    return a.second.front() < b.second.front();
  });
  std::vector<std::string> parts;
  for (const auto& [sig, ranks] : ordered) {
    auto decoded = OpSignature::Decode(sig);
    parts.push_back(absl::StrCat(ranks.size() == 1 ? "rank " : "ranks ", absl::StrJoin(ranks, ","),
                                 " submitted ",
                                 decoded.ok() ? decoded->Describe() : "a malformed signature"));
  }
  return absl::InvalidArgumentError(absl::StrCat("op ", seq, " does not match across ranks: ",
                                                 absl::StrJoin(parts, ", ")));
}

}  // namespace gradsync
