// gradsync-rdma-emulation-bench: what one collective op moves, per algorithm,
// over the RDMA transport on the verbs emulation next to TCP on loopback: the
// algorithm's data messages (posts, counted on both), the control messages the
// transport adds (RDMA: one clear-to-send entry per message; TCP: none, the
// tag rides in each frame's 48-byte header), the bytes on the wire, and the
// payload the transport itself copies (TCP: every byte into and out of the
// kernel's socket buffers; RDMA: none, the NIC writes from the registered
// source into the registered destination; the emulation's one memcpy per
// write stands for that DMA, counted as write_bytes).
//
// A statement about the protocol, not about hardware: the emulation has no
// timing, so no times are printed.
#include <cinttypes>
#include <cstdio>
#include <cstring>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/strings/str_cat.h"
#include "collective/algorithm.h"
#include "collective/collectives.h"
#include "collective/test_cluster.h"
#include "transport/rdma_context.h"

ABSL_FLAG(int, ranks, 4, "ranks of the job (one context each, in this process)");
ABSL_FLAG(int64_t, bytes, 16 << 20, "bytes of each rank's buffer");
ABSL_FLAG(int64_t, segment_bytes, 1 << 20, "ring segment size (the daemon's --segment_bytes)");

namespace gradsync {
namespace {

// Forwards to a context and counts the algorithm's sends.
class CountingContext final : public transport::Context {
 public:
  explicit CountingContext(transport::Context& inner) : inner_(inner) {}
  int rank() const override { return inner_.rank(); }
  int size() const override { return inner_.size(); }
  using Context::RegisterMemory;
  absl::StatusOr<std::unique_ptr<transport::MemoryRegion>> RegisterMemory(
      void* data, size_t size, transport::MemKind kind) override {
    return inner_.RegisterMemory(data, size, kind);
  }
  absl::Status PostSend(int peer, const transport::MemoryRegion& mr, size_t offset, size_t len,
                        const transport::MessageTag& tag, transport::Request* req) override {
    ++messages;
    payload += len;
    return inner_.PostSend(peer, mr, offset, len, tag, req);
  }
  absl::Status PostRecv(int peer, const transport::MemoryRegion& mr, size_t offset,
                        size_t capacity, bool exact, const transport::MessageTag& tag,
                        transport::Request* req) override {
    return inner_.PostRecv(peer, mr, offset, capacity, exact, tag, req);
  }
  absl::Status Progress(absl::Time deadline) override { return inner_.Progress(deadline); }
  void Abort(const absl::Status& reason) override { inner_.Abort(reason); }
  void Interrupt() override { inner_.Interrupt(); }
  absl::Status Fail(const absl::Status& reason) override { return inner_.Fail(reason); }
  absl::Status health() const override { return inner_.health(); }
  uint64_t BytesSentTo(int peer) const override { return inner_.BytesSentTo(peer); }
  int max_in_flight() const override { return inner_.max_in_flight(); }

  uint64_t messages = 0;
  uint64_t payload = 0;

