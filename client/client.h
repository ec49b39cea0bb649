// gradsync client SDK: the library a training process links to talk to the
// local gradsyncd.
//
//   auto client = Client::Connect("unix:/run/gradsync/gradsyncd.sock");
//   SessionOptions options;
//   options.job_id = "job-42";
//   options.world_size = 8;
//   auto session = (*client)->OpenSession(options);
//   auto grads = (*session)->AllocateBuffer(n * sizeof(float));
//   fill((*grads)->as<float>(), n);                       // write in place
//   auto result = (*session)->Allreduce(**grads, 0, n, DType::kF32, ReduceOp::kAvg, "step7");
//   use((*grads)->as<float>(), n);                        // the sum is in place
//
// Data path. Tensor bytes never travel through gRPC. A Buffer is a POSIX
// shared-memory segment that gradsyncd creates; the client maps it (shm_open
// O_RDWR + mmap MAP_SHARED) and the daemon reads and writes the same pages.
// gRPC carries sessions, buffer set-up and errors.
//
// Per-op path. SubmitAsync/Wait/Poll go through an internal OpChannel
// (client/op_channel.h). When a session opens, the client asks the daemon for
// the session's shared-memory op queue (ipc/op_queue.h): a submission and a
// completion ring with futex doorbells, so a tiny op costs microseconds
// instead of two gRPC round trips. A daemon without it (older gradsyncd) is
// served with Worker.Submit / Worker.Wait RPCs instead (logged once).
// Differences a caller can see on the queue:
//   - OpHandle::op_id counts 1, 2, 3, ... per session, and
//     OpHandle::sequence is 0 (the daemon's sequence is not known yet);
//   - what the daemon refuses (an unknown buffer, an algorithm that cannot
//     run the collective, an epoch that failed) comes back as the op's error
//     from Wait/Poll, not from SubmitAsync (local argument checks still fail
//     SubmitAsync at once);
//   - a daemon that stops answering (no heartbeat for 3 s) fails waits with
//     kUnavailable "gradsyncd at T stopped answering (no heartbeat for 3 s)".
// Environment: GRADSYNC_OP_CHANNEL=grpc makes new sessions use the RPCs even
// when the daemon has the queue (for comparisons and debugging); unset or any
// other value: the queue when available. GRADSYNC_WAIT_SPIN_US=N: how long a
// Wait on the queue polls the completion ring (yielding the CPU) before it
// sleeps on the futex (default 100; 0 = never poll). Polling saves a futex
// wake-up per small op (tens of microseconds on a virtual CPU) and costs CPU
// while the op runs.
//
// Errors. Every fallible call returns absl::Status / absl::StatusOr; codes
// follow google.rpc.Code (the same numbers as gRPC):
//   kInvalidArgument     bad arguments, found locally before any RPC; the
//                        message names the value and the limit.
//   kUnavailable         the daemon cannot be reached (retrying may help).
//   kDeadlineExceeded    a wait ran out (the message names the op), or the
//                        daemon did not answer an RPC within its deadline.
//   kFailedPrecondition  the session is closed.
//   anything else        the daemon's (or the op's) own error, verbatim, e.g.
//                        kAborted "... rank 2 ...".
// Nothing blocks without a deadline: every RPC carries one (OpenSession:
// options.timeout + 5 s; Wait: the wait + 5 s; everything else: 10 s).
#ifndef GRADSYNC_CLIENT_CLIENT_H_
#define GRADSYNC_CLIENT_CLIENT_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/op_desc.h"
#include "common/types.h"

