#include "client/client.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <limits>
#include <utility>

#include <grpcpp/client_context.h>
#include <grpcpp/create_channel.h>
#include <grpcpp/security/credentials.h>
#include <grpcpp/support/channel_arguments.h>

#include "absl/strings/match.h"
#include "absl/strings/cord.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "absl/strings/ascii.h"
#include "client/op_channel.h"
#include "client/shm_op_channel.h"
#include "collective/op_validation.h"
#include "common/clock.h"
#include "ipc/fd_registration.h"
#include "ipc/shared_memory.h"
#include "common/logging.h"
#include "common/status_macros.h"

namespace gradsync {
namespace client {

namespace {
// The payload that marks Wait's "still running" (IsStillRunning).
constexpr char kStillRunningPayload[] = "gradsync.dev/still-running";
}  // namespace

bool IsStillRunning(const absl::Status& s) {
  return absl::IsDeadlineExceeded(s) && s.GetPayload(kStillRunningPayload).has_value();
}
namespace {

using internal::kRpcMargin;
using internal::kRpcTimeout;

// The session's tenant token: the option, else $GRADSYNC_TENANT_TOKEN, else
// the first line of $GRADSYNC_TENANT_TOKEN_FILE, else "".
absl::StatusOr<std::string> TenantToken(const std::string& option) {
  if (!option.empty()) return option;
  if (const char* env = std::getenv("GRADSYNC_TENANT_TOKEN"); env != nullptr && *env != '\0') {
    return std::string(env);
  }
  const char* path = std::getenv("GRADSYNC_TENANT_TOKEN_FILE");
  if (path == nullptr || *path == '\0') return std::string();
  std::ifstream in(path);
  std::string line;
  if (!in || !std::getline(in, line)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "OpenSession: GRADSYNC_TENANT_TOKEN_FILE '", path, "' cannot be read"));
  }
  return std::string(absl::StripAsciiWhitespace(line));
}
// $GRADSYNC_TIMELINE: "1"/"true"/"yes"/"on" switches the job's timeline on.
absl::StatusOr<bool> TimelineFromEnvironment() {
  const char* env = std::getenv("GRADSYNC_TIMELINE");
  if (env == nullptr) return false;
  const std::string v = absl::AsciiStrToLower(absl::StripAsciiWhitespace(env));
  if (v == "1" || v == "true" || v == "yes" || v == "on") return true;
  if (v.empty() || v == "0" || v == "false" || v == "no" || v == "off") return false;
  return absl::InvalidArgumentError(absl::StrCat(
      "OpenSession: GRADSYNC_TIMELINE='", env, "': expected 1 or 0 (true/false, yes/no, on/off)"));
}
using internal::CallWhileAlive;
using internal::RpcError;


const char* ChannelStateName(grpc_connectivity_state s) {
  switch (s) {
    case GRPC_CHANNEL_IDLE: return "IDLE";
    case GRPC_CHANNEL_CONNECTING: return "CONNECTING";
    case GRPC_CHANNEL_READY: return "READY";
    case GRPC_CHANNEL_TRANSIENT_FAILURE: return "TRANSIENT_FAILURE";
    case GRPC_CHANNEL_SHUTDOWN: return "SHUTDOWN";
  }
  return "UNKNOWN";
}

std::string ErrnoText(int err) { return absl::StrCat(std::strerror(err), " (errno ", err, ")"); }

// "allreduce 'grad/w' (op 7, seq 3)", or "op 7" when nothing else is known.
std::string OpLabel(const OpHandle& op) {
  std::string label = op.name.empty()
                          ? absl::StrCat("op ", op.op_id)
                          : absl::StrCat(CollectiveName(op.kind), " '", op.name, "' (op ", op.op_id);
  if (!op.name.empty()) {
    if (op.sequence != 0) absl::StrAppend(&label, ", seq ", op.sequence);
    absl::StrAppend(&label, ")");
  } else if (op.sequence != 0) {
    absl::StrAppend(&label, " (seq ", op.sequence, ")");
  }
  return label;
}

// Maps the daemon's segment; the fd is closed before returning.
absl::StatusOr<void*> MapSegment(const std::string& shm_name, size_t size, uint64_t buffer_id) {
  const int fd = shm_open(shm_name.c_str(), O_RDWR, 0);
  if (fd < 0) {
    const int err = errno;
    return absl::Status(absl::ErrnoToStatusCode(err),
                        absl::StrCat("cannot open shared-memory segment '", shm_name, "' of buffer ",
                                     buffer_id, ": ", ErrnoText(err),
                                     "; gradsyncd and this process must share /dev/shm"));
  }
  absl::StatusOr<void*> data = ipc::MapSharedFile(fd, size, shm_name);
  close(fd);
  return data;
}

}  // namespace

