"""gradsync for PyTorch: a torch.distributed backend and a DDP comm hook.

    import torch.distributed as dist
    import gradsync.torch                     # registers backend "gradsync"
    dist.init_process_group("gradsync")       # torchrun env: RANK, WORLD_SIZE, MASTER_ADDR/PORT
    dist.all_reduce(t)                        # through the local gradsyncd

    # Or keep another backend and send DDP's gradient buckets through gradsync:
    model.register_comm_hook(gradsync.torch.HookState(), gradsync.torch.allreduce_hook)

The daemon is $GRADSYNC_DAEMON (or entry $LOCAL_RANK of $GRADSYNC_DAEMONS),
default unix:/run/gradsync/gradsyncd.sock. Ranks agree on a gradsync job id
through the process group's c10d store. CPU and CUDA tensors of f32, f64, f16,
bf16, i32, i64 and u8. A large CPU tensor's all_reduce runs on its own
memory, shared with the daemon in place (DDP's buckets too); every other op is
staged through a pooled buffer (one copy in, one copy out): shared memory for
CPU tensors, a device buffer on the tensor's GPU for CUDA tensors (where the
installed torch has CUDA). An op completes on a
progress thread; errors (which rank, which op) surface from Work.wait() as
gradsync.GradsyncError subclasses (RuntimeErrors; a timeout is also a
TimeoutError whose text starts "Timed out"). See docs/python.md.

Here: the backend (ProcessGroupGradsync) and the functions torch.distributed
lacks; the DDP hook is in _ddp_hook.py, the Work and profiler events in
_torch_work.py, the staging and progress thread in _engine.py.
"""

import datetime
import hashlib
import time
from typing import List, Optional

import torch
import torch.distributed as dist

from . import _torch_compat as _compat
from ._ddp_hook import HookState, allreduce_hook
from ._engine import Engine, check_device, gradsync_dtype
from .errors import GradsyncError
from ._torch_work import _PROFILING_TITLES, _all_of, _completed, _profiling, _Work, _work

__all__ = ["ProcessGroupGradsync", "HookState", "allreduce_hook", "monitored_barrier",
           "premul_sum_all_reduce", "premul_sum_reduce_scatter", "BACKEND"]

BACKEND = "gradsync"

def _op(reduce_op) -> str:
    for k, v in _compat.REDUCE_OPS.items():
        if reduce_op == k:
            return v
    if hasattr(dist.ReduceOp, "PREMUL_SUM") and reduce_op == dist.ReduceOp.PREMUL_SUM:
        raise ValueError(f"gradsync: PREMUL_SUM's factor is not readable from Python in torch "
                         f"{torch.__version__}; use gradsync.torch.premul_sum_all_reduce or "
                         f"premul_sum_reduce_scatter")
    raise ValueError(f"gradsync: unsupported reduce op {reduce_op} (sum, avg, min, max, prod)")


# Tags of the point-to-point messages the backend sends for its own
# collectives (user tags are >= 0 in torch's API).
_ALLTOALLV_TAG = -2
_MONITORED_BARRIER_TAG = -3


def _tensor_list(t) -> List[torch.Tensor]:
    """c10d passes one tensor or a list of them; gradsync takes one."""
    ts = [t] if isinstance(t, torch.Tensor) else list(t)
    if len(ts) != 1:
        raise ValueError(f"gradsync: one tensor per call, got {len(ts)}")
    return ts


