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

--link RATE (e.g. 1gbit) runs the ranks on two "hosts" instead: network
namespaces joined by a veth pair shaped to RATE each way with tbf
(bench/netns_link.py; needs root). The first half of the ranks run on host A,
the rest on host B (ip netns exec). --layout node then means one gradsyncd per
host, network one per rank; the coordinator runs on host A, and this script
starts it and the daemons itself (plaintext, no tenants: `gradsync cluster`
only serves loopback), from --coordinator_bin and --daemon_bin. gloo's
MASTER_ADDR is host A and GLOO_SOCKET_IFNAME the rank's veth, so its traffic
crosses the same link. Traffic between ranks of one host stays on that
host's loopback, as on real hosts. Each run reports (stderr) the bytes that
crossed the link each way, and how busy rank 0's host kept its link while
gradients were in flight: its egress bytes during three more backward passes
over the rate times the span from the first bucket's hand-over (the hook's
trace; other modes from backward's start, a lower bound). --daemon_flags adds gradsyncd flags there (e.g.
--daemon_flags=--tcp_streams=1).

    python3 bench/ddp_step_bench.py --ranks 2,4 --layout node,network
    python3 bench/ddp_step_bench.py --link 1gbit --ranks 2,4 --layout node,network   # as root
"""

import argparse
import contextlib
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from netns_link import DEFAULT_BURST, DEFAULT_LATENCY, NetnsLink  # noqa: E402


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
    # "MODE+CODEC": gradsync's codec (GRADSYNC_CODEC, set by run()); gloo+fp16:
    # torch's fp16_compress_hook on gloo.
    mode, _, codec = a.mode.partition("+")
    if mode in ("gradsync", "hook"):
        import gradsync.torch as gt
    dist.init_process_group("gradsync" if mode == "gradsync" else "gloo", rank=rank,
                            world_size=world)
    h = a.hidden
    model = nn.Sequential(nn.Linear(a.inputs, h), nn.ReLU(), nn.Linear(h, h), nn.ReLU(),
                          nn.Linear(h, 10))
    ddp = nn.parallel.DistributedDataParallel(model, bucket_cap_mb=a.bucket_mb)
    if mode == "hook":
        state = gt.HookState(trace=True)
        ddp.register_comm_hook(state, gt.allreduce_hook)
    elif mode == "gloo" and codec == "fp16":
        from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
        ddp.register_comm_hook(None, default_hooks.fp16_compress_hook)
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
    if mode == "hook":  # one more step: when did each bucket leave, within backward?
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
    dev = os.environ.get("GLOO_SOCKET_IFNAME", "")
    if a.link_bps > 0 and dev:  # every rank steps; rank 0 reports
        # --link: how busy this host's link is while the gradients are in
        # flight: its egress bytes during backward over the link's rate times
        # the span from the first bucket's hand-over (the hook's trace; other
        # modes: backward's start, so a lower bound) to backward's return.
        def tx():
            with open(f"/sys/class/net/{dev}/statistics/tx_bytes") as f:
                return int(f.read())
        busy = []
        for _ in range(3):
            dist.barrier()
            if mode == "hook":
                del state.trace[:]
            loss = nn.functional.cross_entropy(ddp(x), y)
            b0, t0 = tx(), time.perf_counter()
            loss.backward()
            t1, b1 = time.perf_counter(), tx()
            first = state.trace[0][1] if mode == "hook" and state.trace else t0
            busy.append(((b1 - b0) * 8 / a.link_bps / (t1 - first), (b1 - b0), t1 - first))
        util, sent, span = sorted(busy)[1]
        if rank == 0:
            print(f"LINK busy {100 * util:.0f}% while gradients are in flight ({sent / 2**20:.1f} MiB "
                  f"sent in {1e3 * span:.0f} ms from the "
                  f"{'first bucket' if mode == 'hook' else 'backward start'})", flush=True)
    if mode == "hook":
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


def rate_bps(rate):
    """tc's rate ("1gbit", "500mbit", "10gbit", "100kbit") in bits per second."""
    units = {"kbit": 1e3, "mbit": 1e6, "gbit": 1e9, "bit": 1.0}
    for unit, scale in units.items():
        if rate.lower().endswith(unit):
            return float(rate[:-len(unit)]) * scale
    sys.exit(f"ddp_step_bench: --link {rate}: a tc rate such as 1gbit or 500mbit")


