#include "client/c_api.h"

#include <algorithm>
#include <cstddef>
#include <cstring>
#include <memory>
#include <string>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "client/client.h"
#include "collective/op_validation.h"
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
static_assert(GS_DTYPE_F8E4M3 == static_cast<int>(gradsync::DType::kF8E4M3), "dtype");
static_assert(GS_DTYPE_F8E5M2 == static_cast<int>(gradsync::DType::kF8E5M2), "dtype");
static_assert(GS_OP_SUM == static_cast<int>(gradsync::ReduceOp::kSum), "op");
static_assert(GS_OP_AVG == static_cast<int>(gradsync::ReduceOp::kAvg), "op");
static_assert(GS_OP_MIN == static_cast<int>(gradsync::ReduceOp::kMin), "op");
static_assert(GS_OP_MAX == static_cast<int>(gradsync::ReduceOp::kMax), "op");
static_assert(GS_OP_PROD == static_cast<int>(gradsync::ReduceOp::kProd), "op");
static_assert(GS_OP_PREMUL_SUM == static_cast<int>(gradsync::ReduceOp::kPremulSum), "op");
static_assert(GS_ALLREDUCE == static_cast<int>(gradsync::CollectiveKind::kAllreduce), "kind");
static_assert(GS_REDUCE_SCATTER == static_cast<int>(gradsync::CollectiveKind::kReduceScatter), "kind");
static_assert(GS_ALLGATHER == static_cast<int>(gradsync::CollectiveKind::kAllgather), "kind");
static_assert(GS_BROADCAST == static_cast<int>(gradsync::CollectiveKind::kBroadcast), "kind");
static_assert(GS_REDUCE == static_cast<int>(gradsync::CollectiveKind::kReduce), "kind");
static_assert(GS_ALLTOALL == static_cast<int>(gradsync::CollectiveKind::kAlltoall), "kind");
static_assert(GS_BARRIER == static_cast<int>(gradsync::CollectiveKind::kBarrier), "kind");
static_assert(GS_GATHER == static_cast<int>(gradsync::CollectiveKind::kGather), "kind");
static_assert(GS_SCATTER == static_cast<int>(gradsync::CollectiveKind::kScatter), "kind");
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
  if (gradsync::client::IsStillRunning(status)) return GS_PENDING;
  return static_cast<int>(status.code());
}

int Fail(absl::StatusCode code, std::string message) {
  return Fail(absl::Status(code, std::move(message)));
}

int Report(const absl::Status& status) { return status.ok() ? GS_OK : Fail(status); }

int NullArg(const char* fn, const char* arg) {
  return Fail(absl::StatusCode::kInvalidArgument, absl::StrCat(fn, ": ", arg, " is NULL"));
}

// The prefix of a caller's struct that this library knows: a shorter (older)
// struct leaves the rest at its defaults.
template <typename T>
bool CopyStruct(const T* in, T* out, void (*init)(T*)) {
  init(out);
  if (in->struct_size < offsetof(T, struct_size) + sizeof(uint32_t)) return false;
  const size_t n = std::min<size_t>(in->struct_size, sizeof(T));
  std::memcpy(static_cast<void*>(out), in, n);
  out->struct_size = sizeof(T);
  return true;
}

int BadStruct(const char* fn, const char* type) {
  return Fail(absl::StatusCode::kInvalidArgument,
              absl::StrCat(fn, ": ", type, ".struct_size is not set (call ", type, "_init first)"));
}

void FillResult(const gradsync::client::OpResult& r, gs_result* out) {
  if (out == nullptr) return;
  std::memset(out->algorithm, 0, sizeof(out->algorithm));
  std::memcpy(out->algorithm, r.algorithm.data(),
              std::min(r.algorithm.size(), sizeof(out->algorithm) - 1));
  out->queued_us = absl::ToInt64Microseconds(r.queued_time);
  out->run_us = absl::ToInt64Microseconds(r.run_time);
}

