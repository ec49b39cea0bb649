"""The DDP comm hook of gradsync.torch (HookState, allreduce_hook): DDP's
gradient buckets through a gradsync session of their own, whatever backend
the process group uses. Imported by gradsync.torch, which exports it."""

import threading
import time
from typing import List, Optional

import torch
import torch.distributed as dist

from . import _torch_compat as _compat
from ._engine import Engine


class HookState:
    """The DDP comm hook's state: its own gradsync session (a job the ranks
    agree on through the default group's c10d store; `process_group` gives
    the ranks and the world size, default: the default group's),
    with optional job options (`algorithm`; `codec`: the buckets' wire codec,
    e.g. "bf16" or "auto", default $GRADSYNC_CODEC, docs/compression.md;
    `timeline`: the daemons write a Chrome trace of every bucket's op,
    gradsyncd --timeline_dir). `trace`
    records when each bucket was submitted (HookState.trace). Create it after
    init_process_group, on every rank."""

    def __init__(self, process_group=None, algorithm: Optional[str] = None,
                 timeout: float = 300.0, timeline: bool = False, trace: bool = False,
                 codec: Optional[str] = None):
        pg = process_group or _compat.default_group()
        store = _compat.default_store()
        rank, size = dist.get_rank(pg), dist.get_world_size(pg)
        if rank < 0:
            raise ValueError("gradsync: HookState on a process group this rank is not part of")
        # Each group agrees on its job id under keys of its own (in the default
        # store, which every group shares).
        ranks = _compat.group_ranks(pg)
        group = ",".join(str(r) for r in sorted(ranks)) if ranks else "default"
        key = f"ddp_hook/{group}/"
        self.engine = Engine(_HookStore(store, key), rank, size, timeout, prefix="ddp-hook",
                             algorithm=algorithm, timeline=timeline, codec=codec)
        self.buckets = 0
        # With `trace`: (bucket index, time.perf_counter() at submission, bytes)
        # of every bucket, to see them leave during the backward pass.
        self.trace: Optional[List[tuple]] = [] if trace else None
        # Staging buffers whose results DDP reads (allreduce_hook): back to
        # the pool when the next step's first bucket comes.
        self._held: list = []
        self._held_lock = threading.Lock()

    def _hold(self, buf) -> None:
        with self._held_lock:
            self._held.append(buf)

    def _release_held(self) -> None:
        with self._held_lock:
            held, self._held = self._held, []
        for buf in held:
            self.engine.unstage(buf)

    def close(self) -> None:
        self.engine.close()
        self._held = []


class _HookStore:
    """The default store, under a prefix of its own (it may also serve the backend)."""

    def __init__(self, store, prefix: str):
        self._store, self._prefix = store, prefix

    def set(self, key, value):
        self._store.set(self._prefix + key, value)

    def get(self, key):
        return self._store.get(self._prefix + key)

    def wait(self, keys, *timeout):
        self._store.wait([self._prefix + k for k in keys], *timeout)

    def delete_key(self, key):
        return self._store.delete_key(self._prefix + key)


def allreduce_hook(state: HookState, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
    """DDP comm hook: averages the bucket's gradients over the ranks through
    gradsync (avg: one division at the end, so every rank gets the same bits).
    Buckets are submitted as DDP hands them over, during the backward pass.
    A CPU bucket large enough to have pages of its own is shared with the
    daemon in place (Engine.adopted) and reduced there with no copy; the
    future's tensor is the bucket itself. Otherwise the bucket is staged and
    the future's tensor is the staging buffer: DDP copies the result from it
    into the gradients (one copy out, not two); the buffer goes back to the
    pool when the next step's first bucket comes, DDP being done with it by
    then (it reads every result before backward() returns)."""
    tensor = bucket.buffer()
    e = state.engine
    if bucket.index() == 0:  # a new step: the last one's results were read
        state._release_held()
    n = tensor.numel()
    state.buckets += 1
    if state.trace is not None:
        state.trace.append((bucket.index(), time.perf_counter(), n * tensor.element_size()))
    found = e.adopted(tensor)
    if found is not None and found[1] % tensor.element_size() == 0:
        # The bucket's own memory, shared with the daemon: reduced in place.
        return e.submit("allreduce", found[0], tensor.dtype, n, lambda: tensor, op="avg",
                        name=f"bucket{bucket.index()}", offset=found[1] // tensor.element_size(),
                        device=tensor.device)
    buf = e.stage(n * tensor.element_size(), tensor.device)
    staging = e.view(buf, tensor.dtype, n)
    staging.copy_(tensor)

    def finish():
        state._hold(buf)  # only an op that ended: a buffer still in use is never reused
        return staging
    return e.submit("allreduce", buf, tensor.dtype, n, finish, op="avg",
                    name=f"bucket{bucket.index()}", device=tensor.device)