def host_of(rank, ranks, hosts=2):
    """--link: the host (0 = A, 1 = B, ...) of `rank`: the ranks in order, in equal
    blocks (with 2 hosts the first half on A)."""
    return rank * hosts // ranks


class LinkCluster:
    """--link: a coordinator on host A and gradsyncds on the hosts `daemon_hosts`
    (one entry per daemon), each listening on its host's address; clients reach
    daemon i at self.targets[i] (a unix socket: not network-namespaced)."""

    def __init__(self, a, link, daemon_hosts, tmp):
        self.procs, self.logs = [], []
        self.dir = tempfile.mkdtemp(prefix="link-", dir=tmp)
        deadline = time.monotonic() + 30
        try:
            cport = self._start(a.coordinator_bin, link, 0, "coordinator", [
                f"--listen={link.ip[0]}:0", f"--metrics_listen={link.ip[0]}:0"], deadline)
            self.targets = []
            for i, h in enumerate(daemon_hosts):
                self.targets.append(f"unix:{self.dir}/daemon{i}.sock")
                ip = link.ip[h]
                self._spawn(a.daemon_bin, link, h, f"daemon{i}", [
                    f"--listen={self.targets[i]}", f"--coordinator={link.ip[0]}:{cport}",
                    f"--data_listen={ip}:0", f"--metrics_listen={ip}:0", f"--status_listen={ip}:0",
                    "--drain_timeout_ms=1000", f"--timeline_dir={self.dir}/timeline",
                    f"--node_id=host{chr(ord('A') + h)}-{i}"] + [f for f in a.daemon_flags.split(",") if f])
            for i in range(len(daemon_hosts)):
                self._wait_port(i + 1, deadline)
        except BaseException:
            self.print_logs()
            self.stop()
            raise

    def _spawn(self, binary, link, host, name, args):
        log = os.path.join(self.dir, name + ".log")
        with open(log, "w") as f:
            self.procs.append(subprocess.Popen(
                link.exec_prefix(host) + [binary, "--insecure", f"--port_file={log[:-4]}.port"] + args,
                stdout=f, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL))
        self.logs.append(log)

    def _start(self, binary, link, host, name, args, deadline):
        self._spawn(binary, link, host, name, args)
        return self._wait_port(len(self.procs) - 1, deadline)

    def _wait_port(self, i, deadline):
        """The port in the first line of process i's port file, once it serves."""
        path = self.logs[i][:-4] + ".port"
        while time.monotonic() < deadline:
            if self.procs[i].poll() is not None:
                sys.exit(f"ddp_step_bench: {self.logs[i][:-4]} exited ({self.procs[i].returncode}) "
                         f"before serving")
            try:
                with open(path) as f:
                    first = f.readline().strip()
                if first.isdigit():
                    return int(first)
            except FileNotFoundError:
                pass
            time.sleep(0.05)
        sys.exit(f"ddp_step_bench: no {path} within 30 s")

    def print_logs(self, lines=20):
        for log in self.logs:
            with open(log, errors="replace") as f:
                tail = f.readlines()[-lines:]
            print(f"--- last {len(tail)} lines of {log}", file=sys.stderr)
            sys.stderr.write("".join(tail))

    def stop(self):
        stop_all(self.procs)


def stop_all(procs, grace=30):
    """SIGTERM to every process still running, SIGKILL to those that outlast `grace` s."""
    for p in procs:
        if p.poll() is None:
            p.terminate()
    end = time.monotonic() + grace
    for p in procs:
        try:
            p.wait(max(0.1, end - time.monotonic()))
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()