// Fills a caller's gs_op_info of any known size (struct_size) from `r`.
int FillInfo(const char* fn, const gradsync::client::OpResult& r, gs_op_info* out) {
  if (out == nullptr) return GS_OK;
  gs_op_info full;
  if (!CopyStruct(out, &full, gs_op_info_init)) return BadStruct(fn, "gs_op_info");
  const uint32_t caller_size = out->struct_size;
  std::memcpy(full.algorithm, r.algorithm.data(),
              std::min(r.algorithm.size(), sizeof(full.algorithm) - 1));
  full.queued_us = absl::ToInt64Microseconds(r.queued_time);
  full.run_us = absl::ToInt64Microseconds(r.run_time);
  full.source = r.source;
  std::memcpy(static_cast<void*>(out), &full, std::min<size_t>(caller_size, sizeof(full)));
  out->struct_size = caller_size;
  return GS_OK;
}

// gs_wait_result, gs_poll and their gs_op_info forms: waits up to
// timeout_ms (-1: until the op ends; 0: a poll) for op `op_id`.
int WaitFor(const char* fn, gs_session* session, uint64_t op_id, int64_t timeout_ms,
            gradsync::client::OpResult* out) {
  if (session == nullptr) return NullArg(fn, "session");
  if (timeout_ms < -1) {
    return Fail(absl::StatusCode::kInvalidArgument,
                absl::StrCat(fn, ": timeout_ms must be >= -1, got ", timeout_ms));
  }
  gradsync::client::OpHandle handle;
  handle.op_id = op_id;
  const absl::Duration timeout =
      timeout_ms == -1 ? absl::InfiniteDuration() : absl::Milliseconds(timeout_ms);
  auto r = session->impl->Wait(handle, timeout);
  if (!r.ok()) return Fail(r.status());
  *out = *std::move(r);
  return GS_OK;
}

// The C edge of an op: gs_collective_spec to the SDK's CollectiveSpec, the
// one conversion (NULL-safe strings, the int32 enums narrowed by SetOpEnums).
// Checks only what C adds (NULL pointers, struct_size); the SDK's
// ValidateOp checks the op.
int ToSpec(const char* fn, gs_session* session, const gs_collective_spec* in,
           gradsync::client::CollectiveSpec* spec) {
  if (session == nullptr) return NullArg(fn, "session");
  if (in == nullptr) return NullArg(fn, "spec");
  gs_collective_spec c;
  if (!CopyStruct(in, &c, gs_collective_spec_init)) return BadStruct(fn, "gs_collective_spec");
  if (c.buffer == nullptr && c.kind != GS_BARRIER) return NullArg(fn, "spec->buffer");
  spec->name = c.name != nullptr ? c.name : "";
  gradsync::OpContext ctx;
  ctx.rank = session->impl->rank();
  ctx.world_size = session->impl->world_size();
  if (absl::Status s = gradsync::SetOpEnums(c.kind, c.dtype, c.op, ctx, spec); !s.ok()) {
    return Fail(s);
  }
  spec->buffer = c.buffer != nullptr ? c.buffer->impl.get() : nullptr;
  spec->offset_bytes = c.offset_bytes;
  spec->count = c.count;
  spec->root = c.root;
  spec->algorithm = c.algorithm != nullptr ? c.algorithm : "";
  spec->timeout = absl::Milliseconds(c.timeout_ms);
  spec->tag = c.tag;
  spec->premul_factor = c.premul_factor;
  spec->codec = c.codec != nullptr ? c.codec : "";
  return GS_OK;
}

// The allreduce of the entry points that predate gs_collective_spec
// (gs_allreduce_async, gs_allreduce): thin wrappers of gs_submit and gs_run.
gs_collective_spec AllreduceSpec(gs_buffer* buffer, size_t offset_bytes, size_t count, int dtype,
                                 int op, const char* name, int64_t timeout_ms) {
  gs_collective_spec spec;
  gs_collective_spec_init(&spec);
  spec.kind = GS_ALLREDUCE;
  spec.buffer = buffer;
  spec.offset_bytes = offset_bytes;
  spec.count = count;
  spec.dtype = dtype;
  spec.op = op;
  spec.name = name;
  spec.timeout_ms = timeout_ms;
  return spec;
}

