// TcpContext's connection set-up: the full mesh of a job epoch's ranks
// (Connect) and a client's connections to a set of servers (ConnectToServers).
#include <errno.h>
#include <sys/eventfd.h>

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "common/logging.h"
#include "common/status_macros.h"
#include "transport/tcp_context.h"

namespace gradsync::transport {

absl::StatusOr<std::unique_ptr<TcpContext>> TcpContext::Create(const TcpContextOptions& options,
                                                               int peers, int self) {
  std::unique_ptr<TcpContext> ctx(new TcpContext(options, peers, self));
  ctx->wake_fd_.Reset(::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC));
  if (!ctx->wake_fd_.valid()) return absl::InternalError("eventfd: " + ErrnoString(errno));
  return ctx;
}

absl::StatusOr<std::unique_ptr<TcpContext>> TcpContext::Connect(const TcpContextOptions& options,
                                                                TcpListener* listener) {
  if (options.world_size < 1 || options.rank < 0 || options.rank >= options.world_size ||
      static_cast<int>(options.peers.size()) != options.world_size) {
    return absl::InvalidArgumentError(absl::StrCat("bad context: rank ", options.rank, " of ",
                                                   options.world_size, " with ",
                                                   options.peers.size(), " peer addresses"));
  }
  ASSIGN_OR_RETURN(std::unique_ptr<TcpContext> ctx,
                   Create(options, options.world_size, options.rank));
  const int me = options.rank;
  const absl::Time deadline = options.deadline;
  auto peer_error = [&](int p, const absl::Status& s) {
    return absl::Status(s.code(), absl::StrCat("job '", options.job_id, "' epoch ", options.epoch,
                                               ": rank ", me, " could not connect to rank ", p,
                                               " at ", options.peers[p].ToString(), ": ",
                                               s.message()));
  };
  // Phase 1: connect to every higher rank and send our Hello and nonce.
  const int S = ctx->streams_;
  const size_t n = ctx->peers_.size();
  std::vector<Hello> hellos(n);  // the Hello of each connection, as sent or received
  std::vector<std::string> nonces(n);  // this side's nonce of each connection
  for (int p = me + 1; p < options.world_size; ++p) {
    for (int st = 0; st < S; ++st) {
      auto fd = TcpConnect(options.peers[p], deadline, /*retry_refused=*/true);
      if (!fd.ok()) return peer_error(p, fd.status());
      const size_t c = p * S + st;
      hellos[c] = Hello{kHelloMagic, kWireVersion, static_cast<uint16_t>(options.job_id.size()),
                        options.epoch, me, p, options.world_size, static_cast<uint32_t>(st)};
      nonces[c] = RandomNonce();
      absl::Status s = WriteFull(fd->get(), &hellos[c], sizeof(Hello), deadline);
      if (s.ok()) s = WriteFull(fd->get(), options.job_id.data(), options.job_id.size(), deadline);
      if (s.ok()) s = WriteFull(fd->get(), nonces[c].data(), kNonceBytes, deadline);
      if (!s.ok()) return peer_error(p, s);
      ctx->peers_[c].fd = std::move(*fd);
    }
  }
  // Phase 2: take the connections of every lower rank and answer each with
  // our nonce and our proof of the job key.
  std::vector<std::string> peer_nonces(n);  // the connector's nonce of each accepted connection
  // OK(true): claimed and answered; OK(false): the connection failed while
  // answering (its connector went away: another may be waiting); an error:
  // no connection came (the deadline) or there is no listener.
  auto accept = [&](int p, int st) -> absl::StatusOr<bool> {
    if (listener == nullptr) return absl::FailedPreconditionError("no data-plane listener");
    ASSIGN_OR_RETURN(UniqueFd fd, listener->Claim(options.job_id, options.epoch, p, me, st,
                                                  deadline));
    const size_t c = p * S + st;
    hellos[c] = Hello{kHelloMagic, kWireVersion, static_cast<uint16_t>(options.job_id.size()),
                      options.epoch, p, me, options.world_size, static_cast<uint32_t>(st)};
    peer_nonces[c].assign(kNonceBytes, '\0');
    absl::Status s = ReadFull(fd.get(), peer_nonces[c].data(), kNonceBytes, deadline);
    nonces[c] = RandomNonce();
    const std::string proof = HandshakeProof(options.job_key, HandshakeRole::kAcceptor, hellos[c],
                                             options.job_id, peer_nonces[c], nonces[c]);
    HelloAck ack{kHelloMagic, 0, 0};
    if (s.ok()) s = WriteFull(fd.get(), &ack, sizeof(ack), deadline);
    if (s.ok()) s = WriteFull(fd.get(), nonces[c].data(), kNonceBytes, deadline);
    if (s.ok()) s = WriteFull(fd.get(), proof.data(), proof.size(), deadline);
    if (absl::IsDeadlineExceeded(s)) return s;
    ctx->peers_[c].fd = std::move(fd);
    return s.ok();
  };
  auto refused = [&](int p, const char* reason) {
    if (options.on_auth_failure) options.on_auth_failure(reason);
    GS_LOG(WARNING) << "job '" << options.job_id << "' epoch " << options.epoch << ": rank " << me
                    << " closed a connection claiming to be rank " << p << " (" << reason
                    << "); waiting for another";
  };
  // Accepts (p, st) until a connection is answered.
  auto accept_one = [&](int p, int st) -> absl::Status {
    while (true) {
      ASSIGN_OR_RETURN(const bool answered, accept(p, st));
      if (answered) return absl::OkStatus();
      refused(p, "no_proof");
    }
  };
  for (int p = 0; p < me; ++p) {
    for (int st = 0; st < S; ++st) {
      if (absl::Status s = accept_one(p, st); !s.ok()) return s;
    }
  }
  // Phase 3: every higher rank accepted us and proved the job key; we prove it back.
  for (int p = me + 1; p < options.world_size; ++p) {
    for (int st = 0; st < S; ++st) {
      const size_t c = p * S + st;
      const int fd = ctx->peers_[c].fd.get();
      absl::Status s = ReadHelloAck(fd, deadline);
      std::string peer_nonce(kNonceBytes, '\0'), proof(kProofBytes, '\0');
      if (s.ok()) s = ReadFull(fd, peer_nonce.data(), kNonceBytes, deadline);
      if (s.ok()) s = ReadFull(fd, proof.data(), kProofBytes, deadline);
      if (!s.ok()) return peer_error(p, s);
      if (!ProofsEqual(proof, HandshakeProof(options.job_key, HandshakeRole::kAcceptor, hellos[c],
                                             options.job_id, nonces[c], peer_nonce))) {
        if (options.on_auth_failure) options.on_auth_failure("bad_proof");
        return peer_error(p, absl::UnauthenticatedError(
                                 "it did not prove the job's key (a daemon of another job or "
                                 "epoch, or not a daemon of this cluster)"));
      }
      const std::string mine = HandshakeProof(options.job_key, HandshakeRole::kConnector,
                                              hellos[c], options.job_id, peer_nonce, nonces[c]);
      s = WriteFull(fd, mine.data(), mine.size(), deadline);
      if (!s.ok()) return peer_error(p, s);
    }
  }
  // Phase 4: every lower rank proved the job key. A connection that does not
  // is closed and the next one with the same Hello is taken (a forger who
  // connected first does not keep the real peer out).
  for (int p = 0; p < me; ++p) {
    for (int st = 0; st < S; ++st) {
      const size_t c = p * S + st;
      std::string proof(kProofBytes, '\0');
      absl::Status s = ReadFull(ctx->peers_[c].fd.get(), proof.data(), kProofBytes, deadline);
      if (s.ok() && ProofsEqual(proof, HandshakeProof(options.job_key, HandshakeRole::kConnector,
                                                      hellos[c], options.job_id, nonces[c],
                                                      peer_nonces[c]))) {
        continue;
      }
      if (absl::IsDeadlineExceeded(s)) return peer_error(p, s);
      refused(p, s.ok() ? "bad_proof" : "no_proof");
      ctx->peers_[c].fd.Reset();
      if (s = accept_one(p, st); !s.ok()) return peer_error(p, s);
      --st;  // read this connection's proof
    }
  }
  for (Peer& c : ctx->peers_) {
    if (c.rank == me) continue;
    absl::Status s = TuneDataSocket(c.fd.get(), options.socket_buffer_bytes);
    if (!s.ok()) return s;
  }
  // Phase 5 (data TLS): every connection's TLS handshake, bound to the job key.
  if (options.tls != nullptr) RETURN_IF_ERROR(ctx->SecurePeers(options));
  return ctx;
}

