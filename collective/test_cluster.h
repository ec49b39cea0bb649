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
#include "collective/reducer.h"
#include "transport/inproc.h"
#include "transport/staging_context.h"
#include "transport/tcp_listener.h"
#include "transport/memory.h"
#include "transport/transport.h"

namespace gradsync::testing {

// kTcpStaged: TCP contexts wrapped in a StagingContext
// (transport/staging_context.h) with the emulated GPU copier
// (transport/staging_testing.h): ops run on "device memory" (host memory
// labelled cuda:0) with a device-kind reducer and scratch, every message
// staged through host blocks, as the daemon runs device buffers over TCP.
enum class DeviceKind { kTcp, kInProc, kRdma, kTcpStaged };
inline constexpr DeviceKind kAllDevices[] = {DeviceKind::kTcp, DeviceKind::kInProc,
                                             DeviceKind::kRdma, DeviceKind::kTcpStaged};
// "tcp", "inproc", "rdma-emulated", "tcp-staged-device".
const char* DeviceName(DeviceKind kind);

// What an op on `kind`'s contexts runs on: its buffers' memory kind, the
// reducer (null: the CPU's) and the allocator of its scratch.
transport::MemKind BufferKindFor(DeviceKind kind);
const Reducer* ReducerFor(DeviceKind kind);
const transport::MemoryAllocator& ScratchAllocatorFor(DeviceKind kind);

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
  // kTcpStaged: the copiers and the TCP contexts the staging contexts wrap.
  std::vector<std::unique_ptr<transport::DeviceCopier>> copiers;
  std::vector<std::unique_ptr<transport::Context>> inner;
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