namespace gradsync {
namespace client {

namespace internal {
class OpChannel;
struct WorkerConnection;
}  // namespace internal

class Session;

// What OpenSession asks the daemon for.
struct SessionOptions {
  // Job to join (created at the coordinator by the first session). Required.
  std::string job_id;
  // Number of ranks in the job, >= 1.
  int world_size = 1;
  // Rank to take, in [0, world_size), or -1 for "any free rank".
  int rank = -1;
  // How long OpenSession may wait for the rendezvous (all ranks joining).
  absl::Duration timeout = absl::Seconds(60);
  // Job options, used only if this session creates the job; 0 = daemon default.
  int64_t heartbeat_timeout_ms = 0;
  int64_t op_timeout_ms = 0;
  // Used if this session creates the job (0 / "": the daemon's defaults).
  int tcp_streams = 0;       // TCP connections per pair of the job's daemons
  std::string algorithm;     // forced for every op of the job; "" = cost model
  // Every op's codec unless it names one: "" / "none", "bf16", "fp16",
  // "fp8e4m3", "fp8e5m2", "int8", "auto", "auto:bf16,int8", "topk:0.01[,warmup=N]
  // [,momentum=M]" (docs/compression.md).
  std::string codec;
  // Chrome-trace timeline of every op on every rank (gradsyncd --timeline_dir);
  // also switched on by GRADSYNC_TIMELINE=1 in the environment.
  bool timeline = false;
  int ps_shards = 0;         // parameter-server shards (gradsync-ps) for algorithm "ps"
  // Free-form name for the daemon's logs (e.g. "trainer pid 1234").
  std::string client_name;
  // The tenant's token, needed when the coordinator has tenants
  // (docs/security.md). "": $GRADSYNC_TENANT_TOKEN, else the first line of
  // the file $GRADSYNC_TENANT_TOKEN_FILE, else none.
  std::string tenant_token;
  // Non-empty: the coordinator (gRPC target) the job is meant for; the daemon
  // refuses the session, naming both, when it joins jobs at another one.
  std::string coordinator;
};

// A shared-memory buffer mapped into this process. The daemon owns the
// segment; this object owns only the mapping and unmaps it in its destructor.
// Destroying a Buffer without Session::FreeBuffer leaves the segment to the
// daemon until the session closes. The mapping stays valid after the session
// closes (the pages live until unmapped), but the daemon no longer uses them.
// Not synchronized: do not touch the bytes of an op that is still running.
class Buffer {
 public:
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;
  ~Buffer();

  void* data() { return data_; }
  const void* data() const { return data_; }
  size_t size() const { return size_; }
  // The daemon's id of the buffer (unique within its session).
  uint64_t id() const { return id_; }
  // The segment's shm_open name, e.g. "/gradsync.1234.7", or "fd N" for a
  // registered buffer (for diagnostics).
  const std::string& shm_name() const { return shm_name_; }
  // The session the buffer belongs to.
  const std::string& session_id() const { return session_id_; }
  // A device buffer (AllocateDeviceBuffer, RegisterDeviceBuffer): data() is
  // a pointer on this process's CUDA device cuda_device(), the GPU gpu_uuid().
  // -1 and "" for host memory.
  int cuda_device() const { return cuda_device_; }
  bool on_device() const { return cuda_device_ >= 0; }
  const std::string& gpu_uuid() const { return gpu_uuid_; }

  template <class T>
  T* as() {
    return static_cast<T*>(data_);
  }
  template <class T>
  const T* as() const {
    return static_cast<const T*>(data_);
  }

 private:
  friend class Session;
  Buffer(std::string session_id, uint64_t id, std::string shm_name, void* data, size_t size)
      : session_id_(std::move(session_id)),
        id_(id),
        shm_name_(std::move(shm_name)),
        data_(data),
        size_(size) {}

  // A device buffer; `owner` keeps the memory mapped (the daemon's
  // allocation opened here) or is null (the caller's own memory).
  Buffer(std::string session_id, uint64_t id, std::string description, void* data, size_t size,
         int cuda_device, std::string gpu_uuid, std::shared_ptr<void> owner)
      : session_id_(std::move(session_id)),
        id_(id),
        shm_name_(std::move(description)),
        data_(data),
        size_(size),
        cuda_device_(cuda_device),
        gpu_uuid_(std::move(gpu_uuid)),
        device_owner_(std::move(owner)) {}