// gs_submit, with `fn` naming the entry point in errors.
int Submit(const char* fn, gs_session* session, const gs_collective_spec* spec, uint64_t* op_id) {
  if (op_id == nullptr) return NullArg(fn, "op_id");
  gradsync::client::CollectiveSpec c;
  if (int rc = ToSpec(fn, session, spec, &c)) return rc;
  auto handle = session->impl->SubmitAsync(c);
  if (!handle.ok()) return Fail(handle.status());
  *op_id = handle->op_id;
  return GS_OK;
}

// gs_run, with `fn` naming the entry point in errors.
int Run(const char* fn, gs_session* session, const gs_collective_spec* spec, gs_result* result) {
  gradsync::client::CollectiveSpec c;
  if (int rc = ToSpec(fn, session, spec, &c)) return rc;
  auto r = session->impl->Run(c);
  if (!r.ok()) return Fail(r.status());
  FillResult(*r, result);
  return GS_OK;
}

}  // namespace

extern "C" {

void gs_session_options_init(gs_session_options* options) {
  if (options == nullptr) return;
  std::memset(static_cast<void*>(options), 0, sizeof(*options));
  options->struct_size = sizeof(*options);
  options->world_size = 1;
  options->rank = -1;
  options->timeout_ms = 60000;
}

void gs_collective_spec_init(gs_collective_spec* spec) {
  if (spec == nullptr) return;
  std::memset(static_cast<void*>(spec), 0, sizeof(*spec));
  spec->struct_size = sizeof(*spec);
  spec->kind = GS_ALLREDUCE;
  spec->dtype = GS_DTYPE_F32;
  spec->op = GS_OP_SUM;
  spec->premul_factor = 1.0;
}

void gs_op_info_init(gs_op_info* info) {
  if (info == nullptr) return;
  std::memset(static_cast<void*>(info), 0, sizeof(*info));
  info->struct_size = sizeof(*info);
  info->source = -1;
}

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

int gs_session_open_with(gs_client* client, const gs_session_options* in, gs_session** out) {
  constexpr const char* fn = "gs_session_open_with";
  if (client == nullptr) return NullArg(fn, "client");
  if (in == nullptr) return NullArg(fn, "options");
  if (out == nullptr) return NullArg(fn, "out");
  gs_session_options o;
  if (!CopyStruct(in, &o, gs_session_options_init)) return BadStruct(fn, "gs_session_options");
  if (o.job_id == nullptr) return NullArg(fn, "options->job_id");
  if (o.timeout_ms <= 0) {
    return Fail(absl::StatusCode::kInvalidArgument,
                absl::StrCat(fn, ": timeout_ms must be > 0, got ", o.timeout_ms));
  }
  gradsync::client::SessionOptions options;
  options.job_id = o.job_id;
  options.world_size = o.world_size;
  options.rank = o.rank;
  options.timeout = absl::Milliseconds(o.timeout_ms);
  options.heartbeat_timeout_ms = o.heartbeat_timeout_ms;
  options.op_timeout_ms = o.op_timeout_ms;
  options.tcp_streams = o.tcp_streams;
  options.algorithm = o.algorithm != nullptr ? o.algorithm : "";
  options.codec = o.codec != nullptr ? o.codec : "";
  options.timeline = o.timeline != 0;
  options.ps_shards = o.ps_shards;
  options.client_name = o.client_name != nullptr ? o.client_name : "c_api";
  options.tenant_token = o.tenant_token != nullptr ? o.tenant_token : "";
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

int gs_buffer_register_fd(gs_session* session, int fd, uint64_t offset, size_t bytes,
                          gs_buffer** out) {
  if (session == nullptr) return NullArg("gs_buffer_register_fd", "session");
  if (out == nullptr) return NullArg("gs_buffer_register_fd", "out");
  auto buffer = session->impl->RegisterBuffer(fd, bytes, offset);
  if (!buffer.ok()) return Fail(buffer.status());
  *out = new gs_buffer{std::move(*buffer)};
  return GS_OK;
}

int gs_buffer_adopt(gs_session* session, void* ptr, size_t bytes, gs_buffer** out,
                    size_t* offset_bytes) {
  if (session == nullptr) return NullArg("gs_buffer_adopt", "session");
  if (out == nullptr) return NullArg("gs_buffer_adopt", "out");
  if (offset_bytes == nullptr) return NullArg("gs_buffer_adopt", "offset_bytes");
  auto buffer = session->impl->AdoptMemory(ptr, bytes, offset_bytes);
  if (!buffer.ok()) return Fail(buffer.status());
  *out = new gs_buffer{std::move(*buffer)};
  return GS_OK;
}

int gs_buffer_alloc_device(gs_session* session, size_t bytes, int cuda_device, gs_buffer** out) {
  if (session == nullptr) return NullArg("gs_buffer_alloc_device", "session");
  if (out == nullptr) return NullArg("gs_buffer_alloc_device", "out");
  auto buffer = session->impl->AllocateDeviceBuffer(bytes, cuda_device);
  if (!buffer.ok()) return Fail(buffer.status());
  *out = new gs_buffer{std::move(*buffer)};
  return GS_OK;
}

int gs_buffer_register_device(gs_session* session, void* device_ptr, size_t bytes,
                              gs_buffer** out) {
  if (session == nullptr) return NullArg("gs_buffer_register_device", "session");
  if (out == nullptr) return NullArg("gs_buffer_register_device", "out");
  auto buffer = session->impl->RegisterDeviceBuffer(device_ptr, bytes);
  if (!buffer.ok()) return Fail(buffer.status());
  *out = new gs_buffer{std::move(*buffer)};
  return GS_OK;
}

int gs_buffer_cuda_device(const gs_buffer* buffer) {
  return buffer == nullptr ? -1 : buffer->impl->cuda_device();
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
  if (buffer == nullptr) return NullArg("gs_allreduce_async", "buffer");  // not "spec->buffer"
  const gs_collective_spec spec =
      AllreduceSpec(buffer, offset_bytes, count, dtype, op, name, timeout_ms);
  return Submit("gs_allreduce_async", session, &spec, op_id);
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
  if (buffer == nullptr) return NullArg("gs_allreduce", "buffer");  // not "spec->buffer"
  const gs_collective_spec spec =
      AllreduceSpec(buffer, offset_bytes, count, dtype, op, name, timeout_ms);
  return Run("gs_allreduce", session, &spec, nullptr);
}

int gs_submit(gs_session* session, const gs_collective_spec* spec, uint64_t* op_id) {
  return Submit("gs_submit", session, spec, op_id);
}

int gs_wait_result(gs_session* session, uint64_t op_id, int64_t timeout_ms, gs_result* result) {
  gradsync::client::OpResult r;
  if (int rc = WaitFor("gs_wait_result", session, op_id, timeout_ms, &r)) return rc;
  FillResult(r, result);
  return GS_OK;
}

int gs_poll(gs_session* session, uint64_t op_id, gs_result* result) {
  gradsync::client::OpResult r;
  if (int rc = WaitFor("gs_poll", session, op_id, 0, &r)) return rc;
  FillResult(r, result);
  return GS_OK;
}

int gs_wait_info(gs_session* session, uint64_t op_id, int64_t timeout_ms, gs_op_info* info) {
  gradsync::client::OpResult r;
  if (int rc = WaitFor("gs_wait_info", session, op_id, timeout_ms, &r)) return rc;
  return FillInfo("gs_wait_info", r, info);
}

int gs_poll_info(gs_session* session, uint64_t op_id, gs_op_info* info) {
  gradsync::client::OpResult r;
  if (int rc = WaitFor("gs_poll_info", session, op_id, 0, &r)) return rc;
  return FillInfo("gs_poll_info", r, info);
}

int gs_run(gs_session* session, const gs_collective_spec* spec, gs_result* result) {
  return Run("gs_run", session, spec, result);
}

int gs_session_event_fd(gs_session* session, int* fd) {
  if (session == nullptr) return NullArg("gs_session_event_fd", "session");
  if (fd == nullptr) return NullArg("gs_session_event_fd", "fd");
  auto r = session->impl->CompletionFd();
  if (!r.ok()) return Fail(r.status());
  *fd = *r;
  return GS_OK;
}

}  // extern "C"
