#!/usr/bin/python3
"""compare_report.py RESULTS: markdown tables from bench/compare.sh's results.txt.

One table per path (net, node) and rank count, the 8-byte latency per rank count, the key
points per repetition and the verdict on the issue's targets. Every figure is a median over
the repetitions present (a single run otherwise); each run's own figure is the program's mean
over its timed iterations (`time_us`), as nccl-tests reports. busbw is recomputed from that
time: bytes / time * 2(N-1)/N.
"""

import collections
import statistics
import sys


def parse(path):
    rows = []
    with open(path) as f:
        for line in f:
            line = line.strip()
            if not line or line.startswith("#") or " " in line:
                continue
            name, _, rest = line.partition(",")
            kv = {}
            for part in rest.split(","):
                k, _, v = part.partition("=")
                kv[k] = v
            rows.append((name, kv))
    return rows


def fnum(x, digits=3):
    if x is None:
        return "–"
    if x >= 100:
        return "%.0f" % x
    if x >= 10:
        return "%.1f" % x
    return "%.*f" % (digits, x)


def fbytes(b):
    for unit, shift in (("GiB", 30), ("MiB", 20), ("KiB", 10)):
        if b >= 1 << shift and b % (1 << shift) == 0:
            return "%d %s" % (b >> shift, unit)
    return "%d B" % b


def busbw(nbytes, time_us, n):
    return nbytes / time_us / 1e3 * 2.0 * (n - 1) / n if time_us else None


def ratio(a, b):
    return a / b if a is not None and b else None


def fratio(x):
    return "–" if x is None else "%.2f×" % x