def run(a, mode, ranks, extra_env, link=None):
    """Runs `mode` on `ranks` ranks; extra_env: variables for every rank (a dict)
    or for each (a list of dicts). With `link`, each rank runs in its host's
    namespace."""
    port = free_port()
    procs = []
    try:
        for r in range(ranks):
            env = {k: v for k, v in os.environ.items()
                   if k not in ("GRADSYNC_DAEMON", "GRADSYNC_DAEMONS", "GRADSYNC_TENANT_TOKEN")}
            codec = mode.partition("+")[2]
            if codec and not mode.startswith("gloo"):
                env["GRADSYNC_CODEC"] = codec
            env.update(extra_env[r] if isinstance(extra_env, list) else extra_env, RANK=str(r),
                       LOCAL_RANK=str(r), WORLD_SIZE=str(ranks), MASTER_ADDR="127.0.0.1",
                       MASTER_PORT=str(port))
            prefix = []
            if link is not None:
                # The store on host A (rank 0); gloo's pairs on the rank's own veth address.
                host = host_of(r, ranks)
                env.update(MASTER_ADDR=link.ip[0], GLOO_SOCKET_IFNAME=link.dev[host])
                prefix = link.exec_prefix(host)
            cmd = prefix + [sys.executable, os.path.abspath(__file__), "--worker", "--mode", mode]
            for k in ("inputs", "hidden", "batch", "bucket_mb", "steps", "warmup"):
                cmd += [f"--{k}", str(getattr(a, k))]
            if link is not None:
                cmd += ["--link_bps", str(rate_bps(a.link))]
            procs.append(subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, text=True))
        out = ""
        for p in procs:
            o, _ = p.communicate(timeout=3600)
            out += o
            if p.returncode != 0:
                sys.exit(f"ddp_step_bench: {mode} at {ranks} ranks failed")
    finally:
        stop_all(procs, grace=5)  # after a failure, the ranks still waiting for it
    for line in out.splitlines():
        if line.startswith("OVERLAP"):
            print(f"# {ranks} ranks, hook: {line[len('OVERLAP '):]}", file=sys.stderr)
        if line.startswith("LINK"):
            print(f"# {ranks} ranks, {mode}: link {line[len('LINK '):]}", file=sys.stderr)
    _, params, synced, local = next(l for l in out.splitlines() if l.startswith("RESULT")).split()
    return int(params), float(synced), float(local)


def add_cluster_arguments(ap):
    """Where the ranks' daemons run: a loopback cluster (--gradsync), or with
    --link a LinkCluster on two namespaces (also bench/tta_bench.py)."""
    ap.add_argument("--gradsync", default=os.path.join(HERE, "..", "bazel-bin", "cli", "gradsync"))
    ap.add_argument("--link", metavar="RATE",
                    help="run on two network namespaces joined by a link of RATE (tc syntax: 1gbit)")
    ap.add_argument("--link_burst", default=DEFAULT_BURST, help="--link: tbf burst")
    ap.add_argument("--link_latency", default=DEFAULT_LATENCY, help="--link: tbf latency")
    ap.add_argument("--coordinator_bin",
                    default=os.path.join(HERE, "..", "bazel-bin", "server", "gradsync-coordinator"))
    ap.add_argument("--daemon_bin", default=os.path.join(HERE, "..", "bazel-bin", "worker", "gradsyncd"))
    ap.add_argument("--daemon_flags", default="",
                    help="--link: extra gradsyncd flags, comma-separated (e.g. --tcp_streams=1)")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--ranks", default="2,4")
    ap.add_argument("--layout", default="node", help="node, network or both (comma-separated)")
    ap.add_argument("--modes", default="gloo,gradsync,hook",
                    help="gloo, gradsync (the backend), hook (gloo + gradsync's DDP hook); "
                         "MODE+CODEC runs gradsync with that codec (GRADSYNC_CODEC, e.g. "
                         "gradsync+bf16, hook+auto); gloo+fp16 is torch's fp16_compress_hook")
    ap.add_argument("--inputs", type=int, default=1024)
    ap.add_argument("--hidden", type=int, default=4096, help="4096: about 21 M parameters")
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--bucket_mb", type=float, default=25)
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--link_bps", type=float, default=0, help=argparse.SUPPRESS)
    add_cluster_arguments(ap)
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--mode", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.worker:
        return worker(a)
    tmp = tempfile.mkdtemp(prefix="ddp_bench-")
    if a.link:
        # SIGTERM unwinds like Ctrl-C, so the processes and namespaces are cleaned up.
        signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    with NetnsLink(a.link, a.link_burst, a.link_latency) if a.link else contextlib.nullcontext() as link:
        rows = bench_all(a, tmp, link)
    print_table(a, rows, link)


