// Small status helpers (Debian's Abseil 20220623 has no status macros).
#ifndef GRADSYNC_COMMON_STATUS_MACROS_H_
#define GRADSYNC_COMMON_STATUS_MACROS_H_

#include "absl/status/status.h"
#include "absl/status/statusor.h"

#define GS_CONCAT_INNER_(a, b) a##b
#define GS_CONCAT_(a, b) GS_CONCAT_INNER_(a, b)

// Returns from the current function if `expr` (an absl::Status) is not OK.
#define RETURN_IF_ERROR(expr)                         \
  do {                                                \
    ::absl::Status gs_status_ = (expr);               \
    if (!gs_status_.ok()) return gs_status_;          \
  } while (0)

// ASSIGN_OR_RETURN(lhs, expr): evaluates the StatusOr `expr`; on error returns
// its status, otherwise moves the value into `lhs` (which may be a declaration).
#define ASSIGN_OR_RETURN(lhs, expr) \
  GS_ASSIGN_OR_RETURN_IMPL_(GS_CONCAT_(gs_statusor_, __LINE__), lhs, expr)
#define GS_ASSIGN_OR_RETURN_IMPL_(tmp, lhs, expr) \
  auto tmp = (expr);                              \
  if (!tmp.ok()) return tmp.status();             \
  lhs = std::move(tmp).value()

#endif  // GRADSYNC_COMMON_STATUS_MACROS_H_
