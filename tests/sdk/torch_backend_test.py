"""The torch.distributed backend "gradsync" on real processes and a real
daemon ($GRADSYNC_DAEMON): every collective the backend implements, every
dtype and reduce op, exact against values every rank can compute; async ops;
errors (a rank that never submits, an unsupported dtype or device) surfacing
from wait(); CUDA tensors where this torch has CUDA (Debian's has not); and
destroy_process_group followed by a fresh group.

Run without --worker it launches WORLD processes of itself and fails if any
rank fails."""

import datetime
import os
import re
import shutil
import subprocess
import sys
import tempfile

WORLD = 3


def _compat_storage_ptr(t):
    """The data pointer of a tensor's storage (what the backend adopts)."""
    return t.storage().data_ptr()


def worker():
    import torch
    import torch.distributed as dist
    import gradsync.torch  # registers the backend "gradsync"; gradsync's errors below
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    # The ranks meet in files of the launcher's (FileStore): a port picked
    # free in advance can be taken by another process before rank 0 binds it.
    dist.init_process_group("gradsync", rank=rank, world_size=world,
                            init_method=os.environ["FIRST_INIT"],
                            timeout=datetime.timedelta(seconds=20))
    assert dist.get_backend() == "gradsync"
    R = dist.ReduceOp
    dtypes = [torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.int32,
              torch.int64, torch.uint8]
    ops = {R.SUM: lambda v: sum(v), R.MIN: min, R.MAX: max, R.AVG: lambda v: sum(v) / len(v),
           R.PRODUCT: lambda v: v[0] * v[1] * v[2]}
    vals = lambda r: [r + 1, 2 * r + 1, 5 - r]  # per element position, small exact values
    for dt in dtypes:
        for op, ref in ops.items():
            t = torch.tensor([vals(rank)] * 7, dtype=dt).reshape(-1)
            dist.all_reduce(t, op=op)
            want = [ref([vals(r)[i] for r in range(world)]) for i in range(3)] * 7
            if not dt.is_floating_point and op == R.AVG:
                want = [int(w) for w in want]
            got = t.double().tolist()
            assert got == [float(w) for w in want], (dt, op, got[:3], want[:3])
    # PREMUL_SUM: each rank's tensor times its own factor, summed in the daemon
    factors = [0.5, -2.0, 0.25]
    for dt in (torch.float32, torch.bfloat16, torch.float64):
        t = torch.tensor(vals(rank) * 5, dtype=dt)
        gradsync.torch.premul_sum_all_reduce(t, factors[rank])
        want = [sum(vals(r)[i] * factors[r] for r in range(world)) for i in range(3)] * 5
        assert t.double().tolist() == want, (dt, t.tolist(), want)
    o = torch.zeros(4)
    gradsync.torch.premul_sum_reduce_scatter(
        o, [torch.full((4,), float(10 * rank + j)) for j in range(world)], factors[rank])
    assert o.tolist() == [sum((10 * q + rank) * factors[q] for q in range(world))] * 4, o
    try:
        dist.all_reduce(torch.ones(2), op=torch.distributed._make_nccl_premul_sum(2.0))
        raise AssertionError("PREMUL_SUM through dist.all_reduce passed")
    except ValueError as e:
        assert "use gradsync.torch.premul_sum_all_reduce" in str(e), str(e)
    # broadcast, reduce
    b = torch.full((100,), float(rank), dtype=torch.float64)
    dist.broadcast(b, src=world - 1)
    assert b.eq(world - 1).all(), b[:3]
    r = torch.full((10,), rank + 1, dtype=torch.int64)
    dist.reduce(r, dst=1, op=R.SUM)
    assert r.tolist() == ([sum(range(1, world + 1))] * 10 if rank == 1 else [rank + 1] * 10), r
    # allgather (list and into one tensor)
    outs = [torch.zeros(5, dtype=torch.bfloat16) for _ in range(world)]
    dist.all_gather(outs, torch.full((5,), rank + 0.5, dtype=torch.bfloat16))
    assert [o[0].item() for o in outs] == [q + 0.5 for q in range(world)], outs
    flat = torch.zeros(world * 4, dtype=torch.int32)
    dist.all_gather_into_tensor(flat, torch.full((4,), rank, dtype=torch.int32))
    assert flat.tolist() == sum(([q] * 4 for q in range(world)), []), flat
    # ... with a size per rank (rank q gives 2q + 1 elements shaped (2q + 1, 1))
    outs = [torch.full((2 * q + 1, 1), -1.0, dtype=torch.float64) for q in range(world)]
    dist.all_gather(outs, torch.arange(2 * rank + 1, dtype=torch.float64).view(-1, 1) + 100 * rank)
    assert [o.view(-1).tolist() for o in outs] == \
        [[100.0 * q + k for k in range(2 * q + 1)] for q in range(world)], outs
    # ... ranks disagreeing on the sizes: a signature mismatch naming them
    sizes = [2 * q + 1 + (1 if rank == 2 and q == 0 else 0) for q in range(world)]
    try:
        dist.all_gather([torch.zeros(n) for n in sizes],
                        torch.zeros(sizes[rank]))
        raise AssertionError("all_gather with disagreeing sizes passed")
    except gradsync.InvalidArgument as e:
        assert "rank" in str(e) and "does not match" in str(e), str(e)
    # reduce_scatter (list and from one tensor)
    o = torch.zeros(6, dtype=torch.float32)
    dist.reduce_scatter(o, [torch.full((6,), float(10 * rank + j)) for j in range(world)])
    assert o.tolist() == [float(sum(10 * q + rank for q in range(world)))] * 6, o
    o2 = torch.zeros(2, dtype=torch.float16)
    dist.reduce_scatter_tensor(o2, torch.arange(world * 2, dtype=torch.float16), op=R.MAX)
    assert o2.tolist() == [2.0 * rank, 2.0 * rank + 1], o2
    # alltoall (single tensor and lists)
    x = torch.arange(world * 3, dtype=torch.uint8) + 50 * rank
    y = torch.empty_like(x)
    dist.all_to_all_single(y, x)
    assert y.tolist() == sum(([50 * q + 3 * rank + k for k in range(3)] for q in range(world)), []), y
    ins = [torch.full((2,), 100 * rank + j, dtype=torch.int64) for j in range(world)]
    outs = [torch.zeros(2, dtype=torch.int64) for _ in range(world)]
    dist.all_to_all(outs, ins)
    assert [v[0].item() for v in outs] == [100 * q + rank for q in range(world)], outs
    # ... with a size per pair: rank q sends q + j + 1 rows of 2 to rank j
    rows_to = [rank + j + 1 for j in range(world)]
    rows_from = [q + rank + 1 for q in range(world)]
    x = torch.cat([torch.full((n, 2), 10.0 * rank + j) for j, n in enumerate(rows_to)])
    y = torch.full((sum(rows_from), 2), -1.0)
    dist.all_to_all_single(y, x, output_split_sizes=rows_from, input_split_sizes=rows_to)
    want = torch.cat([torch.full((n, 2), 10.0 * q + rank) for q, n in enumerate(rows_from)])
    assert torch.equal(y, want), (y, want)
    ins = [torch.full((rank + j + 1,), rank * 7 + j, dtype=torch.int32) for j in range(world)]
    outs = [torch.zeros(q + rank + 1, dtype=torch.int32) for q in range(world)]
    dist.all_to_all(outs, ins)
    assert [o.tolist() for o in outs] == [[q * 7 + rank] * (q + rank + 1) for q in range(world)]
    # splits that disagree: the recv expecting the wrong size names both ranks
    bad_from = [n + (1 if (rank == 1 and q == 0) else 0) for q, n in enumerate(rows_from)]
    y = torch.zeros(sum(bad_from), 2)
    # (every rank on one daemon here: the send learns it too)
    try:
        dist.all_to_all_single(y, x, output_split_sizes=bad_from, input_split_sizes=rows_to)
        assert rank == 2, "rank 1 expected 3 rows from rank 0, which sends it 2"
    except gradsync.InvalidArgument as e:
        want = {1: "the message from rank 0 with tag -2 has 16 bytes (u8[16]); this recv's "
                   "tensor has 24 bytes (u8[24])",
                0: "rank 1's matching recv (recv '' u8[24] from rank 0 tag -2) has 24 bytes "
                   "(u8[24]); this message has 16 bytes (u8[16])"}
        assert rank in want and want[rank] in str(e), (rank, str(e))
    dist.barrier()
    # gather and scatter from every root, exact; non-roots pass no list
    for root in range(world):
        gl = [torch.zeros(4, dtype=torch.float64) for _ in range(world)] if rank == root else None
        dist.gather(torch.arange(4, dtype=torch.float64) + 10 * rank + 0.25, gather_list=gl,
                    dst=root)
        if rank == root:
            assert [g.tolist() for g in gl] == \
                [[10 * q + 0.25 + k for k in range(4)] for q in range(world)], gl
        sl = [torch.full((3, 2), 100 * root + j, dtype=torch.int32) for j in range(world)]
        out = torch.zeros(3, 2, dtype=torch.int32)
        dist.scatter(out, scatter_list=sl if rank == root else None, src=root)
        assert out.eq(100 * root + rank).all(), (root, out)
    # ... any dtype (as bytes), and the object variants built on them
    gb = [torch.zeros(2, dtype=torch.bool) for _ in range(world)] if rank == 0 else None
    dist.gather(torch.tensor([rank % 2 == 0, True]), gather_list=gb, dst=0)
    if rank == 0:
        assert [g.tolist() for g in gb] == [[q % 2 == 0, True] for q in range(world)], gb
    objs = [None] * world if rank == 2 else None
    dist.gather_object({"rank": rank, "s": "x" * (rank + 1)}, objs, dst=2)
    if rank == 2:
        assert objs == [{"rank": q, "s": "x" * (q + 1)} for q in range(world)], objs
    got = [None]
    dist.scatter_object_list(got, [("obj", j, [j] * j) for j in range(world)] if rank == 1
                             else None, src=1)
    assert got[0] == ("obj", rank, [rank] * rank), got
    # async: several in flight, completed in order
    ts = [torch.full((1000 * (i + 1),), float(rank)) for i in range(4)]
    works = [dist.all_reduce(t, async_op=True) for t in ts]
    for w in works:
        w.wait()
        assert w.is_completed()
    assert all(t.eq(sum(range(world))).all() for t in ts)
    # torch's profiler sees each op as c10d records gloo's: one async event
    # "gradsync:<op>" per op, from submission to completion, with the shapes.
    with torch.autograd.profiler.profile(record_shapes=True) as prof:
        dist.all_reduce(torch.ones(6, 4))
        dist.broadcast(torch.ones(3), src=0, async_op=True).wait()
        dist.all_gather([torch.zeros(2) for _ in range(world)], torch.ones(2))
        dist.gather(torch.ones(5), [torch.zeros(5) for _ in range(world)] if rank == 0 else None)
        dist.scatter(torch.zeros(2), [torch.ones(2)] * world if rank == 0 else None)
        dist.barrier()
    events = [e for e in prof.function_events if e.name.startswith("gradsync:")]
    names = sorted(e.name for e in events)
    assert names == ["gradsync:all_gather", "gradsync:all_reduce", "gradsync:barrier",
                     "gradsync:broadcast", "gradsync:gather", "gradsync:scatter"], names
    for e in events:
        assert e.is_async and e.count == 1 and e.cpu_time >= 0, (e.name, e.is_async, e.count)
    shapes = {e.name: e.input_shapes for e in events}
    assert shapes["gradsync:all_reduce"] == [[6, 4]], shapes
    assert shapes["gradsync:broadcast"] == [[3]], shapes
    # Data-movement collectives take any dtype (moved as bytes), e.g. DDP's bool buffers.
    mask = torch.tensor([rank % 2 == 0, True, False])
    dist.broadcast(mask, src=1)
    assert mask.tolist() == [False, True, False], mask
    q = [torch.zeros(2, dtype=torch.int8) for _ in range(world)]
    dist.all_gather(q, torch.full((2,), -rank, dtype=torch.int8))
    assert [v[0].item() for v in q] == [-r for r in range(world)], q
    z = torch.full((2,), complex(rank, -rank), dtype=torch.complex64)
    dist.broadcast(z, src=2)
    assert z.tolist() == [complex(2, -2)] * 2, z
    # Zero elements complete at once; a wrong list length is refused, naming it.
    e0 = torch.empty(0)
    dist.all_reduce(e0)
    try:
        dist.reduce_scatter(torch.zeros(2), [torch.zeros(2)])
        raise AssertionError("reduce_scatter with 1 of 3 inputs accepted")
    except ValueError as err:
        assert "takes 3 input" in str(err), err
    # Large CPU tensors are shared with the daemon in place (no staging): a
    # view at an offset into a 36 MiB storage (above glibc's largest mmap
    # threshold), exact, the elements outside the view untouched.
    import gradsync.torch as gt
    pg = dist.distributed_c10d._get_default_group()
    big = (torch.arange(9 << 20) % 1024).float() + rank  # small integers: exact sums
    part = big[5:(8 << 20) + 5]
    dist.all_reduce(part)
    want_part = (torch.arange(5, (8 << 20) + 5) % 1024).float() * world + sum(range(world))
    assert torch.equal(part, want_part), (part[:3], want_part[:3])
    assert big[:5].tolist() == [float(k + rank) for k in range(5)], big[:5]
    assert big[(8 << 20) + 5:].eq((torch.arange((8 << 20) + 5, 9 << 20) % 1024).float()
                                  + rank).all()
    assert len(pg._engine._adopted) >= 1, "a 36 MiB storage was staged, not adopted"
    del big, part
    # all_gather_into_tensor into a 36 MiB output: gathered in place, exact;
    # also with the input a view of this rank's own block (FSDP's unsharding).
    block = 3 << 20
    out = torch.zeros(world * block)
    dist.all_gather_into_tensor(out, torch.full((block,), float(rank + 1)))
    assert all(out[q * block:(q + 1) * block].eq(q + 1).all() for q in range(world)), out[::block]
    base = _compat_storage_ptr(out)
    assert base in pg._engine._adopted, "a 36 MiB allgather output was staged, not adopted"
    out.zero_()
    out[rank * block:(rank + 1) * block] = -7.0 - rank
    dist.all_gather_into_tensor(out, out[rank * block:(rank + 1) * block])
    assert all(out[q * block:(q + 1) * block].eq(-7.0 - q).all() for q in range(world))
    del out
    # ... and so are DDP's buckets through the hook: a 36 MiB layer, its
    # gradient averaged over the ranks (every rank computes every rank's
    # local gradient to check it, within float rounding of the sum's order).
    torch.manual_seed(5)
    layer = torch.nn.Linear(3000, 3000, bias=False)
    xs = [torch.randn(2, 3000, generator=torch.Generator().manual_seed(100 + q))
          for q in range(world)]
    local = []
    for x in xs:
        layer.zero_grad()
        layer(x).square().sum().backward()
        local.append(layer.weight.grad.clone())
    want_grad = sum(local) / world
    ddp = torch.nn.parallel.DistributedDataParallel(layer)
    hook = gt.HookState(timeout=30)
    ddp.register_comm_hook(hook, gt.allreduce_hook)
    for _ in range(2):  # DDP rebuilds its buckets after the first step
        layer.zero_grad()
        ddp(xs[rank]).square().sum().backward()
        err = (layer.weight.grad - want_grad).abs().max().item()
        assert err <= 1e-5 * want_grad.abs().max().item(), err
    assert len(hook.engine._adopted) >= 1, "DDP's 36 MiB bucket was staged, not adopted"
    hook.close()
    del ddp, layer
    dist.barrier()
    # Two DDP hook states in one process get jobs of their own.
    h1, h2 = gt.HookState(timeout=30), gt.HookState(timeout=30)
    assert h1.engine.session.job != h2.engine.session.job
    h1.close()
    h2.close()
    dist.barrier()
    # An unsupported dtype is refused at once, naming it.
    try:
        dist.all_reduce(torch.zeros(3, dtype=torch.int16))
        raise AssertionError("int16 accepted")
    except ValueError as e:
        assert "torch.int16" in str(e), e
    dist.barrier()
    # A device gradsync does not stage through is refused, naming it.
    try:
        dist.all_reduce(torch.zeros(3, device="meta"))
        raise AssertionError("a meta tensor accepted")
    except ValueError as e:
        assert "tensors on meta are not supported (cpu or cuda)" in str(e), e
    if torch.cuda.is_available():  # CUDA tensors, staged through device buffers
        dev = torch.device("cuda", rank % torch.cuda.device_count())
        g = torch.arange(1 << 20, dtype=torch.float32, device=dev) * (rank + 1)
        dist.all_reduce(g)
        want = torch.arange(1 << 20, dtype=torch.float32, device=dev) * (world * (world + 1) // 2)
        assert torch.equal(g, want), (g[:3], want[:3])
        outs = [torch.zeros(4, dtype=torch.int32, device=dev) for _ in range(world)]
        dist.all_gather(outs, torch.full((4,), rank, dtype=torch.int32, device=dev))
        assert [o[0].item() for o in outs] == list(range(world)), outs
        print(f"rank {rank}: CUDA tensors on {dev} ok")
    else:
        print(f"rank {rank}: this torch has no CUDA; CUDA tensors not exercised")
    dist.barrier()
    dist.destroy_process_group()
    # A fresh group (a new gradsync job); an op rank 2 never submits fails on
    # the others within the group timeout, naming rank 2.
    # Its store is a file of its own.
    dist.init_process_group("gradsync", rank=rank, world_size=world,
                            init_method=os.environ["SECOND_INIT"],
                            timeout=datetime.timedelta(seconds=2))
    t = torch.ones(10)
    dist.all_reduce(t)
    assert t.eq(world).all()
    store = dist.distributed_c10d._get_default_store()
    if rank != 2:
        w = dist.all_reduce(torch.ones(10), async_op=True)
        try:  # a wait shorter than the op's deadline runs out first
            w.wait(datetime.timedelta(seconds=0.3))
            raise AssertionError("a 0.3 s wait on a stuck op returned")
        except RuntimeError as e:
            assert "Work.wait timed out after 0.3 s" in str(e), e
            assert isinstance(e, gradsync.StillRunning), type(e)
        try:
            w.wait()
            raise AssertionError("an op rank 2 never submitted completed")
        except RuntimeError as e:
            assert "waiting for rank(s) 2" in str(e), e
            # gradsync's class, and a timeout as torch's callers recognise one.
            assert isinstance(e, gradsync.DeadlineExceeded) and isinstance(e, TimeoutError), type(e)
            assert re.search(" (Timed out|closed|timeout) ", str(e)), e  # torch's own pattern
            print(f"rank {rank}: {e}")
        store.set(f"gave_up_{rank}", "1")
    else:  # stays in the job (submitting nothing) until the others gave up
        store.wait([f"gave_up_{r}" for r in range(world) if r != 2], datetime.timedelta(seconds=60))
    dist.destroy_process_group()
    print(f"rank {rank}: ok")


def main():
    tmp = tempfile.mkdtemp(prefix="torch-backend-")
    procs = []
    for r in range(WORLD):
        env = dict(os.environ, RANK=str(r), WORLD_SIZE=str(WORLD),
                   FIRST_INIT="file://" + os.path.join(tmp, "first"),
                   SECOND_INIT="file://" + os.path.join(tmp, "second"))
        procs.append(subprocess.Popen([sys.executable, __file__, "--worker"], env=env))
    codes = [p.wait(timeout=300) for p in procs]
    shutil.rmtree(tmp, ignore_errors=True)
    if any(codes):
        sys.exit(f"torch backend test: exit codes by rank {codes}")
    print("torch backend test: PASS")


if __name__ == "__main__":
    worker() if "--worker" in sys.argv else main()
