/* gradsync C API: a thin C wrapper of the C++ client SDK (client/client.h),
 * for Python ctypes/cffi, Rust, Go and friends. Pure C; no C++ types.
 *
 * Return values. Every function that can fail returns 0 (GS_OK) on success
 * or a status code (the absl/gRPC code numbers, GS_* below). The message of
 * the calling thread's last failure is gs_last_error(). Output parameters are
 * written only on success.
 *
 * Ownership. gs_client_connect, gs_session_open and gs_buffer_alloc hand out
 * objects the caller owns and releases with gs_client_free, gs_session_close
 * and gs_buffer_free. A session keeps its own connection, so the client may
 * be freed before its sessions.
 *
 * Threads. A gs_client and a gs_session may be used from several threads at
 * once. A gs_buffer's bytes are plain memory: do not touch the range of an op
 * that is still running.
 *
 * Blocking. gs_client_connect, gs_session_open(_with), gs_wait(_result),
 * gs_run and gs_allreduce block up to their timeouts; the other calls that
 * talk to the daemon block for one local RPC (at most 10 s); gs_submit,
 * gs_allreduce_async and gs_poll do not block on the queue path. Nothing
 * blocks without a bound.
 *
 * Structs. gs_session_options and gs_collective_spec start with
 * `struct_size`: fill them with their *_init function (which sets it and the
 * defaults), then set the fields you need. A library that knows a newer,
 * longer struct still accepts an older caller's.
 *
 * Data. Buffers are POSIX shared memory shared with gradsyncd: write the
 * input into gs_buffer_data(), run the allreduce, read the result from the
 * same bytes. No tensor bytes are copied.
 */
#ifndef GRADSYNC_CLIENT_C_API_H_
#define GRADSYNC_CLIENT_C_API_H_

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Status codes (google.rpc.Code; the same numbers as absl::StatusCode). */
enum {
  GS_OK = 0,
  GS_CANCELLED = 1,
  GS_UNKNOWN = 2,
  GS_INVALID_ARGUMENT = 3,   /* bad argument, found before talking to the daemon */
  GS_DEADLINE_EXCEEDED = 4,  /* a wait ran out; the op may still be running */
  GS_NOT_FOUND = 5,
  GS_ALREADY_EXISTS = 6,
  GS_PERMISSION_DENIED = 7,
  GS_RESOURCE_EXHAUSTED = 8,
  GS_FAILED_PRECONDITION = 9, /* e.g. the session is closed */
  GS_ABORTED = 10,            /* the op was aborted (e.g. a rank died); retry higher up */
  GS_OUT_OF_RANGE = 11,
  GS_UNIMPLEMENTED = 12,
  GS_INTERNAL = 13,
  GS_UNAVAILABLE = 14, /* the daemon cannot be reached; retrying may help */
  GS_DATA_LOSS = 15,
  GS_UNAUTHENTICATED = 16,
  /* Not an error: a wait or poll ran out while the op is still running (it
   * goes on; wait again). An op past its own deadline is GS_DEADLINE_EXCEEDED. */
  GS_PENDING = 100
};

/* Element types (values of gradsync::DType / gradsync.v1.DataType). */
enum {
  GS_DTYPE_F32 = 1,
  GS_DTYPE_F64 = 2,
  GS_DTYPE_F16 = 3,
  GS_DTYPE_BF16 = 4,
  GS_DTYPE_I32 = 5,
  GS_DTYPE_I64 = 6,
  GS_DTYPE_U8 = 7,
  GS_DTYPE_F8E4M3 = 8, /* OCP FP8 E4M3 bytes; reduced in f32, saturating */
  GS_DTYPE_F8E5M2 = 9  /* OCP FP8 E5M2 bytes; reduced in f32, saturating */
};

/* Reduction operators (values of gradsync::ReduceOp / gradsync.v1.ReduceOp). */
enum {
  GS_OP_SUM = 1,
  GS_OP_AVG = 2, /* sum, then divide by world size once (integers truncate) */
  GS_OP_MIN = 3,
  GS_OP_MAX = 4,
  GS_OP_PROD = 5,
  /* Each rank's input multiplied by its own gs_collective_spec.premul_factor,
   * then summed: allreduce and reduce_scatter of float dtypes. */
  GS_OP_PREMUL_SUM = 6
};

