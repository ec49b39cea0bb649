#include "client/c_api.h"

#include <memory>
#include <string>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "client/client.h"
#include "common/types.h"

struct gs_client {
  std::unique_ptr<gradsync::client::Client> impl;
};

struct gs_session {
  std::unique_ptr<gradsync::client::Session> impl;
};

struct gs_buffer {
  std::unique_ptr<gradsync::client::Buffer> impl;
};

// The C constants are the C++ enum values (and so the proto enum values).
static_assert(GS_DTYPE_F32 == static_cast<int>(gradsync::DType::kF32), "dtype");
static_assert(GS_DTYPE_F64 == static_cast<int>(gradsync::DType::kF64), "dtype");
static_assert(GS_DTYPE_F16 == static_cast<int>(gradsync::DType::kF16), "dtype");
static_assert(GS_DTYPE_BF16 == static_cast<int>(gradsync::DType::kBF16), "dtype");
static_assert(GS_DTYPE_I32 == static_cast<int>(gradsync::DType::kI32), "dtype");
static_assert(GS_DTYPE_I64 == static_cast<int>(gradsync::DType::kI64), "dtype");
static_assert(GS_DTYPE_U8 == static_cast<int>(gradsync::DType::kU8), "dtype");
static_assert(GS_OP_SUM == static_cast<int>(gradsync::ReduceOp::kSum), "op");
static_assert(GS_OP_AVG == static_cast<int>(gradsync::ReduceOp::kAvg), "op");
static_assert(GS_OP_MIN == static_cast<int>(gradsync::ReduceOp::kMin), "op");
static_assert(GS_OP_MAX == static_cast<int>(gradsync::ReduceOp::kMax), "op");
static_assert(GS_OP_PROD == static_cast<int>(gradsync::ReduceOp::kProd), "op");
static_assert(GS_INVALID_ARGUMENT == static_cast<int>(absl::StatusCode::kInvalidArgument), "code");
static_assert(GS_DEADLINE_EXCEEDED == static_cast<int>(absl::StatusCode::kDeadlineExceeded), "code");
static_assert(GS_ABORTED == static_cast<int>(absl::StatusCode::kAborted), "code");
static_assert(GS_UNAVAILABLE == static_cast<int>(absl::StatusCode::kUnavailable), "code");
static_assert(GS_UNAUTHENTICATED == static_cast<int>(absl::StatusCode::kUnauthenticated), "code");

namespace {

using gradsync::DType;
using gradsync::ReduceOp;

thread_local std::string t_last_error;

int Fail(const absl::Status& status) {
  t_last_error = std::string(status.message());
  return static_cast<int>(status.code());
}

int Fail(absl::StatusCode code, std::string message) {
  return Fail(absl::Status(code, std::move(message)));
}

int Report(const absl::Status& status) { return status.ok() ? GS_OK : Fail(status); }

int NullArg(const char* fn, const char* arg) {
  return Fail(absl::StatusCode::kInvalidArgument, absl::StrCat(fn, ": ", arg, " is NULL"));
}

// Checks the C-only arguments (pointers, enum values) of an allreduce.
int CheckAllreduceArgs(const char* fn, gs_session* session, gs_buffer* buffer, int dtype, int op,
                       int64_t timeout_ms) {
  if (session == nullptr) return NullArg(fn, "session");
  if (buffer == nullptr) return NullArg(fn, "buffer");
  if (!gradsync::IsValidDType(dtype)) {
    return Fail(absl::StatusCode::kInvalidArgument,
                absl::StrCat(fn, ": dtype ", dtype,
                             " is not a GS_DTYPE_* value (1..7: f32 f64 f16 bf16 i32 i64 u8)"));
  }
  if (!gradsync::IsValidReduceOp(op)) {
    return Fail(absl::StatusCode::kInvalidArgument,
                absl::StrCat(fn, ": op ", op,
                             " is not a GS_OP_* value (1..5: sum avg min max prod)"));
  }
  if (timeout_ms < 0) {
    return Fail(absl::StatusCode::kInvalidArgument,
                absl::StrCat(fn, ": timeout_ms must be >= 0, got ", timeout_ms));
  }
  return GS_OK;
}

}  // namespace

