#!/usr/bin/env python3
"""Trains an MLP on scikit-learn's digits with DistributedDataParallel, on
several ranks of one host, once per mode with the same seed, and prints the
loss of every step, the final test accuracy and the step time side by side:

  gloo      torch's gloo backend (the reference)
  gradsync  the gradsync backend: dist.init_process_group("gradsync")
  hook      gloo for set-up, every gradient bucket through gradsync's DDP comm hook
  MODE+CODEC  gradsync or hook with that wire codec ($GRADSYNC_CODEC: bf16, fp16,
            fp8e4m3, fp8e5m2, int8, auto, topk:0.1 (hook only: it needs named
            ops); docs/compression.md). Codecs apply between daemons: run them
            with --daemons equal to --ranks.

    python3 examples/train_ddp.py --ranks 4 --epochs 3 [--modes gloo,gradsync,hook]

The ranks reach gradsyncd at $GRADSYNC_DAEMON; without it the example starts
`gradsync cluster` (one daemon: every rank on it, as on one GPU node) from
--gradsync (default: on PATH, else the checkout's bazel-bin/cli/gradsync);
--daemons N starts N daemons and puts rank r on daemon r mod N.
With --check it exits 1 unless every mode's loss at every step is within
--loss_tol of gloo's and the test accuracies within --acc_tol (a mode with a
lossy codec: --codec_loss_tol and --codec_acc_tol; with topk: --topk_loss_tol
and --topk_acc_tol).
"""

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))


def data():
    import numpy as np
    from sklearn.datasets import load_digits
    d = load_digits()
    x = (d.data / 16.0).astype(np.float32)
    y = d.target.astype(np.int64)
    return x[:1500], y[:1500], x[1500:], y[1500:]


def worker(args):
    """One rank: env RANK, WORLD_SIZE, MASTER_ADDR/PORT; writes its results as JSON."""
    import torch
    import torch.distributed as dist
    import torch.nn as nn
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    torch.manual_seed(args.seed)
    torch.set_num_threads(1)
    mode = args.mode.partition("+")[0]  # the codec reaches gradsync as $GRADSYNC_CODEC
    if mode == "gradsync" or mode == "hook":
        import gradsync.torch as gt  # registers backend "gradsync"
    backend = "gradsync" if mode == "gradsync" else "gloo"
    # The ranks meet in a file of the launcher's (FileStore): a port picked
    # free in advance can be taken by another process before rank 0 binds it.
    dist.init_process_group(backend, init_method=os.environ["TRAIN_DDP_INIT"], rank=rank,
                            world_size=world)
    model = nn.Sequential(nn.Linear(64, args.hidden), nn.ReLU(), nn.Linear(args.hidden, args.hidden),
                          nn.ReLU(), nn.Linear(args.hidden, 10))
    ddp = nn.parallel.DistributedDataParallel(model, bucket_cap_mb=args.bucket_mb)
    state = None
    if mode == "hook":
        state = gt.HookState()
        ddp.register_comm_hook(state, gt.allreduce_hook)
    opt = torch.optim.SGD(ddp.parameters(), lr=args.lr, momentum=0.9)
    xtr, ytr, xte, yte = (torch.from_numpy(a) for a in data())
    g = torch.Generator().manual_seed(args.seed)
    per_rank = args.batch // world
    losses, times = [], []
    for _ in range(args.epochs):
        order = torch.randperm(len(xtr), generator=g)
        for start in range(0, len(order) - args.batch + 1, args.batch):
            idx = order[start + rank * per_rank: start + (rank + 1) * per_rank]
            t0 = time.perf_counter()
            opt.zero_grad()
            loss = nn.functional.cross_entropy(ddp(xtr[idx]), ytr[idx])
            loss.backward()
            opt.step()
            times.append(time.perf_counter() - t0)
            losses.append(loss.item())
    with torch.no_grad():
        acc = (model(xte).argmax(1) == yte).float().mean().item()
    if state is not None:
        state.close()
    dist.destroy_process_group()
    with open(args.out, "w") as f:
        json.dump({"losses": losses, "times": times, "accuracy": acc}, f)


def find_gradsync(arg):
    if arg:
        return arg
    for c in (shutil.which("gradsync"), os.path.join(HERE, "..", "bazel-bin", "cli", "gradsync")):
        if c and os.path.exists(c):
            return c
    sys.exit("train_ddp: no gradsync binary (pass --gradsync or set GRADSYNC_DAEMON)")


