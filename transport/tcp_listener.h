// The daemon's data-plane listener: one TCP port for every job. It accepts
// connections, reads and validates each Hello (with a deadline, on a bounded
// number of handshake threads, so garbage or a silent client can't block
// anyone) and parks well-formed connections until the job's context claims
// them. Parked connections nobody claims are closed after `park_timeout`.
//
// Optionally (ListenerOptions::route_prefix / route) connections whose job id
// starts with a prefix are handed to a callback instead of being parked: the
// parameter server (ps/) takes its "ps/<job>" connections this way.
#ifndef GRADSYNC_TRANSPORT_TCP_LISTENER_H_
#define GRADSYNC_TRANSPORT_TCP_LISTENER_H_

#include <atomic>
#include <cstdint>
#include <functional>
#include <list>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <tuple>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/net.h"
#include "transport/wire.h"

namespace gradsync::transport {

// A handshaken connection handed to ListenerOptions::route.
struct RoutedConnection {
  UniqueFd fd;         // blocking; the HelloAck has not been sent yet
  Hello hello;         // validated (see ListenerOptions::route)
  std::string job_id;  // the full job id, prefix included
  std::string peer;    // "host:port" of the connector
};

struct ListenerOptions {
  HostPort listen{"0.0.0.0", 0};
  absl::Duration handshake_timeout = absl::Seconds(5);
  absl::Duration park_timeout = absl::Seconds(60);
  int max_pending_handshakes = 256;
  // Per source address (the connector's IP): handshakes in progress, and
  // parked connections. One host that opens silent connections, or parks
  // Hellos nobody claims, cannot take every slot from the others; and when
  // several hosts fill every handshake slot, a newcomer from a host with
  // fewer slots takes the slot of the oldest silent connection of the host
  // with the most (fair shares).
  // A daemon opens up to 16 streams per peer for each job forming at once,
  // all from one address; this leaves room for several.
  int max_handshakes_per_source = 64;
  int max_parked_per_source = 1024;
  // Connections with the same Hello waiting at once (the claimer tries them
  // in arrival order until one proves the job key).
  int max_parked_per_hello = 4;

  // Optional routing. When `route_prefix` is non-empty and `route` is set,
  // every well-formed connection whose job id starts with `route_prefix` is
  // passed to `route` instead of being parked (Claim never sees it); all
  // other connections behave exactly as without routing. For routed
  // connections dst_rank is not a rank of the job, so the hello check is
  // magic, version, job id length, 1 <= world_size <= kMaxWorldSize,
  // 0 <= src_rank < world_size and 0 <= dst_rank < kMaxWorldSize.
  // `route` runs on the handshake thread, owns the connection from then on
  // (it answers the HelloAck), must return promptly (it holds one of the
  // max_pending_handshakes slots) and must stay callable until the listener
  // is destroyed (the destructor waits for running calls).
  std::string route_prefix;
  std::function<void(RoutedConnection)> route;
};

struct ListenerStats {
  uint64_t accepted = 0;
  uint64_t rejected = 0;  // bad handshakes (garbage, truncated, wrong version), over a limit
  uint64_t expired = 0;   // parked but never claimed
  uint64_t routed = 0;    // handed to ListenerOptions::route
  uint64_t replaced = 0;  // parked, then closed by the peer before anyone claimed it
  uint64_t evicted = 0;   // silent connections dropped to give another source its share
  uint64_t parked = 0;    // waiting to be claimed now
};

class TcpListener {
 public:
  // Binds and starts the accept thread.
  static absl::StatusOr<std::unique_ptr<TcpListener>> Start(const ListenerOptions& options);
  ~TcpListener();  // stops accepting, joins threads, closes parked connections

  int port() const { return port_; }

  // Waits until the connection (job, epoch, src -> dst, stream) has arrived
  // and takes it; DeadlineExceeded naming the peer otherwise. The caller
  // answers the HelloAck.
  absl::StatusOr<UniqueFd> Claim(const std::string& job_id, uint64_t epoch, int src_rank,
                                 int dst_rank, uint32_t stream, absl::Time deadline);

  ListenerStats stats() const;

 private:
  using Key = std::tuple<std::string, uint64_t, int, int, uint32_t>;
  struct Parked {
    UniqueFd fd;
    absl::Time arrived;
    std::string source;  // the connector's address, without the port
  };
  struct Handshake {
    std::thread thread;
    std::atomic<bool> done{false};
    std::string source;
    absl::Time started;
    int fd = -1;  // while its Hello is being read (guarded by mu_); -1 after
  };

  TcpListener(const ListenerOptions& options, UniqueFd fd, int port);
  void AcceptLoop();
  void DoHandshake(UniqueFd fd, std::string peer, Handshake* self);
  // Parks a handshaken connection behind the others with the same Hello,
  // unless its source or its Hello has too many waiting. Returns why it was
  // refused.
  absl::Status ParkLocked(Key key, UniqueFd fd, const std::string& source)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void ReapLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The handshake slots are full: makes room for a connection from `source`
  // (holding `from_source` slots) by dropping the oldest connection still
  // silent before its Hello from the source that holds the most, if that
  // source holds more than one slot more than `source`. False: no room.
  bool EvictForLocked(const std::string& source, int from_source)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const ListenerOptions options_;
  UniqueFd listen_fd_;
  const int port_;
  std::atomic<bool> stop_{false};
  std::thread accept_thread_;

  mutable absl::Mutex mu_;
  std::multimap<Key, Parked> parked_ ABSL_GUARDED_BY(mu_);  // per key in arrival order
  std::list<std::unique_ptr<Handshake>> handshakes_ ABSL_GUARDED_BY(mu_);
  ListenerStats stats_ ABSL_GUARDED_BY(mu_);
};

}  // namespace gradsync::transport

#endif  // GRADSYNC_TRANSPORT_TCP_LISTENER_H_
