// The TCP device: contexts of TcpContext (tcp_context.h) over one data-plane
// listener, with the daemon's socket settings.
#ifndef GRADSYNC_TRANSPORT_TCP_DEVICE_H_
#define GRADSYNC_TRANSPORT_TCP_DEVICE_H_

#include <functional>
#include <memory>

#include "transport/device.h"
#include "common/tls.h"
#include "transport/tcp_context.h"
#include "transport/tcp_listener.h"

namespace gradsync::transport {

struct TcpDeviceOptions {
  // The data-plane listener; not owned, outlives the device. Null: a
  // dial-only device (client contexts, and CreateContext for rank 0 of 1).
  TcpListener* listener = nullptr;
  int socket_buffer_bytes = 0;      // SO_SNDBUF/SO_RCVBUF; 0: the kernel's autotuning
  int spin_us = 0;                  // TcpContextOptions::spin_us
  // TcpContextOptions::on_auth_failure of every context (may be empty).
  std::function<void(absl::string_view reason)> on_auth_failure;
  // This process's certificate for contexts that encrypt (ContextSpec,
  // ServerSetSpec, ClientSpec ::encrypt: data TLS), loaded for each such
  // context; empty: they are refused.
  TlsConfig tls;
};

class TcpDevice final : public Device {
 public:
  explicit TcpDevice(TcpDeviceOptions options);
  // A device without a listener, for client contexts and server contexts
  // over connections accepted elsewhere (the PS worker's and shard's own),
  // with `tls` for the contexts that encrypt.
  static std::unique_ptr<TcpDevice> DialOnly(int socket_buffer_bytes, TlsConfig tls = {});
  const DeviceProperties& properties() const override { return properties_; }
  // A TcpContext (Context::tcp() is non-null); spec.lanes = its streams.
  absl::StatusOr<std::unique_ptr<Context>> CreateContext(const ContextSpec& spec) override;
  // A TcpContext::ConnectToServers context (needs no listener).
  absl::StatusOr<std::unique_ptr<Context>> ConnectToServers(const ServerSetSpec& spec) override;
  // A TcpContext::Adopt context over the connection.
  absl::StatusOr<std::unique_ptr<Context>> AcceptClient(UniqueFd connection,
                                                        const ClientSpec& spec) override;

 private:
  // The options every context of this device shares.
  TcpContextOptions Options(const std::string& job_id, uint64_t epoch) const;
  // The node's certificate as a TLS context, for a context of `job_id` that
  // must encrypt (errors name the job and the file that cannot be used).
  absl::StatusOr<std::shared_ptr<const DataTls>> LoadTls(const std::string& job_id) const;
  const TcpDeviceOptions options_;
  DeviceProperties properties_;
};

}  // namespace gradsync::transport

#endif  // GRADSYNC_TRANSPORT_TCP_DEVICE_H_