class ProcessGroupGradsync(dist.ProcessGroup):
    """A torch.distributed process group whose collectives run on gradsyncd."""

    def __init__(self, store, rank: int, size: int, timeout: datetime.timedelta):
        super().__init__(rank, size)
        self._engine = Engine(store, rank, size, timeout.total_seconds(), prefix="torch")

    def getBackendName(self) -> str:
        return BACKEND

    # One tensor in place: allreduce and reduce in its dtype; broadcast as bytes
    # (any dtype: bool, int8, complex, ... move as they are).
    def _in_place(self, kind: str, tensor: torch.Tensor, op: str = "sum", root: int = 0,
                  factor: Optional[float] = None):
        check_device(tensor)
        if tensor.numel() == 0:
            return _completed([tensor])
        as_bytes = kind == "broadcast"
        dtype = torch.uint8 if as_bytes else tensor.dtype
        if not as_bytes:
            gradsync_dtype(tensor)
        e = self._engine
        if kind == "allreduce":
            work = self._allreduce_adopted(tensor, op, factor)
            if work is not None:
                return work
        n = tensor.numel() * tensor.element_size() if as_bytes else tensor.numel()
        buf = e.stage(tensor.numel() * tensor.element_size(), tensor.device)
        staging = e.view(buf, dtype, n)
        flat = tensor.reshape(-1)
        staging.copy_(flat.contiguous().view(torch.uint8) if as_bytes else flat)
        me = self.rank()

        def finish():
            if kind != "reduce" or me == root:
                result = staging.view(tensor.dtype) if as_bytes else staging
                tensor.copy_(result.view(tensor.shape))
            return [tensor]
        return _work(e.submit(kind, buf, dtype, n, finish, op=op, root=root, staged=[buf],
                              device=tensor.device, factor=factor,
                              wrap=_profiling(_PROFILING_TITLES[kind], [tensor])))

    def _allreduce_adopted(self, tensor: torch.Tensor, op: str,
                           factor: Optional[float]) -> Optional["_Work"]:
        """The allreduce in place on the tensor's own memory, shared with the
        daemon (Engine.adopted); None where it is not (then it stages)."""
        e = self._engine
        found = e.adopted(tensor)
        if found is None or found[1] % tensor.element_size():
            return None
        buf, offset = found
        return _work(e.submit("allreduce", buf, tensor.dtype, tensor.numel(), lambda: [tensor],
                              op=op, offset=offset // tensor.element_size(), factor=factor,
                              device=tensor.device,
                              wrap=_profiling("all_reduce", [tensor])))

    def allreduce(self, tensors, opts=None):
        opts = opts or dist.AllreduceOptions()
        t = _tensor_list(tensors)[0]
        if t.layout == torch.sparse_coo:
            return self._sparse_allreduce(t, opts.reduceOp)
        return self._in_place("allreduce", t, _op(opts.reduceOp))

    def _sparse_allreduce(self, t: torch.Tensor, reduce_op) -> "_Work":
        """A sparse COO tensor's sum, as gloo does it: every rank's coalesced
        indices and values allgathered (padded to the largest count, which
        an allgather of the counts tells), summed into one coalesced tensor
        that replaces `t`'s contents. Sum only. Runs before it returns (the
        Work is complete)."""
        if _op(reduce_op) != "sum":
            raise ValueError(f"gradsync: sparse all_reduce supports only SUM, got {reduce_op}")
        n = self.size()
        mine = t.coalesce()
        idx, vals = mine.indices(), mine.values()
        counts = torch.zeros(n, dtype=torch.int64)
        self._blocked("allgather", [torch.tensor([idx.shape[1]], dtype=torch.int64)],
                      list(counts.view(n, 1).unbind(0))).wait()
        most = int(counts.max())
        pad_idx = torch.zeros((idx.shape[0], most), dtype=idx.dtype)
        pad_idx[:, :idx.shape[1]] = idx
        pad_vals = torch.zeros((most,) + tuple(vals.shape[1:]), dtype=vals.dtype)
        pad_vals[:vals.shape[0]] = vals
        all_idx = [torch.empty_like(pad_idx) for _ in range(n)]
        all_vals = [torch.empty_like(pad_vals) for _ in range(n)]
        if most > 0:
            self._blocked("allgather", [pad_idx.contiguous()], all_idx).wait()
            self._blocked("allgather", [pad_vals.contiguous()], all_vals).wait()
        k = [int(c) for c in counts]
        total = torch.sparse_coo_tensor(
            torch.cat([a[:, :c] for a, c in zip(all_idx, k)], dim=1),
            torch.cat([v[:c] for v, c in zip(all_vals, k)]), t.shape).coalesce()
        t.copy_(total)
        return _completed([t])

    def broadcast(self, tensors, opts=None):
        if isinstance(opts, int):  # broadcast(tensor, root)
            root, opts = opts, dist.BroadcastOptions()
            opts.rootRank = root
        opts = opts or dist.BroadcastOptions()
        return self._in_place("broadcast", _tensor_list(tensors)[0], root=opts.rootRank)

    def reduce(self, tensors, opts=None):
        opts = opts or dist.ReduceOptions()
        return self._in_place("reduce", _tensor_list(tensors)[0], _op(opts.reduceOp),
                              root=opts.rootRank)

    # Blocked collectives: world_size equal blocks in one staging buffer;
    # reduce_scatter in its dtype, allgather, alltoall, gather and scatter as
    # bytes. gather and scatter stage world_size blocks on every rank (the
    # daemon's layout); a non-root rank fills or reads only its own.
    def _blocked(self, kind: str, inputs: List[torch.Tensor], outputs: List[torch.Tensor],
                 op: str = "sum", keep_block: Optional[int] = None, title: Optional[str] = None,
                 root: int = 0, name: Optional[str] = None, factor: Optional[float] = None):
        n, me = self.size(), self.rank()
        rooted = kind in ("gather", "scatter")
        if rooted and not 0 <= root < n:
            raise ValueError(f"gradsync: {kind} root {root} is not a rank of {n}")
        want_in = {"allgather": 1, "gather": 1, "scatter": n if me == root else 0}.get(kind, n)
        want_out = {"reduce_scatter": 1, "scatter": 1,
                    "gather": n if me == root else 0}.get(kind, n)
        if len(inputs) != want_in or len(outputs) != want_out:
            where = f" on {'the root' if me == root else 'a non-root rank'}" if rooted else ""
            raise ValueError(f"gradsync: {kind} at {n} ranks takes {want_in} input and {want_out} "
                             f"output tensors{where}; got {len(inputs)} and {len(outputs)}")
        ref = outputs[0] if kind == "scatter" else inputs[0]
        for t in list(inputs) + list(outputs):
            if t.numel() != ref.numel() or t.dtype != ref.dtype or t.device != ref.device:
                raise ValueError(f"gradsync: {kind} needs tensors of {ref.numel()} {ref.dtype} "
                                 f"elements each on {ref.device}; got {t.numel()} {t.dtype} on "
                                 f"{t.device}")
        check_device(ref)
        if ref.numel() == 0:
            return _completed(outputs)
        as_bytes = kind != "reduce_scatter"
        if not as_bytes:
            gradsync_dtype(ref)
        dtype = torch.uint8 if as_bytes else ref.dtype
        block = ref.numel() * ref.element_size() if as_bytes else ref.numel()
        e = self._engine
        buf = e.stage(n * ref.numel() * ref.element_size(), ref.device)
        staging = e.view(buf, dtype, n * block)

        def put(j: int, t: torch.Tensor) -> None:
            flat = t.reshape(-1)
            staging[j * block:(j + 1) * block].copy_(flat.contiguous().view(torch.uint8)
                                                     if as_bytes else flat)

        def get(j: int, t: torch.Tensor) -> None:
            part = staging[j * block:(j + 1) * block]
            t.copy_((part.view(t.dtype) if as_bytes else part).view(t.shape))
        if kind in ("allgather", "gather"):
            put(me, inputs[0])
        else:
            for j, t in enumerate(inputs):
                put(j, t)

        def finish():
            if keep_block is not None:
                get(keep_block, outputs[0])
            else:
                for j, t in enumerate(outputs):
                    get(j, t)
            return outputs
        return _work(e.submit(kind, buf, dtype, n * block, finish, op=op, root=root, staged=[buf],
                              device=ref.device, name=name, factor=factor,
                              wrap=_profiling(title or _PROFILING_TITLES[kind], list(inputs))))

    def allgather(self, output_tensors, input_tensors, opts=None):
        if len(output_tensors) != 1:
            raise ValueError(f"gradsync: one output list per call, got {len(output_tensors)}")
        ins, outs = _tensor_list(input_tensors), list(output_tensors[0])
        if (len(outs) == self.size() and outs[self.rank()].numel() == ins[0].numel()
                and any(t.numel() != ins[0].numel() for t in outs)
                and all(t.dtype == ins[0].dtype for t in outs)):
            return self._allgatherv(ins[0], outs)
        return self._blocked("allgather", ins, outs)

    def _allgatherv(self, mine: torch.Tensor, outs: List[torch.Tensor]) -> "_Work":
        """all_gather with a size per rank (output j sized as rank j's input,
        as torch's API allows): one daemon allgather of blocks padded to the
        largest output, each output read from its block's prefix. The op's
        name carries a digest of the sizes, so ranks that disagree on them
        fail it as a signature mismatch naming them."""
        sizes = [t.numel() for t in outs]
        block = max(sizes)
        digest = hashlib.blake2s(repr(sizes).encode(), digest_size=8).hexdigest()
        padded = torch.zeros(block, dtype=mine.dtype, device=mine.device)
        padded[:mine.numel()].copy_(mine.reshape(-1))
        blocks = [torch.empty(block, dtype=mine.dtype, device=mine.device) for _ in outs]
        gathered = self._blocked("allgather", [padded], blocks,
                                 name=f"all_gather sizes {digest}").get_future()
        out = torch.futures.Future()

        def unpad(_) -> None:
            try:
                gathered.value()
            except Exception as e:  # the op's error, its class kept
                out.set_exception(e)
                return
            for t, b in zip(outs, blocks):
                t.copy_(b[:t.numel()].view(t.shape))
            out.set_result(outs)
        gathered.add_done_callback(unpad)
        return _work(out)

    @staticmethod
    def _contiguous(t: torch.Tensor, what: str) -> torch.Tensor:
        if not t.is_contiguous():
            raise ValueError(f"gradsync: {what} must be a contiguous tensor")
        return t

    def _allgather_base(self, output: torch.Tensor, input: torch.Tensor, opts=None):
        outs = list(self._contiguous(output, "the output").view(self.size(), -1).unbind(0))
        work = self._allgather_adopted(output, outs, input)
        if work is not None:
            return work
        return self._blocked("allgather", [input], outs, title="all_gather_into_tensor")

    def _allgather_adopted(self, output: torch.Tensor, outs: List[torch.Tensor],
                           input: torch.Tensor) -> Optional["_Work"]:
        """all_gather_into_tensor on the output's own memory, shared with the
        daemon (Engine.adopted; FSDP's unsharding): this rank's input copied
        into its block (nothing when it is that block already), then the
        allgather in place. None where the output is not shared (it stages)."""
        me = self.rank()
        if input.numel() != outs[me].numel() or input.dtype != output.dtype or \
                input.device != output.device:
            return None  # _blocked names what is wrong
        e = self._engine
        found = e.adopted(output)
        if found is None:
            return None
        buf, offset = found
        if input.data_ptr() != outs[me].data_ptr():
            outs[me].copy_(input.reshape(outs[me].shape))
        nbytes = output.numel() * output.element_size()
        return _work(e.submit("allgather", buf, torch.uint8, nbytes, lambda: [output],
                              offset=offset, device=output.device,
                              wrap=_profiling("all_gather_into_tensor", [input])))

    def reduce_scatter(self, output_tensors, input_tensors, opts=None):
        opts = opts or dist.ReduceScatterOptions()
        if len(input_tensors) != 1:
            raise ValueError(f"gradsync: one input list per call, got {len(input_tensors)}")
        return self._blocked("reduce_scatter", list(input_tensors[0]), _tensor_list(output_tensors),
                             _op(opts.reduceOp), keep_block=self.rank())

    def _reduce_scatter_base(self, output: torch.Tensor, input: torch.Tensor, opts=None):
        opts = opts or dist.ReduceScatterOptions()
        ins = list(self._contiguous(input, "the input").view(self.size(), -1).unbind(0))
        return self._blocked("reduce_scatter", ins, [output], _op(opts.reduceOp),
                             keep_block=self.rank(), title="reduce_scatter_tensor")

    def alltoall(self, output_tensors, input_tensors, opts=None):
        ins, outs = list(input_tensors), list(output_tensors)
        n = self.size()
        if len(ins) != n or len(outs) != n:
            raise ValueError(f"gradsync: all_to_all at {n} ranks takes {n} input and {n} output "
                             f"tensors; got {len(ins)} and {len(outs)}")
        if all(t.numel() == ins[0].numel() and t.dtype == ins[0].dtype for t in ins + outs):
            return self._blocked("alltoall", ins, outs)
        return self._alltoallv(ins, outs)

    def alltoall_base(self, output: torch.Tensor, input: torch.Tensor, output_split_sizes,
                      input_split_sizes, opts=None):
        n = self.size()
        if not output_split_sizes and not input_split_sizes:
            if input.numel() % n:
                raise ValueError(f"gradsync: all_to_all_single of {input.numel()} elements does "
                                 f"not split into {n} equal blocks")
            ins = list(input.reshape(n, -1).unbind(0))
            outs = list(self._contiguous(output, "the output").view(n, -1).unbind(0))
            return self._blocked("alltoall", ins, outs)
        return self._alltoallv(self._split(input, input_split_sizes, "input"),
                               self._split(self._contiguous(output, "the output"),
                                           output_split_sizes, "output"))

    def _split(self, t: torch.Tensor, splits, what: str) -> List[torch.Tensor]:
        """all_to_all_single's tensor as n views along its first dimension
        (`splits` rows each; none: equal parts)."""
        n = self.size()
        rows = t.shape[0] if t.dim() > 0 else 0
        splits = list(splits) if splits else ([rows // n] * n if rows % n == 0 else None)
        if splits is None or len(splits) != n or sum(splits) != rows or min(splits) < 0:
            raise ValueError(f"gradsync: all_to_all_single's {what} splits {splits} do not cut "
                             f"its {rows} rows into {n} parts")
        return list(t.split(splits, dim=0)) if rows else [t] * n

    def _alltoallv(self, ins: List[torch.Tensor], outs: List[torch.Tensor]) -> "_Work":
        """All-to-all with a size per pair: input i goes to rank i, output j
        comes from rank j, as the daemon's point-to-point messages (a message
        whose size differs from the receiver's output fails its recv naming
        both ranks); this rank's own part is a copy."""
        n, me = self.size(), self.rank()
        for t in ins + outs:
            check_device(t)
            if t.dtype != ins[0].dtype:
                raise ValueError(f"gradsync: all_to_all needs one dtype; got {ins[0].dtype} "
                                 f"and {t.dtype}")
        if ins[me].numel() != outs[me].numel():
            raise ValueError(f"gradsync: all_to_all at rank {me}: this rank's own input part has "
                             f"{ins[me].numel()} elements and its output part "
                             f"{outs[me].numel()}")
        outs[me].copy_(ins[me])
        futs = []
        for peer in range(n):
            if peer == me:
                continue
            futs.append(self._p2p("send", [ins[peer].contiguous()], peer, _ALLTOALLV_TAG,
                                  title=None).get_future())
        for peer in range(n):
            if peer == me:
                continue
            futs.append(self._p2p("recv", [outs[peer]], peer, _ALLTOALLV_TAG,
                                  title=None).get_future())
        fut = _all_of(futs, outs)
        wrap = _profiling("all_to_all", ins)
        return _work(wrap(fut) if wrap is not None else fut)

    # Coalesced calls: one op over several tensors, packed into one staging
    # buffer (the copy in the backend makes anyway), so the daemon sees one
    # signature and runs one pass.
    def allreduce_coalesced(self, tensors, opts=None):
        opts = opts or dist.AllreduceCoalescedOptions()
        ts = list(tensors)
        if not ts:
            return _completed([])
        for t in ts:
            check_device(t)
            if t.dtype != ts[0].dtype or t.device != ts[0].device:
                raise ValueError(f"gradsync: allreduce_coalesced needs one dtype and device; got "
                                 f"{ts[0].dtype} on {ts[0].device} and {t.dtype} on {t.device}")
            if t.layout != torch.strided:
                raise ValueError(f"gradsync: allreduce_coalesced takes dense tensors; got "
                                 f"{t.layout}")
        gradsync_dtype(ts[0])
        total = sum(t.numel() for t in ts)
        if total == 0:
            return _completed(ts)
        e = self._engine
        buf = e.stage(total * ts[0].element_size(), ts[0].device)
        staging = e.view(buf, ts[0].dtype, total)
        at = 0
        for t in ts:
            staging[at:at + t.numel()].copy_(t.reshape(-1))
            at += t.numel()

        def finish():
            at = 0
            for t in ts:
                t.copy_(staging[at:at + t.numel()].view(t.shape))
                at += t.numel()
            return ts
        return _work(e.submit("allreduce", buf, ts[0].dtype, total, finish,
                              op=_op(opts.reduceOp), staged=[buf], device=ts[0].device,
                              wrap=_profiling("all_reduce_coalesced", ts)))

    def allgather_coalesced(self, output_lists, input_list, opts=None):
        n, me = self.size(), self.rank()
        ins = list(input_list)
        if len(output_lists) != n or any(len(o) != len(ins) for o in output_lists):
            raise ValueError(f"gradsync: allgather_coalesced at {n} ranks takes {n} output lists "
                             f"of {len(ins)} tensors each")
        for j, outs in enumerate(output_lists):
            for t, i in zip(outs, ins):
                if t.numel() != i.numel() or t.dtype != i.dtype:
                    raise ValueError(f"gradsync: allgather_coalesced output {j} needs tensors "
                                     f"shaped as the inputs ({i.numel()} {i.dtype}); got "
                                     f"{t.numel()} {t.dtype}")
        for t in ins:
            check_device(t)
        sizes = [t.numel() * t.element_size() for t in ins]
        block = sum(sizes)
        if block == 0:
            return _completed(output_lists)
        e = self._engine
        buf = e.stage(n * block, ins[0].device if ins else None)
        staging = e.view(buf, torch.uint8, n * block)
        at = me * block
        for t, size in zip(ins, sizes):
            staging[at:at + size].copy_(t.contiguous().reshape(-1).view(torch.uint8))
            at += size

        def finish():
            for j, outs in enumerate(output_lists):
                at = j * block
                for t, size in zip(outs, sizes):
                    t.copy_(staging[at:at + size].view(t.dtype).view(t.shape))
                    at += size
            return output_lists
        return _work(e.submit("allgather", buf, torch.uint8, n * block, finish, staged=[buf],
                              device=ins[0].device,
                              wrap=_profiling("all_gather_coalesced", ins)))

    # torch 1.13's signatures: on the root gather's output_tensors is
    # [gather_list] and scatter's input_tensors [scatter_list]; elsewhere [].
    def gather(self, output_tensors, input_tensors, opts=None):
        opts = opts or dist.GatherOptions()
        if len(output_tensors) > 1:
            raise ValueError(f"gradsync: one output list per call, got {len(output_tensors)}")
        outs = list(output_tensors[0]) if output_tensors else []
        return self._blocked("gather", _tensor_list(input_tensors), outs, root=opts.rootRank)

    def scatter(self, output_tensors, input_tensors, opts=None):
        opts = opts or dist.ScatterOptions()
        if len(input_tensors) > 1:
            raise ValueError(f"gradsync: one input list per call, got {len(input_tensors)}")
        ins = list(input_tensors[0]) if input_tensors else []
        return self._blocked("scatter", ins, _tensor_list(output_tensors),
                             keep_block=self.rank(), root=opts.rootRank)

    # Point-to-point: the tensor as bytes through one staging buffer; send and
    # recv must agree on its size in bytes. The daemon matches them by
    # (source, tag) in send order (worker/point_to_point.h).
    def _p2p(self, kind: str, tensors, peer: int, tag: int, timeout: Optional[float] = None,
             title: Optional[str] = "") -> "_Work":
        t = _tensor_list(tensors)[0]
        n = self.size()
        if not (0 <= peer < n or (kind == "recv" and peer == -1)) or peer == self.rank():
            raise ValueError(f"gradsync: {kind} at rank {self.rank()}: peer rank {peer} is not "
                             f"another rank of this group of {n}")
        check_device(t)
        if not t.is_contiguous():
            raise ValueError(f"gradsync: {kind} needs a contiguous tensor")
        e = self._engine
        nbytes = t.numel() * t.element_size()
        buf = e.stage(nbytes, t.device)
        staging = e.view(buf, torch.uint8, nbytes)
        if kind == "send":
            staging.copy_(t.reshape(-1).view(torch.uint8))

        def finish():
            if kind == "recv":
                t.copy_(staging.view(t.dtype).view(t.shape))
            return [t]
        results: list = []
        title = _PROFILING_TITLES[kind] if title == "" else title
        w = _work(e.submit(kind, buf, torch.uint8, nbytes, finish, root=peer, staged=[buf],
                           device=t.device, tag=tag, results=results, timeout=timeout,
                           wrap=_profiling(title, [t]) if title else None))
        w._results = results
        return w

    def send(self, tensors, dstRank: int, tag: int = 0):
        return self._p2p("send", tensors, dstRank, tag)

    def recv(self, tensors, srcRank: int, tag: int = 0):
        return self._p2p("recv", tensors, srcRank, tag)

    def recv_anysource(self, tensors, tag: int = 0):
        return self._p2p("recv", tensors, -1, tag)

    def monitored_barrier(self, timeout=None, wait_all_ranks: bool = False) -> None:
        """gloo's monitored barrier: rank 0 waits for every other rank (at
        most `timeout`) and then releases them, naming the ranks that did not
        arrive: "Rank 2 failed to pass monitoredBarrier in 2000 ms" (with
        `wait_all_ranks`, every such rank: "Ranks 1, 2 failed ..."); the
        others raise if rank 0 does not release them in time. Blocks; point-
        to-point messages with a tag of the backend's own."""
        n, me = self.size(), self.rank()
        seconds = timeout.total_seconds() if isinstance(timeout, datetime.timedelta) else \
            float(timeout) if timeout is not None else self._engine.timeout_s
        ms = int(seconds * 1000)
        token = torch.zeros(1, dtype=torch.uint8)
        if me != 0:
            try:
                self._p2p("send", [token], 0, _MONITORED_BARRIER_TAG,
                          timeout=max(seconds, 0.001), title=None).wait()
                self._p2p("recv", [token.clone()], 0, _MONITORED_BARRIER_TAG,
                          timeout=max(seconds, 0.001), title=None).wait()
            except GradsyncError as e:
                raise RuntimeError(
                    f"[Rank {me}]: Rank {me} successfully reached monitoredBarrier, but received "
                    f"errors while waiting for send/recv from rank 0. Please check rank 0 logs "
                    f"for faulty rank. ({e})") from e
            return
        if seconds <= 0:
            raise RuntimeError(f"[Rank 0]: Rank 0 timed out in monitoredBarrier after {ms} ms")
        deadline = time.monotonic() + seconds
        recvs = [(r, self._p2p("recv", [torch.zeros(1, dtype=torch.uint8)], r,
                               _MONITORED_BARRIER_TAG, timeout=seconds, title=None))
                 for r in range(1, n)]
        failed = []
        for r, w in recvs:
            try:
                w.wait()
            except GradsyncError:
                failed.append(r)
                if not wait_all_ranks:
                    break
        if failed:
            if len(failed) == 1:
                raise RuntimeError(f"[Rank 0]: Rank {failed[0]} failed to pass monitoredBarrier "
                                   f"in {ms} ms")
            raise RuntimeError(f"[Rank 0]: Ranks {', '.join(map(str, failed))} failed to pass "
                               f"monitoredBarrier in {ms} ms")
        left = max(deadline - time.monotonic(), 0.001)
        sends = [self._p2p("send", [token], r, _MONITORED_BARRIER_TAG, timeout=left, title=None)
                 for r in range(1, n)]
        for w in sends:
            w.wait()

    def barrier(self, opts=None):
        e = self._engine
        return _work(e.submit("barrier", None, torch.uint8, 0, lambda: [],
                              wrap=_profiling("barrier", [])))

    def __del__(self):
        engine = getattr(self, "_engine", None)
        if engine is not None:
            self._engine = None
            try:
                engine.close()
            except Exception:
                pass


def monitored_barrier(group=None, timeout=None, wait_all_ranks: bool = False) -> None:
    """torch.distributed.monitored_barrier for gradsync groups (torch 1.13's
    refuses every backend but gloo): the same arguments, behaviour and error
    texts. A rank outside `group` returns at once; `timeout` defaults to the
    group's."""
    if group is not None and _compat.rank_not_in_group(group):
        return
    pg = group if group is not None else _compat.default_group()
    if not isinstance(pg, ProcessGroupGradsync):
        return dist.monitored_barrier(group, timeout, wait_all_ranks)
    return pg.monitored_barrier(timeout, wait_all_ranks=wait_all_ranks)


def _gradsync_group(group, what: str) -> Optional[ProcessGroupGradsync]:
    """`group` (default: the default group) as a gradsync group; None for a
    rank outside it; ValueError for another backend's."""
    if group is not None and _compat.rank_not_in_group(group):
        return None
    pg = group if group is not None else _compat.default_group()
    if not isinstance(pg, ProcessGroupGradsync):
        raise ValueError(f"gradsync: {what} needs a gradsync process group, got "
                         f"{type(pg).__name__}")
    return pg


def premul_sum_all_reduce(tensor: torch.Tensor, factor: float, group=None,
                          async_op: bool = False):
    """dist.all_reduce with PREMUL_SUM on a gradsync group: every rank's
    `tensor` (a float dtype) multiplied by that rank's own `factor`, then
    summed, in the daemon. torch 1.13 keeps the factor of
    dist._make_nccl_premul_sum out of a Python backend's reach, so this is
    how to ask for it. Returns the Work if async_op, else None."""
    pg = _gradsync_group(group, "premul_sum_all_reduce")
    if pg is None:
        return None
    work = pg._in_place("allreduce", _tensor_list(tensor)[0], "premul_sum",
                        factor=float(factor))
    if async_op:
        return work
    work.wait()
    return None


def premul_sum_reduce_scatter(output: torch.Tensor, input_list: List[torch.Tensor],
                              factor: float, group=None, async_op: bool = False):
    """dist.reduce_scatter with PREMUL_SUM on a gradsync group: `output`
    gets the sum over ranks of input_list[rank] multiplied by each rank's
    own `factor` (FSDP's pre-divided gradient reduction)."""
    pg = _gradsync_group(group, "premul_sum_reduce_scatter")
    if pg is None:
        return None
    work = pg._blocked("reduce_scatter", list(input_list), [output], "premul_sum",
                       keep_block=pg.rank(), factor=float(factor))
    if async_op:
        return work
    work.wait()
    return None


def _create(store, rank: int, size: int, timeout: datetime.timedelta) -> ProcessGroupGradsync:
    return ProcessGroupGradsync(store, rank, size, timeout)


_compat.register_backend(BACKEND, _create)
