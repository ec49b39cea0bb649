"""The torch side of an op of gradsync.torch: the c10d Work the backend
returns (_Work), kept alive until its result is taken; the profiler event of
each op; and futures that join several. Internal to gradsync.torch."""

import datetime
import threading
from typing import List, Optional

import torch
import torch.distributed as dist

from . import _torch_compat as _compat
from .errors import PENDING, StillRunning


class _Work(dist.Work):
    """A c10d Work over a torch future: wait() raises the op's error (torch
    1.13's future-wrapping Work swallows it) and get_future() is what DDP
    chains on."""

    def __init__(self, fut: torch.futures.Future):
        super().__init__()
        self._fut = fut
        self._done = threading.Event()
        self._taken = False
        fut.add_done_callback(lambda _: self._on_done())

    def wait(self, timeout: datetime.timedelta = None) -> bool:
        """Waits for the op (at most `timeout`, if given and not zero) and
        raises its error; RuntimeError if the wait runs out first."""
        seconds = None if timeout is None else timeout.total_seconds()
        if seconds and not self._done.wait(seconds):
            raise StillRunning(PENDING, f"Work.wait timed out after {seconds:g} s; the op is still "
                               "running (its deadline at the daemon is the group's timeout)")
        self._consumed()
        self._fut.wait()  # raises the op's error
        return True

    def is_completed(self) -> bool:
        return self._fut.done()

    def is_success(self) -> bool:
        if not self._fut.done():
            return False
        try:
            self._fut.wait()
            return True
        except Exception:
            return False

    def result(self):
        return self._fut.wait()

    def get_future(self) -> torch.futures.Future:
        self._consumed()
        return self._fut

    # A recv's sender (torch's recv from any source asks for it).
    _results: Optional[list] = None

    def _source_rank(self) -> int:
        self.wait()
        if not self._results:
            raise RuntimeError("gradsync: only a recv's work has a source rank")
        return self._results[0].source

    # C++ callers (DDP, broadcast_coalesced) hold a Work only as a C++ pointer;
    # once its Python object is gone, pybind11 no longer dispatches wait() or
    # get_future() to it. So a work stays referenced (in _LIVE) until its op is
    # done and someone took its result (wait() or get_future()).
    def _consumed(self) -> None:
        self._taken = True
        if self._fut.done():
            _LIVE.discard(self)

    def _on_done(self) -> None:
        self._done.set()
        if self._taken:
            _LIVE.discard(self)


_LIVE: "set[_Work]" = set()


def _work(fut: torch.futures.Future) -> "_Work":
    w = _Work(fut)
    _LIVE.add(w)
    return w


# The profiler event of each op, named as torch's own backends name theirs
# (gloo:all_reduce ...): "gradsync:" + this.
_PROFILING_TITLES = {"allreduce": "all_reduce", "broadcast": "broadcast", "reduce": "reduce",
                     "allgather": "all_gather", "reduce_scatter": "reduce_scatter",
                     "alltoall": "all_to_all", "barrier": "barrier", "gather": "gather",
                     "scatter": "scatter", "send": "send", "recv": "recv"}


def _profiling(title: str, inputs: List[torch.Tensor]):
    """Engine.submit's `wrap` for an op: while torch's profiler runs, the
    event of _profiled; otherwise none."""
    if not _compat.profiler_enabled():
        return None
    return lambda fut: _profiled(title, inputs, fut)


def _profiled(title: str, inputs: List[torch.Tensor], fut: torch.futures.Future):
    """An async profiler event `gradsync:<title>` with the inputs' shapes, from
    now until `fut` completes (as c10d records gloo's; Engine.submit calls this
    before its progress thread can complete `fut`, so the event ends there, on
    another thread), and a future that completes only once the event has
    ended, with the op's result or its error (its class kept)."""
    ended = _compat.record_async("gradsync:" + title, inputs, fut)
    out = torch.futures.Future()

    def relay(_):
        try:
            out.set_result(fut.value())
        except Exception as e:  # the op's error, as the caller would have had it
            out.set_exception(e)
    ended.add_done_callback(relay)
    return out


def _all_of(futs: List[torch.futures.Future], value) -> torch.futures.Future:
    """A future of `value` once every one of `futs` completed; the first
    error among them (in order) if any failed, its class kept."""
    out = torch.futures.Future()
    left = [len(futs)]
    lock = threading.Lock()

    def one(_) -> None:
        with lock:
            left[0] -= 1
            if left[0]:
                return
        for f in futs:
            try:
                f.value()
            except Exception as e:
                out.set_exception(e)
                return
        out.set_result(value)
    if not futs:
        out.set_result(value)
    for f in futs:
        f.add_done_callback(one)
    return out


def _completed(value) -> "_Work":
    fut = torch.futures.Future()
    fut.set_result(value)
    return _work(fut)
