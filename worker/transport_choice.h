// Which transport a job epoch's daemons connect over (gradsyncd --transport),
// decided the same way by every daemon of the epoch from what each one
// advertised through the coordinator (Endpoint.rdma, rdma_required), so they
// all agree, and all fail alike, without another round trip.
#ifndef GRADSYNC_WORKER_TRANSPORT_CHOICE_H_
#define GRADSYNC_WORKER_TRANSPORT_CHOICE_H_

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace gradsync {

enum class TransportMode {
  kAuto,  // RDMA when every daemon of the epoch has the same kind of RDMA port, else TCP
  kTcp,   // TCP always (and no RDMA port advertised)
  kRdma,  // RDMA or nothing: the daemon needs a port, and a job that cannot use it fails
};

absl::StatusOr<TransportMode> ParseTransportMode(absl::string_view s);  // "auto", "tcp", "rdma"
const char* TransportModeName(TransportMode m);

// What one daemon of the epoch (or a PS shard) advertised.
struct TransportAdvert {
  std::string rdma;       // its RDMA port ("ib", "roce", ...; "" = none)
  bool required = false;  // it runs --transport=rdma
  std::string name;       // how errors name it ("daemon 2 (host:port)", "ps shard 0 (...)")
};

struct TransportChoice {
  bool rdma = false;
  // Why TCP, when some daemon of the epoch has RDMA ("" when RDMA, when no
  // daemon has it, or when this daemon runs --transport=tcp).
  std::string why_not_rdma;
};

// The epoch's transport, from every daemon's advert (`daemons`, by index). A
// data-TLS job never runs over RDMA (its traffic would not be encrypted).
// When a daemon requires RDMA and the epoch cannot use it, every daemon
// fails with the same FailedPrecondition, naming the daemons and the cause.
absl::StatusOr<TransportChoice> ChooseTransport(TransportMode mode,
                                                const std::vector<TransportAdvert>& daemons,
                                                bool data_tls, absl::string_view job_id);

}  // namespace gradsync

#endif  // GRADSYNC_WORKER_TRANSPORT_CHOICE_H_
