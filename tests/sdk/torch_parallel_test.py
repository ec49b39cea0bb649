#!/usr/bin/env python3
"""ZeroRedundancyOptimizer and a 2 x 2 (pipeline x data) parallel shape over
the gradsync backend, each checked against one process training the same
model on the same global batches.

Four rank processes, ranks 0 and 1 on the first daemon of $GRADSYNC_DAEMONS,
2 and 3 on the second:
  * ZeRO: DDP over the four ranks with torch's ZeroRedundancyOptimizer (Adam,
    its state sharded over the ranks, parameters broadcast back each step)
    on scikit-learn's digits; the parameters after every step must equal the
    single-process run's within 2e-5 (float sums in another order).
  * 2 x 2: stage 0 (ranks 0, 1) holds the first layer, stage 1 (ranks 2, 3)
    the second; data-parallel groups {0, 1} and {2, 3} (new_group) run DDP on
    their stage; activations go forward and their gradients back between the
    stages with send/recv (0 <-> 2, 1 <-> 3: across the daemons). Parameters
    of both stages must equal the single-process run's.

    /usr/bin/python3 tests/sdk/torch_parallel_test.py     # needs GRADSYNC_DAEMONS (2 daemons)
"""

import os
import subprocess
import sys
import tempfile

STEPS = 6
BATCH = 64  # global; 16 per rank for ZeRO, 32 per replica for the 2 x 2 shape
TOL = 2e-5


def data():
    import numpy as np
    from sklearn.datasets import load_digits
    d = load_digits()
    return (d.data / 16.0).astype(np.float32), d.target.astype(np.int64)


def mlp(seed):
    import torch
    import torch.nn as nn
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(64, 32), nn.ReLU(), nn.Linear(32, 10))


def batches():
    import torch
    x, y = (torch.from_numpy(a) for a in data())
    g = torch.Generator().manual_seed(7)
    order = torch.randperm(len(x), generator=g)
    return [(x[order[s * BATCH:(s + 1) * BATCH]], y[order[s * BATCH:(s + 1) * BATCH]])
            for s in range(STEPS)]


def reference(optimizer):
    """Parameters after each step of one process on the global batches."""
    import torch.nn as nn
    model = mlp(1)
    opt = optimizer(model.parameters())
    out = []
    for xb, yb in batches():
        opt.zero_grad()
        nn.functional.cross_entropy(model(xb), yb).backward()
        opt.step()
        out.append([p.detach().clone() for p in model.parameters()])
    return out


def close(got, want, what):
    import torch
    for i, (a, b) in enumerate(zip(got, want)):
        err = (a - b).abs().max().item()
        if not torch.allclose(a, b, rtol=0, atol=TOL):
            raise AssertionError(f"{what}: parameter {i} differs from the single process run by "
                                 f"{err:g} (tolerance {TOL:g})")


def adam(params):
    import torch
    return torch.optim.Adam(params, lr=0.01)


def zero(rank, world):
    import torch
    import torch.distributed as dist
    import torch.nn as nn
    from torch.distributed.optim import ZeroRedundancyOptimizer
    model = mlp(1)
    ddp = nn.parallel.DistributedDataParallel(model)
    opt = ZeroRedundancyOptimizer(ddp.parameters(), optimizer_class=torch.optim.Adam, lr=0.01)
    want = reference(adam)
    per = BATCH // world
    for step, (xb, yb) in enumerate(batches()):
        opt.zero_grad()
        nn.functional.cross_entropy(ddp(xb[rank * per:(rank + 1) * per]),
                                    yb[rank * per:(rank + 1) * per]).backward()
        opt.step()
        close([p.detach() for p in model.parameters()], want[step], f"ZeRO step {step}")
    # Every rank holds a shard of Adam's state; the whole is consolidated on rank 0.
    opt.consolidate_state_dict(to=0)
    if rank == 0:
        assert len(opt.state_dict()["state"]) == 4, "consolidated Adam state of 4 parameters"
    dist.barrier()


def pipeline(rank, world):
    """2 x 2: stage = rank // 2, replica = rank % 2."""
    import torch
    import torch.distributed as dist
    import torch.nn as nn
    stage, replica = rank // 2, rank % 2
    groups = [dist.new_group([0, 1]), dist.new_group([2, 3])]  # every rank makes both
    full = mlp(1)
    part = full[0:2] if stage == 0 else full[2:3]
    ddp = nn.parallel.DistributedDataParallel(part, process_group=groups[stage])
    opt = torch.optim.SGD(ddp.parameters(), lr=0.1, momentum=0.9)
    want = reference(lambda p: torch.optim.SGD(p, lr=0.1, momentum=0.9))
    peer = rank + 2 if stage == 0 else rank - 2
    half = BATCH // 2
    for step, (xb, yb) in enumerate(batches()):
        xs, ys = xb[replica * half:(replica + 1) * half], yb[replica * half:(replica + 1) * half]
        opt.zero_grad()
        if stage == 0:
            act = ddp(xs)
            dist.send(act.detach().contiguous(), peer, tag=step)
            grad = torch.empty_like(act)
            dist.recv(grad, peer, tag=1000 + step)
            act.backward(grad)
        else:
            act = torch.empty(half, 32)
            dist.recv(act, peer, tag=step)
            act.requires_grad_(True)
            nn.functional.cross_entropy(ddp(act), ys).backward()
            dist.send(act.grad.contiguous(), peer, tag=1000 + step)
        opt.step()
        mine = [p.detach() for p in part.parameters()]
        close(mine, want[step][0:2] if stage == 0 else want[step][2:4],
              f"2x2 stage {stage} replica {replica} step {step}")
    dist.barrier()


def worker():
    import torch
    import torch.distributed as dist
    import importlib
    importlib.import_module("gradsync.torch")  # registers the backend
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    torch.set_num_threads(1)
    dist.init_process_group("gradsync", init_method=os.environ["PARALLEL_INIT"], rank=rank,
                            world_size=world)
    zero(rank, world)
    pipeline(rank, world)
    dist.destroy_process_group()
    print(f"rank {rank}: ZeRO and 2x2 match the single process run")


def main():
    if os.environ.get("RANK") is not None:
        worker()
        return
    daemons = os.environ["GRADSYNC_DAEMONS"].split(",")
    if len(daemons) < 2:
        sys.exit("torch_parallel_test: GRADSYNC_DAEMONS must name 2 daemons")
    tmp = tempfile.mkdtemp(prefix="torch-parallel-")
    procs = []
    for rank in range(4):
        env = dict(os.environ, RANK=str(rank), WORLD_SIZE="4", GRADSYNC_DAEMON=daemons[rank // 2],
                   PARALLEL_INIT=f"file://{tmp}/store")
        env.pop("GRADSYNC_DAEMONS")
        procs.append(subprocess.Popen([sys.executable, os.path.abspath(__file__)], env=env))
    codes = []
    for p in procs:
        try:
            codes.append(p.wait(timeout=300))
        except subprocess.TimeoutExpired:
            p.kill()
            codes.append("timeout")
    if codes != [0, 0, 0, 0]:
        sys.exit(f"torch_parallel_test: rank exit codes {codes}")
    print("PASS")


if __name__ == "__main__":
    main()
