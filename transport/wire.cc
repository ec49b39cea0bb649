#include "transport/wire.h"

#include <openssl/crypto.h>
#include <algorithm>
#include <sys/random.h>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/digest.h"
#include "common/net.h"
#include "common/status_macros.h"

namespace gradsync::transport {

absl::Status ReadHelloAck(int fd, absl::Time deadline) {
  HelloAck ack;
  RETURN_IF_ERROR(ReadFull(fd, &ack, sizeof(ack), deadline));
  if (ack.magic != kHelloMagic) return absl::DataLossError("bad handshake reply");
  if (ack.code == 0) return absl::OkStatus();
  std::string msg(std::min<size_t>(ack.message_len, 1024), '\0');
  (void)ReadFull(fd, msg.data(), msg.size(), deadline);
  const absl::StatusCode code = ack.code <= static_cast<uint16_t>(absl::StatusCode::kUnauthenticated)
                                    ? static_cast<absl::StatusCode>(ack.code)
                                    : absl::StatusCode::kUnknown;
  return absl::Status(code, "refused: " + msg);
}

absl::Status WriteHelloAck(int fd, const absl::Status& verdict, absl::Time deadline) {
  const std::string msg(verdict.message().substr(0, 1024));
  const HelloAck ack{kHelloMagic, static_cast<uint16_t>(verdict.code()),
                     static_cast<uint16_t>(msg.size())};
  RETURN_IF_ERROR(WriteFull(fd, &ack, sizeof(ack), deadline));
  return WriteFull(fd, msg.data(), msg.size(), deadline);
}

uint64_t JobTag(absl::string_view job_id) {
  uint64_t h = 1469598103934665603ull;
  for (unsigned char c : job_id) {
    h ^= c;
    h *= 1099511628211ull;
  }
  return h;
}

std::string HandshakeProof(absl::string_view key, HandshakeRole role, const Hello& hello,
                           absl::string_view job_id, absl::string_view peer_nonce,
                           absl::string_view own_nonce) {
  std::string msg = role == HandshakeRole::kAcceptor ? "gradsync-accept" : "gradsync-connect";
  msg.append(reinterpret_cast<const char*>(&hello), sizeof(hello));
  msg.append(job_id.data(), job_id.size());
  msg.append(peer_nonce.data(), peer_nonce.size());
  msg.append(own_nonce.data(), own_nonce.size());
  // An empty key (tests, contexts built without one) still gives a proof;
  // it proves nothing a peer could not compute.
  return HmacSha256(key, msg);
}

bool ProofsEqual(absl::string_view a, absl::string_view b) {
  return a.size() == b.size() && CRYPTO_memcmp(a.data(), b.data(), a.size()) == 0;
}

std::string RandomNonce() {
  std::string out(kNonceBytes, '\0');
  size_t got = 0;
  while (got < out.size()) {
    const ssize_t r = ::getrandom(out.data() + got, out.size() - got, 0);
    if (r > 0) got += static_cast<size_t>(r);
  }
  return out;
}

absl::Status ValidateHello(const Hello& h) {
  if (h.magic != kHelloMagic) {
    return absl::InvalidArgumentError(
        absl::StrFormat("bad handshake magic 0x%08x (expected 0x%08x)", h.magic, kHelloMagic));
  }
  if (h.version != kWireVersion) {
    return absl::FailedPreconditionError(absl::StrCat("unsupported wire version ", h.version,
                                                      " (this daemon speaks ", kWireVersion, ")"));
  }
  if (h.job_id_len == 0 || h.job_id_len > kMaxJobIdBytes) {
    return absl::InvalidArgumentError(absl::StrCat("bad job id length ", h.job_id_len));
  }
  if (h.world_size < 1 || h.world_size > kMaxWorldSize) {
    return absl::InvalidArgumentError(absl::StrCat("bad world size ", h.world_size));
  }
  if (h.src_rank < 0 || h.src_rank >= h.world_size || h.dst_rank < 0 ||
      h.dst_rank >= h.world_size || h.src_rank == h.dst_rank) {
    return absl::InvalidArgumentError(absl::StrCat("bad ranks src=", h.src_rank, " dst=", h.dst_rank,
                                                   " for world size ", h.world_size));
  }
  return absl::OkStatus();
}

absl::Status ValidateFrameHeader(const FrameHeader& h) {
  if (h.magic != kFrameMagic) {
    return absl::DataLossError(
        absl::StrFormat("bad frame magic 0x%08x (expected 0x%08x)", h.magic, kFrameMagic));
  }
  if (h.version != kWireVersion) {
    return absl::DataLossError(absl::StrCat("bad frame version ", h.version));
  }
  if (h.type != static_cast<uint8_t>(FrameType::kData) &&
      h.type != static_cast<uint8_t>(FrameType::kAbort)) {
    return absl::DataLossError(absl::StrCat("bad frame type ", h.type));
  }
  if (h.type == static_cast<uint8_t>(FrameType::kAbort) && h.length > kMaxAbortBytes) {
    return absl::DataLossError(absl::StrCat("abort frame too long: ", h.length, " bytes"));
  }
  if (h.length > kMaxFrameBytes) {
    return absl::DataLossError(absl::StrCat("frame too long: ", h.length, " bytes"));
  }
  return absl::OkStatus();
}

std::string DescribeFrame(const FrameHeader& h) {
  return absl::StrFormat("{type=%d epoch=%d op=%d slot=%d offset=%d length=%d dtype=%d}", h.type,
                         h.epoch, h.op_seq, static_cast<int64_t>(h.slot == kControlSlot ? -1 : h.slot),
                         h.offset, h.length, h.dtype);
}

}  // namespace gradsync::transport