def main():
    if len(sys.argv) != 2:
        sys.exit("usage: compare_report.py results.txt")
    rows = parse(sys.argv[1])
    meta = {name: kv for name, kv in rows
            if name in ("machine", "source", "binaries", "versions", "config")}
    key_ranks = int(meta.get("config", {}).get("key_ranks", 4))
    key_bytes = int(meta.get("config", {}).get("key_bytes", 64 << 20))
    gap = meta.get("config", {}).get("gap_us", "?")

    # times[(prog, ranks, bytes)] -> {rep: [time_us, ...]}; medians[(prog, ranks, bytes)] likewise.
    times = collections.defaultdict(lambda: collections.defaultdict(list))
    medians = collections.defaultdict(lambda: collections.defaultdict(list))
    algos = collections.defaultdict(set)
    membw = collections.defaultdict(list)
    errors, loads = [], []
    for name, kv in rows:
        rep = int(kv.get("rep", 1))
        if name == "error":
            errors.append(kv)
            continue
        if name == "load":
            loads.append(kv)
            continue
        if name == "membw":
            membw[int(kv["bytes"])].append(float(kv["gbps"]))
            continue
        if name == "gradsync":
            prog = "gs_%s_%s_%s" % (kv["path"], kv["req"], kv["timing"])
            if kv.get("build", "new") == "old":  # --old_bin_dir's build
                prog = "old_" + prog
            algos[(prog, int(kv["ranks"]), int(kv["bytes"]))].add(kv.get("algo", ""))
        elif name in ("ring_limit", "ring_limit_spin", "gloo"):
            prog = name
        elif name == "mpi":
            prog = "mpi_" + kv["transport"]
        else:
            continue
        key = (prog, int(kv["ranks"]), int(kv["bytes"]))
        times[key][rep].append(float(kv["time_us"]))
        if "median_us" in kv:
            medians[key][rep].append(float(kv["median_us"]))
        elif name == "gradsync" and kv["timing"] in ("blocking", "gap"):
            medians[key][rep].append(float(kv["time_us"]))  # bench --blocking prints the median

    def t(prog, n, b):  # median over reps of each rep's time (for --blocking runs: its median)
        reps = times.get((prog, n, b))
        if not reps:
            return None
        return statistics.median(statistics.mean(v) for v in reps.values())

    def nreps(prog, n, b):
        return len(times.get((prog, n, b), {}))

    def med(prog, n, b):  # median over reps of each rep's per-iteration median
        pool = [statistics.median(v) for v in medians.get((prog, n, b), {}).values()]
        return statistics.median(pool) if pool else None

    out = []
    p = out.append
    m = meta.get("machine", {})
    s = meta.get("source", {})
    v = meta.get("versions", {})
    bins = meta.get("binaries", {})
    p("Machine: %s CPUs (%s), %s GB RAM, kernel %s. Source: commit %s (%s tracked files modified), "
      "built %s; gradsyncd sha256 %s…. Open MPI %s, torch %s." % (
          m.get("nproc"), m.get("cpu", "").replace("_", " "), m.get("mem_gb"), m.get("kernel"),
          s.get("commit"), s.get("dirty_files"), s.get("built", "?"),
          bins.get("gradsyncd_sha256", "?"), v.get("mpi"), v.get("torch")))
    # Others' CPU share per batch: batch label -> {rep: foreign_pct}.
    foreign = collections.defaultdict(dict)
    for l in loads:
        foreign[l["batch"]][int(l["rep"])] = int(l["foreign_pct"])
    if loads:
        fp = sorted(int(l["foreign_pct"]) for l in loads)
        p("")
        p("Load (%d batches; a batch is one size of one path, all programs back to back): 1-min load "
          "average at the start %s … %s; before each batch the script waited for ≥ 85%% idle CPUs "
          "(idle at the start: median %d%%, min %d%%). Share of both CPUs used by other processes "
          "during a batch: median %d%%, max %d%%; batches above 10%%: %s. Hypervisor steal: max %d%%." % (
              len(loads), min(l["load"].split("/")[0] for l in loads),
              max(l["load"].split("/")[0] for l in loads),
              statistics.median(int(l["idle_before_pct"]) for l in loads),
              min(int(l["idle_before_pct"]) for l in loads), statistics.median(fp), fp[-1],
              ", ".join("%s rep %s (%s%%)" % (l["batch"], l["rep"], l["foreign_pct"])
                        for l in loads if int(l["foreign_pct"]) > 10) or "none",
              max(int(l["steal_pct"]) for l in loads)))
        rerun = ["%s rep %s" % (l["batch"], l["rep"]) for l in loads if int(l.get("try", 1)) > 1]
        p("")
        p("Batches run again because other processes used more than the allowed CPU share during an "
          "earlier try (the earlier tries are in discarded.txt): %s." % (", ".join(rerun) or "none"))

    def others(label):
        v = foreign.get(label)
        return "%d%%" % max(v.values()) if v else "–"

    if errors:
        p("")
        p("**Failed runs:** " + "; ".join("%s ranks=%s bytes=%s rc=%s" % (
            e.get("run"), e.get("ranks"), e.get("bytes"), e.get("rc")) for e in errors))

    ranks_all = sorted({k[1] for k in times})
    for n in ranks_all:
        sizes = sorted({k[2] for k in times if k[1] == n and k[0] == "gs_net_auto_b2b" and k[2] > 8})
        if sizes:
            p("")
            p("### Network path, %d ranks (one daemon per rank, TCP over loopback)" % n)
            p("")
            p("| bytes | gradsync algo | gradsync time µs | gradsync busbw | gradsync ring busbw | "
              "ring limit busbw | Gloo busbw | MPI tcp busbw | gradsync / Gloo | gradsync / ring limit "
              "| gradsync time / MPI time | runs | others' CPU |")
            p("| ---: | :-- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
            for b in sizes:
                tg = t("gs_net_auto_b2b", n, b)
                tr = t("gs_net_ring_b2b", n, b)
                tl = t("ring_limit", n, b)
                tgl = t("gloo", n, b)
                tm = t("mpi_tcp", n, b)
                bg, bl, bgl = busbw(b, tg, n), busbw(b, tl, n), busbw(b, tgl, n)
                p("| %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %d | %s |" % (
                    fbytes(b), "/".join(sorted(algos[("gs_net_auto_b2b", n, b)])), fnum(tg),
                    fnum(bg), fnum(busbw(b, tr, n)) if tr else "–", fnum(bl), fnum(bgl),
                    fnum(busbw(b, tm, n)), fratio(ratio(bg, bgl)), fratio(ratio(bg, bl)),
                    fratio(ratio(tg, tm)), nreps("gs_net_auto_b2b", n, b),
                    others("net:ranks=%d:bytes=%d" % (n, b))))
        sizes = sorted({k[2] for k in times if k[1] == n and k[0] == "gs_node_auto_b2b" and k[2] > 8})
        if sizes:
            p("")
            p("### Node path, %d ranks sharing one daemon (hierarchical, shared memory)" % n)
            p("")
            p("Memory bound: the hierarchical allreduce reads the %d buffers and writes one "
              "(local reduce), then copies the result into %d buffers (read + write each): "
              "(3N−1)·B = %d·B bytes of memory traffic; at the single-thread `a += b` bandwidth "
              "that takes (3N−1)·B / membw." % (n, n - 1, 3 * n - 1))
            p("")
            p("| bytes | gradsync time µs | gradsync busbw | MPI vader time µs | MPI vader busbw | "
              "MPI time / gradsync time | membw a+=b GB/s | memory-bound time µs | bound / gradsync time "
              "| runs | others' CPU |")
            p("| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
            for b in sizes:
                tg = t("gs_node_auto_b2b", n, b)
                tm = t("mpi_vader", n, b)
                mb = statistics.median(membw[b]) if membw.get(b) else None
                bound = (3 * n - 1) * b / (mb * 1e3) if mb else None
                p("| %s | %s | %s | %s | %s | %s | %s | %s | %s | %d | %s |" % (
                    fbytes(b), fnum(tg), fnum(busbw(b, tg, n)), fnum(tm), fnum(busbw(b, tm, n)),
                    fratio(ratio(tm, tg)), fnum(mb, 1), fnum(bound), fratio(ratio(bound, tg)),
                    nreps("gs_node_auto_b2b", n, b), others("node:ranks=%d:bytes=%d" % (n, b))))
        lat = [("gs_net_auto_b2b", "gradsync net, %s ops back to back, time / ops"),
               ("gs_net_auto_blocking", "gradsync net, each op alone (`--blocking`), %s ops"),
               ("ring_limit", "ring limit (blocking poll)"),
               ("ring_limit_spin", "ring limit (spinning first, like gradsyncd --spin_us)"),
               ("gloo", "Gloo (blocking ops)"),
               ("mpi_tcp", "Open MPI tcp (blocking ops)"),
               ("gs_node_auto_b2b", "gradsync node (one daemon: local ops), %s ops back to back, time / ops"),
               ("gs_node_auto_blocking", "gradsync node (one daemon: local ops), each op alone (`--blocking`), %s ops"),
               ("mpi_vader", "Open MPI vader (blocking ops)"),
               ("gs_net_auto_gap", "gradsync net, each op after %s µs idle (`--blocking --gap_us`), %%s ops" % gap),
               ("mpi_tcp_gap", "Open MPI tcp, each op after %s µs idle" % gap),
               ("gs_node_auto_gap", "gradsync node (one daemon: local ops), each op after %s µs idle (`--blocking --gap_us`), %%s ops" % gap),
               ("mpi_vader_gap", "Open MPI vader, each op after %s µs idle" % gap)]
        if any((prog, n, 8) in times for prog, _ in lat):
            p("")
            p("### 8-byte allreduce latency, %d ranks" % n)
            p("")
            p("Peers and gradsync `--blocking`: every op after a barrier, timed alone; the slowest "
              "rank's time per iteration, mean and median over the iterations (gradsync prints only "
              "the median). gradsync back to back: only a mean exists (total / ops). Others' CPU share "
              "during these batches: net %s, node %s (max over repetitions)." % (
                  others("latency:net:ranks=%d" % n), others("latency:node:ranks=%d" % n)))
            p("")
            p("| program | mean µs | median µs | runs | median vs MPI (same transport) |")
            p("| :-- | ---: | ---: | ---: | ---: |")
            for prog, label in lat:
                key = (prog, n, 8)
                if key not in times:
                    continue
                if "%s" in label:
                    timing = prog.rsplit("_", 1)[1]
                    iters = {kv.get("iters") for nm, kv in rows if nm == "gradsync"
                             and kv.get("bytes") == "8" and kv.get("ranks") == str(n)
                             and kv.get("timing") == timing}
                    label = label % "/".join(sorted(i for i in iters if i))
                ref = "mpi_vader" if "node" in prog or prog.startswith("mpi_vader") else "mpi_tcp"
                if prog.endswith("_gap"):
                    ref += "_gap"
                md = med(prog, n, 8)
                if prog.endswith("_b2b"):
                    cmp_ = ratio(t(prog, n, 8), med(ref, n, 8))
                    cmp_s = fratio(cmp_) + " (mean)" if cmp_ else "–"
                else:
                    cmp_s = fratio(ratio(md, med(ref, n, 8)))
                mean = "–" if prog.endswith(("_blocking", "_gap")) and prog.startswith("gs_") \
                    else fnum(t(prog, n, 8))
                p("| %s | %s | %s | %d | %s |" % (label, mean, fnum(md), nreps(prog, n, 8), cmp_s))

    # Key points, per repetition.
    n, b = key_ranks, key_bytes
    p("")
    p("### Key points, each repetition (%d ranks)" % n)
    p("")
    p("| rep | gradsync net %s busbw | gradsync ring busbw | ring limit busbw | Gloo busbw | MPI tcp busbw "
      "| gradsync node time µs | MPI vader time µs | gradsync net 8 B median µs | MPI tcp 8 B "
      "median µs | gradsync node 8 B median µs | MPI vader 8 B median µs |" % fbytes(b))
    p("| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    reps = sorted({r for k, v in times.items() if k[1] == n for r in v})

    def rt(prog, bb, rep):
        v = times.get((prog, n, bb), {}).get(rep)
        return statistics.mean(v) if v else None

    def rm(prog, rep):
        v = medians.get((prog, n, 8), {}).get(rep)
        return statistics.median(v) if v else None

    for rep in reps:
        p("| %d | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s |" % (
            rep, fnum(busbw(b, rt("gs_net_auto_b2b", b, rep), n)),
            fnum(busbw(b, rt("gs_net_ring_b2b", b, rep), n)),
            fnum(busbw(b, rt("ring_limit", b, rep), n)), fnum(busbw(b, rt("gloo", b, rep), n)),
            fnum(busbw(b, rt("mpi_tcp", b, rep), n)), fnum(rt("gs_node_auto_b2b", b, rep)),
            fnum(rt("mpi_vader", b, rep)), fnum(rm("gs_net_auto_blocking", rep)),
            fnum(rm("mpi_tcp", rep)), fnum(rm("gs_node_auto_blocking", rep)),
            fnum(rm("mpi_vader", rep))))

    # Verdict on the targets (medians over repetitions).
    def verdict(ok):
        return "**met**" if ok else "**missed**"

    p("")
    p("### Targets (%d ranks, %s; medians over the repetitions)" % (n, fbytes(b)))
    p("")
    p("| target | measured | verdict |")
    p("| :-- | :-- | :-- |")
    bg = busbw(b, t("gs_net_auto_b2b", n, b), n)
    br = busbw(b, t("gs_net_ring_b2b", n, b), n)
    bgl = busbw(b, t("gloo", n, b), n)
    bl = busbw(b, t("ring_limit", n, b), n)
    def per_rep(a, b_):  # ratio of busbw a/b_ (= time b_/a) in each repetition
        out_ = []
        for rep in reps:
            ta, tb = rt(a, b, rep), rt(b_, b, rep)
            if ta and tb:
                out_.append(tb / ta)
        return out_

    if bg and bgl:
        r = bg / bgl
        pr = per_rep("gs_net_auto_b2b", "gloo")
        p("| net busbw ≥ 1.2× Gloo | gradsync %.3f GB/s (ring forced: %s), Gloo %.3f GB/s: %.2f× "
          "(per repetition: %s) | %s%s |" % (
              bg, fnum(br), bgl, r, ", ".join("%.2f×" % x for x in pr), verdict(r >= 1.2),
              "" if r >= 1.2 else ", by %.1f%%" % ((1.2 - r) / 1.2 * 100)))
    if bg and bl:
        r = bg / bl
        pr = per_rep("gs_net_auto_b2b", "ring_limit")
        p("| net busbw ≥ 85%% of the ring limit | gradsync %.3f GB/s, ring limit %.3f GB/s: %.0f%% "
          "(per repetition: %s) | %s%s |" % (
              bg, bl, r * 100, ", ".join("%.0f%%" % (x * 100) for x in pr), verdict(r >= 0.85),
              "" if r >= 0.85 else ", by %.0f points" % ((0.85 - r) * 100)))
    gl, ml = med("gs_net_auto_blocking", n, 8), med("mpi_tcp", n, 8)
    if gl and ml:
        p("| net 8 B latency ≤ MPI tcp | gradsync median %.1f µs (`--blocking`), MPI tcp median %.1f µs: %.2f× | %s |" % (
            gl, ml, gl / ml, verdict(gl <= ml)))
    tg, tm = t("gs_node_auto_b2b", n, b), t("mpi_vader", n, b)
    if tg and tm:
        p("| node %s ≥ 2× faster than MPI vader | gradsync %.0f µs, MPI vader %.0f µs: %.2f× faster | %s |" % (
            fbytes(b), tg, tm, tm / tg, verdict(tm / tg >= 2)))
    gl, ml = med("gs_node_auto_blocking", n, 8), med("mpi_vader", n, 8)
    if gl and ml:
        p("| node 8 B latency within 2× of MPI vader | gradsync median %.1f µs (`--blocking`), MPI vader median "
          "%.1f µs: %.1f× | %s |" % (gl, ml, gl / ml, verdict(gl <= 2 * ml)))
    old_vs_new(p, times, medians)
    print("\n".join(out))


def old_vs_new(p, times, medians):
    """This build against --old_bin_dir's, point by point: each repetition ran both in the
    same batch, one right after the other, so the per-repetition ratio compares runs under
    the same conditions; the verdict is on the median of those ratios."""
    pairs = sorted(k for k in times if k[0].startswith("old_") and (k[0][4:], k[1], k[2]) in times)
    if not pairs:
        return
    p("")
    p("### Against the old build (`--old_bin_dir`), interleaved in every repetition")
    p("")
    p("Time ratio new / old per repetition (< 1: this build is faster); for `--blocking` runs the "
      "median op, else the mean. Guard: 64 MiB within 5%, 8 B within 10%.")
    p("")
    p("| point | ranks | bytes | new | old | new / old per repetition | median ratio | guard |")
    p("| :-- | ---: | ---: | ---: | ---: | :-- | ---: | :-- |")
    for old_key in pairs:
        prog, n, b = old_key[0][4:], old_key[1], old_key[2]
        blocking = prog.endswith(("_blocking", "_gap"))
        src = medians if blocking else times

        def per_rep(key):
            return {r: statistics.median(v) if blocking else statistics.mean(v)
                    for r, v in src.get(key, {}).items() if v}
        new_t, old_t = per_rep((prog, n, b)), per_rep(old_key)
        common = sorted(set(new_t) & set(old_t))
        if not common:
            continue
        ratios = [new_t[r] / old_t[r] for r in common]
        mr = statistics.median(ratios)
        bound = 1.05 if b >= (1 << 20) else 1.10
        def shown(v):
            return ("%s GB/s" % fnum(busbw(b, v, n))) if b >= (1 << 20) and not blocking \
                else "%s µs" % fnum(v)
        p("| %s | %d | %s | %s | %s | %s | %.3f | %s |" % (
            prog[3:], n, fbytes(b), shown(statistics.median(new_t[r] for r in common)),
            shown(statistics.median(old_t[r] for r in common)),
            ", ".join("%.3f" % x for x in ratios), mr,
            "within" if mr <= bound else "**slower by %.0f%%**" % ((mr - 1) * 100)))


if __name__ == "__main__":
    main()
