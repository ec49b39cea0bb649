#include "collective/codec_request.h"

#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"

namespace gradsync {

namespace {
constexpr uint8_t kCodecBits = 0x3e;  // CodecId 1..5
constexpr uint8_t kLenientBit = 0x40;
constexpr uint8_t kAutoBit = 0x80;
constexpr uint8_t Bit(CodecId id) { return static_cast<uint8_t>(1u << static_cast<int>(id)); }
}  // namespace

CodecId CodecRequest::only() const {
  for (CodecId id : kAllCodecs) {
    if (id != CodecId::kNone && allows(id)) return id;
  }
  return CodecId::kNone;
}

uint8_t CodecRequest::Code() const {
  return static_cast<uint8_t>((allowed & kCodecBits) | (lenient ? kLenientBit : 0) |
                              (automatic ? kAutoBit : 0));
}

CodecRequest CodecRequest::FromCode(uint8_t code) {
  CodecRequest r;
  r.allowed = code & kCodecBits;
  r.lenient = (code & kLenientBit) != 0;
  r.automatic = (code & kAutoBit) != 0;
  return r;
}

CodecRequest CodecRequest::FromCodes(uint8_t code, uint64_t sparse) {
  CodecRequest r = FromCode(code);
  r.topk = SparseSpec::FromCode(sparse);
  return r;
}

std::string CodecRequest::ToString() const {
  if (topk.on()) return absl::StrCat(topk.ToString(), lenient ? " (job)" : "");
  std::vector<std::string> names;
  for (CodecId id : kAllCodecs) {
    if (id != CodecId::kNone && allows(id)) names.push_back(CodecName(id));
  }
  if (automatic) return absl::StrCat("auto:", absl::StrJoin(names, ","));
  if (names.empty()) return "none";
  return absl::StrCat(names[0], lenient ? " (job)" : "");
}

absl::StatusOr<CodecRequest> ParseCodecRequest(absl::string_view text, bool job) {
  CodecRequest r;
  const std::string lower = absl::AsciiStrToLower(absl::StripAsciiWhitespace(text));
  absl::string_view rest = lower;
  if (rest.empty() || rest == "none") return r;
  if (rest == "auto") {
    r.automatic = r.lenient = true;
    r.allowed = Bit(CodecId::kBf16) | Bit(CodecId::kFp16) | Bit(CodecId::kInt8);
    return r;
  }
  if (absl::ConsumePrefix(&rest, "topk:")) {
    absl::StatusOr<SparseSpec> spec = ParseSparseSpec(rest);
    if (!spec.ok()) return spec.status();
    r.topk = *spec;
    r.lenient = job;
    return r;
  }
  if (absl::ConsumePrefix(&rest, "auto:")) {
    r.automatic = r.lenient = true;
    for (absl::string_view name : absl::StrSplit(rest, ',')) {
      if (absl::StartsWith(absl::StripAsciiWhitespace(name), "topk")) {
        return absl::InvalidArgumentError(
            "codec 'topk' is named on its own ('topk:0.01'), never chosen by 'auto'");
      }
      absl::StatusOr<CodecId> id = ParseCodec(absl::StripAsciiWhitespace(name));
      if (!id.ok()) return id.status();
      if (*id != CodecId::kNone) r.allowed |= Bit(*id);
    }
    return r;
  }
  absl::StatusOr<CodecId> id = ParseCodec(rest);
  if (!id.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat(id.status().message(),
                     "; or 'auto', or 'auto:' and a list of codecs, or 'topk:RATIO'"));
  }
  if (*id != CodecId::kNone) r.allowed = Bit(*id);
  r.lenient = job;
  return r;
}

absl::StatusOr<CodecRequest> EffectiveCodecRequest(absl::string_view op_codec,
                                                   absl::string_view job_codec) {
  if (!op_codec.empty()) return ParseCodecRequest(op_codec, /*job=*/false);
  return ParseCodecRequest(job_codec, /*job=*/true);
}

}  // namespace gradsync
