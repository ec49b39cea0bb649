#!/usr/bin/env python3
"""Time to accuracy: DDP training on scikit-learn's digits, every mode side
by side in one run over the same link, several seeds each.

A model where gradient sync matters, with a few samples per rank, trained
for --steps steps; rank 0 measures the test accuracy every --eval_every steps
(outside the timed span). --model mlp: 64-H-H-10 (H=4096: 17.1 M parameters,
68 MiB of f32 gradients); --model cnn: two 3x3 convolutions of C channels on
the 8x8 image, then C*64-H-10 (C=32, H=1024: 2.1 M parameters). Modes
(comma-separated, --modes):

  gloo             torch's gloo backend, dense
  gloo+fp16        gloo with torch's fp16_compress_hook
  gloo+powersgd    gloo with torch's PowerSGD hook (rank 1; a failure is recorded)
  gradsync         the gradsync backend, dense
  gradsync+CODEC   the backend with that codec ($GRADSYNC_CODEC: bf16, int8, auto, ...)
  hook, hook+CODEC gloo for set-up, buckets through gradsync's DDP hook
                   (hook+topk:0.01: top-k with error feedback, which needs the
                   hook's named buckets)

Prints, per mode (medians over seeds): the wall-clock training time to the
target accuracy (--target), the final accuracy (mean), the step time, and the
bytes each host sent per step; writes accuracy against wall-clock time as an
SVG (--svg). With --link RATE (root) the ranks run on --hosts network
namespaces (2: joined by a tbf-shaped link; more: on a switch whose ports are
shaped; bench/netns_link.py), in equal blocks, as bench/ddp_step_bench.py
--link does; without it, on loopback.

    python3 bench/tta_bench.py --link 1gbit --ranks 2 --seeds 3 --svg /tmp/tta.svg
"""

import argparse
import contextlib
import json
import os
import signal
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from ddp_step_bench import (LinkCluster, add_cluster_arguments, free_port, host_of,  # noqa: E402
                            start_cluster, stop_all)
from netns_link import NetnsLink  # noqa: E402

COLORS = ["#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f"]


def make_model(nn, a):
    """--model mlp or cnn (their inputs: 64 values, or a 1x8x8 image)."""
    h, c = a.hidden, a.channels
    if a.model == "cnn":
        return nn.Sequential(nn.Unflatten(1, (1, 8, 8)), nn.Conv2d(1, c, 3, padding=1), nn.ReLU(),
                             nn.Conv2d(c, c, 3, padding=1), nn.ReLU(), nn.Flatten(),
                             nn.Linear(c * 64, h), nn.ReLU(), nn.Linear(h, 10))
    return nn.Sequential(nn.Linear(64, h), nn.ReLU(), nn.Linear(h, h), nn.ReLU(), nn.Linear(h, 10))


def describe_model(a):
    h, c = a.hidden, a.channels
    if a.model == "cnn":
        params = 10 * c + (9 * c + 1) * c + (64 * c + 1) * h + (h + 1) * 10
        return f"CNN conv3x3 1-{c}-{c}, fc {64 * c}-{h}-10 ({params / 1e6:.1f} M parameters)"
    params = 64 * h + h * h + h * 10 + 2 * h + 10
    return f"MLP 64-{h}-{h}-10 ({params / 1e6:.1f} M parameters)"


