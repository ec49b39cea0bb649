"""Client, Session, Buffer and Work: the gradsync SDK in Python (see help(gradsync))."""

from __future__ import annotations

import atexit
import contextlib
import ctypes
import os
import threading
import weakref
from dataclasses import dataclass
from typing import Any, Dict, Optional, Tuple

from . import _capi
from .errors import PENDING, GradsyncError, error

DEFAULT_DAEMON = "unix:/run/gradsync/gradsyncd.sock"

# Sessions and clients still open at exit are closed then, while the C++
# runtime (gRPC's threads) is still whole.
_open: "weakref.WeakSet" = weakref.WeakSet()


@atexit.register
def _close_open() -> None:
    for obj in [o for o in list(_open) if isinstance(o, Session)] + list(_open):
        try:
            obj.close()
        except Exception:
            pass

# Element types: gradsync's names, their C API values and element sizes.
DTYPES: Dict[str, Tuple[int, int]] = {
    "f32": (1, 4), "f64": (2, 8), "f16": (3, 2), "bf16": (4, 2),
    "i32": (5, 4), "i64": (6, 8), "u8": (7, 1), "f8e4m3": (8, 1), "f8e5m2": (9, 1),
}
_NUMPY_NAMES = {"float32": "f32", "float64": "f64", "float16": "f16", "int32": "i32",
                "int64": "i64", "uint8": "u8"}
_TORCH_NAMES = {"torch.float32": "f32", "torch.float64": "f64", "torch.float16": "f16",
                "torch.bfloat16": "bf16", "torch.int32": "i32", "torch.int64": "i64",
                "torch.uint8": "u8"}
OPS = {"sum": 1, "avg": 2, "min": 3, "max": 4, "prod": 5, "premul_sum": 6}
COLLECTIVES = {"allreduce": 1, "reduce_scatter": 2, "allgather": 3, "broadcast": 4,
               "reduce": 5, "alltoall": 6, "barrier": 7, "gather": 8, "scatter": 9}
# Point-to-point ops (Session.send / recv): `root` is the peer.
POINT_TO_POINT = {"send": 10, "recv": 11}
_BLOCKED = {"reduce_scatter", "allgather", "alltoall", "gather", "scatter"}


def dtype_name(dtype: Any) -> str:
    """gradsync's name ("f32", ...) for a name, a numpy dtype or a torch dtype."""
    if isinstance(dtype, str) and dtype in DTYPES:
        return dtype
    text = str(dtype)
    if text in _TORCH_NAMES:
        return _TORCH_NAMES[text]
    try:
        import numpy
        name = numpy.dtype(dtype).name
        if name in _NUMPY_NAMES:
            return _NUMPY_NAMES[name]
    except Exception:
        pass
    raise error(3, f"unsupported dtype {dtype!r} (gradsync: {', '.join(DTYPES)})")


def _check(code: int) -> None:
    if code != 0:
        raise error(code, _capi.last_error())


def _ms(seconds: Optional[float], default: int) -> int:
    """Milliseconds for the C API: None -> `default`, 0 -> 0 (its "default"),
    anything positive at least 1."""
    if seconds is None:
        return default
    return 0 if seconds <= 0 else max(1, int(seconds * 1000))


@dataclass(frozen=True)
class Result:
    """What a completed op reports: the plan it ran ("ring", "oneshot", "hier",
    ...), and how long it waited in the queue and ran, in microseconds."""
    algorithm: str
    queued_us: int
    run_us: int
    source: int = -1  # recv: the rank the message came from; send: its peer


def _free_buffer(session: "Session", handle: int) -> int:
    """gs_buffer_free: at the daemon too while the session is open."""
    lib = _capi.lib()
    try:
        with session._using() as h:
            return lib.gs_buffer_free(h, handle)
    except GradsyncError:  # closed: the daemon freed it already
        return lib.gs_buffer_free(None, handle)


