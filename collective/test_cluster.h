// Test helper: one context per rank of a job, from a transport device: TCP
// on loopback (each rank with its own data-plane listener, connected exactly
// as daemons connect), the in-process device (transport/inproc.h), which
// can inject faults, or the RDMA device (transport/rdma_device.h) over the
// verbs emulation (rdma/verbs_emulation.h, one per test process),
// bootstrapped over loopback TCP.
#ifndef GRADSYNC_COLLECTIVE_TEST_CLUSTER_H_
#define GRADSYNC_COLLECTIVE_TEST_CLUSTER_H_

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "rdma/verbs_emulation.h"
#include "transport/inproc.h"
#include "transport/tcp_listener.h"
#include "transport/memory.h"
#include "transport/transport.h"

namespace gradsync::testing {

enum class DeviceKind { kTcp, kInProc, kRdma };
inline constexpr DeviceKind kAllDevices[] = {DeviceKind::kTcp, DeviceKind::kInProc,
                                             DeviceKind::kRdma};
// "tcp", "inproc", "rdma-emulated".
const char* DeviceName(DeviceKind kind);

// The process's verbs emulation that kRdma clusters run on (its stats).
const rdma::VerbsEmulation& Emulation();

// The host memory of a vector, as an op's buffer.
template <class V>
transport::Buffer HostBuffer(V& v) {
  return transport::Buffer{v.data(), v.size() * sizeof(v[0])};
}

struct Cluster {
  std::vector<std::unique_ptr<transport::TcpListener>> listeners;  // TCP and RDMA
  std::vector<std::unique_ptr<transport::Device>> devices;  // TCP and RDMA (after the contexts go)
  std::vector<std::unique_ptr<transport::Context>> contexts;  // destroyed first
  int size() const { return static_cast<int>(contexts.size()); }
};

// Connects `world` ranks of job `job` (epoch 1), one thread per rank, on
// `device` (faults: in-process only). Fails the calling test (gtest) if a
// rank cannot connect.
Cluster MakeCluster(int world, const std::string& job, DeviceKind device = DeviceKind::kTcp,
                    const transport::InProcFaults& faults = {});

// Runs fn(rank) for rank 0..world-1, each on its own thread, and returns their
// statuses by rank.
std::vector<absl::Status> RunOnRanks(int world, const std::function<absl::Status(int)>& fn);

}  // namespace gradsync::testing

#endif  // GRADSYNC_COLLECTIVE_TEST_CLUSTER_H_