def worker(a):
    """One rank; writes (elapsed training seconds, accuracy) after every
    evaluation and the step times to --out as JSON."""
    import numpy as np
    import torch
    import torch.distributed as dist
    import torch.nn as nn
    from sklearn.datasets import load_digits
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    mode, _, codec = a.mode.partition("+")
    torch.manual_seed(a.seed)
    torch.set_num_threads(1)
    if mode in ("gradsync", "hook"):
        import gradsync.torch as gt
    dist.init_process_group("gradsync" if mode == "gradsync" else "gloo", rank=rank,
                            world_size=world)
    d = load_digits()
    x = torch.from_numpy((d.data / 16.0).astype(np.float32))
    y = torch.from_numpy(d.target.astype(np.int64))
    xtr, ytr, xte, yte = x[:1500], y[:1500], x[1500:], y[1500:]
    model = make_model(nn, a)
    ddp = nn.parallel.DistributedDataParallel(model, bucket_cap_mb=a.bucket_mb)
    state = None
    if mode == "hook":
        state = gt.HookState()
        ddp.register_comm_hook(state, gt.allreduce_hook)
    elif mode == "gloo" and codec == "fp16":
        from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
        ddp.register_comm_hook(None, default_hooks.fp16_compress_hook)
    elif mode == "gloo" and codec == "powersgd":
        from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook as psgd
        state = psgd.PowerSGDState(process_group=None, matrix_approximation_rank=1,
                                   start_powerSGD_iter=2)
        ddp.register_comm_hook(state, psgd.powerSGD_hook)
    opt = torch.optim.SGD(ddp.parameters(), lr=a.lr, momentum=0.9)
    g = torch.Generator().manual_seed(a.seed)
    curve, times, elapsed = [], [], 0.0
    step = 0
    while step < a.steps:
        order = torch.randperm(len(xtr), generator=g)
        for start in range(0, len(order) - a.batch * world + 1, a.batch * world):
            if step == a.steps:
                break
            idx = order[start + rank * a.batch: start + (rank + 1) * a.batch]
            dist.barrier()
            t0 = time.perf_counter()
            opt.zero_grad()
            nn.functional.cross_entropy(ddp(xtr[idx]), ytr[idx]).backward()
            opt.step()
            times.append(time.perf_counter() - t0)
            elapsed += times[-1]
            step += 1
            if rank == 0 and (step % a.eval_every == 0 or step == a.steps):
                with torch.no_grad():
                    acc = (model(xte).argmax(1) == yte).float().mean().item()
                curve.append((step, elapsed, acc))
    if state is not None and hasattr(state, "close"):
        state.close()
    dist.destroy_process_group()
    if rank == 0:
        with open(a.out, "w") as f:
            json.dump({"curve": curve, "times": times}, f)


def run(a, mode, seed, extra_env, link, tmp):
    """One training run; its rank 0's results, or {"error": ...}."""
    port = free_port()
    out = os.path.join(tmp, f"{mode}.{seed}.json")
    procs = []
    try:
        for r in range(a.ranks):
            env = {k: v for k, v in os.environ.items()
                   if k not in ("GRADSYNC_DAEMON", "GRADSYNC_DAEMONS", "GRADSYNC_TENANT_TOKEN")}
            codec = mode.partition("+")[2]
            if codec and not mode.startswith("gloo"):
                env["GRADSYNC_CODEC"] = codec
            if not mode.startswith("gloo"):
                env.update(extra_env[r])
            env.update(RANK=str(r), LOCAL_RANK=str(r), WORLD_SIZE=str(a.ranks),
                       MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
            prefix = []
            if link is not None:
                host = host_of(r, a.ranks, a.hosts)
                env.update(MASTER_ADDR=link.ip[0], GLOO_SOCKET_IFNAME=link.dev[host])
                prefix = link.exec_prefix(host)
            cmd = prefix + [sys.executable, os.path.abspath(__file__), "--worker", "--mode", mode,
                            "--seed", str(seed), "--out", out]
            for k in ("model", "hidden", "channels", "batch", "bucket_mb", "steps", "eval_every",
                      "lr"):
                cmd += [f"--{k}", str(getattr(a, k))]
            with open(f"{out}.{r}.err", "w") as err:
                procs.append(subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=err))
        # A rank that fails leaves the others waiting for it (gloo's timeout is
        # 30 minutes): once one fails, the rest are stopped.
        deadline = time.monotonic() + a.run_timeout
        while any(p.poll() is None for p in procs) and time.monotonic() < deadline:
            if any(p.poll() not in (None, 0) for p in procs):
                break
            time.sleep(0.2)
        failed = [p for p in procs if p.poll() not in (None, 0)]
        if failed or any(p.poll() is None for p in procs):
            stop_all(procs, grace=5)
            if not failed:
                return {"error": f"still running after {a.run_timeout:g} s"}
            with open(f"{out}.{procs.index(failed[0])}.err", errors="replace") as f:
                err = f.read().strip()
            return {"error": (err.splitlines()[-1] if err else f"exit {failed[0].returncode}")[:200]}
    finally:
        stop_all(procs, grace=5)
    with open(out) as f:
        return json.load(f)


