// Data-plane wire format between daemons (TCP). All integers little-endian
// (static_assert'ed host order; gradsync targets x86-64 and aarch64 LE).
//
// A connection starts with a handshake:
//   connector -> acceptor : Hello   (fixed 32 bytes) + job_id bytes
//   acceptor  -> connector: HelloAck (fixed 8 bytes)  + message bytes
// Between the daemons of a job (TcpContext::Connect) both sides then prove
// that they hold the job's key, over fresh nonces from each side:
//   connector -> acceptor : Nc (16 bytes, sent right after the job id)
//   acceptor  -> connector: HelloAck + Na (16 bytes) + HandshakeMac(accept, Nc, Na)
//   connector -> acceptor : HandshakeMac(connect, Na, Nc)
// and neither side takes a frame before the other's proof checked out. A PS
// worker and a shard (TcpContext::ConnectToServers, ps/shard_handshake.h)
// run the same exchange with the job's shard key, and the shard then admits
// or refuses the proven worker:
//   acceptor  -> connector: HelloAck (admission: OK, or the refusal's code and message)
// so nothing about a job is created or revealed to a peer that did not
// prove the key. Then
// both sides exchange frames:
//   FrameHeader (48 bytes) + `length` payload bytes
// A DATA frame carries part of an op's buffer: (job, epoch, op sequence,
// slot = message index within the op, byte offset, length, dtype). An ABORT
// frame carries a UTF-8 reason (at most kMaxAbortBytes); the receiver fails
// its op and job with that reason. Anything else is a protocol error that
// closes the connection.
#ifndef GRADSYNC_TRANSPORT_WIRE_H_
#define GRADSYNC_TRANSPORT_WIRE_H_

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "transport/transport.h"

namespace gradsync::transport {

static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__, "wire format assumes little-endian");

inline constexpr uint32_t kHelloMagic = 0x4C454853;  // "SHEL"
inline constexpr uint32_t kFrameMagic = 0x4E595347;  // "GSYN"
// 2: from 4 ranks on, every op's signature round goes by recursive doubling
// (collective/op_signature.h), not all-to-all; daemons of different versions
// refuse each other at the handshake instead of falling out of step.
// 3: the daemons of a job prove the job key at the handshake.
// 4: a PS shard admits a worker (a second HelloAck) only after the proofs.
inline constexpr uint16_t kWireVersion = 4;
// A tenant's job "TENANT/JOB" (32 + 1 + 128), with room for "ps/" in front.
inline constexpr size_t kMaxJobIdBytes = 192;
inline constexpr int kMaxWorldSize = 4096;
inline constexpr uint32_t kMaxAbortBytes = 4096;
// A frame carries one message (transport.h: kMaxMessageBytes, kControlSlot).
inline constexpr uint32_t kMaxFrameBytes = kMaxMessageBytes;

struct Hello {
  uint32_t magic;
  uint16_t version;
  uint16_t job_id_len;
  uint64_t epoch;
  int32_t src_rank;  // the connector
  int32_t dst_rank;  // the acceptor
  int32_t world_size;
  uint32_t stream;  // stream index within the pair (multi-stream TCP)
};
static_assert(sizeof(Hello) == 32, "Hello is 32 bytes on the wire");

// Hello.stream of a client's connection to a server (ServerSetSpec) that
// bootstraps RDMA: the server answers on an RDMA context (the Hello is
// covered by the handshake's proof, so nobody on the path can change it).
inline constexpr uint32_t kRdmaBootstrapStream = 0x80000000u;

struct HelloAck {
  uint32_t magic;
  uint16_t code;  // absl::StatusCode; 0 = accepted
  uint16_t message_len;
};
static_assert(sizeof(HelloAck) == 8, "HelloAck is 8 bytes on the wire");

enum class FrameType : uint8_t { kData = 1, kAbort = 2 };

struct FrameHeader {
  uint32_t magic;
  uint16_t version;
  uint8_t type;   // FrameType
  uint8_t dtype;  // gradsync::DType of the payload, 0 for control
  uint32_t length;
  uint32_t slot;
  uint64_t job_tag;  // JobTag(job_id): catches cross-job mix-ups
  uint64_t epoch;
  uint64_t op_seq;
  uint64_t offset;  // byte offset of the payload within the op's buffer
};
static_assert(sizeof(FrameHeader) == 48, "FrameHeader is 48 bytes on the wire");

// The handshake's nonces and proofs.
inline constexpr size_t kNonceBytes = 16;
inline constexpr size_t kProofBytes = 32;
enum class HandshakeRole { kAcceptor, kConnector };
// HMAC-SHA256 under `key` of the role, the Hello, the job id and the two
// nonces (the prover's peer's first): binds the proof to this connection's
// identity and to both sides' fresh nonces, so it cannot be replayed.
std::string HandshakeProof(absl::string_view key, HandshakeRole role, const Hello& hello,
                           absl::string_view job_id, absl::string_view peer_nonce,
                           absl::string_view own_nonce);
// Compares proofs in time independent of their contents.
bool ProofsEqual(absl::string_view a, absl::string_view b);
// kNonceBytes random bytes (getrandom).
std::string RandomNonce();

// Reads a HelloAck within the deadline: OK, or the acceptor's refusal with
// its code and "refused: <message>"; DataLoss for a reply that is no HelloAck.
absl::Status ReadHelloAck(int fd, absl::Time deadline);
// Writes a HelloAck for `verdict` (OK: accepted; else its code and at most
// 1,024 bytes of its message).
absl::Status WriteHelloAck(int fd, const absl::Status& verdict, absl::Time deadline);

// 64-bit FNV-1a of the job id.
uint64_t JobTag(absl::string_view job_id);

// Validates a received Hello (and its job id), naming the problem.
absl::Status ValidateHello(const Hello& h);
// Validates magic/version/type/length bounds of a received header.
absl::Status ValidateFrameHeader(const FrameHeader& h);
std::string DescribeFrame(const FrameHeader& h);

}  // namespace gradsync::transport

#endif  // GRADSYNC_TRANSPORT_WIRE_H_