def run_mode(args, mode, tmp, env):
    init = "file://" + os.path.join(tmp, f"{mode}.rendezvous")
    procs = []
    for r in range(args.ranks):
        e = dict(env, RANK=str(r), LOCAL_RANK=str(r), WORLD_SIZE=str(args.ranks),
                 TRAIN_DDP_INIT=init)
        if "GRADSYNC_DAEMONS" in env:  # one of several daemons
            daemons = env["GRADSYNC_DAEMONS"].split(",")
            e.pop("GRADSYNC_DAEMONS")
            e["GRADSYNC_DAEMON"] = daemons[r % len(daemons)]
        codec = mode.partition("+")[2]
        if codec:
            e["GRADSYNC_CODEC"] = codec
        out = os.path.join(tmp, f"{mode}.{r}.json")
        cmd = [sys.executable, os.path.abspath(__file__), "--worker", "--mode", mode, "--out", out]
        for k in ("seed", "epochs", "batch", "hidden", "lr", "bucket_mb"):
            cmd += [f"--{k}", str(getattr(args, k))]
        procs.append((subprocess.Popen(cmd, env=e), out))
    results = []
    for p, out in procs:
        if p.wait(timeout=args.timeout) != 0:
            for q, _ in procs:  # the others would wait for the failed rank
                q.kill()
            sys.exit(f"train_ddp: a {mode} rank failed (exit {p.returncode})")
        with open(out) as f:
            results.append(json.load(f))
    steps = len(results[0]["losses"])
    loss = [sum(r["losses"][i] for r in results) / len(results) for i in range(steps)]
    times = sorted(results[0]["times"][2:]) or results[0]["times"]
    return {"loss": loss, "accuracy": results[0]["accuracy"], "step_ms": 1e3 * times[len(times) // 2]}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--ranks", type=int, default=4)
    ap.add_argument("--modes", default="gloo,gradsync,hook")
    ap.add_argument("--epochs", type=int, default=3)
    ap.add_argument("--batch", type=int, default=64, help="global batch (split over the ranks)")
    ap.add_argument("--hidden", type=int, default=256)
    ap.add_argument("--lr", type=float, default=0.05)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--bucket_mb", type=float, default=25)
    ap.add_argument("--gradsync", default="", help="the gradsync CLI (to start a local cluster)")
    ap.add_argument("--daemons", type=int, default=1, help="daemons of the local cluster")
    ap.add_argument("--check", action="store_true")
    ap.add_argument("--loss_tol", type=float, default=1e-3, help="max |loss - gloo's loss| per step")
    ap.add_argument("--acc_tol", type=float, default=0.01, help="max |accuracy - gloo's|")
    ap.add_argument("--codec_loss_tol", type=float, default=0.05,
                    help="--loss_tol of a mode with a codec")
    ap.add_argument("--codec_acc_tol", type=float, default=0.02,
                    help="--acc_tol of a mode with a codec")
    ap.add_argument("--topk_loss_tol", type=float, default=0.3,
                    help="--loss_tol of a mode with topk (values arrive late: larger)")
    ap.add_argument("--topk_acc_tol", type=float, default=0.03,
                    help="--acc_tol of a mode with topk")
    ap.add_argument("--timeout", type=float, default=600)
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--mode", help=argparse.SUPPRESS)
    ap.add_argument("--out", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        return worker(args)
    if args.batch % args.ranks:
        sys.exit(f"train_ddp: --batch {args.batch} does not split over {args.ranks} ranks")
    modes = args.modes.split(",")
    env = dict(os.environ)
    cluster = None
    tmp = tempfile.mkdtemp(prefix="train_ddp-")
    try:
        if any(m != "gloo" for m in modes) and not env.get("GRADSYNC_DAEMON"):
            env_file = os.path.join(tmp, "cluster.env")
            cluster = subprocess.Popen([find_gradsync(args.gradsync), "cluster",
                                        f"--ranks={args.daemons}", f"--env_file={env_file}"],
                                       stdout=subprocess.DEVNULL)
            for _ in range(300):
                if os.path.exists(env_file) or cluster.poll() is not None:
                    break
                time.sleep(0.1)
            if not os.path.exists(env_file):
                sys.exit("train_ddp: gradsync cluster did not start")
            for line in open(env_file):
                k, _, v = line.strip().partition("=")
                if k == "GRADSYNC_DAEMON_0":
                    env["GRADSYNC_DAEMON"] = v
                elif k == "GRADSYNC_DAEMONS" and args.daemons > 1:
                    env[k] = v
                elif k == "GRADSYNC_TENANT_TOKEN":  # the cluster's tenant
                    env[k] = v
        res = {m: run_mode(args, m, tmp, env) for m in modes}
    finally:
        if cluster is not None:
            cluster.terminate()
            cluster.wait(30)
        shutil.rmtree(tmp, ignore_errors=True)
    steps = len(res[modes[0]]["loss"])
    print(f"# MLP 64-{args.hidden}-{args.hidden}-10 on digits, DDP, {args.ranks} ranks, global batch "
          f"{args.batch}, {steps} steps, seed {args.seed}")
    print("  step " + "".join(f"{'loss ' + m:>16}" for m in modes))
    for i in range(steps):
        if i < 5 or i % max(1, steps // 10) == 0 or i == steps - 1:
            print(f"{i:6d} " + "".join(f"{res[m]['loss'][i]:16.6f}" for m in modes))
    print("# test accuracy: " + ", ".join(f"{m} {res[m]['accuracy']:.4f}" for m in modes))
    print("# median step time (ms): " + ", ".join(f"{m} {res[m]['step_ms']:.2f}" for m in modes))
    ok = True
    if "gloo" in res:
        for m in modes:
            if m == "gloo":
                continue
            diff = max(abs(a - b) for a, b in zip(res[m]["loss"], res["gloo"]["loss"]))
            dacc = abs(res[m]["accuracy"] - res["gloo"]["accuracy"])
            lossy = "+" in m and not m.endswith("+none")
            loss_tol = args.codec_loss_tol if lossy else args.loss_tol
            acc_tol = args.codec_acc_tol if lossy else args.acc_tol
            if "+topk" in m:
                loss_tol, acc_tol = args.topk_loss_tol, args.topk_acc_tol
            good = diff <= loss_tol and dacc <= acc_tol
            ok = ok and good
            print(f"# {m} vs gloo: max |loss diff| {diff:.2e} (tolerance {loss_tol:g}), "
                  f"|accuracy diff| {dacc:.4f} (tolerance {acc_tol:g}): "
                  f"{'agree' if good else 'DISAGREE'}")
    if args.check and not ok:
        sys.exit(1)


if __name__ == "__main__":
    main()