def bench_all(a, tmp, link):
    rows = []
    for ranks in [int(r) for r in a.ranks.split(",")]:
        if link is not None and ranks < 2:
            sys.exit("ddp_step_bench: --link needs at least 2 ranks (one per host)")
        for layout in a.layout.split(","):
            loopback = cluster = None  # `gradsync cluster` process, or LinkCluster
            try:
                if link is not None:
                    # node: one daemon per host, each rank on its host's; network: one per rank.
                    hosts = [host_of(r, ranks) for r in range(ranks)]
                    cluster = LinkCluster(a, link, [0, 1] if layout == "node" else hosts, tmp)
                    extra = [{"GRADSYNC_DAEMON": cluster.targets[hosts[r] if layout == "node" else r]}
                             for r in range(ranks)]  # no tenants: no token
                else:
                    loopback, env = start_cluster(a.gradsync, 1 if layout == "node" else ranks, tmp)
                    extra = ({"GRADSYNC_DAEMON": env["GRADSYNC_DAEMON_0"]} if layout == "node" else
                             {"GRADSYNC_DAEMONS": env["GRADSYNC_DAEMONS"]})
                    extra["GRADSYNC_TENANT_TOKEN"] = env.get("GRADSYNC_TENANT_TOKEN", "")
                res = {}
                for mode in a.modes.split(","):
                    if mode.startswith("gloo") and layout != a.layout.split(",")[0]:
                        continue  # gloo does not depend on the daemon layout
                    before = link.tx_bytes() if link is not None else None
                    res[mode] = run(a, mode, ranks, {} if mode.startswith("gloo") else extra, link)
                    if link is not None:  # what crossed the link, each way (all steps of the run)
                        ab, ba = (x - y for x, y in zip(link.tx_bytes(), before))
                        print(f"# {ranks} ranks, {layout}, {mode}: link carried {ab / 2**20:.1f} MiB "
                              f"A->B, {ba / 2**20:.1f} MiB B->A", file=sys.stderr)
                rows.append((ranks, layout, res))
            except BaseException:
                if cluster is not None:
                    cluster.print_logs()
                raise
            finally:
                if cluster is not None:
                    cluster.stop()
                if loopback is not None:
                    loopback.terminate()
                    loopback.wait(30)
    return rows


def print_table(a, rows, link):
    params = next(iter(rows[0][2].values()))[0]
    print(f"# DDP step time: MLP {a.inputs}-{a.hidden}-{a.hidden}-10 ({params / 1e6:.1f} M parameters, "
          f"{params * 4 / 2**20:.0f} MiB of f32 gradients), batch {a.batch} per rank, buckets "
          f"{a.bucket_mb:g} MiB, {a.steps} timed steps (medians), {os.cpu_count()} CPUs, "
          + (f"over a {link.describe()}" if link is not None else "over loopback"))
    print(f"{'ranks':>5} {'layout':>8} {'mode':>14} {'step ms':>9} {'compute ms':>11} {'comm ms':>9} "
          f"{'vs gloo':>8}")
    gloo = {}
    for ranks, layout, res in rows:
        if "gloo" in res:
            gloo[ranks] = res["gloo"][1]
        for mode, (_, synced, local) in res.items():
            ratio = f"{gloo[ranks] / synced:7.2f}x" if ranks in gloo else f"{'-':>8}"
            print(f"{ranks:5d} {layout if not mode.startswith('gloo') else '-':>8} {mode:>14} {1e3 * synced:9.1f} "
                  f"{1e3 * local:11.1f} {1e3 * max(0.0, synced - local):9.1f} {ratio}")


if __name__ == "__main__":
    main()