def _release(session: "Session", handle: int) -> None:
    """Frees a buffer nobody refers to any more."""
    _free_buffer(session, handle)


class Buffer:
    """A shared-memory buffer of a session: the daemon reads and writes these
    very bytes, so ops on it copy nothing. `buf.bytes`, `buf.numpy()` and
    `buf.torch()` are views of the same memory. The buffer lives as long as
    it or any view of it is referenced (then the daemon frees it too), also
    after the session closed (the daemon then no longer uses it); `free()`
    frees it at once and invalidates views."""

    def __init__(self, session: "Session", handle: int):
        self._session = session
        self._handle = handle
        lib = _capi.lib()
        self.address: int = lib.gs_buffer_data(handle)
        self.nbytes: int = lib.gs_buffer_size(handle)
        # The CUDA device (this process's ordinal) of a device buffer, else -1.
        self.cuda_device: int = lib.gs_buffer_cuda_device(handle)
        if self.cuda_device >= 0:
            # Device memory: no host view; torch() views it on the GPU. A view
            # holds the Buffer (through its __cuda_array_interface__ object).
            self._bytes = None
            self._unmap = weakref.finalize(self, _release, session, handle)
        else:
            self._bytes = (ctypes.c_char * self.nbytes).from_address(self.address)
            self._bytes._owner = self  # a view (which holds _bytes) keeps its Buffer alive
            # Released when the buffer and its last view are gone; not at exit,
            # where other threads may still use the memory (the exit unmaps it).
            self._unmap = weakref.finalize(self._bytes, _release, session, handle)
        self._unmap.atexit = False

    def _host_only(self, what: str) -> None:
        if self.cuda_device >= 0:
            raise error(3, f"gradsync: {what} of a device buffer (cuda:{self.cuda_device}); "
                           "use torch() for a CUDA tensor view")

    def __buffer__(self, flags):  # Python 3.12+; older ones use memoryview(buf.bytes)
        self._host_only("a memoryview")
        return memoryview(self._bytes)

    @property
    def bytes(self) -> memoryview:
        """The buffer's bytes, writable (the buffer protocol); host buffers only."""
        self._host_only("the bytes")
        return memoryview(self._bytes).cast("B")

    def numpy(self, dtype: Any = "float32", count: Optional[int] = None, offset: int = 0):
        """A numpy array over `count` elements at byte `offset` (default: all that fit)."""
        import numpy
        self._host_only("a numpy array")
        dt = numpy.dtype(dtype)
        if count is None:
            count = (self.nbytes - offset) // dt.itemsize
        return numpy.frombuffer(self._bytes, dtype=dt, count=count, offset=offset)

    def torch(self, dtype: Any = None, count: Optional[int] = None, offset: int = 0):
        """A torch tensor over the buffer (no copy): on the CPU for a host
        buffer, on cuda:N for a device buffer (needs a torch with CUDA)."""
        import torch
        dtype = torch.float32 if dtype is None else dtype
        esize = torch.empty((), dtype=dtype).element_size()
        if count is None:
            count = (self.nbytes - offset) // esize
        if offset < 0 or count < 0 or offset + count * esize > self.nbytes:
            raise error(3, f"gradsync: {count} elements at byte {offset} exceed the buffer's "
                           f"{self.nbytes} bytes")
        if self.cuda_device < 0:
            return torch.frombuffer(self._bytes, dtype=dtype, count=count, offset=offset)
        if not torch.cuda.is_available():
            raise error(9, f"gradsync: a device buffer (cuda:{self.cuda_device}) needs a torch "
                           f"with CUDA; this one ({torch.__version__}) has none")
        return torch.as_tensor(_CudaArray(self, dtype, count, offset),
                               device=f"cuda:{self.cuda_device}")

    def free(self) -> None:
        """Frees the buffer at the daemon and unmaps it now: every view of it
        becomes invalid (touching one afterwards crashes the process)."""
        if self._handle:
            handle, self._handle = self._handle, 0
            self._unmap.detach()
            _check(_free_buffer(self._session, handle))


