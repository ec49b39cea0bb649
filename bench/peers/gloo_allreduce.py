#!/usr/bin/python3
"""Gloo allreduce benchmark (PyTorch's gloo backend) on 127.0.0.1.

Starts --ranks processes with torch.multiprocessing (spawn), rendezvous over
tcp://127.0.0.1:<free port>, Gloo's TCP device pinned to the loopback interface
(GLOO_SOCKET_IFNAME=lo). For each message size B it runs allreduce(sum) over a
contiguous f32 CPU tensor of B/4 elements, in place: --warmup untimed then
--iters timed iterations, each one started after dist.barrier() and timed on
each rank around the blocking all_reduce call. The reported time is the mean
over iterations of the slowest rank's time; busbw follows nccl-tests for
allreduce: algbw = B / time, busbw = algbw * 2(N-1)/N. The result of the last
iteration is checked (every element must equal N).

Algorithm: torch 1.13's ProcessGroupGloo does not let Python pick Gloo's
allreduce algorithm. It calls gloo::allreduce() without setting one, which Gloo
maps to its ring (reduce-scatter then allgather, in segments). So there is one
variant: the default.

Must run with Debian's /usr/bin/python3 (python3-torch); other Pythons on PATH
do not see that torch.

Output, from rank 0, one line per size:
  gloo,ranks=4,bytes=67108864,time_us=150000.00,busbw_gbps=0.671089
plus human-readable lines starting with "# ".
"""

import argparse
import ctypes
import datetime
import os
import signal
import socket
import sys
import time

_UNITS = {"": 0, "B": 0, "K": 10, "M": 20, "G": 30}


def parse_bytes(text):
    t = text.strip().upper()
    if t.endswith("IB"):
        t = t[:-2]
    elif len(t) >= 2 and t.endswith("B") and not t[-2].isdigit():
        t = t[:-1]
    digits = len(t) - len(t.lstrip("0123456789"))
    if digits == 0 or t[digits:] not in _UNITS:
        raise argparse.ArgumentTypeError("bad byte size %r (e.g. 4096, 4K, 64M, 1G)" % text)
    return int(t[:digits]) << _UNITS[t[digits:]]


def message_sizes(args):
    if args.sizes:
        sizes = [parse_bytes(s) for s in args.sizes.split(",") if s.strip()]
    else:
        lo, hi = parse_bytes(args.min_bytes), parse_bytes(args.max_bytes)
        if lo <= 0 or lo > hi or args.step_factor < 2:
            raise SystemExit("gloo_allreduce: need 0 < min_bytes <= max_bytes and step_factor >= 2")
        sizes, b = [], lo
        while b <= hi:
            sizes.append(b)
            b *= args.step_factor
        if sizes[-1] != hi:
            sizes.append(hi)
    if args.latency:
        sizes.append(8)
    sizes = sorted(set(sizes))
    if not sizes or sizes[0] < 4:
        raise SystemExit("gloo_allreduce: sizes must be at least 4 bytes (one f32)")
    return sizes


def free_port():
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def fmt_bytes(b):
    for unit in ("B", "KiB", "MiB"):
        if b < 1024 or b % 1024:
            return "%d %s" % (b, unit)
        b //= 1024
    return "%d GiB" % b