absl::StatusOr<std::unique_ptr<TcpContext>> TcpContext::ConnectToServers(
    const TcpContextOptions& options) {
  const int servers = static_cast<int>(options.peers.size());
  if (servers < 1 || options.world_size < 1 || options.rank < 0 ||
      options.rank >= options.world_size) {
    return absl::InvalidArgumentError(absl::StrCat("bad client context: rank ", options.rank,
                                                   " of ", options.world_size, " clients, ",
                                                   servers, " servers"));
  }
  TcpContextOptions o = options;
  o.streams = 1;
  if (o.self_name.empty()) o.self_name = absl::StrCat("client rank ", options.rank);
  o.peer_names.resize(servers);
  for (int k = 0; k < servers; ++k) {
    if (o.peer_names[k].empty()) {
      o.peer_names[k] = absl::StrCat("server ", k, " (", options.peers[k].ToString(), ")");
    }
  }
  ASSIGN_OR_RETURN(std::unique_ptr<TcpContext> ctx, Create(o, servers, /*self=*/-1));
  const absl::Time deadline = options.deadline;
  auto server_error = [&](int k, const absl::Status& s) {
    return absl::Status(s.code(),
                        absl::StrCat(ctx->PeerName(k), ": cannot connect: ", s.message()));
  };
  // Every Hello (and nonce) first, then every HelloAck and proof: the
  // servers answer in parallel. Server k proves server_keys[k] (the key the
  // coordinator gave it for this job) before this side proves it back.
  std::vector<Hello> hellos(servers);
  std::vector<std::string> nonces(servers);
  for (int k = 0; k < servers; ++k) {
    auto fd = TcpConnect(options.peers[k], deadline);
    if (!fd.ok()) return server_error(k, fd.status());
    hellos[k] = Hello{kHelloMagic, kWireVersion, static_cast<uint16_t>(options.job_id.size()),
                      options.epoch, options.rank, k, options.world_size, options.hello_stream};
    nonces[k] = RandomNonce();
    absl::Status s = WriteFull(fd->get(), &hellos[k], sizeof(Hello), deadline);
    if (s.ok()) s = WriteFull(fd->get(), options.job_id.data(), options.job_id.size(), deadline);
    if (s.ok()) s = WriteFull(fd->get(), nonces[k].data(), kNonceBytes, deadline);
    if (!s.ok()) return server_error(k, s);
    ctx->peers_[k].fd = std::move(*fd);
  }
  for (int k = 0; k < servers; ++k) {
    const int fd = ctx->peers_[k].fd.get();
    const std::string key =
        k < static_cast<int>(options.server_keys.size()) ? options.server_keys[k] : "";
    absl::Status s = ReadHelloAck(fd, deadline);
    std::string server_nonce(kNonceBytes, '\0'), proof(kProofBytes, '\0');
    if (s.ok()) s = ReadFull(fd, server_nonce.data(), kNonceBytes, deadline);
    if (s.ok()) s = ReadFull(fd, proof.data(), kProofBytes, deadline);
    if (s.ok() && !ProofsEqual(proof, HandshakeProof(key, HandshakeRole::kAcceptor, hellos[k],
                                                     options.job_id, nonces[k], server_nonce))) {
      if (options.on_auth_failure) options.on_auth_failure("bad_proof");
      s = absl::UnauthenticatedError(
          "the server did not prove the job's key (not the job's shard, or a forgery)");
    }
    if (s.ok()) {
      const std::string mine = HandshakeProof(key, HandshakeRole::kConnector, hellos[k],
                                              options.job_id, server_nonce, nonces[k]);
      s = WriteFull(fd, mine.data(), mine.size(), deadline);
    }
    if (s.ok()) s = ReadHelloAck(fd, deadline);  // the server admits the proven client
    if (s.ok()) s = TuneDataSocket(fd, options.socket_buffer_bytes);
    if (!s.ok()) return server_error(k, s);
  }
  if (options.tls != nullptr) RETURN_IF_ERROR(ctx->SecurePeers(options));
  return ctx;
}

absl::StatusOr<std::unique_ptr<TcpContext>> TcpContext::Adopt(UniqueFd fd,
                                                              const TcpContextOptions& options) {
  TcpContextOptions o = options;
  o.streams = 1;
  o.server = true;
  o.world_size = 1;
  if (o.peer_names.empty()) o.peer_names = {"client"};
  if (o.self_name.empty()) o.self_name = "server";
  ASSIGN_OR_RETURN(std::unique_ptr<TcpContext> ctx, Create(o, 1, /*self=*/-1));
  RETURN_IF_ERROR(TuneDataSocket(fd.get(), options.socket_buffer_bytes));
  ctx->peers_[0].fd = std::move(fd);
  if (options.tls != nullptr) RETURN_IF_ERROR(ctx->SecurePeers(o));
  return ctx;
}

}  // namespace gradsync::transport