_TYPESTR = {"float32": "<f4", "float64": "<f8", "float16": "<f2", "bfloat16": "<V2",
            "int32": "<i4", "int64": "<i8", "uint8": "|u1", "int8": "|i1", "bool": "|b1"}


class _CudaArray:
    """A device buffer's range as __cuda_array_interface__ (version 3), so
    torch.as_tensor views it without a copy; the tensor keeps this object, and
    so the Buffer, alive."""

    def __init__(self, buf: Buffer, dtype, count: int, offset: int):
        name = str(dtype).replace("torch.", "")
        if name not in _TYPESTR:
            raise error(3, f"gradsync: no CUDA view of dtype {dtype}")
        self._buf = buf
        self.__cuda_array_interface__ = {
            "shape": (count,), "typestr": _TYPESTR[name], "descr": [("", _TYPESTR[name])],
            "data": (buf.address + offset, False), "strides": None, "version": 3,
            "stream": None,  # the daemon's ops complete before Work.wait returns
        }


def _op_info() -> "_capi.OpInfo":
    info = _capi.OpInfo()
    _capi.lib().gs_op_info_init(ctypes.byref(info))
    return info


def _still_running(code: int) -> bool:
    """Whether a wait/poll code means "not done yet" (GS_PENDING), as opposed
    to any error of the op, its own DEADLINE_EXCEEDED included."""
    return code == PENDING


class Work:
    """A submitted op. `wait()` blocks (the GIL released) until it is done and
    returns its Result, or raises its error; `done()` polls."""

    def __init__(self, session: "Session", op_id: int, what: str, keep: Any = None):
        self._session = session
        self.op_id = op_id
        self.what = what
        self._keep = keep  # the arrays the op runs on stay alive until it is done
        self._result: Optional[Result] = None
        self._error: Optional[Exception] = None

    def wait(self, timeout: Optional[float] = None) -> Result:
        """Waits up to `timeout` seconds (None: until the op ends, which its
        deadline at the daemon bounds). StillRunning (a DeadlineExceeded) if it is
        still running then: wait again."""
        if self._result is not None:
            return self._result
        if self._error is not None:
            raise self._error
        res = _op_info()
        with self._session._using() as handle:
            code = _capi.lib().gs_wait_info(handle, self.op_id,
                                            -1 if timeout is None else max(0, int(timeout * 1000)),
                                            ctypes.byref(res))
        return self._finish(code, res)

    def done(self) -> bool:
        """True once the op ended (then wait() returns or raises at once)."""
        if self._result is not None or self._error is not None:
            return True
        res = _op_info()
        with self._session._using() as handle:
            code = _capi.lib().gs_poll_info(handle, self.op_id, ctypes.byref(res))
        if _still_running(code):
            return False
        try:
            self._finish(code, res)
        except Exception:
            pass
        return True

    def _finish(self, code: int, res: _capi.OpInfo) -> Result:
        if _still_running(code):  # the op is not over, so nothing is recorded
            raise error(code, _capi.last_error())
        if code != 0:
            self._error = error(code, _capi.last_error())
            self._keep = None
            raise self._error
        self._result = Result(res.algorithm.decode(), res.queued_us, res.run_us, res.source)
        self._keep = None
        return self._result


class _Closable:
    """close() on leaving a `with` block and when collected."""

    def close(self) -> None:
        raise NotImplementedError

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __del__(self):
        try:
            self.close()
        except Exception:
            pass


