// A transport device: what creates a job's contexts (transport.h) and what
// the planner and the daemon learn about the links from (DeviceProperties).
//
// Three devices exist: TCP (tcp_device.h) and RDMA verbs (rdma_device.h),
// for real jobs, and in-process (inproc.h), which connects contexts inside
// one process through memory queues and injects faults, for testing the
// collectives' protocol logic.
#ifndef GRADSYNC_TRANSPORT_DEVICE_H_
#define GRADSYNC_TRANSPORT_DEVICE_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/net.h"
#include "transport/transport.h"

namespace gradsync::transport {

struct DeviceProperties {
  std::string name;           // "tcp", "rdma", "inproc"
  bool host_memory = true;    // can register MemKind::kHost
  bool cuda_memory = false;   // can register MemKind::kCuda directly (GPUDirect)
  double link_gbps = 0;       // nominal link bandwidth; 0: unknown (the link probe measures it)
  double latency_us = 0;      // nominal one-way latency; 0: unknown
  // Requests a context accepts posted and not yet completed per peer and
  // direction (Context::max_in_flight(); 0: unbounded).
  int max_in_flight = 0;
  bool Supports(MemKind kind) const {
    return kind.type == MemKind::kHost ? host_memory : cuda_memory;
  }
};

// One rank's context of a job epoch.
struct ContextSpec {
  std::string job_id;
  uint64_t epoch = 0;
  int rank = 0;
  int world_size = 1;
  std::vector<HostPort> peers;  // each rank's data endpoint (devices that dial use it)
  absl::Time deadline;          // for the whole set-up
  // Parallel connections per peer, for devices that spread a peer's messages
  // over several (TCP streams); others use one.
  int lanes = 1;
  // The job's secret (from the coordinator, for its members only): peers
  // prove they hold it when they connect. Empty: no proof is possible.
  std::string job_key;
  // Encrypt and authenticate every connection (devices that can: TCP with
  // TLS 1.3, transport/tcp_tls.h); a device that cannot refuses.
  bool encrypt = false;
  // Progress also returns OK when a message arrives that no posted receive
  // expects, or a peer closes (Context::Probe tells what came): for a driver
  // that posts receives only for what it has seen (TCP; other devices ignore
  // it).
  bool announce_arrivals = false;
  // How errors name peer k (default "rank k"), e.g. "daemon 1 (10.0.0.2:7000)".
  std::vector<std::string> peer_names;
};

// A client's connections to a set of servers of one job (the
// parameter-server shards): peer k of the context is server k. The Hello
// to server k names the job, the epoch, src_rank = `rank`, dst_rank = k and
// world_size = `clients`. A server's ABORT fails the context with the
// server's own code and message (the servers speak for the job), not
// Aborted("aborted by ..."); a server's fault (loss, ABORT, protocol error)
// is told to the other servers only by the owner's Fail(reason), in its words.
struct ServerSetSpec {
  std::string job_id;  // the data-plane job id (e.g. "ps/<job>")
  uint64_t epoch = 0;
  int rank = 0;     // this client among the job's clients
  int clients = 1;  // the job's clients
  std::vector<HostPort> servers;
  // How the context's errors name server k (default "server k (host:port)")
  // and this client (default "client rank R").
  std::vector<std::string> server_names;
  std::string self_name;
  absl::Time deadline;  // for the whole set-up
  // The key server k proves at the handshake, and the client proves back
  // (ps: PsShardKey of the job key and the shard's id). Missing: empty.
  std::vector<std::string> server_keys;
  // Encrypt every connection, bound to its server's key (ContextSpec::encrypt).
  bool encrypt = false;
  // The Hello's stream field: 0, or wire.h's kRdmaBootstrapStream from an
  // RDMA device bootstrapping over TCP (the server then answers over RDMA).
  uint32_t hello_stream = 0;
};

// The server side of ConnectToServers: a context over one client's
// connection, accepted and handshaken by the server's listener (peer 0 = the
// client, rank() -1). It reports messages no posted receive expects (Probe)
// and the client's close, and when it fails, its ABORT names no op
// (kConnectionOp): the connection ends.
struct ClientSpec {
  std::string job_id;  // the data-plane job id the Hello named
  uint64_t epoch = 0;
  std::string client_name;  // how errors name the client ("worker rank 2")
  std::string self_name;    // and this server ("ps shard 0: job 'j'")
  // Encrypt the connection (ContextSpec::encrypt), bound to `key`: the key
  // the client proved at the handshake. The TLS handshake runs by `deadline`.
  bool encrypt = false;
  std::string key;
  absl::Time deadline = absl::InfiniteFuture();
};

class Device {
 public:
  virtual ~Device() = default;
  virtual const DeviceProperties& properties() const = 0;
  // Connects `spec.rank` to every peer (blocks up to spec.deadline).
  virtual absl::StatusOr<std::unique_ptr<Context>> CreateContext(const ContextSpec& spec) = 0;
  // Connects a client to every server of `spec` (blocks up to spec.deadline).
  // A refusal or an unreachable server fails with "<server name>: cannot
  // connect: <cause>" and the cause's code. Unimplemented where the device
  // has no client contexts.
  virtual absl::StatusOr<std::unique_ptr<Context>> ConnectToServers(const ServerSetSpec& spec) {
    (void)spec;
    return absl::UnimplementedError(properties().name + " device has no client contexts");
  }
  // A server context over `connection` (TCP: it becomes the data connection;
  // a transport with its own links bootstraps them over it). Unimplemented
  // where the device has no server contexts.
  virtual absl::StatusOr<std::unique_ptr<Context>> AcceptClient(UniqueFd connection,
                                                                const ClientSpec& spec) {
    (void)connection;
    (void)spec;
    return absl::UnimplementedError(properties().name + " device has no server contexts");
  }
};

}  // namespace gradsync::transport

#endif  // GRADSYNC_TRANSPORT_DEVICE_H_