/* Collectives (values of gradsync::CollectiveKind / gradsync.v1.CollectiveType).
 * Buffer layouts (docs/collectives.md): allreduce, broadcast and reduce use
 * `count` elements; reduce_scatter, allgather, alltoall, gather and scatter
 * world_size blocks of `count` elements each (rank r's own block is block r);
 * barrier none (buffer NULL, count 0).
 *   GS_GATHER   (root): on return the root's block j holds rank j's block j;
 *               the other ranks send their block r and are left unchanged.
 *   GS_SCATTER  (root): on return rank r's block r holds the root's block r;
 *               the root's buffer and every other block are left unchanged.
 * Every rank, root or not, passes the same count and a buffer of world_size
 * blocks (a non-root rank uses only its own block). */
enum {
  GS_ALLREDUCE = 1,
  GS_REDUCE_SCATTER = 2,
  GS_ALLGATHER = 3,
  GS_BROADCAST = 4,
  GS_REDUCE = 5,
  GS_ALLTOALL = 6,
  GS_BARRIER = 7,
  GS_GATHER = 8,
  GS_SCATTER = 9,
  GS_SEND = 10, /* point-to-point: `root` is the peer, `tag` matches send and recv */
  GS_RECV = 11  /* root -1: from any source (gs_op_info.source says which) */
};

typedef struct gs_client gs_client;
typedef struct gs_session gs_session;
typedef struct gs_buffer gs_buffer;

/* The message of the calling thread's most recent failed call ("" if none).
 * Successful calls do not clear it. Valid until the thread's next failing
 * call. */
const char* gs_last_error(void);

/* Connects to gradsyncd at `target` ("unix:/run/gradsync/gradsyncd.sock",
 * "unix-abstract:NAME" or "host:port"), waiting up to timeout_ms (> 0) for
 * the connection. GS_UNAVAILABLE naming the target if it cannot be reached. */
int gs_client_connect(const char* target, int64_t timeout_ms, gs_client** out);
/* Frees a client (NULL is a no-op). Its sessions stay usable. */
void gs_client_free(gs_client* client);

/* Joins job `job_id` of `world_size` ranks as `rank` (-1: any), waiting up
 * to timeout_ms (> 0) for every rank to join. */
int gs_session_open(gs_client* client, const char* job_id, int world_size, int rank,
                    int64_t timeout_ms, gs_session** out);
/* What gs_session_open_with asks the daemon for. Strings may be NULL ("").
 * Job options are used only if this session creates the job (0 / "": the
 * daemon's defaults). */
typedef struct gs_session_options {
  uint32_t struct_size;         /* sizeof(gs_session_options), set by gs_session_options_init */
  const char* job_id;           /* required */
  int32_t world_size;           /* >= 1 */
  int32_t rank;                 /* -1: any free rank */
  int64_t timeout_ms;           /* rendezvous bound, > 0 (default 60000) */
  int64_t heartbeat_timeout_ms; /* job option */
  int64_t op_timeout_ms;        /* job option: default op timeout */
  int32_t tcp_streams;          /* job option: TCP connections per pair of daemons */
  const char* algorithm;        /* job option: forced for every op ("" = the planner's choice) */
  int32_t timeline;             /* job option: non-zero = Chrome-trace timeline of every op
                                   (also GRADSYNC_TIMELINE=1 in the environment) */
  int32_t ps_shards;            /* job option: parameter-server shards for algorithm "ps" */
  const char* client_name;      /* for the daemon's logs */
  const char* tenant_token;     /* the tenant's token for a coordinator with tenants; NULL/"":
                                   $GRADSYNC_TENANT_TOKEN or the file $GRADSYNC_TENANT_TOKEN_FILE */
  const char* codec;            /* job option: every op's wire codec unless it names one: NULL/""
                                   or "none", "bf16", "fp16", "fp8e4m3", "fp8e5m2", "int8",
                                   "auto", "auto:bf16,int8", "topk:0.01[,warmup=N][,momentum=M]"
                                   (docs/compression.md) */
} gs_session_options;

/* Sets struct_size and the defaults (rank -1, world_size 1, timeout 60 s). */
void gs_session_options_init(gs_session_options* options);
/* gs_session_open with every option. GS_INVALID_ARGUMENT names a bad field. */
int gs_session_open_with(gs_client* client, const gs_session_options* options, gs_session** out);

/* This session's rank and world size (-1 if session is NULL). */
int gs_session_rank(const gs_session* session);
int gs_session_world_size(const gs_session* session);
/* Leaves the job and frees `session` (NULL is a no-op returning GS_OK). The
 * daemon frees the session's buffers; their gs_buffer handles must still be
 * released with gs_buffer_free(NULL, buffer). Returns the close RPC's status;
 * the session is freed in any case. */
int gs_session_close(gs_session* session);