// ---------------------------------------------------------------- Buffer

Buffer::~Buffer() {
  if (on_device()) return;  // device_owner_ closes what the SDK opened
  if (data_ != nullptr && size_ > 0 && munmap(data_, size_) != 0) {
    GS_LOG(WARNING) << "munmap of buffer " << id_ << " (" << shm_name_
                    << ") failed: " << ErrnoText(errno);
  }
}

// ---------------------------------------------------------------- Session

Session::Session(std::shared_ptr<internal::WorkerConnection> conn, std::string id, int rank,
                 int world_size, int64_t epoch, JobFacts job,
                 std::unique_ptr<internal::OpChannel> ops)
    : conn_(std::move(conn)),
      ops_(std::move(ops)),
      id_(std::move(id)),
      rank_(rank),
      world_size_(world_size),
      epoch_(epoch),
      job_(std::move(job)),
      default_op_timeout_(job_.default_op_timeout) {}

Session::~Session() {
  absl::Status s = Close();
  if (!s.ok()) {
    GS_LOG(WARNING) << "closing gradsync session " << id_ << ": " << s;
  }
}

absl::Status Session::CheckOpen() const {
  absl::MutexLock lock(&mu_);
  if (closed_) return absl::FailedPreconditionError(absl::StrCat("session ", id_, " is closed"));
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<Buffer>> Session::AllocateBuffer(size_t bytes) {
  RETURN_IF_ERROR(CheckOpen());
  if (bytes == 0) return absl::InvalidArgumentError("AllocateBuffer: bytes must be > 0, got 0");

  v1::AllocateBufferRequest req;
  req.set_session_id(id_);
  req.set_size_bytes(bytes);
  v1::AllocateBufferResponse resp;
  RETURN_IF_ERROR(CallWhileAlive(*ops_, *conn_, "AllocateBuffer", [&](auto* ctx, auto done) {
    conn_->stub->async()->AllocateBuffer(ctx, &req, &resp, std::move(done));
  }));

  absl::Status error;
  void* data = nullptr;
  if (resp.size_bytes() < bytes || resp.size_bytes() > std::numeric_limits<size_t>::max()) {
    error = absl::InternalError(absl::StrCat("gradsyncd returned a ", resp.size_bytes(),
                                             "-byte buffer for a ", bytes, "-byte request"));
  } else {
    absl::StatusOr<void*> mapped =
        resp.by_descriptor() ? FetchAndMap(resp.buffer_id(), resp.size_bytes())
                             : MapSegment(resp.shm_name(), resp.size_bytes(), resp.buffer_id());
    if (mapped.ok()) {
      data = *mapped;
    } else {
      error = mapped.status();
    }
  }
  if (!error.ok()) {
    // Give the segment back; the daemon would free it at Close anyway.
    v1::FreeBufferRequest free_req;
    free_req.set_session_id(id_);
    free_req.set_buffer_id(resp.buffer_id());
    grpc::ClientContext free_ctx;
    free_ctx.set_deadline(absl::ToChronoTime(absl::Now() + kRpcTimeout));
    v1::FreeBufferResponse free_resp;
    conn_->stub->FreeBuffer(&free_ctx, free_req, &free_resp).IgnoreError();
    return error;
  }
  return std::unique_ptr<Buffer>(new Buffer(
      id_, resp.buffer_id(),
      resp.by_descriptor() ? absl::StrCat("sealed memfd of buffer ", resp.buffer_id())
                           : resp.shm_name(),
      data, resp.size_bytes()));
}

absl::StatusOr<void*> Session::FetchAndMap(uint64_t buffer_id, size_t size) {
  if (job_.fd_socket.empty()) {
    return absl::InternalError(absl::StrCat("gradsyncd at ", conn_->target,
                                            " hands out buffer ", buffer_id,
                                            " by descriptor but announced no fd socket"));
  }
  ipc::FetchRequest request;
  request.session_id = id_;
  request.token = job_.registration_token;
  request.kind = ipc::SegmentKind::kBuffer;
  request.id = buffer_id;
  absl::StatusOr<ipc::FetchedSegment> fetched =
      ipc::FetchSegment(job_.fd_socket, request, absl::Now() + kRpcTimeout);
  if (!fetched.ok()) {
    return absl::Status(fetched.status().code(),
                        absl::StrCat("cannot fetch buffer ", buffer_id, " from ", job_.fd_socket,
                                     ": ", fetched.status().message()));
  }
  return ipc::MapSharedFile(fetched->fd.get(), size, absl::StrCat("buffer ", buffer_id));
}

absl::Status Session::FreeBuffer(std::unique_ptr<Buffer> buffer) {
  if (buffer == nullptr) return absl::InvalidArgumentError("FreeBuffer: buffer is null");
  if (buffer->session_id() != id_) {
    return absl::InvalidArgumentError(absl::StrCat("FreeBuffer: buffer ", buffer->id(),
                                                   " belongs to session ", buffer->session_id(),
                                                   ", not to session ", id_));
  }
  const uint64_t buffer_id = buffer->id();
  buffer.reset();  // unmap first: the daemon may reuse the pages once freed
  {
    absl::MutexLock lock(&mu_);
    if (closed_) return absl::OkStatus();  // Close already freed every segment
  }
  v1::FreeBufferRequest req;
  req.set_session_id(id_);
  req.set_buffer_id(buffer_id);
  v1::FreeBufferResponse resp;
  return CallWhileAlive(*ops_, *conn_, "FreeBuffer", [&](auto* ctx, auto done) {
    conn_->stub->async()->FreeBuffer(ctx, &req, &resp, std::move(done));
  });
}

namespace {
// The allreduce of AllreduceAsync and Allreduce.
CollectiveSpec AllreduceSpec(const Buffer& buffer, size_t offset_bytes, size_t count, DType dtype,
                             ReduceOp op, absl::string_view name, absl::Duration timeout) {
  CollectiveSpec spec;
  spec.kind = CollectiveKind::kAllreduce;
  spec.buffer = &buffer;
  spec.offset_bytes = offset_bytes;
  spec.count = count;
  spec.dtype = dtype;
  spec.op = op;
  spec.name = std::string(name);
  spec.timeout = timeout;
  return spec;
}
}  // namespace

absl::StatusOr<OpHandle> Session::AllreduceAsync(const Buffer& buffer, size_t offset_bytes,
                                                 size_t count, DType dtype, ReduceOp op,
                                                 absl::string_view name, absl::Duration timeout) {
  return SubmitAsync(AllreduceSpec(buffer, offset_bytes, count, dtype, op, name, timeout));
}

absl::StatusOr<OpResult> Session::Allreduce(const Buffer& buffer, size_t offset_bytes,
                                            size_t count, DType dtype, ReduceOp op,
                                            absl::string_view name, absl::Duration timeout) {
  return Run(AllreduceSpec(buffer, offset_bytes, count, dtype, op, name, timeout));
}

absl::StatusOr<OpHandle> Session::SubmitAsync(const CollectiveSpec& spec) {
  RETURN_IF_ERROR(CheckOpen());
  OpContext ctx;  // the job's placement and shards: the daemon checks them
  ctx.rank = rank_;
  ctx.world_size = world_size_;
  ctx.job_algorithm = job_.algorithm;
  ctx.job_codec = job_.codec;
  OpDesc op = spec;
  op.buffer_id = spec.buffer != nullptr ? spec.buffer->id() : 0;
  ASSIGN_OR_RETURN(const OpShape shape, ValidateOp(op, ctx));
  if (spec.buffer != nullptr) {
    if (spec.buffer->session_id() != id_) {
      return absl::InvalidArgumentError(absl::StrCat(
          CollectiveName(op.kind), " '", op.name, "' on rank ", rank_, ": buffer ",
          spec.buffer->id(), " belongs to session ", spec.buffer->session_id(),
          ", not to session ", id_));
    }
    RETURN_IF_ERROR(CheckOpBuffer(op, ctx, shape, spec.buffer->size()));
  }
  ASSIGN_OR_RETURN(internal::SubmitTicket ticket, ops_->Submit(op));
  return OpHandle{ticket.op_id, ticket.sequence, std::move(op.name), op.kind};
}

absl::StatusOr<OpResult> Session::Run(const CollectiveSpec& spec) {
  ASSIGN_OR_RETURN(OpHandle handle, SubmitAsync(spec));
  absl::Duration op_timeout = spec.timeout;
  if (op_timeout <= absl::ZeroDuration()) op_timeout = default_op_timeout_;
  if (op_timeout <= absl::ZeroDuration()) op_timeout = kDefaultOpWait;
  return Wait(handle, op_timeout + kRpcMargin);
}

absl::StatusOr<OpResult> Session::Wait(const OpHandle& op, absl::Duration timeout) {
  RETURN_IF_ERROR(CheckOpen());
  if (timeout < absl::ZeroDuration()) timeout = absl::ZeroDuration();
  const absl::Time deadline =
      timeout == absl::InfiniteDuration() ? absl::InfiniteFuture() : FastNow() + timeout;
  ASSIGN_OR_RETURN(internal::WaitOutcome outcome, ops_->Wait(op.op_id, deadline));
  if (!outcome.done) {
    absl::Status pending = absl::DeadlineExceededError(absl::StrCat(
        OpLabel(op), " of session ", id_, " still running after ", absl::FormatDuration(timeout)));
    pending.SetPayload(kStillRunningPayload, absl::Cord("1"));
    return pending;
  }
  return OpResult(std::move(outcome));
}

absl::StatusOr<bool> Session::Poll(const OpHandle& op) {
  RETURN_IF_ERROR(CheckOpen());
  ASSIGN_OR_RETURN(internal::WaitOutcome outcome, ops_->Wait(op.op_id, absl::InfinitePast()));
  return outcome.done;
}

absl::StatusOr<int> Session::CompletionFd() {
  RETURN_IF_ERROR(CheckOpen());
  return ops_->CompletionFd();
}

absl::Status Session::Close() {
  {
    absl::MutexLock lock(&mu_);
    if (closed_) return absl::OkStatus();
    closed_ = true;
  }
  v1::CloseSessionRequest req;
  req.set_session_id(id_);
  v1::CloseSessionResponse resp;
  return CallWhileAlive(*ops_, *conn_, "CloseSession", [&](auto* ctx, auto done) {
    conn_->stub->async()->CloseSession(ctx, &req, &resp, std::move(done));
  });
}

// ---------------------------------------------------------------- Client

Client::Client(std::shared_ptr<internal::WorkerConnection> conn) : conn_(std::move(conn)) {}

const std::string& Client::target() const { return conn_->target; }

absl::StatusOr<std::unique_ptr<Client>> Client::Connect(const std::string& target,
                                                        absl::Duration timeout) {
  if (target.empty()) {
    return absl::InvalidArgumentError(
        "Connect: empty target (expected e.g. 'unix:/run/gradsync/gradsyncd.sock')");
  }
  if (timeout <= absl::ZeroDuration() || timeout == absl::InfiniteDuration()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "Connect: timeout must be finite and > 0, got ", absl::FormatDuration(timeout)));
  }
  // gRPC would only log its own complaint about a path the kernel cannot
  // take and then time out; say what is wrong at once.
  if (absl::StartsWith(target, "unix:") && !absl::StartsWith(target, "unix-abstract:")) {
    absl::string_view path = absl::string_view(target).substr(5);
    if (absl::StartsWith(path, "//")) path.remove_prefix(2);  // unix:///abs/path
    constexpr size_t kMaxPath = sizeof(sockaddr_un::sun_path) - 1;
    if (path.size() > kMaxPath) {
      return absl::InvalidArgumentError(absl::StrCat(
          "Connect: the unix socket path '", path, "' is ", path.size(),
          " bytes; the kernel allows at most ", kMaxPath,
          " (start gradsyncd with a shorter --listen, e.g. under /run)"));
    }
  }
  grpc::ChannelArguments args;
  // A local daemon that is starting up should be picked up quickly, not after
  // gRPC's default 1 s (growing to 120 s) reconnect backoff.
  args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, 100);
  args.SetInt(GRPC_ARG_MIN_RECONNECT_BACKOFF_MS, 100);
  args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, 1000);
  auto conn = std::make_shared<internal::WorkerConnection>();
  conn->target = target;
  conn->channel = grpc::CreateCustomChannel(target, grpc::InsecureChannelCredentials(), args);
  if (!conn->channel->WaitForConnected(absl::ToChronoTime(absl::Now() + timeout))) {
    return absl::UnavailableError(absl::StrCat(
        "cannot connect to gradsyncd at '", target, "' within ", absl::FormatDuration(timeout),
        " (channel ", ChannelStateName(conn->channel->GetState(false)),
        "); is gradsyncd running and is the socket address right?"));
  }
  conn->stub = v1::Worker::NewStub(conn->channel);
  return std::unique_ptr<Client>(new Client(std::move(conn)));
}

