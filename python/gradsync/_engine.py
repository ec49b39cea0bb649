"""Runs torch tensors' collectives through one gradsync session: staging
through pooled buffers (shared memory for CPU tensors, device buffers on the
tensor's GPU for CUDA tensors), and completion of torch futures on a progress
thread (in submission order, the order the daemon runs them). Internal to
gradsync.torch."""

from __future__ import annotations

import atexit
import collections
import datetime
import os
import threading
import uuid
import weakref
from typing import Callable, Deque, Dict, List, Optional, Tuple

import torch

from . import _torch_compat as _compat
from .errors import GradsyncError
from .session import Buffer, Client, Session, Work

_TORCH_DTYPES = {torch.float32: "f32", torch.float64: "f64", torch.float16: "f16",
                 torch.bfloat16: "bf16", torch.int32: "i32", torch.int64: "i64",
                 torch.uint8: "u8"}


def check_device(t: torch.Tensor) -> None:
    """CPU tensors, and CUDA tensors (staged through device buffers)."""
    if t.device.type not in ("cpu", "cuda"):
        raise ValueError(f"gradsync: tensors on {t.device} are not supported (cpu or cuda)")


def gradsync_dtype(t: torch.Tensor) -> str:
    name = _TORCH_DTYPES.get(t.dtype)
    if name is None:
        raise ValueError(f"gradsync: unsupported tensor dtype {t.dtype} "
                         f"(supported: {', '.join(str(d) for d in _TORCH_DTYPES)})")
    check_device(t)
    return name


def _cuda(device: Optional[torch.device]) -> bool:
    return device is not None and device.type == "cuda"


def daemon_target() -> str:
    """Where the local gradsyncd listens: $GRADSYNC_DAEMON, else entry
    $LOCAL_RANK of $GRADSYNC_DAEMONS (comma-separated; for several daemons on
    one test host), else the default socket."""
    if os.environ.get("GRADSYNC_DAEMON"):
        return os.environ["GRADSYNC_DAEMON"]
    many = os.environ.get("GRADSYNC_DAEMONS")
    if many:
        targets = many.split(",")
        return targets[int(os.environ.get("LOCAL_RANK", "0")) % len(targets)]
    return "unix:/run/gradsync/gradsyncd.sock"


def agree_job_id(store, rank: int, world_size: int, prefix: str) -> str:
    """A job id every rank of the group learns through the c10d store. A
    store can outlive a destroyed group, so rank 0 deletes the key once every
    rank read it: a later group on the same store never reads an old id."""
    key = "gradsync/job_id"
    # The waits take the rendezvous deadline, not the store's own timeout
    # (the group's op timeout, which may be a second or two).
    deadline = datetime.timedelta(seconds=MIN_RENDEZVOUS_S)
    if rank != 0:
        store.wait([key], deadline)
        job = store.get(key).decode()
        store.set(f"{key}/read/{rank}", "1")
        return job
    job = f"{prefix}-{uuid.uuid4().hex[:16]}"
    store.set(key, job)
    read = [f"{key}/read/{r}" for r in range(1, world_size)]
    if read:
        store.wait(read, deadline)
    for k in [key] + read:
        store.delete_key(k)
    return job


# The rendezvous waits at least this long: ranks reach init_process_group at
# different times (imports, data loading), and a short op timeout should not
# make the set-up fail.
MIN_RENDEZVOUS_S = 60.0

_live_engines: "weakref.WeakSet[Engine]" = weakref.WeakSet()


@atexit.register
def _close_all() -> None:
    """At exit, before the interpreter and the C++ runtime go away: every
    progress thread stopped and every session closed (a process group torch
    still holds is never collected)."""
    for e in list(_live_engines):
        try:
            e.close()
        except Exception:
            pass