/* Allocates and maps a shared-memory buffer of `bytes` (> 0) bytes. */
int gs_buffer_alloc(gs_session* session, size_t bytes, gs_buffer** out);
/* Registers memory this process already holds: [offset, offset+bytes) of the
 * file behind `fd` (a memfd made with MFD_ALLOW_SEALING, or a tmpfs file),
 * opened read-write; `offset` is a multiple of the page size. The daemon maps
 * the same pages (the descriptor travels over its unix fd socket), so ops
 * read and write the file in place. The file is sealed against shrinking
 * first. The caller keeps `fd`. Release the buffer with gs_buffer_free. Needs
 * a daemon reached over a unix socket. */
int gs_buffer_register_fd(gs_session* session, int fd, uint64_t offset, size_t bytes,
                          gs_buffer** out);
/* Hands memory this process got from malloc (posix_memalign, ...) to the
 * daemon in place: the allocation `ptr` points to must be one glibc gave a
 * mapping of its own (a large one, above its mmap threshold), and
 * [ptr, ptr + bytes) inside it. Its pages become those of a sealed memfd
 * registered as gs_buffer_register_fd does, with the same bytes at the same
 * addresses; *out maps them too, the allocation starting *offset_bytes into
 * it, so ops on *out at that offset read and write the allocation with no
 * copy. No other thread may write the allocation during the call. The memory
 * stays the caller's (free() releases it as before; it is shared with a
 * child forked later; do not realloc it); free *out once the allocation is
 * freed. GS_FAILED_PRECONDITION saying why for memory that cannot be shared
 * in place (e.g. a small allocation on malloc's heap: copy it instead). */
int gs_buffer_adopt(gs_session* session, void* ptr, size_t bytes, gs_buffer** out,
                    size_t* offset_bytes);
/* A device buffer of `bytes` (> 0) bytes in the memory of this process's CUDA
 * device `cuda_device`, allocated by the daemon and opened here by CUDA IPC:
 * gs_buffer_data is a device pointer. GS_FAILED_PRECONDITION naming why when
 * this process or the daemon cannot use that GPU (no CUDA, no driver, a GPU
 * the daemon does not see). */
int gs_buffer_alloc_device(gs_session* session, size_t bytes, int cuda_device, gs_buffer** out);
/* Registers CUDA memory this process holds: [device_ptr, device_ptr+bytes)
 * inside one cudaMalloc allocation. The daemon opens the allocation by its IPC
 * handle; ops read and write it in place. Keep it allocated until the buffer
 * is freed or the session closed. */
int gs_buffer_register_device(gs_session* session, void* device_ptr, size_t bytes,
                              gs_buffer** out);
/* The buffer's CUDA device in this process, -1 for host memory (or NULL). */
int gs_buffer_cuda_device(const gs_buffer* buffer);
/* The mapped bytes and their size (NULL / 0 if buffer is NULL). The size may
 * exceed the requested one. */
void* gs_buffer_data(gs_buffer* buffer);
size_t gs_buffer_size(const gs_buffer* buffer);
/* Unmaps `buffer`, frees the handle and, if `session` is not NULL, tells the
 * daemon to free the segment (pass NULL after the session was closed).
 * `buffer` is released even when an error is returned. NULL buffer: GS_OK. */
int gs_buffer_free(gs_session* session, gs_buffer* buffer);

/* Submits an allreduce of `count` elements of `dtype` (GS_DTYPE_*) with `op`
 * (GS_OP_*) at `offset_bytes` (a multiple of the element size) in `buffer`,
 * and returns at once with *op_id set. `name` (may be NULL) identifies the op
 * across ranks. `timeout_ms` bounds the op at the daemon (0: job default).
 * Bad dtype/op/range/arguments: GS_INVALID_ARGUMENT without any RPC.
 * A thin wrapper of gs_submit (an allreduce gs_collective_spec), kept for
 * callers written before it. */
int gs_allreduce_async(gs_session* session, gs_buffer* buffer, size_t offset_bytes, size_t count,
                       int dtype, int op, const char* name, int64_t timeout_ms, uint64_t* op_id);
/* Waits up to timeout_ms (0: poll; -1: until the op ends, which its deadline
 * at the daemon bounds) for op `op_id`. GS_OK: done; GS_PENDING: still
 * running (wait again); otherwise the op's own error (e.g. GS_ABORTED, or
 * GS_DEADLINE_EXCEEDED when the op ran past its deadline, naming who it
 * waited for). */
