#!/usr/bin/env python3
"""DDP step time with gradsync vs gloo (a benchmark, not a test).

A model with enough parameters that gradient sync matters (an MLP of about
--params_m million parameters), DistributedDataParallel on --ranks ranks of
this host, the same bucket size for every mode:

  gloo             torch's gloo backend
  gradsync         the gradsync backend (dist.init_process_group("gradsync"))
  hook             gloo for set-up, DDP's buckets through gradsync.torch.allreduce_hook

Each mode runs --steps timed steps (after --warmup) and as many with
ddp.no_sync() (the same compute without gradient sync); "comm" is the
difference: the step time gradient sync adds, overlap included.
--layout node puts every rank on one gradsyncd (as on one GPU node: the
daemon combines them in memory); --layout network gives each rank its own
gradsyncd (the daemons exchange over TCP loopback, like gloo).

    python3 bench/ddp_step_bench.py --ranks 2,4 --layout node,network
"""

import argparse
import os
import socket
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def worker(a):
    import torch
    import torch.distributed as dist
    import torch.nn as nn
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    torch.manual_seed(0)
    torch.set_num_threads(1)
    if a.mode in ("gradsync", "hook"):
        import gradsync.torch as gt
    dist.init_process_group("gradsync" if a.mode == "gradsync" else "gloo", rank=rank,
                            world_size=world)
    h = a.hidden
    model = nn.Sequential(nn.Linear(a.inputs, h), nn.ReLU(), nn.Linear(h, h), nn.ReLU(),
                          nn.Linear(h, 10))
    ddp = nn.parallel.DistributedDataParallel(model, bucket_cap_mb=a.bucket_mb)
    if a.mode == "hook":
        state = gt.HookState(trace=True)
        ddp.register_comm_hook(state, gt.allreduce_hook)
    x, y = torch.randn(a.batch, a.inputs), torch.randint(0, 10, (a.batch,))

    def step():
        loss = nn.functional.cross_entropy(ddp(x), y)
        loss.backward()
        for p in model.parameters():
            p.grad = None

    def timed(n, sync):
        out = []
        for _ in range(n):
            dist.barrier()
            t0 = time.perf_counter()
            if sync:
                step()
            else:
                with ddp.no_sync():
                    step()
            out.append(time.perf_counter() - t0)
        return sorted(out)[len(out) // 2]
    for _ in range(a.warmup):
        step()
    synced, local = timed(a.steps, True), timed(a.steps, False)
    if rank == 0:
        params = sum(p.numel() for p in model.parameters())
        print(f"RESULT {params} {synced:.6f} {local:.6f}", flush=True)
    if a.mode == "hook":  # one more step: when did each bucket leave, within backward?
        dist.barrier()
        del state.trace[:]
        loss = nn.functional.cross_entropy(ddp(x), y)
        t0 = time.perf_counter()
        loss.backward()
        t1 = time.perf_counter()
        if rank == 0:
            marks = ", ".join(f"bucket {i} ({b / 2**20:.0f} MiB) at {1e3 * (t - t0):.0f} ms"
                              for i, t, b in state.trace)
            print(f"OVERLAP backward {1e3 * (t1 - t0):.0f} ms (it returns once every bucket is "
                  f"reduced); {marks}", flush=True)
    if a.mode == "hook":
        state.close()
    dist.destroy_process_group()


def start_cluster(gradsync, daemons, tmp):
    env_file = os.path.join(tmp, f"cluster{daemons}.env")
    p = subprocess.Popen([gradsync, "cluster", f"--ranks={daemons}", f"--env_file={env_file}"],
                         stdout=subprocess.DEVNULL)
    for _ in range(300):
        if os.path.exists(env_file) or p.poll() is not None:
            break
        time.sleep(0.1)
    if not os.path.exists(env_file):
        p.terminate()
        sys.exit(f"ddp_step_bench: gradsync cluster ({gradsync}) did not start")
    env = dict(line.strip().split("=", 1) for line in open(env_file) if "=" in line)
    return p, env


def run(a, mode, ranks, extra_env):
    port = free_port()
    procs = []
    for r in range(ranks):
        env = {k: v for k, v in os.environ.items() if k not in ("GRADSYNC_DAEMON", "GRADSYNC_DAEMONS")}
        env.update(extra_env, RANK=str(r), LOCAL_RANK=str(r), WORLD_SIZE=str(ranks),
                   MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
        cmd = [sys.executable, os.path.abspath(__file__), "--worker", "--mode", mode]
        for k in ("inputs", "hidden", "batch", "bucket_mb", "steps", "warmup"):
            cmd += [f"--{k}", str(getattr(a, k))]
        procs.append(subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, text=True))
    out = ""
    for p in procs:
        o, _ = p.communicate(timeout=3600)
        out += o
        if p.returncode != 0:
            sys.exit(f"ddp_step_bench: {mode} at {ranks} ranks failed")
    for line in out.splitlines():
        if line.startswith("OVERLAP"):
            print(f"# {ranks} ranks, hook: {line[len('OVERLAP '):]}", file=sys.stderr)
    _, params, synced, local = next(l for l in out.splitlines() if l.startswith("RESULT")).split()
    return int(params), float(synced), float(local)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--ranks", default="2,4")
    ap.add_argument("--layout", default="node", help="node, network or both (comma-separated)")
    ap.add_argument("--modes", default="gloo,gradsync,hook")
    ap.add_argument("--inputs", type=int, default=1024)
    ap.add_argument("--hidden", type=int, default=4096, help="4096: about 21 M parameters")
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--bucket_mb", type=float, default=25)
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--gradsync", default=os.path.join(HERE, "..", "bazel-bin", "cli", "gradsync"))
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--mode", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.worker:
        return worker(a)
    tmp = tempfile.mkdtemp(prefix="ddp_bench-")
    rows = []
    for ranks in [int(r) for r in a.ranks.split(",")]:
        for layout in a.layout.split(","):
            clusters = []
            try:
                if layout == "node":
                    p, env = start_cluster(a.gradsync, 1, tmp)
                    extra = {"GRADSYNC_DAEMON": env["GRADSYNC_DAEMON_0"]}
                else:
                    p, env = start_cluster(a.gradsync, ranks, tmp)
                    extra = {"GRADSYNC_DAEMONS": env["GRADSYNC_DAEMONS"]}
                clusters.append(p)
                extra["GRADSYNC_TENANT_TOKEN"] = env.get("GRADSYNC_TENANT_TOKEN", "")
                res = {}
                for mode in a.modes.split(","):
                    if mode == "gloo" and layout != a.layout.split(",")[0]:
                        continue  # gloo does not depend on the daemon layout
                    res[mode] = run(a, mode, ranks, extra if mode != "gloo" else {})
                rows.append((ranks, layout, res))
            finally:
                for p in clusters:
                    p.terminate()
                    p.wait(30)
    params = next(iter(rows[0][2].values()))[0]
    print(f"# DDP step time: MLP {a.inputs}-{a.hidden}-{a.hidden}-10 ({params / 1e6:.1f} M parameters, "
          f"{params * 4 / 2**20:.0f} MiB of f32 gradients), batch {a.batch} per rank, buckets "
          f"{a.bucket_mb:g} MiB, {a.steps} timed steps (medians), {os.cpu_count()} CPUs")
    print(f"{'ranks':>5} {'layout':>8} {'mode':>9} {'step ms':>9} {'compute ms':>11} {'comm ms':>9} "
          f"{'vs gloo':>8}")
    gloo = {}
    for ranks, layout, res in rows:
        if "gloo" in res:
            gloo[ranks] = res["gloo"][1]
        for mode, (_, synced, local) in res.items():
            ratio = f"{gloo[ranks] / synced:7.2f}x" if ranks in gloo else f"{'-':>8}"
            print(f"{ranks:5d} {layout if mode != 'gloo' else '-':>8} {mode:>9} {1e3 * synced:9.1f} "
                  f"{1e3 * local:11.1f} {1e3 * max(0.0, synced - local):9.1f} {ratio}")


if __name__ == "__main__":
    main()