  const std::string session_id_;
  const uint64_t id_;
  const std::string shm_name_;
  void* const data_;
  const size_t size_;
  const int cuda_device_ = -1;
  const std::string gpu_uuid_;
  std::shared_ptr<void> device_owner_;
};

// One collective, for Session::SubmitAsync/Run: an OpDesc (common/op_desc.h:
// kind, dtype, op, root, count, offset_bytes, name, algorithm, timeout) and
// the mapped buffer it runs on, which must belong to the session (null only
// for a barrier). SubmitAsync takes OpDesc::buffer_id from `buffer`; the one
// set here is not used.
struct CollectiveSpec : OpDesc {
  const Buffer* buffer = nullptr;
};

// A submitted op. Copyable; valid for the session that returned it. Only
// op_id matters to Wait/Poll (the C API builds handles from it alone);
// sequence and name make error messages precise.
struct OpHandle {
  uint64_t op_id = 0;
  // Position in the session's op stream, from 1 (0 = unknown).
  uint64_t sequence = 0;
  // The op's name as submitted (used in error messages; may be empty).
  std::string name;
  CollectiveKind kind = CollectiveKind::kAllreduce;  // for error messages, with name
};

// A completed op: algorithm (the plan that ran, e.g. "ring"), queued_time
// (submission to start), run_time (start to completion). Its status is OK:
// Wait returns a failed op's error instead.
using OpResult = ::gradsync::OpResult;

// One membership in a job, opened through the local daemon.
//
// Thread-safe: any method may be called from any thread. Ops of a session run
// in submission order (OpHandle::sequence); with several submitting threads
// that order is whatever order the daemon received them in, and every rank
// must submit the same ops in the same order.
//
// Owns its connection to the daemon (it stays usable after its Client is
// destroyed). The destructor calls Close() (best effort, errors are logged).
class Session {
 public:
  Session(const Session&) = delete;
  Session& operator=(const Session&) = delete;
  ~Session();

  int rank() const { return rank_; }
  int world_size() const { return world_size_; }
  int64_t epoch() const { return epoch_; }
  // The daemon's session id.
  const std::string& id() const { return id_; }
  // How this rank's daemon reaches the job's other daemons: "rdma: <device
  // port, link>", "tcp: <streams>[; not RDMA: <why>]" or "local: ..." (every
  // rank on one daemon); "" from a daemon that does not say.
  const std::string& transport() const { return job_.transport; }

  // Asks the daemon for a shared-memory buffer of `bytes` (> 0) bytes and
  // maps it. The returned size() may be larger than asked (rounded up by the
  // daemon). Blocks for one RPC.
  absl::StatusOr<std::unique_ptr<Buffer>> AllocateBuffer(size_t bytes);

  // Registers memory this process already holds: [offset, offset+bytes) of
  // the file behind `fd`, a memfd (memfd_create with MFD_ALLOW_SEALING) or a
  // file on tmpfs, opened read-write. The descriptor travels to the daemon
  // over its fd socket (ipc/fd_registration.h); both then map the same pages,
  // so writes through any mapping of the file (this process's own, or the
  // returned Buffer's data()) are what the ops read, and results land there
  // with no copy. The SDK seals the file against shrinking (F_SEAL_SHRINK)
  // first, as the daemon requires; the file may still grow. `offset` must be
  // a multiple of the page size. The caller keeps `fd` (the daemon holds its
  // own reference). FreeBuffer and Close release it as any buffer.
  // FailedPrecondition when the daemon has no fd socket (it serves clients
  // over TCP) or the file cannot be sealed; the daemon's refusals otherwise
  // (the range beyond the file's end, a read-only descriptor, ...).
  absl::StatusOr<std::unique_ptr<Buffer>> RegisterBuffer(int fd, size_t bytes, uint64_t offset = 0);

  // Hands memory this process allocated with malloc (posix_memalign, ...) to
  // the daemon in place, so ops on it copy nothing: the allocation that
  // `ptr` heads must be one glibc gave a mapping of its own (a large one:
  // client/malloc_mapping.h), [ptr, ptr + bytes) inside it. Its pages are
  // replaced, at the same addresses and with the same bytes, by those of a
  // sealed memfd registered as RegisterBuffer does; the returned buffer maps
  // them too, the allocation starting `*offset` bytes into it. No other
  // thread may write the allocation during the call. Afterwards it is
  // ordinary memory of the process again, except that it is shared (a child
  // forked later shares it instead of copying it): free() unmaps it as
  // before, while the buffer's pages live until FreeBuffer (the caller frees
  // the buffer once the allocation is gone). Do not realloc it.
  // FailedPrecondition saying why for memory that cannot be shared in place
  // (a heap allocation; the caller then copies), and RegisterBuffer's errors.
  absl::StatusOr<std::unique_ptr<Buffer>> AdoptMemory(void* ptr, size_t bytes, size_t* offset);