 private:
  transport::Context& inner_;
};

struct Row {
  uint64_t messages = 0;  // the algorithm's sends, every rank
  uint64_t payload = 0;   // their bytes
  uint64_t control = 0;   // transport control messages (RDMA: CTS)
  uint64_t wire = 0;      // bytes the transport sent (TCP: frames with headers)
  uint64_t rdma_writes = 0;
  uint64_t written = 0;   // RDMA: payload bytes the (emulated) NIC wrote into receivers
  bool ok = false;
};

Row RunOne(testing::DeviceKind device, CollectiveKind kind, Algorithm algo, int world,
           size_t bytes, size_t segment, uint64_t seq) {
  Row row;
  testing::Cluster c = testing::MakeCluster(world, absl::StrCat("emu-bench-", seq), device);
  if (c.size() != world) return row;
  const size_t elem = 4;
  const size_t per_rank = CollectiveBufferBytes(kind, 1, DType::kF32, world) / elem;  // blocks
  const size_t count = std::max<size_t>(1, bytes / elem / std::max<size_t>(1, per_rank));
  std::vector<std::vector<float>> data(world);
  std::vector<CountingContext> counting;
  counting.reserve(world);
  for (int r = 0; r < world; ++r) {
    counting.emplace_back(*c.contexts[r]);
    data[r].assign(std::max<size_t>(1, CollectiveBufferBytes(kind, count, DType::kF32, world) / elem),
                   static_cast<float>(r + 1));
  }
  const uint64_t written_before = testing::Emulation().stats().write_bytes;
  std::vector<uint64_t> wire_before(world, 0);
  for (int r = 0; r < world; ++r) {
    for (int p = 0; p < world; ++p) wire_before[r] += p == r ? 0 : c.contexts[r]->BytesSentTo(p);
  }
  std::vector<absl::Status> st = testing::RunOnRanks(world, [&](int r) {
    CollectiveCall call;
    call.kind = kind;
    call.buffer = testing::HostBuffer(data[r]);
    call.count = count;
    call.seq = seq;
    call.ring.segment_bytes = segment;
    call.deadline = absl::Now() + absl::Seconds(60);
    transport::Scratch scratch;
    return RunCollective(counting[r], call, algo, &scratch);
  });
  row.ok = true;
  row.written = testing::Emulation().stats().write_bytes - written_before;
  for (int r = 0; r < world; ++r) {
    if (!st[r].ok()) {
      std::fprintf(stderr, "%s %s rank %d: %s\n", AlgorithmName(algo), testing::DeviceName(device),
                   r, st[r].ToString().c_str());
      row.ok = false;
    }
    row.messages += counting[r].messages;
    row.payload += counting[r].payload;
    uint64_t wire = 0;
    for (int p = 0; p < world; ++p) wire += p == r ? 0 : c.contexts[r]->BytesSentTo(p);
    row.wire += wire - wire_before[r];
    if (auto* rdma = dynamic_cast<transport::RdmaContext*>(c.contexts[r].get())) {
      row.control += rdma->counters().control_sent;
      row.rdma_writes += rdma->counters().writes;
    }
  }
  return row;
}

int Main() {
  const int world = absl::GetFlag(FLAGS_ranks);
  const size_t bytes = static_cast<size_t>(absl::GetFlag(FLAGS_bytes));
  const size_t segment = static_cast<size_t>(absl::GetFlag(FLAGS_segment_bytes));
  std::printf("# one op of %zu bytes per rank, %d ranks, ring segments of %zu bytes; sums over "
              "every rank\n", bytes, world, segment);
  std::printf("# RDMA on the verbs emulation (protocol counts, not hardware timing); TCP on "
              "loopback\n");
  std::printf("# msgs = the algorithm's sends; ctrl = transport control messages (RDMA: one CTS "
              "per message);\n# wire = bytes the transport sent (TCP frames incl. 48-byte "
              "headers; RDMA writes + 48-byte CTS);\n# copied = payload bytes the transport "
              "copies on the hosts (TCP: into and out of the kernel, 2 per byte; RDMA: 0);\n# written = "
              "payload bytes the emulated NIC wrote into receivers' registered memory (RDMA: each "
              "byte once)\n");
  std::printf("%-15s %-9s %-5s %8s %8s %14s %14s %14s %14s\n", "collective", "algo", "via",
              "msgs", "ctrl", "payload", "wire", "copied", "written");
  const CollectiveKind kinds[] = {CollectiveKind::kAllreduce, CollectiveKind::kReduceScatter,
                                  CollectiveKind::kAllgather, CollectiveKind::kBroadcast,
                                  CollectiveKind::kAlltoall};
  uint64_t seq = 1;
  int failures = 0;
  for (CollectiveKind kind : kinds) {
    for (Algorithm algo : kAllAlgorithms) {
      if (!Implements(algo, kind) || algo == Algorithm::kOneShot) continue;
      for (testing::DeviceKind dev : {testing::DeviceKind::kTcp, testing::DeviceKind::kRdma}) {
        const Row row = RunOne(dev, kind, algo, world, bytes, segment, seq++);
        if (!row.ok) ++failures;
        const bool rdma = dev == testing::DeviceKind::kRdma;
        const uint64_t wire = rdma ? row.payload + 48 * row.control : row.wire;
        std::printf("%-15s %-9s %-5s %8" PRIu64 " %8" PRIu64 " %14" PRIu64 " %14" PRIu64
                    " %14" PRIu64 " %14s%s\n",
                    CollectiveName(kind), AlgorithmName(algo), rdma ? "rdma" : "tcp",
                    row.messages, row.control, row.payload, wire, rdma ? 0 : 2 * row.payload,
                    rdma ? absl::StrCat(row.written).c_str() : "-",
                    rdma && (row.rdma_writes != row.messages || row.written != row.payload)
                        ? "  (writes or written bytes differ from the messages!)"
                        : "");
      }
    }
  }
  return failures == 0 ? 0 : 1;
}

}  // namespace
}  // namespace gradsync

int main(int argc, char** argv) {
  absl::SetProgramUsageMessage(
      "messages, control messages and bytes per collective op per algorithm over the RDMA "
      "transport (verbs emulation) next to TCP (loopback)");
  absl::ParseCommandLine(argc, argv);
  return gradsync::Main();
}