class Session(_Closable):
    """One rank of a job: open with Client.open_session. Collectives run on
    arrays made by `empty()` (or views of a Buffer), in place, and return a
    Work; every rank of the job must issue the same ops in the same order."""

    def __init__(self, handle: int, job: str):
        self._handle = handle
        self.job = job
        lib = _capi.lib()
        self.rank: int = lib.gs_session_rank(handle)
        self.world_size: int = lib.gs_session_world_size(handle)
        # Live buffers by address (weak: a buffer nobody refers to is freed).
        self._buffers: "weakref.WeakValueDictionary[int, Buffer]" = weakref.WeakValueDictionary()
        self._lock = threading.Lock()
        self._cv = threading.Condition()
        self._calls = 0  # C calls using the handle now
        _open.add(self)

    def _live(self) -> int:
        if not self._handle:
            raise error(9, f"session of job '{self.job}' (rank {self.rank}) is closed")
        return self._handle

    @contextlib.contextmanager
    def _using(self):
        """The handle, for one C call; close() waits until no call uses it
        (the C API frees the session in gs_session_close)."""
        with self._cv:
            handle = self._live()
            self._calls += 1
        try:
            yield handle
        finally:
            with self._cv:
                self._calls -= 1
                self._cv.notify_all()

    def alloc(self, nbytes: int) -> Buffer:
        """A new shared-memory buffer of at least `nbytes` bytes."""
        out = ctypes.c_void_p()
        with self._using() as handle:
            _check(_capi.lib().gs_buffer_alloc(handle, int(nbytes), ctypes.byref(out)))
        return self._add(Buffer(self, out.value))

    def register_fd(self, fd: int, nbytes: int, offset: int = 0) -> Buffer:
        """Registers `nbytes` at `offset` (page-aligned) of the file behind
        `fd`, a memfd (os.memfd_create(name, os.MFD_ALLOW_SEALING)) or tmpfs
        file opened read-write: the daemon maps the same pages, so ops on the
        returned buffer read and write the file in place, and any other
        mapping of it sees the results. The file is sealed against shrinking.
        The caller keeps `fd`. Needs a daemon reached over a unix socket."""
        out = ctypes.c_void_p()
        with self._using() as handle:
            _check(_capi.lib().gs_buffer_register_fd(handle, int(fd), int(offset), int(nbytes),
                                                     ctypes.byref(out)))
        return self._add(Buffer(self, out.value))

    def adopt(self, address: int, nbytes: int) -> Tuple[Buffer, int]:
        """Hands `nbytes` at `address` of memory this process got from malloc
        (a large allocation glibc gave a mapping of its own, e.g. a big torch
        CPU tensor's storage; `address` where the allocation starts) to the
        daemon in place: (buffer, offset), the allocation starting `offset`
        bytes into the buffer, whose pages are now the allocation's, so ops
        on the buffer read and write it with no copy. No other thread may
        write it during the call; free the buffer once the allocation is
        gone. FailedPrecondition saying why for memory that cannot be shared
        in place (copy it instead)."""
        out, offset = ctypes.c_void_p(), ctypes.c_size_t()
        with self._using() as handle:
            _check(_capi.lib().gs_buffer_adopt(handle, ctypes.c_void_p(int(address)), int(nbytes),
                                               ctypes.byref(out), ctypes.byref(offset)))
        return self._add(Buffer(self, out.value)), offset.value

    def alloc_device(self, nbytes: int, cuda_device: int = 0) -> Buffer:
        """A new buffer of at least `nbytes` bytes in the memory of this
        process's CUDA device `cuda_device`, allocated by the daemon (shared
        by CUDA IPC); its torch() is a CUDA tensor. Fails, saying why, where
        this process or the daemon has no usable GPU."""
        out = ctypes.c_void_p()
        with self._using() as handle:
            _check(_capi.lib().gs_buffer_alloc_device(handle, int(nbytes), int(cuda_device),
                                                      ctypes.byref(out)))
        return self._add(Buffer(self, out.value))

    def register_device(self, device_ptr: int, nbytes: int) -> Buffer:
        """Registers CUDA memory this process holds ([device_ptr, +nbytes)
        inside one cudaMalloc allocation, e.g. a CUDA tensor's data_ptr()): ops
        on the buffer read and write it in place. Keep the memory allocated
        while the buffer lives."""
        out = ctypes.c_void_p()
        with self._using() as handle:
            _check(_capi.lib().gs_buffer_register_device(handle, ctypes.c_void_p(int(device_ptr)),
                                                         int(nbytes), ctypes.byref(out)))
        return self._add(Buffer(self, out.value))

    def _add(self, buf: Buffer) -> Buffer:
        with self._lock:
            self._buffers[buf.address] = buf
        return buf

    def empty(self, count: int, dtype: Any = "float32"):
        """A numpy array of `count` elements in a new shared-memory buffer."""
        import numpy
        dt = numpy.dtype(dtype)
        return self.alloc(max(1, count * dt.itemsize)).numpy(dt, count)

    def empty_tensor(self, count: int, dtype: Any = None, device: Any = None):
        """A torch tensor of `count` elements in a new buffer: shared memory
        for the CPU (device None or "cpu"), the GPU's memory for "cuda:N"."""
        import torch
        dtype = torch.float32 if dtype is None else dtype
        esize = torch.empty((), dtype=dtype).element_size()
        dev = torch.device(device) if device is not None else torch.device("cpu")
        if dev.type == "cuda":
            index = dev.index if dev.index is not None else torch.cuda.current_device()
            return self.alloc_device(max(1, count * esize), index).torch(dtype, count)
        if dev.type != "cpu":
            raise error(3, f"gradsync: tensors on {dev} are not supported (cpu or cuda)")
        return self.alloc(max(1, count * esize)).torch(dtype, count)

    def _locate(self, array: Any) -> Tuple[Buffer, int, int]:
        """(buffer, byte offset, byte length) of an array that views a buffer of this session."""
        if isinstance(array, Buffer):
            return array, 0, array.nbytes
        if hasattr(array, "data_ptr"):  # torch
            if not array.is_contiguous():
                raise error(3, "gradsync: the tensor must be contiguous")
            addr, nbytes = array.data_ptr(), array.numel() * array.element_size()
        elif hasattr(array, "__array_interface__"):
            if not array.flags["C_CONTIGUOUS"]:
                raise error(3, "gradsync: the array must be C-contiguous")
            addr, nbytes = array.__array_interface__["data"][0], array.nbytes
        else:
            raise error(3, f"gradsync: {type(array).__name__} is not an array of a session buffer")
        with self._lock:
            for buf in list(self._buffers.values()):
                if buf._handle and buf.address <= addr and addr + nbytes <= buf.address + buf.nbytes:
                    return buf, addr - buf.address, nbytes
        raise error(3, "gradsync: the array does not lie in a buffer of this session (make it "
                       "with session.empty(), empty_tensor() or a Buffer's numpy()/torch())")

    def submit(self, kind: str, array: Any = None, op: str = "sum", root: int = 0,
               dtype: Any = None, name: Optional[str] = None, algorithm: Optional[str] = None,
               timeout: Optional[float] = None, tag: int = 0,
               factor: Optional[float] = None, codec: Optional[str] = None) -> Work:
        """Submits collective `kind` (or "send"/"recv", `root` the peer) on
        `array` in place and returns its Work. op "premul_sum" (allreduce,
        reduce_scatter of floats) sums every rank's array multiplied by its
        own `factor`. `codec`: the wire codec of an f32 allreduce or
        reduce_scatter ("bf16", "fp16", "fp8e4m3", "fp8e5m2", "int8", "auto",
        "auto:bf16,int8", "none"; default: the job's; docs/compression.md).
        Blocked collectives (reduce_scatter, allgather, alltoall, gather,
        scatter) take an array of world_size equal blocks on every rank. `dtype` defaults to the array's."""
        self._live()
        kinds = {**COLLECTIVES, **POINT_TO_POINT}
        if kind not in kinds:
            raise error(3, f"gradsync: unknown collective '{kind}' ({', '.join(kinds)})")
        if op not in OPS:
            raise error(3, f"gradsync: unknown reduce op '{op}' ({', '.join(OPS)})")
        if (op == "premul_sum") != (factor is not None):
            raise error(3, "gradsync: reduce op premul_sum takes a factor (this rank's multiplier); "
                           f"other ops take none (op '{op}', factor {factor})")
        spec = _capi.CollectiveSpec()
        lib = _capi.lib()
        lib.gs_collective_spec_init(ctypes.byref(spec))
        spec.kind = kinds[kind]
        if kind != "barrier":
            buf, offset, nbytes = self._locate(array)
            dname = dtype_name(dtype if dtype is not None else getattr(array, "dtype", "u8"))
            code, esize = DTYPES[dname]
            count = nbytes // esize
            if kind in _BLOCKED:
                if count % self.world_size:
                    raise error(3, f"gradsync: {kind} needs {self.world_size} equal blocks; "
                                   f"{count} elements do not divide")
                count //= self.world_size
            spec.buffer = buf._handle
            spec.offset_bytes = offset
            spec.count = count
            spec.dtype = code
        spec.op = OPS[op]
        spec.root = root
        spec.name = name.encode() if name else None
        spec.algorithm = algorithm.encode() if algorithm else None
        spec.codec = codec.encode() if codec else None
        spec.timeout_ms = _ms(timeout, 0)
        spec.tag = int(tag)
        if factor is not None:
            spec.premul_factor = float(factor)
        op_id = ctypes.c_uint64()
        with self._using() as handle:
            _check(lib.gs_submit(handle, ctypes.byref(spec), ctypes.byref(op_id)))
        return Work(self, op_id.value, kind, keep=array)

    def allreduce(self, array, op: str = "sum", **kw) -> Work:
        """Every rank ends with the reduction (sum, avg, min, max, prod; premul_sum with
        factor=) of every rank's array."""
        return self.submit("allreduce", array, op=op, **kw)

    def reduce_scatter(self, array, op: str = "sum", **kw) -> Work:
        """Block r of rank r's array ends with the reduction of every rank's block r."""
        return self.submit("reduce_scatter", array, op=op, **kw)

    def allgather(self, array, **kw) -> Work:
        """Block j of every rank's array ends with rank j's block j."""
        return self.submit("allgather", array, **kw)

    def broadcast(self, array, root: int = 0, **kw) -> Work:
        """Every rank ends with root's array."""
        return self.submit("broadcast", array, root=root, **kw)

    def reduce(self, array, root: int = 0, op: str = "sum", **kw) -> Work:
        """Root ends with the reduction; the other ranks' arrays stay as they were."""
        return self.submit("reduce", array, op=op, root=root, **kw)

    def alltoall(self, array, **kw) -> Work:
        """Block j of rank i's array goes to block i of rank j."""
        return self.submit("alltoall", array, **kw)

    def gather(self, array, root: int = 0, **kw) -> Work:
        """Block j of root's array ends with rank j's block j; the other ranks
        send their block (their own rank's) and their arrays stay as they were.
        Every rank passes world_size blocks."""
        return self.submit("gather", array, root=root, **kw)

    def scatter(self, array, root: int = 0, **kw) -> Work:
        """Block r of rank r's array ends with root's block r; root's array and
        every other block stay as they were. Every rank passes world_size blocks."""
        return self.submit("scatter", array, root=root, **kw)

    def send(self, array, dst: int, tag: int = 0, **kw) -> Work:
        """Sends `array` to rank `dst`; done once the message is on its way
        (another daemon's rank) or in the matching recv (a rank on this daemon)."""
        return self.submit("send", array, root=dst, tag=tag, **kw)

    def recv(self, array, src: int = -1, tag: int = 0, **kw) -> Work:
        """Receives into `array` the first message from rank `src` (-1: any
        rank) with `tag`; it must have the array's dtype and size. The Work's
        result names the sender (Result.source)."""
        return self.submit("recv", array, root=src, tag=tag, **kw)

    def barrier(self, **kw) -> Work:
        """Completes on each rank once every rank entered it."""
        return self.submit("barrier", None, **kw)

    def event_fd(self) -> int:
        """A file descriptor that becomes readable when ops complete (for
        select/asyncio; read 8 bytes to re-arm it). Owned by the session."""
        fd = ctypes.c_int()
        with self._using() as handle:
            _check(_capi.lib().gs_session_event_fd(handle, ctypes.byref(fd)))
        return fd.value

    def close(self) -> None:
        """Leaves the job. The daemon frees the session's buffers; their
        mappings (and the arrays over them) stay valid until released. Waits
        for calls other threads are making on the session (a wait ends at its
        op's deadline at the latest)."""
        with self._cv:
            handle, self._handle = self._handle, 0  # no new call starts
            while handle and self._calls:
                self._cv.wait()
        if handle:
            with self._lock:
                self._buffers.clear()  # the mappings go with their last views (Buffer._unmap)
            _check(_capi.lib().gs_session_close(handle))



