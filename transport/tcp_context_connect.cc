// TcpContext's connection set-up: the full mesh of a job epoch's ranks
// (Connect) and a client's connections to a set of servers (ConnectToServers).
#include <errno.h>
#include <poll.h>
#include <sys/eventfd.h>

#include <algorithm>
#include <atomic>
#include <thread>

#include "absl/strings/str_cat.h"
#include "common/logging.h"
#include "common/process.h"
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
  const int S = ctx->streams_;
  // Set when either side failed: the other stops waiting.
  std::atomic<bool> failed{false};
  const absl::Status gave_up = absl::CancelledError("the other side of the set-up failed");

  // The connector's side, for every higher rank, on a thread of its own: it
  // connects and sends each Hello and nonce, then answers each acceptor's
  // proof with its own as soon as it arrives (in any order), so an acceptor
  // waiting for this rank's proof never waits on a third rank.
  auto connect_higher = [&]() -> absl::Status {
    std::vector<Hello> hellos(ctx->peers_.size());
    std::vector<std::string> nonces(ctx->peers_.size());
    std::vector<size_t> pending;
    for (int p = me + 1; p < options.world_size; ++p) {
      for (int st = 0; st < S; ++st) {
        if (failed) return gave_up;
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
        pending.push_back(c);
      }
    }
    std::vector<pollfd> fds;
    while (!pending.empty()) {
      if (failed) return gave_up;
      const absl::Time now = absl::Now();
      if (now >= deadline) {
        return peer_error(static_cast<int>(pending[0] / S),
                          absl::DeadlineExceededError("it did not answer the handshake"));
      }
      fds.clear();
      for (size_t c : pending) fds.push_back(pollfd{ctx->peers_[c].fd.get(), POLLIN, 0});
      const int wait_ms = static_cast<int>(
          std::min<int64_t>(100, absl::ToInt64Milliseconds(deadline - now) + 1));
      if (::poll(fds.data(), fds.size(), wait_ms) < 0 && errno != EINTR) {
        return absl::InternalError("poll: " + ErrnoString(errno));
      }
      std::vector<size_t> still;
      for (size_t i = 0; i < pending.size(); ++i) {
        const size_t c = pending[i];
        if (fds[i].revents == 0) {
          still.push_back(c);
          continue;
        }
        const int p = static_cast<int>(c / S);
        const int fd = ctx->peers_[c].fd.get();
        absl::Status s = ReadHelloAck(fd, deadline);
        std::string peer_nonce(kNonceBytes, '\0'), proof(kProofBytes, '\0');
        if (s.ok()) s = ReadFull(fd, peer_nonce.data(), kNonceBytes, deadline);
        if (s.ok()) s = ReadFull(fd, proof.data(), kProofBytes, deadline);
        if (!s.ok()) return peer_error(p, s);
        if (!ProofsEqual(proof, HandshakeProof(options.job_key, HandshakeRole::kAcceptor,
                                               hellos[c], options.job_id, nonces[c],
                                               peer_nonce))) {
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
      pending.swap(still);
    }
    return absl::OkStatus();
  };

  // The acceptor's side, for every lower rank: claims the connection with
  // the rank's Hello, answers with its nonce and proof, and takes it once the
  // connector proved the key back. Each step has its own short deadline
  // (the connector sends its nonce with the Hello and, thanks to its own
  // thread, its proof within a round trip of our answer): a connection that
  // misses one, sends a wrong proof or closes is dropped and the next one
  // with the same Hello is tried, so a forger who connected first and stays
  // silent costs one step, not the job.
  auto refused = [&](int p, const char* reason) {
    if (options.on_auth_failure) options.on_auth_failure(reason);
    GS_LOG(WARNING) << "job '" << options.job_id << "' epoch " << options.epoch << ": rank " << me
                    << " closed a connection claiming to be rank " << p << " (" << reason
                    << "); waiting for another";
  };
  auto accept_lower = [&]() -> absl::Status {
    if (me > 0 && listener == nullptr) {
      return absl::FailedPreconditionError("no data-plane listener");
    }
    for (int p = 0; p < me; ++p) {
      for (int st = 0; st < S; ++st) {
        const size_t c = p * S + st;
        const Hello hello{kHelloMagic, kWireVersion, static_cast<uint16_t>(options.job_id.size()),
                          options.epoch, p, me, options.world_size, static_cast<uint32_t>(st)};
        while (true) {
          // Claim in slices, so a failure of the other side ends the wait.
          absl::StatusOr<UniqueFd> fd = absl::DeadlineExceededError("");
          while (true) {
            if (failed) return gave_up;
            const absl::Time slice = std::min(deadline, absl::Now() + absl::Milliseconds(200));
            fd = listener->Claim(options.job_id, options.epoch, p, me, st, slice);
            if (fd.ok() || !absl::IsDeadlineExceeded(fd.status()) || slice >= deadline) break;
          }
          if (!fd.ok()) return peer_error(p, fd.status());
          const absl::Time step = std::min(deadline, absl::Now() + options.handshake_step_timeout);
          std::string peer_nonce(kNonceBytes, '\0');
          absl::Status s = ReadFull(fd->get(), peer_nonce.data(), kNonceBytes, step);
          const std::string nonce = RandomNonce();
          const std::string proof = HandshakeProof(options.job_key, HandshakeRole::kAcceptor, hello,
                                                   options.job_id, peer_nonce, nonce);
          const HelloAck ack{kHelloMagic, 0, 0};
          if (s.ok()) s = WriteFull(fd->get(), &ack, sizeof(ack), step);
          if (s.ok()) s = WriteFull(fd->get(), nonce.data(), kNonceBytes, step);
          if (s.ok()) s = WriteFull(fd->get(), proof.data(), proof.size(), step);
          std::string theirs(kProofBytes, '\0');
          const absl::Time proof_step =
              std::min(deadline, absl::Now() + options.handshake_step_timeout);
          if (s.ok()) s = ReadFull(fd->get(), theirs.data(), kProofBytes, proof_step);
          if (s.ok() && ProofsEqual(theirs, HandshakeProof(options.job_key,
                                                           HandshakeRole::kConnector, hello,
                                                           options.job_id, nonce, peer_nonce))) {
            ctx->peers_[c].fd = *std::move(fd);
            break;
          }
          if (absl::Now() >= deadline) {
            return peer_error(p, absl::DeadlineExceededError(absl::StrCat(
                                     "no connection completed the handshake (the last: ",
                                     s.ok() ? "a wrong proof" : s.message(), ")")));
          }
          refused(p, s.ok() ? "bad_proof" : "no_proof");
        }
      }
    }
    return absl::OkStatus();
  };

  absl::Status connected;
  std::thread connector([&] {
    connected = connect_higher();
    if (!connected.ok()) failed = true;
  });
  NameThread(connector, "gs-connect");
  absl::Status accepted = accept_lower();
  if (!accepted.ok()) failed = true;
  connector.join();
  // The side that failed first names the cause; the other only gave up.
  if (!accepted.ok() && !absl::IsCancelled(accepted)) return accepted;
  if (!connected.ok()) return connected;
  if (!accepted.ok()) return accepted;
  for (Peer& c : ctx->peers_) {
    if (c.rank == me) continue;
    absl::Status s = TuneDataSocket(c.fd.get(), options.socket_buffer_bytes);
    if (!s.ok()) return s;
  }
  // Data TLS: every connection's TLS handshake, bound to the job key.
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