absl::StatusOr<std::unique_ptr<Session>> Client::OpenSession(const SessionOptions& options) {
  if (options.job_id.empty()) return absl::InvalidArgumentError("OpenSession: job_id is empty");
  if (options.world_size < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("OpenSession: world_size must be >= 1, got ", options.world_size));
  }
  if (options.rank < -1 || options.rank >= options.world_size) {
    return absl::InvalidArgumentError(absl::StrCat("OpenSession: rank ", options.rank,
                                                   " is outside [0, ", options.world_size,
                                                   ") (or -1 for any)"));
  }
  if (options.timeout <= absl::ZeroDuration() || options.timeout == absl::InfiniteDuration()) {
    return absl::InvalidArgumentError(absl::StrCat("OpenSession: timeout must be finite and > 0, got ",
                                                   absl::FormatDuration(options.timeout)));
  }
  if (options.heartbeat_timeout_ms < 0 || options.op_timeout_ms < 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "OpenSession: heartbeat_timeout_ms (", options.heartbeat_timeout_ms, ") and op_timeout_ms (",
        options.op_timeout_ms, ") must be >= 0"));
  }

  v1::OpenSessionRequest req;
  req.set_job_id(options.job_id);
  req.set_world_size(options.world_size);
  req.set_rank(options.rank);
  req.set_timeout_ms(TimeoutMillis(options.timeout));
  req.mutable_options()->set_heartbeat_timeout_ms(options.heartbeat_timeout_ms);
  req.mutable_options()->set_op_timeout_ms(options.op_timeout_ms);
  req.mutable_options()->set_tcp_streams(options.tcp_streams);
  req.mutable_options()->set_algorithm(options.algorithm);
  req.mutable_options()->set_codec(options.codec);
  absl::StatusOr<bool> env_timeline = TimelineFromEnvironment();
  if (!env_timeline.ok()) return env_timeline.status();
  req.mutable_options()->set_timeline(options.timeline || *env_timeline);
  req.mutable_options()->set_ps_shards(options.ps_shards);
  req.set_client_name(options.client_name);
  req.set_expected_coordinator(options.coordinator);
  absl::StatusOr<std::string> token = TenantToken(options.tenant_token);
  if (!token.ok()) return token.status();
  req.set_tenant_token(*token);
  grpc::ClientContext ctx;
  const absl::Duration rpc_timeout = options.timeout + kRpcMargin;
  const absl::Time deadline = absl::Now() + rpc_timeout;
  ctx.set_deadline(absl::ToChronoTime(deadline));
  v1::OpenSessionResponse resp;
  grpc::Status s = conn_->stub->OpenSession(&ctx, req, &resp);
  if (!s.ok()) return RpcError(s, *conn_, "OpenSession", deadline, rpc_timeout);

  Session::JobFacts job;
  job.algorithm = resp.job_algorithm();
  job.codec = resp.job_codec();
  job.ps_shards = resp.ps_shards();
  job.fd_socket = resp.fd_socket();
  job.registration_token = resp.registration_token();
  job.transport = resp.transport();
  job.default_op_timeout = absl::Milliseconds(
      resp.op_timeout_ms() > 0 ? resp.op_timeout_ms() : options.op_timeout_ms);
  std::unique_ptr<internal::OpChannel> ops =
      internal::NewSessionOpChannel(conn_, resp.session_id(), job.default_op_timeout,
                                    job.fd_socket, job.registration_token);
  return std::unique_ptr<Session>(new Session(conn_, resp.session_id(), resp.rank(),
                                              resp.world_size(), resp.epoch(), std::move(job),
                                              std::move(ops)));
}

}  // namespace client
}  // namespace gradsync
