#include "collective/op_signature.h"

#include <cstddef>
#include <cstring>
#include <algorithm>
#include <map>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "collective/codec_request.h"
#include "collective/planner.h"

namespace gradsync {

OpSignature OpSignature::Of(const OpDesc& op, uint8_t plan_code, uint8_t codecs,
                            uint64_t sparse) {
  OpSignature sig;
  sig.kind = op.kind;
  sig.dtype = op.dtype;
  sig.op = op.op;
  sig.count = op.count;
  sig.root = IsRootedCollective(op.kind) || IsPointToPoint(op.kind) ? op.root : 0;
  sig.tag = IsPointToPoint(op.kind) ? op.tag : 0;
  sig.name.assign(op.name.data(), op.name.size());
  sig.forced = plan_code;
  sig.codecs = codecs;
  sig.sparse = sparse;
  return sig;
}

std::string OpSignature::Describe() const {
  std::string out = absl::StrCat(CollectiveName(kind), " '", name, "'");
  if (kind != CollectiveKind::kBarrier) {
    absl::StrAppend(&out, " ", DTypeName(dtype), "[", count, "]");
  }
  if (IsReducingCollective(kind)) absl::StrAppend(&out, " ", ReduceOpName(op));
  if (IsRootedCollective(kind)) absl::StrAppend(&out, " root ", root);
  if (kind == CollectiveKind::kSend) absl::StrAppend(&out, " to rank ", root, " tag ", tag);
  if (kind == CollectiveKind::kRecv) {
    absl::StrAppend(&out, " from ", root < 0 ? "any rank" : absl::StrCat("rank ", root), " tag ",
                    tag);
  }
  if (forced != kNoAlgorithm) absl::StrAppend(&out, " algo ", PlanCodeName(forced));
  if (codecs != 0 || sparse != 0) {
    absl::StrAppend(&out, " codec ", CodecRequest::FromCodes(codecs, sparse).ToString());
  }
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
  uint8_t streams;   // not compared either
  uint8_t codec;     // nor this
  uint8_t codecs;    // compared
  uint64_t sparse;   // compared
};
constexpr size_t kProposalOffset = offsetof(PackedSignature, proposal);
constexpr size_t kStreamsOffset = offsetof(PackedSignature, streams);
constexpr size_t kCodecOffset = offsetof(PackedSignature, codec);
static_assert(kStreamsOffset == kProposalOffset + 1 && kCodecOffset == kProposalOffset + 2,
              "the uncompared bytes are adjacent");
constexpr size_t kUncompared = 3;  // bytes from kProposalOffset
static_assert(sizeof(PackedSignature) == 40, "packed signature layout");
}  // namespace

std::string OpSignature::Encode() const {
  std::string out;
  EncodeTo(&out);
  return out;
}

void OpSignature::EncodeTo(std::string* out) const {
  PackedSignature p{seq,
                    count,
                    static_cast<uint8_t>(kind),
                    static_cast<uint8_t>(dtype),
                    static_cast<uint8_t>(op),
                    forced,
                    static_cast<uint32_t>(name.size()),
                    root,
                    proposal,
                    streams,
                    codec,
                    codecs,
                    sparse};
  out->resize(sizeof(p) + name.size());
  std::memcpy(out->data(), &p, sizeof(p));
  std::memcpy(out->data() + sizeof(p), name.data(), name.size());
}

absl::StatusOr<OpSignature> OpSignature::Decode(const std::string& bytes) {
  PackedSignature p;
  if (bytes.size() < sizeof(p)) return absl::DataLossError("short op signature");
  std::memcpy(&p, bytes.data(), sizeof(p));
  if (p.name_len > kMaxOpNameBytes || bytes.size() != sizeof(p) + p.name_len ||
      !IsValidDType(p.dtype) || !IsValidReduceOp(p.op) || !IsValidCollective(p.kind) ||
      IsPointToPoint(static_cast<CollectiveKind>(p.kind))) {
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
  s.streams = p.streams;
  s.codec = p.codec;
  s.codecs = p.codecs;
  s.sparse = p.sparse;
  s.name = bytes.substr(sizeof(p));
  return s;
}

bool OpSignature::operator==(const OpSignature& o) const {
  return seq == o.seq && kind == o.kind && dtype == o.dtype && op == o.op && count == o.count &&
         root == o.root && name == o.name && forced == o.forced && codecs == o.codecs &&
         sparse == o.sparse;
}

uint8_t SignatureProposal(absl::string_view encoded) {
  if (encoded.size() < sizeof(PackedSignature)) return OpSignature::kNoAlgorithm;
  return static_cast<uint8_t>(encoded[kProposalOffset]);
}

uint8_t SignatureCodec(absl::string_view encoded) {
  if (encoded.size() < sizeof(PackedSignature)) return 0;
  return static_cast<uint8_t>(encoded[kCodecOffset]);
}

uint8_t SignatureStreams(absl::string_view encoded) {
  if (encoded.size() < sizeof(PackedSignature)) return 0;
  return static_cast<uint8_t>(encoded[kStreamsOffset]);
}

static_assert(kMaxEncodedSignatureBytes == sizeof(PackedSignature) + kMaxOpNameBytes,
              "kMaxEncodedSignatureBytes");

size_t EncodedSignatureLength(const char* msg, size_t len) {
  if (len < sizeof(PackedSignature)) return len;
  PackedSignature p;
  std::memcpy(&p, msg, sizeof(p));
  if (p.name_len > kMaxOpNameBytes || sizeof(p) + p.name_len > len) return len;
  return sizeof(p) + p.name_len;
}

bool SameSignature(absl::string_view a, absl::string_view b) {
  if (a.size() != b.size()) return false;
  if (a.size() < kProposalOffset + kUncompared) return a == b;
  constexpr size_t kAfter = kProposalOffset + kUncompared;
  return std::memcmp(a.data(), b.data(), kProposalOffset) == 0 &&
         std::memcmp(a.data() + kAfter, b.data() + kAfter, a.size() - kAfter) == 0;
}

absl::Status CompareSignatures(uint64_t seq, const std::vector<std::string>& encoded_by_rank) {
  // Group ranks by signature; every rank computes the same message.
  std::map<std::string, std::vector<int>> groups;
  for (int p = 0; p < static_cast<int>(encoded_by_rank.size()); ++p) {
    std::string key = encoded_by_rank[p];
    for (size_t i = kProposalOffset; i < kProposalOffset + kUncompared && i < key.size(); ++i) {
      key[i] = 0;  // proposals may differ
    }
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
