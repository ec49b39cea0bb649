#include "worker/transport_choice.h"

#include "absl/strings/str_cat.h"

namespace gradsync {

absl::StatusOr<TransportMode> ParseTransportMode(absl::string_view s) {
  if (s == "auto") return TransportMode::kAuto;
  if (s == "tcp") return TransportMode::kTcp;
  if (s == "rdma") return TransportMode::kRdma;
  return absl::InvalidArgumentError(
      absl::StrCat("--transport '", s, "': expected auto, tcp or rdma"));
}

const char* TransportModeName(TransportMode m) {
  switch (m) {
    case TransportMode::kAuto:
      return "auto";
    case TransportMode::kTcp:
      return "tcp";
    case TransportMode::kRdma:
      return "rdma";
  }
  return "?";
}

namespace {

const std::string& Name(const std::vector<TransportAdvert>& daemons, size_t i) {
  return daemons[i].name;
}

// Why the epoch cannot run over RDMA ("" when it can). The same words on
// every daemon: it looks at the adverts in index order, not from one side.
std::string WhyNotRdma(const std::vector<TransportAdvert>& daemons, bool data_tls) {
  if (data_tls) return "the job encrypts its data plane (data_tls), which RDMA cannot";
  for (size_t i = 0; i < daemons.size(); ++i) {
    if (daemons[i].rdma.empty()) return absl::StrCat(Name(daemons, i), " has no RDMA port");
  }
  for (size_t i = 1; i < daemons.size(); ++i) {
    if (daemons[i].rdma != daemons[0].rdma) {
      return absl::StrCat(Name(daemons, i), " has RDMA '", daemons[i].rdma, "', ",
                          Name(daemons, 0), " '", daemons[0].rdma, "'");
    }
  }
  return "";
}

}  // namespace

absl::StatusOr<TransportChoice> ChooseTransport(TransportMode mode,
                                                const std::vector<TransportAdvert>& daemons,
                                                bool data_tls, absl::string_view job_id) {
  TransportChoice c;
  const std::string why = WhyNotRdma(daemons, data_tls);
  for (size_t i = 0; i < daemons.size(); ++i) {
    if (daemons[i].required && !why.empty()) {
      return absl::FailedPreconditionError(absl::StrCat(
          "job '", job_id, "' cannot run over RDMA: ", why, "; ", Name(daemons, i),
          " runs --transport=rdma (--transport=auto falls back to TCP)"));
    }
  }
  if (mode == TransportMode::kTcp) return c;
  if (why.empty()) {
    c.rdma = true;
    return c;
  }
  // Say why only where RDMA was in reach: a cluster without it is the
  // ordinary TCP cluster, not news.
  for (const TransportAdvert& d : daemons) {
    if (!d.rdma.empty()) c.why_not_rdma = why;
  }
  return c;
}

}  // namespace gradsync