extern "C" {

const char* gs_last_error(void) { return t_last_error.c_str(); }

int gs_client_connect(const char* target, int64_t timeout_ms, gs_client** out) {
  if (target == nullptr) return NullArg("gs_client_connect", "target");
  if (out == nullptr) return NullArg("gs_client_connect", "out");
  if (timeout_ms <= 0) {
    return Fail(absl::StatusCode::kInvalidArgument,
                absl::StrCat("gs_client_connect: timeout_ms must be > 0, got ", timeout_ms));
  }
  auto client = gradsync::client::Client::Connect(target, absl::Milliseconds(timeout_ms));
  if (!client.ok()) return Fail(client.status());
  *out = new gs_client{std::move(*client)};
  return GS_OK;
}

void gs_client_free(gs_client* client) { delete client; }

int gs_session_open(gs_client* client, const char* job_id, int world_size, int rank,
                    int64_t timeout_ms, gs_session** out) {
  if (client == nullptr) return NullArg("gs_session_open", "client");
  if (job_id == nullptr) return NullArg("gs_session_open", "job_id");
  if (out == nullptr) return NullArg("gs_session_open", "out");
  if (timeout_ms <= 0) {
    return Fail(absl::StatusCode::kInvalidArgument,
                absl::StrCat("gs_session_open: timeout_ms must be > 0, got ", timeout_ms));
  }
  gradsync::client::SessionOptions options;
  options.job_id = job_id;
  options.world_size = world_size;
  options.rank = rank;
  options.timeout = absl::Milliseconds(timeout_ms);
  options.client_name = "c_api";
  auto session = client->impl->OpenSession(options);
  if (!session.ok()) return Fail(session.status());
  *out = new gs_session{std::move(*session)};
  return GS_OK;
}

int gs_session_rank(const gs_session* session) {
  return session == nullptr ? -1 : session->impl->rank();
}

int gs_session_world_size(const gs_session* session) {
  return session == nullptr ? -1 : session->impl->world_size();
}

int gs_session_close(gs_session* session) {
  if (session == nullptr) return GS_OK;
  const absl::Status status = session->impl->Close();
  delete session;
  return Report(status);
}

int gs_buffer_alloc(gs_session* session, size_t bytes, gs_buffer** out) {
  if (session == nullptr) return NullArg("gs_buffer_alloc", "session");
  if (out == nullptr) return NullArg("gs_buffer_alloc", "out");
  auto buffer = session->impl->AllocateBuffer(bytes);
  if (!buffer.ok()) return Fail(buffer.status());
  *out = new gs_buffer{std::move(*buffer)};
  return GS_OK;
}

void* gs_buffer_data(gs_buffer* buffer) {
  return buffer == nullptr ? nullptr : buffer->impl->data();
}

size_t gs_buffer_size(const gs_buffer* buffer) {
  return buffer == nullptr ? 0 : buffer->impl->size();
}

int gs_buffer_free(gs_session* session, gs_buffer* buffer) {
  if (buffer == nullptr) return GS_OK;
  std::unique_ptr<gradsync::client::Buffer> impl = std::move(buffer->impl);
  delete buffer;
  if (session == nullptr) return GS_OK;  // just unmaps (impl goes out of scope)
  return Report(session->impl->FreeBuffer(std::move(impl)));
}

int gs_allreduce_async(gs_session* session, gs_buffer* buffer, size_t offset_bytes, size_t count,
                       int dtype, int op, const char* name, int64_t timeout_ms, uint64_t* op_id) {
  if (op_id == nullptr) return NullArg("gs_allreduce_async", "op_id");
  if (int rc = CheckAllreduceArgs("gs_allreduce_async", session, buffer, dtype, op, timeout_ms)) {
    return rc;
  }
  auto handle = session->impl->AllreduceAsync(
      *buffer->impl, offset_bytes, count, static_cast<DType>(dtype), static_cast<ReduceOp>(op),
      name == nullptr ? "" : name, absl::Milliseconds(timeout_ms));
  if (!handle.ok()) return Fail(handle.status());
  *op_id = handle->op_id;
  return GS_OK;
}

int gs_wait(gs_session* session, uint64_t op_id, int64_t timeout_ms) {
  if (session == nullptr) return NullArg("gs_wait", "session");
  if (timeout_ms < -1) {
    return Fail(absl::StatusCode::kInvalidArgument,
                absl::StrCat("gs_wait: timeout_ms must be >= -1, got ", timeout_ms));
  }
  gradsync::client::OpHandle handle;
  handle.op_id = op_id;
  const absl::Duration timeout =
      timeout_ms == -1 ? absl::InfiniteDuration() : absl::Milliseconds(timeout_ms);
  return Report(session->impl->Wait(handle, timeout).status());
}

int gs_allreduce(gs_session* session, gs_buffer* buffer, size_t offset_bytes, size_t count,
                 int dtype, int op, const char* name, int64_t timeout_ms) {
  if (int rc = CheckAllreduceArgs("gs_allreduce", session, buffer, dtype, op, timeout_ms)) {
    return rc;
  }
  auto result = session->impl->Allreduce(*buffer->impl, offset_bytes, count,
                                         static_cast<DType>(dtype), static_cast<ReduceOp>(op),
                                         name == nullptr ? "" : name,
                                         absl::Milliseconds(timeout_ms));
  return Report(result.status());
}

}  // extern "C"
