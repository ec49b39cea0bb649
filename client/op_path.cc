#include "client/op_path.h"

#include "absl/strings/str_cat.h"

namespace gradsync {
namespace client {
namespace internal {

bool Overlap(const PathOp& a, const PathOp& b) {
  if (a.data == nullptr || b.data == nullptr || a.bytes == 0 || b.bytes == 0) return false;
  if (a.args.buffer_id != b.args.buffer_id) return false;
  const uint64_t a0 = a.args.offset_bytes, b0 = b.args.offset_bytes;
  return a0 < b0 + b.bytes && b0 < a0 + a.bytes;
}

absl::Status NotPendingError(uint64_t op_id, absl::string_view session_id) {
  return absl::NotFoundError(absl::StrCat("op ", op_id, " is not pending in session ", session_id,
                                          " (already reported, or never submitted)"));
}

}  // namespace internal
}  // namespace client
}  // namespace gradsync
