// The connector's side of the data-plane handshake (wire.h) done by hand,
// for tests that drive a TcpContext's peer with a raw socket.
#ifndef GRADSYNC_TRANSPORT_HANDSHAKE_TESTING_H_
#define GRADSYNC_TRANSPORT_HANDSHAKE_TESTING_H_

#include <string>

#include "absl/status/status.h"
#include "absl/time/clock.h"
#include "common/net.h"
#include "transport/wire.h"

namespace gradsync::transport::testing {

// Sends the Hello of (job, epoch, src -> dst of world) and a nonce on `fd`;
// returns the nonce.
inline std::string SendHelloAndNonce(int fd, const std::string& job, uint64_t epoch, int src,
                                     int dst, int world, absl::Time deadline) {
  Hello h{kHelloMagic, kWireVersion, static_cast<uint16_t>(job.size()), epoch, src, dst, world, 0};
  const std::string nonce = RandomNonce();
  (void)WriteFull(fd, &h, sizeof(h), deadline);
  (void)WriteFull(fd, job.data(), job.size(), deadline);
  (void)WriteFull(fd, nonce.data(), nonce.size(), deadline);
  return nonce;
}

// Reads the acceptor's HelloAck, nonce and proof, checks the proof under
// `key` and answers with the connector's proof under `answer_key` (a wrong
// one to play a forger).
inline absl::Status FinishConnector(int fd, const std::string& job, uint64_t epoch, int src,
                                    int dst, int world, const std::string& nonce,
                                    const std::string& key, const std::string& answer_key,
                                    absl::Time deadline) {
  Hello h{kHelloMagic, kWireVersion, static_cast<uint16_t>(job.size()), epoch, src, dst, world, 0};
  HelloAck ack;
  std::string peer_nonce(kNonceBytes, '\0'), proof(kProofBytes, '\0');
  absl::Status s = ReadFull(fd, &ack, sizeof(ack), deadline);
  if (s.ok() && ack.code != 0) return absl::PermissionDeniedError("refused");
  if (s.ok()) s = ReadFull(fd, peer_nonce.data(), kNonceBytes, deadline);
  if (s.ok()) s = ReadFull(fd, proof.data(), kProofBytes, deadline);
  if (!s.ok()) return s;
  if (!ProofsEqual(proof, HandshakeProof(key, HandshakeRole::kAcceptor, h, job, nonce,
                                         peer_nonce))) {
    return absl::UnauthenticatedError("the acceptor's proof is wrong");
  }
  const std::string mine =
      HandshakeProof(answer_key, HandshakeRole::kConnector, h, job, peer_nonce, nonce);
  return WriteFull(fd, mine.data(), mine.size(), deadline);
}

}  // namespace gradsync::transport::testing

#endif  // GRADSYNC_TRANSPORT_HANDSHAKE_TESTING_H_
