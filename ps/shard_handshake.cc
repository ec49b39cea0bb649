#include "ps/shard_handshake.h"

#include "absl/time/clock.h"
#include "common/net.h"
#include "common/status_macros.h"
#include "transport/wire.h"

namespace gradsync::ps {

absl::StatusOr<ShardJobKey> ShardKeyCache::Get(const std::string& job_id, uint64_t epoch) {
  if (source_ == nullptr) return ShardJobKey{};
  const auto id = std::make_pair(job_id, epoch);
  {
    absl::MutexLock l(&mu_);
    auto it = keys_.find(id);
    if (it != keys_.end() && absl::Now() < it->second.second) return it->second.first;
  }
  absl::StatusOr<ShardJobKey> key = source_(job_id, epoch);
  if (!key.ok()) return key.status();
  absl::MutexLock l(&mu_);
  const absl::Time now = absl::Now();
  for (auto it = keys_.begin(); it != keys_.end();) {
    it = now >= it->second.second ? keys_.erase(it) : std::next(it);
  }
  if (keys_.size() >= kMaxEntries) keys_.erase(keys_.begin());
  keys_[id] = {*key, now + ttl_};
  return key;
}

absl::StatusOr<std::string> ReadWorkerNonce(const transport::RoutedConnection& rc,
                                            absl::Time deadline) {
  std::string nonce(transport::kNonceBytes, '\0');
  RETURN_IF_ERROR(ReadFull(rc.fd.get(), nonce.data(), nonce.size(), deadline));
  return nonce;
}

absl::Status ProveJobKey(const transport::RoutedConnection& rc, const std::string& key,
                         const std::string& worker_nonce, absl::Time deadline) {
  using transport::HandshakeProof;
  using transport::HandshakeRole;
  const std::string nonce = transport::RandomNonce();
  const transport::HelloAck ack{transport::kHelloMagic, 0, 0};
  const std::string proof =
      HandshakeProof(key, HandshakeRole::kAcceptor, rc.hello, rc.job_id, worker_nonce, nonce);
  RETURN_IF_ERROR(WriteFull(rc.fd.get(), &ack, sizeof(ack), deadline));
  RETURN_IF_ERROR(WriteFull(rc.fd.get(), nonce.data(), nonce.size(), deadline));
  RETURN_IF_ERROR(WriteFull(rc.fd.get(), proof.data(), proof.size(), deadline));
  std::string theirs(transport::kProofBytes, '\0');
  RETURN_IF_ERROR(ReadFull(rc.fd.get(), theirs.data(), theirs.size(), deadline));
  if (!transport::ProofsEqual(theirs, HandshakeProof(key, HandshakeRole::kConnector, rc.hello,
                                                     rc.job_id, nonce, worker_nonce))) {
    return absl::UnauthenticatedError("the worker did not prove the job's key");
  }
  return absl::OkStatus();
}

}  // namespace gradsync::ps