class Engine:
    """One gradsync session with a staging pool and a progress thread."""

    def __init__(self, store, rank: int, world_size: int, timeout_s: float, prefix: str,
                 algorithm: Optional[str] = None, timeline: bool = False,
                 codec: Optional[str] = None):
        """`codec`: the job's wire codec (default $GRADSYNC_CODEC; docs/compression.md)."""
        self.rank, self.world_size, self.timeout_s = rank, world_size, timeout_s
        if codec is None:
            codec = os.environ.get("GRADSYNC_CODEC") or None
        job = agree_job_id(store, rank, world_size, prefix)
        self._client = Client(daemon_target())
        self.session: Session = self._client.open_session(
            job, world_size, rank=rank, timeout=max(timeout_s, MIN_RENDEZVOUS_S),
            algorithm=algorithm, timeline=timeline, codec=codec,
            client_name=f"torch rank {rank} pid {os.getpid()}")
        # Storages shared in place (adopted), by their data pointer: (weak
        # reference, buffer, offset of the storage in it); and the data
        # pointers of storages that cannot be (weak reference).
        self._adopted: Dict[int, Tuple[int, Buffer, int]] = {}
        self._unadoptable: Dict[int, int] = {}
        self._adopt_lock = threading.Lock()
        self._adopt = os.environ.get("GRADSYNC_TORCH_ADOPT", "1") != "0"
        self._pool: Dict[int, List] = collections.defaultdict(list)
        self._pool_lock = threading.Lock()
        self._pooled_bytes = 0  # in _pool
        self._queue: Deque[Tuple[Work, Callable[[], object], torch.futures.Future, list,
                                 Optional[torch.device]]] = collections.deque()
        self._cv = threading.Condition()
        self._closing = False
        self._broken: Optional[str] = None
        self._thread = threading.Thread(target=self._progress, name="gradsync-progress", daemon=True)
        self._thread.start()
        _live_engines.add(self)

    # Staging: buffers by device and size class, reused; at most
    # POOL_PER_CLASS per class and POOL_TOTAL_BYTES in all are kept, none above
    # POOL_MAX_BYTES. Size classes are powers of two up to 1 MiB, then
    # eighths of the next power of two (a 64 MiB + 16 KiB DDP bucket stages
    # in 72 MiB, not 128 MiB). CPU tensors stage through shared memory, CUDA
    # tensors through device buffers on their GPU (a device-to-device copy
    # each way). A buffer that is not kept is freed: the next op of its size
    # maps and faults in a new one, which on a large bucket costs more than
    # the copy.
    POOL_PER_CLASS = 4
    POOL_MAX_BYTES = 1 << 30
    POOL_TOTAL_BYTES = 2 << 30

    @staticmethod
    def size_class(nbytes: int) -> int:
        n = max(4096, nbytes)
        p = 1 << (n - 1).bit_length()
        if p <= 1 << 20:
            return p
        step = p >> 3
        return (n + step - 1) // step * step

    def stage(self, nbytes: int, device: Optional[torch.device] = None):
        size = self.size_class(nbytes)
        index = -1
        if _cuda(device):
            index = device.index if device.index is not None else torch.cuda.current_device()
        with self._pool_lock:
            free = self._pool[(index, size)]
            if free:
                self._pooled_bytes -= size
                return free.pop()
        buf = self.session.alloc(size) if index < 0 else self.session.alloc_device(size, index)
        buf.size_class = (index, size)
        return buf

    def unstage(self, buf) -> None:
        """Returns a staging buffer whose op is over (never one that may still run)."""
        size = buf.size_class[1]
        with self._pool_lock:
            free = self._pool[buf.size_class]
            if size <= self.POOL_MAX_BYTES and len(free) < self.POOL_PER_CLASS and \
                    self._pooled_bytes + size <= self.POOL_TOTAL_BYTES:
                free.append(buf)
                self._pooled_bytes += size
                return
        buf.free()

    # Adoption: a large CPU tensor's storage handed to the daemon in place
    # (Session.adopt: its pages become shared memory at the same addresses,
    # with the same bytes), so ops on it copy nothing in or out. Once per
    # storage (that first time costs one copy of it); its buffer is freed
    # once torch freed the storage (checked at every lookup).
    # $GRADSYNC_TORCH_ADOPT=0 turns it off (every op stages).
    ADOPT_MIN_BYTES = 1 << 20

    def adopted(self, t: torch.Tensor) -> Optional[Tuple[Buffer, int]]:
        """(buffer, byte offset of t's first element in it) for a contiguous
        CPU tensor whose storage is (now) shared in place; None when it
        cannot be (a small or heap allocation, a daemon without an fd
        socket, ...): stage it then."""
        nbytes = t.numel() * t.element_size()
        if not self._adopt or t.device.type != "cpu" or not t.is_contiguous() or \
                nbytes < self.ADOPT_MIN_BYTES:
            return None
        storage = _compat.storage_of(t)
        base = storage.data_ptr()
        with self._adopt_lock:
            self._sweep_adopted()
            entry = self._adopted.get(base)
            if entry is None and base not in self._unadoptable:
                try:
                    buf, offset = self.session.adopt(base, storage.nbytes())
                except GradsyncError:  # FailedPrecondition (not its own mapping), no fd socket...
                    self._unadoptable[base] = _compat.storage_ref(storage)
                    return None
                entry = (_compat.storage_ref(storage), buf, offset)
                self._adopted[base] = entry
        if entry is None:
            return None
        return entry[1], entry[2] + (t.data_ptr() - base)

    def _sweep_adopted(self) -> None:
        """Forgets storages torch freed (with _adopt_lock held); a buffer is
        released with its last reference (a running op's Work holds one)."""
        for table in (self._adopted, self._unadoptable):
            for base, entry in list(table.items()):
                ref = entry[0] if isinstance(entry, tuple) else entry
                if _compat.storage_expired(ref):
                    del table[base]
                    _compat.free_storage_ref(ref)

    def view(self, buf, dtype: torch.dtype, count: int) -> torch.Tensor:
        return buf.torch(dtype, count)

    def submit(self, kind: str, buf, dtype: torch.dtype, count: int, finish: Callable[[], object],
               op: str = "sum", root: int = 0, name: Optional[str] = None,
               staged: Optional[list] = None,
               device: Optional[torch.device] = None,
               wrap: Optional[Callable[[torch.futures.Future], torch.futures.Future]] = None,
               tag: int = 0, results: Optional[list] = None,
               offset: int = 0, timeout: Optional[float] = None,
               factor: Optional[float] = None) -> torch.futures.Future:
        """Submits `kind` on the first `count` elements of staging buffer `buf`;
        the future gets finish()'s value once the op is done and finish() ran.
        The staged buffers go back to the pool once the op is over. For a
        CUDA `device` the copies into the staging buffer (on the caller's
        stream) finish before the op is submitted, and finish()'s copies out
        before the future completes and the buffer is reused. `wrap` (the
        profiler's event, torch.py) gets the future before the progress thread
        can complete it, so whatever it chains runs on that thread; its
        result is returned. `tag`: send and recv's. `results`: the op's
        gradsync Result is appended to it before finish() runs (a recv's
        Result.source names its sender). `offset`: the op starts that many
        elements into `buf`. `timeout`: the op's deadline in seconds (default:
        the group's). `factor`: premul_sum's multiplier."""
        staged = staged or []
        fut = torch.futures.Future()
        try:
            if _cuda(device):
                torch.cuda.current_stream(device).synchronize()
            with self._cv:
                if self._broken is not None:
                    raise RuntimeError(f"gradsync: this process group is unusable: {self._broken}")
            if kind == "barrier":
                work = self.session.barrier(timeout=self.timeout_s)
            else:
                array = self.view(buf, dtype, offset + count)[offset:]
                work = self.session.submit(kind, array, op=op, root=root,
                                           dtype=_TORCH_DTYPES[dtype], name=name,
                                           timeout=timeout or self.timeout_s, tag=tag,
                                           factor=factor)
        except BaseException:
            for b in staged:  # nothing was submitted on them
                self.unstage(b)
            raise
        out = wrap(fut) if wrap is not None else fut
        with self._cv:
            self._queue.append((work, finish, fut, staged, device, results))
            self._cv.notify()
        return out

    def _progress(self) -> None:
        try:
            while True:
                with self._cv:
                    while not self._queue and not self._closing:
                        self._cv.wait()
                    if not self._queue:
                        return
                    work, finish, fut, staged, device, results = self._queue[0]
                over = True  # the op ended (done, or failed with its own error)
                try:
                    result = work.wait(self.timeout_s + 5)
                    if results is not None:
                        results.append(result)
                    value, error = finish(), None
                    if _cuda(device):
                        torch.cuda.synchronize(device)  # the copies out, before reuse
                except Exception as e:  # surfaces in Work.wait() / the future
                    value, error = None, e
                    over = work.done()  # a wait that ran out leaves the op running
                for b in staged:
                    if over:
                        self.unstage(b)
                    # else: dropped, never reused while the daemon may still use it
                with self._cv:
                    self._queue.popleft()
                if error is None:
                    fut.set_result(value)
                elif isinstance(error, GradsyncError):
                    fut.set_exception(error)  # keeps its class (a RuntimeError)
                else:
                    fut.set_exception(RuntimeError(f"gradsync: {error}"))
        except BaseException as e:  # never leave futures that nobody completes
            self._fail_pending(f"the progress thread failed: {e!r}")
            raise

    def _fail_pending(self, why: str) -> None:
        with self._cv:
            self._broken = self._broken or why
            pending, self._queue = list(self._queue), collections.deque()
        for _, _, fut, _, _, _ in pending:
            if not fut.done():
                fut.set_exception(RuntimeError(f"gradsync: {why}"))

    def close(self) -> None:
        """Stops taking ops, lets the queued ones finish (each bounded by its
        deadline), then closes the session."""
        with self._cv:
            if self._closing:
                return
            self._closing = True
            self._broken = self._broken or "it was destroyed"
            self._cv.notify()
        if threading.current_thread() is not self._thread:
            self._thread.join(self.timeout_s + 10)
        if self._thread.is_alive():
            # Still inside a wait on the session: closing it now would free it
            # under that call. Fail what is queued and leave the session to exit.
            self._fail_pending("destroyed while an op was still running")
            return
        try:
            self.session.close()
        finally:
            self._client.close()
