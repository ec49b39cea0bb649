// Internal to rdma/verbs.cc and rdma/verbs_qp.cc: errno mapping and the
// byte helpers of the endpoint format. Not for other users.
#ifndef GRADSYNC_RDMA_VERBS_INTERNAL_H_
#define GRADSYNC_RDMA_VERBS_INTERNAL_H_

#include <infiniband/verbs.h>

#include <array>
#include <cerrno>
#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "rdma/verbs.h"

namespace gradsync {
namespace rdma {
namespace verbs_internal {

// A failed verb: `what` names the call and its arguments, `err` is the errno
// value. The code follows the errno (ENOMEM -> kResourceExhausted, ...).
inline absl::Status VerbError(absl::string_view what, int err) {
  std::string msg = absl::StrCat(what, " failed: ", ErrnoText(err));
  switch (err) {
    case ENOMEM: return absl::ResourceExhaustedError(msg);
    case EINVAL:
    case EFAULT: return absl::InvalidArgumentError(msg);
    case EACCES:
    case EPERM: return absl::PermissionDeniedError(msg);
    case ENOSYS:
    case ENODEV:
    case ENXIO: return absl::UnavailableError(msg);
    default: return absl::InternalError(msg);
  }
}

// The value of errno after a verb returned NULL / -1, never 0.
inline int LastErrno() { return errno != 0 ? errno : EIO; }
// For verbs that return an errno value (0 on success) but may also set errno.
inline int ErrFromRc(int rc) { return rc > 0 ? rc : LastErrno(); }

inline ibv_mtu MtuEnum(int bytes) {
  if (bytes >= 4096) return IBV_MTU_4096;
  if (bytes >= 2048) return IBV_MTU_2048;
  if (bytes >= 1024) return IBV_MTU_1024;
  if (bytes >= 512) return IBV_MTU_512;
  return IBV_MTU_256;
}

inline std::string GidText(const std::array<uint8_t, 16>& gid) {
  std::string out;
  for (int i = 0; i < 16; i += 2) {
    if (i > 0) out += ':';
    absl::StrAppend(&out, absl::Hex((gid[i] << 8) | gid[i + 1], absl::kZeroPad4));
  }
  return out;
}

inline void PutBe16(uint8_t* p, uint16_t v) {
  p[0] = static_cast<uint8_t>(v >> 8);
  p[1] = static_cast<uint8_t>(v);
}
inline void PutBe32(uint8_t* p, uint32_t v) {
  for (int i = 0; i < 4; ++i) p[i] = static_cast<uint8_t>(v >> (24 - 8 * i));
}
inline uint16_t GetBe16(const uint8_t* p) { return static_cast<uint16_t>((p[0] << 8) | p[1]); }
inline uint32_t GetBe32(const uint8_t* p) {
  return (uint32_t{p[0]} << 24) | (uint32_t{p[1]} << 16) | (uint32_t{p[2]} << 8) | p[3];
}

inline constexpr uint32_t k24Bits = 0xffffff;
inline constexpr int kAccessFlags =
    IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ;

}  // namespace verbs_internal
}  // namespace rdma
}  // namespace gradsync

#endif  // GRADSYNC_RDMA_VERBS_INTERNAL_H_