int gs_wait(gs_session* session, uint64_t op_id, int64_t timeout_ms);
/* One collective for gs_submit / gs_run. */
typedef struct gs_collective_spec {
  uint32_t struct_size; /* sizeof(gs_collective_spec), set by gs_collective_spec_init */
  int32_t kind;         /* GS_ALLREDUCE ... GS_BARRIER */
  gs_buffer* buffer;    /* NULL only for a barrier */
  size_t offset_bytes;  /* a multiple of the element size */
  size_t count;         /* elements (per block for the blocked collectives) */
  int32_t dtype;        /* GS_DTYPE_* */
  int32_t op;           /* GS_OP_*: allreduce, reduce_scatter, reduce */
  int32_t root;         /* broadcast, reduce, gather, scatter */
  const char* name;     /* identifies the op across ranks; may be NULL */
  const char* algorithm; /* "" / NULL: the job's choice or the planner's */
  int64_t timeout_ms;   /* bound at the daemon from submission; 0: the job's default */
  int32_t tag;          /* GS_SEND, GS_RECV: a recv takes its peer's first message with this tag */
  double premul_factor; /* GS_OP_PREMUL_SUM: this rank's input is multiplied by it (init: 1) */
  const char* codec;    /* NULL / "": the job's codec; "none"; a codec the op must travel
                           through ("bf16", ..., f32 allreduce / reduce_scatter); "auto...";
                           "topk:R..." (f32 allreduce with a name, error feedback by name) */
} gs_collective_spec;

/* What an op that completed reports. */
typedef struct gs_result {
  char algorithm[16];  /* the plan it ran, e.g. "ring", "oneshot", "hier", NUL-terminated */
  int64_t queued_us;   /* submission to start */
  int64_t run_us;      /* start to completion */
} gs_result;

/* Sets struct_size and the defaults (allreduce, f32, sum). */
void gs_collective_spec_init(gs_collective_spec* spec);

/* What an op that completed reports, extensibly (fill with gs_op_info_init):
 * gs_result's fields and `source`, the rank a GS_RECV's message came from
 * (its peer for GS_SEND; -1 for collectives). */
typedef struct gs_op_info {
  uint32_t struct_size; /* sizeof(gs_op_info), set by gs_op_info_init */
  char algorithm[16];
  int64_t queued_us;
  int64_t run_us;
  int32_t source;
} gs_op_info;
void gs_op_info_init(gs_op_info* info);
/* gs_wait_result and gs_poll, filling a gs_op_info. */
int gs_wait_info(gs_session* session, uint64_t op_id, int64_t timeout_ms, gs_op_info* info);
int gs_poll_info(gs_session* session, uint64_t op_id, gs_op_info* info);
/* Submits any collective and returns at once with *op_id set.
 * GS_INVALID_ARGUMENT without any RPC for a NULL session/spec/op_id, a
 * buffer NULL for anything but a barrier, an unset struct_size, and what the
 * SDK's one validator refuses (collective/op_validation.h: the kind, dtype
 * and op values, root in [0, world_size) for broadcast, reduce, gather and
 * scatter, timeout >= 0, the algorithm, the range and alignment in the
 * buffer); the message
 * names the op, the rank, the value and what was expected. */
int gs_submit(gs_session* session, const gs_collective_spec* spec, uint64_t* op_id);
/* gs_wait, and on GS_OK fills *result (may be NULL). */
int gs_wait_result(gs_session* session, uint64_t op_id, int64_t timeout_ms, gs_result* result);
/* Non-blocking check: GS_OK done (then *result, if not NULL, is filled), 
 * GS_DEADLINE_EXCEEDED still running, otherwise the op's error. */
int gs_poll(gs_session* session, uint64_t op_id, gs_result* result);
/* gs_submit + gs_wait_result: blocks until the op ends, at most the op's
 * timeout + 5 s (0: the job's default, or 10 min). */
int gs_run(gs_session* session, const gs_collective_spec* spec, gs_result* result);

/* A file descriptor that becomes readable when ops of `session` complete, for
 * poll/epoll/select beside other work: read 8 bytes from it to re-arm it,
 * then gs_poll the ops. Owned by the session: do not close it; valid until
 * gs_session_close. GS_UNIMPLEMENTED when the session reaches the daemon
 * over gRPC (GRADSYNC_OP_CHANNEL=grpc). */
int gs_session_event_fd(gs_session* session, int* fd);

/* gs_allreduce_async + gs_wait: blocks until the op ends, at most
 * timeout_ms + 5 s (timeout_ms 0: the job's default op timeout at the daemon,
 * and the client gives up after 10 min + 5 s). A thin wrapper of gs_run. */
int gs_allreduce(gs_session* session, gs_buffer* buffer, size_t offset_bytes, size_t count,
                 int dtype, int op, const char* name, int64_t timeout_ms);

#ifdef __cplusplus
}  /* extern "C" */
#endif

#endif /* GRADSYNC_CLIENT_C_API_H_ */
