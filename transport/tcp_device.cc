#include "transport/tcp_device.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "transport/tcp_context.h"

namespace gradsync::transport {

TcpDevice::TcpDevice(TcpDeviceOptions options) : options_(options) {
  properties_.name = "tcp";
  properties_.host_memory = true;
  properties_.cuda_memory = false;
  properties_.max_in_flight = TcpContextOptions::kDefaultMaxInFlight;
}

TcpContextOptions TcpDevice::Options(const std::string& job_id, uint64_t epoch) const {
  TcpContextOptions o;
  o.job_id = job_id;
  o.epoch = epoch;
  o.socket_buffer_bytes = options_.socket_buffer_bytes;
  o.spin_us = options_.spin_us;
  o.max_in_flight = properties_.max_in_flight;
  return o;
}

absl::StatusOr<std::shared_ptr<const DataTls>> TcpDevice::LoadTls(const std::string& job_id) const {
  absl::StatusOr<std::shared_ptr<const DataTls>> tls = DataTls::Load(options_.tls);
  if (!tls.ok()) {
    return absl::Status(tls.status().code(), absl::StrCat("job '", job_id, "' runs with data TLS: ",
                                                          tls.status().message()));
  }
  return tls;
}

std::unique_ptr<TcpDevice> TcpDevice::DialOnly(int socket_buffer_bytes, TlsConfig tls) {
  TcpDeviceOptions o;
  o.socket_buffer_bytes = socket_buffer_bytes;
  o.tls = std::move(tls);
  return std::make_unique<TcpDevice>(o);
}

absl::StatusOr<std::unique_ptr<Context>> TcpDevice::CreateContext(const ContextSpec& spec) {
  TcpContextOptions o = Options(spec.job_id, spec.epoch);
  o.rank = spec.rank;
  o.world_size = spec.world_size;
  o.peers = spec.peers;
  o.deadline = spec.deadline;
  o.streams = std::max(1, spec.lanes);
  o.job_key = spec.job_key;
  o.announce_arrivals = spec.announce_arrivals;
  o.peer_names = spec.peer_names;
  o.on_auth_failure = options_.on_auth_failure;
  if (spec.encrypt) {
    ASSIGN_OR_RETURN(o.tls, LoadTls(spec.job_id));
  }
  absl::StatusOr<std::unique_ptr<TcpContext>> ctx = TcpContext::Connect(o, options_.listener);
  if (!ctx.ok()) return ctx.status();
  return std::unique_ptr<Context>(std::move(*ctx));
}

absl::StatusOr<std::unique_ptr<Context>> TcpDevice::ConnectToServers(const ServerSetSpec& spec) {
  TcpContextOptions o = Options(spec.job_id, spec.epoch);
  o.rank = spec.rank;
  o.world_size = spec.clients;
  o.peers = spec.servers;
  o.deadline = spec.deadline;
  o.self_name = spec.self_name;
  o.peer_names = spec.server_names;
  o.server_keys = spec.server_keys;
  o.hello_stream = spec.hello_stream;
  o.verbatim_aborts = true;
  o.relay_faults = false;
  if (spec.encrypt) {
    ASSIGN_OR_RETURN(o.tls, LoadTls(spec.job_id));
  }
  absl::StatusOr<std::unique_ptr<TcpContext>> ctx = TcpContext::ConnectToServers(o);
  if (!ctx.ok()) return ctx.status();
  return std::unique_ptr<Context>(std::move(*ctx));
}

absl::StatusOr<std::unique_ptr<Context>> TcpDevice::AcceptClient(UniqueFd connection,
                                                                const ClientSpec& spec) {
  TcpContextOptions o = Options(spec.job_id, spec.epoch);
  o.spin_us = 0;  // a server thread sleeps between a client's frames
  o.self_name = spec.self_name;
  o.peer_names = {spec.client_name};
  o.deadline = spec.deadline;
  if (spec.encrypt) {
    ASSIGN_OR_RETURN(o.tls, LoadTls(spec.job_id));
    o.job_key = spec.key;
  }
  absl::StatusOr<std::unique_ptr<TcpContext>> ctx =
      TcpContext::Adopt(std::move(connection), o);
  if (!ctx.ok()) return ctx.status();
  return std::unique_ptr<Context>(std::move(*ctx));
}

}  // namespace gradsync::transport
