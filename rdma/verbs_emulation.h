// An in-process emulation of the verbs the RDMA transport uses, with RC
// semantics, for testing the transport's protocol without a NIC. It is a
// VerbsTable (verbs_table.h): code under test opens its devices exactly as it
// opens libibverbs' ones.
//
// What it models:
//   * Devices with one ACTIVE port each (InfiniBand with a LID, or Ethernet
//     with a RoCE v1/v2 GID table), protection domains, memory regions with
//     lkey/rkey and access flags, completion queues with a capacity,
//     completion channels (an eventfd that turns readable when an armed CQ
//     gets an entry), RC queue pairs with the RESET/INIT/RTR/RTS/ERR states.
//   * RDMA WRITE (with immediate: it consumes a posted receive at the peer
//     and completes there with the length and the immediate) and SEND/RECV
//     into the peer's registered memory; lkey and rkey checked with bounds.
//   * In-order delivery and completion per QP; a work request keeps its send
//     queue slot until its completion (or a later signaled one's) is polled,
//     so a full send queue refuses posts with ENOMEM as hardware does.
//   * Receiver not ready: a SEND or WRITE_WITH_IMM waits for a receive (rnr
//     retry 7) or fails with RNR_RETRY_EXC_ERR (less).
//   * Errors: a bad lkey is LOC_PROT_ERR, a bad rkey REM_ACCESS_ERR, a short
//     receive LOC_LEN_ERR (REM_INV_REQ_ERR at the sender), a peer QP that is
//     gone or in error RETRY_EXC_ERR; the QP then enters ERR and flushes
//     everything posted (WR_FLUSH_ERR). A CQ that overflows fails poll_cq
//     (EOVERFLOW) and errors its QPs.
//   * Faults (EmulatedFaults): a dropped work request, a delay on every one,
//     a wrong rkey, a smaller CQ.
// What it cannot show: timing, PCIe and NIC behaviour, memory pinning (a
// registration pins nothing), real RoCE routing.
//
// A linked emulation (EmulationOptions::fabric) reaches the linked
// emulations of other processes on this host (verbs_emulation_link.h): each
// process is a node of the fabric with its own devices, and work requests
// between them carry their data over a unix socket, landing with the same
// checks and completions; a process that dies fails the work requests sent
// to it with RETRY_EXC_ERR. This is how separate gradsyncd processes run the
// RDMA transport in tests.
//
// One VerbsEmulation exists at a time (its table's functions reach it
// through a process-wide pointer).
#ifndef GRADSYNC_RDMA_VERBS_EMULATION_H_
#define GRADSYNC_RDMA_VERBS_EMULATION_H_

#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "rdma/verbs.h"
#include "rdma/verbs_table.h"

namespace gradsync::rdma {

struct EmulatedFaults {
  // Work request number `drop_at` posted after SetFaults (from 1, counting
  // every send queue) is lost on the wire: its QP fails with RETRY_EXC_ERR.
  uint64_t drop_at = 0;
  // RDMA WRITE number `bad_rkey_at` (from 1) carries a wrong rkey.
  uint64_t bad_rkey_at = 0;
  // Every work request is delivered this long after it was posted.
  absl::Duration delay = absl::ZeroDuration();
  // CQs created from now on hold at most this many entries (0: as asked).
  int cq_capacity = 0;
};

struct EmulationOptions {
  int devices = 1;  // named "emu_ib0", ... (InfiniBand) or "emu_roce0", ... (Ethernet)
  LinkLayer link_layer = LinkLayer::kInfiniBand;
  int active_mtu = 4096;
  int max_inline_data = 128;  // what QPs are granted at most
  // Non-empty: a linked emulation, one node of this fabric of processes
  // (1 to 64 characters, no '/'; VerbsEmulation::Open).
  std::string fabric;
};

struct EmulationStats {
  uint64_t reg_mr = 0;      // registrations made (ibv_reg_mr, ibv_reg_dmabuf_mr)
  uint64_t dereg_mr = 0;
  uint64_t live_mrs = 0;
  uint64_t writes = 0;      // RDMA WRITE (with or without immediate) delivered
  uint64_t sends = 0;       // SEND delivered
  uint64_t write_bytes = 0;
  uint64_t send_bytes = 0;
  uint64_t inline_sends = 0;
  uint64_t rnr_waits = 0;   // deliveries that waited for a receive
  uint64_t sq_full = 0;     // posts refused because the send queue was full
  int max_sq_outstanding = 0;  // most work requests one send queue held
};

class VerbsEmulation {
 public:
  // An emulation of this process alone (options.fabric empty).
  explicit VerbsEmulation(EmulationOptions options = {});
  // Either kind; a linked one binds its node on the fabric (errors name why).
  static absl::StatusOr<std::unique_ptr<VerbsEmulation>> Open(EmulationOptions options);
  ~VerbsEmulation();
  VerbsEmulation(const VerbsEmulation&) = delete;
  VerbsEmulation& operator=(const VerbsEmulation&) = delete;

  const VerbsTable& verbs() const;
  void SetFaults(const EmulatedFaults& faults);
  EmulationStats stats() const;
  // This process's node on a linked fabric (LIDs node*16+i+1; GID bytes
  // 13-14); 0 when unlinked.
  int node() const;

  class Fabric;  // verbs_emulation_fabric.h

 private:
  explicit VerbsEmulation(std::unique_ptr<Fabric> fabric);
  std::unique_ptr<Fabric> fabric_;
};

}  // namespace gradsync::rdma

#endif  // GRADSYNC_RDMA_VERBS_EMULATION_H_