def median(v):
    v = sorted(v)
    return v[len(v) // 2] if v else float("nan")


def time_to(curve, target):
    """Training seconds at the first evaluation at or above `target` (None: never)."""
    return next((t for _, t, acc in curve if acc >= target), None)


def write_svg(path, results, a):
    """Accuracy against training time, every mode's seeds (one color a mode)."""
    w, h, m = 720, 440, 60
    tmax = max((c[-1][1] for runs in results.values() for r in runs if "curve" in r
                for c in [r["curve"]] if c), default=1.0)
    px = lambda t: m + (w - 2 * m) * t / tmax  # noqa: E731
    py = lambda acc: h - m - (h - 2 * m) * acc  # noqa: E731
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="{h}" '
           f'font-family="sans-serif" font-size="12">',
           f'<rect width="{w}" height="{h}" fill="white"/>',
           f'<text x="{w / 2}" y="20" text-anchor="middle">Test accuracy against training time: '
           f'{a.ranks} ranks, {a.link or "loopback"}, {a.seeds} seeds</text>',
           f'<line x1="{m}" y1="{h - m}" x2="{w - m}" y2="{h - m}" stroke="black"/>',
           f'<line x1="{m}" y1="{m}" x2="{m}" y2="{h - m}" stroke="black"/>',
           f'<text x="{w / 2}" y="{h - 20}" text-anchor="middle">training time (s)</text>',
           f'<text x="15" y="{h / 2}" transform="rotate(-90 15 {h / 2})" '
           f'text-anchor="middle">test accuracy</text>']
    for i in range(6):
        t = tmax * i / 5
        out.append(f'<text x="{px(t):.0f}" y="{h - m + 16}" text-anchor="middle">{t:.0f}</text>')
        out.append(f'<text x="{m - 6}" y="{py(i / 5) + 4:.0f}" text-anchor="end">{i / 5:.1f}</text>')
    out.append(f'<line x1="{m}" y1="{py(a.target):.0f}" x2="{w - m}" y2="{py(a.target):.0f}" '
               f'stroke="gray" stroke-dasharray="4"/>')
    for k, (mode, runs) in enumerate(results.items()):
        color = COLORS[k % len(COLORS)]
        for r in runs:
            if "curve" not in r or not r["curve"]:
                continue
            pts = " ".join(f"{px(t):.1f},{py(acc):.1f}" for _, t, acc in [(0, 0.0, 0.1)] + r["curve"])
            out.append(f'<polyline points="{pts}" fill="none" stroke="{color}" stroke-width="1.5"/>')
        out.append(f'<text x="{w - m - 120}" y="{m + 16 * k + 20}" fill="{color}">{mode}</text>')
    out.append("</svg>")
    with open(path, "w") as f:
        f.write("\n".join(out))


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--ranks", type=int, default=2)
    ap.add_argument("--modes", default="gloo,gloo+fp16,gloo+powersgd,gradsync,hook,gradsync+bf16,"
                                       "gradsync+int8,gradsync+auto")
    ap.add_argument("--layout", default="node", help="node: a daemon per host; network: per rank")
    ap.add_argument("--hosts", type=int, default=2,
                    help="--link: hosts (namespaces; more than 2 share a switch); the ranks in blocks")
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--steps", type=int, default=60)
    ap.add_argument("--eval_every", type=int, default=5)
    ap.add_argument("--target", type=float, default=0.85, help="the test accuracy to reach")
    ap.add_argument("--model", choices=("mlp", "cnn"), default="mlp")
    ap.add_argument("--hidden", type=int, default=0,
                    help="the hidden width (default: mlp 4096, 17.1 M parameters; cnn 1024)")
    ap.add_argument("--channels", type=int, default=32, help="cnn: channels of each convolution")
    ap.add_argument("--batch", type=int, default=4, help="samples per rank per step")
    ap.add_argument("--lr", type=float, default=0.02)
    ap.add_argument("--bucket_mb", type=float, default=25)
    ap.add_argument("--svg", default="", help="write accuracy against time here")
    ap.add_argument("--run_timeout", type=float, default=900, help="seconds one run may take")
    add_cluster_arguments(ap)
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--mode", help=argparse.SUPPRESS)
    ap.add_argument("--seed", type=int, default=0, help=argparse.SUPPRESS)
    ap.add_argument("--out", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.hidden == 0:
        a.hidden = 1024 if a.model == "cnn" else 4096
    if a.worker:
        return worker(a)
    if a.link:
        signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    tmp = tempfile.mkdtemp(prefix="tta_bench-")
    modes = a.modes.split(",")
    results = {m: [] for m in modes}
    bytes_per_step = {m: [] for m in modes}
    if a.link and not 2 <= a.hosts <= a.ranks:
        sys.exit(f"tta_bench: --hosts {a.hosts}: 2 to --ranks ({a.ranks}) hosts")
    with (NetnsLink(a.link, a.link_burst, a.link_latency, hosts=a.hosts) if a.link
          else contextlib.nullcontext()) as link:
        cluster = loopback = None
        try:
            hosts = [host_of(r, a.ranks, a.hosts) for r in range(a.ranks)]
            if link is not None:
                cluster = LinkCluster(a, link, list(range(a.hosts)) if a.layout == "node" else hosts,
                                      tmp)
                extra = [{"GRADSYNC_DAEMON": cluster.targets[hosts[r] if a.layout == "node" else r]}
                         for r in range(a.ranks)]
            else:
                loopback, env = start_cluster(a.gradsync, 1 if a.layout == "node" else a.ranks, tmp)
                extra = [{"GRADSYNC_DAEMON": env[f"GRADSYNC_DAEMON_{0 if a.layout == 'node' else r}"],
                          "GRADSYNC_TENANT_TOKEN": env.get("GRADSYNC_TENANT_TOKEN", "")}
                         for r in range(a.ranks)]
            # Seeds outermost: every mode runs once before any runs twice.
            for seed in range(1, a.seeds + 1):
                for mode in modes:
                    before = link.tx_bytes() if link is not None else None
                    r = run(a, mode, seed, extra, link, tmp)
                    results[mode].append(r)
                    if link is not None and "times" in r:
                        sent = [x - y for x, y in zip(link.tx_bytes(), before)]  # by host
                        bytes_per_step[mode].append(sum(sent) / len(sent) / a.steps)
                    status = r.get("error") or f"final accuracy {r['curve'][-1][2]:.3f}"
                    print(f"# seed {seed} {mode}: {status}", file=sys.stderr, flush=True)
        finally:
            if cluster is not None:
                cluster.stop()
            if loopback is not None:
                loopback.terminate()
                loopback.wait(30)
    print(f"# time to accuracy: {describe_model(a)} on "
          f"digits, DDP, {a.ranks} ranks ({a.layout}), {a.batch} samples per rank, lr {a.lr}, "
          f"{a.steps} steps, {a.seeds} seeds, target test accuracy {a.target}, "
          + (f"over a {link.describe()}" if link is not None else "over loopback"))
    print(f"{'mode':>16} {'to target s':>12} {'vs gloo':>8} {'final acc':>10} {'step ms':>8} "
          f"{'MiB/step':>9}  note")
    gloo_tta = None
    for mode in modes:
        ok = [r for r in results[mode] if "curve" in r]
        if not ok:
            print(f"{mode:>16} {'-':>12} {'-':>8} {'-':>10} {'-':>8} {'-':>9}  failed: "
                  f"{results[mode][0].get('error', '?')}")
            continue
        ttas = [time_to(r["curve"], a.target) for r in ok]
        reached = [t for t in ttas if t is not None]
        tta = median(reached) if len(reached) == len(ok) else None
        if mode == "gloo":
            gloo_tta = tta
        final = sum(r["curve"][-1][2] for r in ok) / len(ok)
        step_ms = 1e3 * median([median(r["times"][2:]) for r in ok])
        mib = median(bytes_per_step[mode]) / 2**20 if bytes_per_step[mode] else float("nan")
        ratio = f"{gloo_tta / tta:7.2f}x" if tta and gloo_tta else f"{'-':>8}"
        note = "" if len(reached) == len(ok) else f"{len(ok) - len(reached)} of {len(ok)} seeds missed the target"
        print(f"{mode:>16} {tta if tta else float('nan'):12.1f} {ratio} {final:10.4f} {step_ms:8.1f} "
              f"{mib:9.1f}  {note}")
    if a.svg:
        write_svg(a.svg, results, a)
        print(f"# plot: {a.svg}")


if __name__ == "__main__":
    main()