def worker(rank, args, sizes, port, parent_pid):
    # Die with the parent, whatever happens to it.
    libc = ctypes.CDLL("libc.so.6", use_errno=True)
    libc.prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    if os.getppid() != parent_pid:
        os._exit(3)
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    n = args.ranks
    dist.init_process_group(
        "gloo",
        init_method="tcp://127.0.0.1:%d" % port,
        rank=rank,
        world_size=n,
        timeout=datetime.timedelta(seconds=args.op_timeout_s),
    )
    if rank == 0:
        print("# gloo: torch %s, %d ranks on 127.0.0.1 (GLOO_SOCKET_IFNAME=%s), allreduce sum f32 "
              "in place, algorithm: default (ring; torch exposes no choice), %d iters + %d warmup, "
              "barrier before each, busbw = bytes/time * 2(N-1)/N"
              % (torch.__version__, n, os.environ.get("GLOO_SOCKET_IFNAME", ""),
                 args.iters, args.warmup), flush=True)
    for nbytes in sizes:
        count = nbytes // 4
        nbytes = count * 4
        t = torch.empty(count, dtype=torch.float32)
        times = []
        for it in range(args.warmup + args.iters):
            t.fill_(1.0)
            dist.barrier()
            t0 = time.perf_counter()
            dist.all_reduce(t, op=dist.ReduceOp.SUM)
            t1 = time.perf_counter()
            if it >= args.warmup:
                times.append(t1 - t0)
        if float(t[0]) != n or float(t[-1]) != n:
            raise RuntimeError("rank %d: wrong allreduce result %r (expected %d)"
                               % (rank, (float(t[0]), float(t[-1])), n))
        slowest = torch.tensor(times, dtype=torch.float64)
        dist.all_reduce(slowest, op=dist.ReduceOp.MAX)
        if rank == 0:
            s = slowest.tolist()
            mean = sum(s) / len(s)
            algbw = nbytes / mean / 1e9 if mean > 0 else 0.0
            busbw = algbw * 2.0 * (n - 1) / n
            print("gloo,ranks=%d,bytes=%d,time_us=%.2f,busbw_gbps=%.6g"
                  % (n, nbytes, mean * 1e6, busbw), flush=True)
            srt = sorted(s)
            median = (srt[len(srt) // 2] if len(srt) % 2
                      else (srt[len(srt) // 2 - 1] + srt[len(srt) // 2]) / 2)
            print("# gloo %d ranks %10s: %11.2f us/iter (median %.2f, min %.2f, max %.2f)  "
                  "algbw %8.3f GB/s  busbw %8.3f GB/s"
                  % (n, fmt_bytes(nbytes), mean * 1e6, median * 1e6, srt[0] * 1e6, srt[-1] * 1e6,
                     algbw, busbw), flush=True)
    dist.barrier()
    dist.destroy_process_group()


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--ranks", type=int, default=4)
    p.add_argument("--sizes", default="", help="comma-separated sizes, e.g. 8,1M,64M (overrides min/max)")
    p.add_argument("--min_bytes", default="4K")
    p.add_argument("--max_bytes", default="64M")
    p.add_argument("--step_factor", type=int, default=4)
    p.add_argument("--latency", action="store_true", help="also run 8 bytes")
    p.add_argument("--iters", type=int, default=10)
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--op_timeout_s", type=float, default=120.0,
                   help="Gloo's timeout for one collective or the rendezvous")
    p.add_argument("--timeout_s", type=float, default=600.0,
                   help="deadline for the whole run; then every rank is killed")
    args = p.parse_args()
    if args.ranks < 2 or args.iters < 1 or args.warmup < 0:
        raise SystemExit("gloo_allreduce: need --ranks >= 2, --iters >= 1, --warmup >= 0")
    try:
        sizes = message_sizes(args)
    except argparse.ArgumentTypeError as e:
        raise SystemExit("gloo_allreduce: %s" % e)
    try:
        import torch.multiprocessing as mp
    except ImportError as e:
        raise SystemExit("gloo_allreduce: cannot import torch (%s); run with /usr/bin/python3 and "
                         "install python3-torch" % e)

    os.environ["GLOO_SOCKET_IFNAME"] = "lo"  # inherited by the spawned ranks
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    deadline = time.monotonic() + args.timeout_s
    ctx = mp.spawn(worker, args=(args, sizes, free_port(), os.getpid()), nprocs=args.ranks,
                   join=False)
    try:
        while not ctx.join(timeout=0.5):
            if time.monotonic() > deadline:
                sys.stderr.write("gloo_allreduce: run exceeded --timeout_s=%g; killing ranks\n"
                                 % args.timeout_s)
                for proc in ctx.processes:
                    if proc.is_alive():
                        proc.kill()
                for proc in ctx.processes:
                    proc.join(5)
                return 124
    except Exception as e:  # a rank failed; spawn has already stopped the others
        sys.stderr.write("gloo_allreduce: %s\n" % e)
        for proc in ctx.processes:
            if proc.is_alive():
                proc.kill()
            proc.join(5)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