class Client(_Closable):
    """A connection to the local gradsyncd. `target` defaults to
    $GRADSYNC_DAEMON, else unix:/run/gradsync/gradsyncd.sock."""

    def __init__(self, target: Optional[str] = None, timeout: float = 10.0):
        self.target = target or os.environ.get("GRADSYNC_DAEMON") or DEFAULT_DAEMON
        out = ctypes.c_void_p()
        _check(_capi.lib().gs_client_connect(self.target.encode(), _ms(timeout, 10000),
                                             ctypes.byref(out)))
        self._handle = out.value
        _open.add(self)

    def open_session(self, job: str, world_size: int, rank: int = -1,
                     timeout: float = 60.0, algorithm: Optional[str] = None,
                     op_timeout: Optional[float] = None, tcp_streams: int = 0,
                     timeline: bool = False, ps_shards: int = 0,
                     heartbeat_timeout: Optional[float] = None,
                     client_name: Optional[str] = None,
                     tenant_token: Optional[str] = None,
                     codec: Optional[str] = None) -> Session:
        """Joins `job` of `world_size` ranks as `rank` (-1: any free rank),
        waiting up to `timeout` seconds for every rank. The job options
        (algorithm, op_timeout, ...) count only for the session that creates the job.
        `tenant_token`: the tenant's token for a coordinator with tenants
        (default: $GRADSYNC_TENANT_TOKEN or the file $GRADSYNC_TENANT_TOKEN_FILE).
        `codec`: the job's wire codec for every f32 allreduce and
        reduce_scatter that names none (docs/compression.md)."""
        o = _capi.SessionOptions()
        lib = _capi.lib()
        lib.gs_session_options_init(ctypes.byref(o))
        o.job_id = job.encode()
        o.world_size = world_size
        o.rank = rank
        o.timeout_ms = _ms(timeout, 60000) or 60000
        o.heartbeat_timeout_ms = _ms(heartbeat_timeout, 0)
        o.op_timeout_ms = _ms(op_timeout, 0)
        o.tcp_streams = tcp_streams
        o.algorithm = algorithm.encode() if algorithm else None
        o.timeline = 1 if timeline else 0
        o.ps_shards = ps_shards
        o.client_name = (client_name or f"python pid {os.getpid()}").encode()
        o.tenant_token = tenant_token.encode() if tenant_token else None
        o.codec = codec.encode() if codec else None
        out = ctypes.c_void_p()
        if not self._handle:
            raise error(9, "gradsync: the client is closed")
        _check(lib.gs_session_open_with(self._handle, ctypes.byref(o), ctypes.byref(out)))
        return Session(out.value, job)

    def close(self) -> None:
        """Frees the client (its sessions stay usable)."""
        if self._handle:
            handle, self._handle = self._handle, 0
            _capi.lib().gs_client_free(handle)