  // Asks the daemon for a buffer of `bytes` (> 0) in the memory of this
  // process's CUDA device `cuda_device` and opens it here (CUDA IPC): data()
  // is a device pointer. The daemon runs ops on it, staging it through host
  // memory for the network (docs/architecture.md). FailedPrecondition naming
  // why when this process or the daemon cannot use that GPU (no CUDA, a GPU
  // the daemon does not see, ...). Blocks for one RPC.
  absl::StatusOr<std::unique_ptr<Buffer>> AllocateDeviceBuffer(size_t bytes, int cuda_device);
  // Registers CUDA memory this process holds: [device_ptr, device_ptr+bytes),
  // inside one cudaMalloc allocation (CUDA IPC covers neither cudaMallocAsync
  // pools nor VMM memory). The daemon opens the allocation from its IPC handle;
  // ops read and write this memory in place. Keep the allocation alive until
  // the buffer is freed or the session closed.
  absl::StatusOr<std::unique_ptr<Buffer>> RegisterDeviceBuffer(void* device_ptr, size_t bytes);

  // Unmaps `buffer` and tells the daemon to free its segment. The buffer is
  // unmapped even when the RPC fails. InvalidArgument if null or if it
  // belongs to another session. Do not free a buffer an op is still using.
  absl::Status FreeBuffer(std::unique_ptr<Buffer> buffer);

  // Submits an allreduce of `count` elements of `dtype` starting at
  // `offset_bytes` in `buffer` (which must belong to this session) and
  // returns at once. `offset_bytes` must be a multiple of the element size
  // and the range must lie inside the buffer; violations are
  // InvalidArgument, found before any RPC. `name` identifies the op across
  // ranks (e.g. the tensor name). `timeout` bounds the op at the daemon,
  // measured from submission; zero = the job's default op timeout.
  // The result is written in place into the same range. A thin wrapper of
  // SubmitAsync (an allreduce CollectiveSpec).
  absl::StatusOr<OpHandle> AllreduceAsync(const Buffer& buffer, size_t offset_bytes, size_t count,
                                          DType dtype, ReduceOp op, absl::string_view name,
                                          absl::Duration timeout = absl::ZeroDuration());

  // Submits any collective (see CollectiveSpec) and returns at once.
  // InvalidArgument, before anything is sent, for what ValidateOp and
  // CheckOpBuffer refuse (collective/op_validation.h: the values, root,
  // timeout, the requested plan, the range in the buffer) and for a buffer
  // of another session.
  absl::StatusOr<OpHandle> SubmitAsync(const CollectiveSpec& spec);
  // SubmitAsync + Wait for the op's timeout plus a 5 s margin (as Allreduce).
  absl::StatusOr<OpResult> Run(const CollectiveSpec& spec);

  // Waits up to `timeout` for `op` (negative = 0 = poll once;
  // absl::InfiniteDuration() waits until the op ends, which the op's own
  // deadline at the daemon bounds). Long waits are split into RPCs of at most
  // 30 s (+5 s deadline margin), so a dead daemon is an error, not a hang.
  // DeadlineExceeded naming the op if it is still running by then (it keeps
  // running; wait again later), marked so that IsStillRunning() is true. If
  // the op failed, its error exactly as the daemon reported it (e.g. Aborted
  // "... rank 2 ..."; an op past its own deadline is DeadlineExceeded too,
  // with IsStillRunning() false).
  absl::StatusOr<OpResult> Wait(const OpHandle& op, absl::Duration timeout);

  // Non-blocking check (one RPC): true = done OK, false = still running,
  // error = the op failed (as in Wait).
  absl::StatusOr<bool> Poll(const OpHandle& op);

  // AllreduceAsync + Wait: a thin wrapper of Run. Waits for the op's timeout
  // plus a 5 s margin; the op's timeout is `timeout`, else
  // SessionOptions::op_timeout_ms, else kDefaultOpWait.
  absl::StatusOr<OpResult> Allreduce(const Buffer& buffer, size_t offset_bytes, size_t count,
                                     DType dtype, ReduceOp op, absl::string_view name,
                                     absl::Duration timeout = absl::ZeroDuration());

  // A file descriptor (an eventfd) that becomes readable when ops of this
  // session complete: poll/epoll it beside other work, read 8 bytes from it
  // to re-arm it, then Poll or Wait the ops. Owned by the session (valid
  // until the session is destroyed). The first call starts one thread that
  // watches the session's completion queue. Unimplemented when the session
  // reaches the daemon over gRPC (GRADSYNC_OP_CHANNEL=grpc).
  absl::StatusOr<int> CompletionFd();

  // Leaves the job; the daemon frees the session's buffers and fails its
  // running ops. Idempotent: later calls return OK. After Close every other
  // method returns FailedPrecondition. Blocks for one RPC (10 s deadline).
  absl::Status Close();

  // Client-side bound for Allreduce when neither the call nor the session
  // options give an op timeout (the daemon's job default is not known here).
  static constexpr absl::Duration kDefaultOpWait = absl::Minutes(10);

 private:
  friend class Client;
  struct JobFacts {  // what OpenSession learned of the job
    std::string algorithm;  // forced for every op; "" = cost model
    std::string codec;      // every op's codec unless it names one; "" = none
    int ps_shards = 0;
    absl::Duration default_op_timeout;  // zero = unknown
    std::string fd_socket;              // "" = the daemon has none
    std::string registration_token;     // proves this session on fd_socket
    std::string transport;              // OpenSessionResponse.transport
  };
  Session(std::shared_ptr<internal::WorkerConnection> conn, std::string id, int rank,
          int world_size, int64_t epoch, JobFacts job, std::unique_ptr<internal::OpChannel> ops);

  absl::Status CheckOpen() const;
  // Fetches the descriptor of a buffer the daemon hands out by descriptor (a
  // sealed memfd) on its fd socket and maps `size` bytes of it.
  absl::StatusOr<void*> FetchAndMap(uint64_t buffer_id, size_t size);

  const std::shared_ptr<internal::WorkerConnection> conn_;
  const std::unique_ptr<internal::OpChannel> ops_;
  const std::string id_;
  const int rank_;
  const int world_size_;
  const int64_t epoch_;
  const JobFacts job_;
  const absl::Duration default_op_timeout_;  // zero = unknown

  mutable absl::Mutex mu_;
  bool closed_ ABSL_GUARDED_BY(mu_) = false;
};

// A connection to one gradsyncd. Thread-safe. Sessions it opens keep the
// connection alive on their own, so the Client may be destroyed first.
class Client {
 public:
  // Connects to `target`: "unix:/run/gradsync/gradsyncd.sock",
  // "unix-abstract:NAME" or "host:port". Blocks until the channel is ready or
  // `timeout` passes (so a daemon that is still starting is waited for);
  // Unavailable naming the target otherwise. InvalidArgument if `target` is
  // empty or `timeout` is not positive.
  static absl::StatusOr<std::unique_ptr<Client>> Connect(const std::string& target,
                                                         absl::Duration timeout = absl::Seconds(10));

  // Joins a job through the daemon. Blocks until the rendezvous completes
  // (every rank joined) or options.timeout passes. InvalidArgument for bad
  // options (checked before any RPC).
  absl::StatusOr<std::unique_ptr<Session>> OpenSession(const SessionOptions& options);

  const std::string& target() const;

 private:
  explicit Client(std::shared_ptr<internal::WorkerConnection> conn);

  const std::shared_ptr<internal::WorkerConnection> conn_;
};

// True if `s` is a wait that ran out while its op is still running (it goes
// on; wait again), false for every other status, including an op's own
// DEADLINE_EXCEEDED. The C API returns GS_PENDING for these.
bool IsStillRunning(const absl::Status& s);

}  // namespace client
}  // namespace gradsync

#endif  // GRADSYNC_CLIENT_CLIENT_H_
