"""The Python package against a real local cluster (GRADSYNC_DAEMONS, from
`gradsync cluster`): every collective, every dtype and reduce op, checked
exactly against numpy; errors as exceptions with gradsync's message."""

import os
import threading
import unittest

import numpy as np

import gradsync

TARGETS = os.environ["GRADSYNC_DAEMONS"].split(",")
WORLD = len(TARGETS)
NP = {"f32": np.float32, "f64": np.float64, "f16": np.float16, "i32": np.int32,
      "i64": np.int64, "u8": np.uint8}
_job = [0]


def job_name(what):
    _job[0] += 1
    return f"py-{what}-{os.getpid()}-{_job[0]}"


def on_ranks(fn, world=WORLD):
    """Runs fn(rank, session) on every rank (a thread each, its own daemon)."""
    job = job_name(fn.__name__)
    out, errors = [None] * world, [None] * world

    def run(r):
        try:
            with gradsync.Client(TARGETS[r]) as c, c.open_session(job, world, rank=r, timeout=30) as s:
                out[r] = fn(r, s)
        except Exception as e:  # reported by the caller
            errors[r] = e
    threads = [threading.Thread(target=run, args=(r,)) for r in range(world)]
    for t in threads:
        t.start()
    for r, t in enumerate(threads):
        t.join(60)
        if t.is_alive():
            errors[r] = TimeoutError(f"rank {r} still running after 60 s")
    return out, errors


def data(dtype, count, rank, op):
    """Small integers: every reduction order gives the same exact result."""
    rng = np.random.default_rng(rank * 7919 + count)
    lo, hi = (1, 3) if op == "prod" else (-4, 5)
    if dtype == "u8":
        lo, hi = (1, 3) if op == "prod" else (0, 9)
    return rng.integers(lo, hi, size=count)


def as_dtype(values, dtype):
    """Values as the array the session holds (bf16: the top 16 bits of f32)."""
    if dtype == "bf16":
        return (values.astype(np.float32).view(np.uint32) >> 16).astype(np.uint16)
    return values.astype(NP[dtype])


def from_dtype(array, dtype):
    if dtype == "bf16":
        return (array.astype(np.uint32) << 16).view(np.float32).astype(np.float64)
    return array.astype(np.float64)


def reduce(values, op):
    stack = np.stack(values).astype(np.float64)
    if op in ("sum", "avg"):
        r = stack.sum(axis=0)
        return r / len(values) if op == "avg" else r
    return {"min": stack.min(axis=0), "max": stack.max(axis=0), "prod": stack.prod(axis=0)}[op]


class Collectives(unittest.TestCase):
    def test_allreduce_every_dtype_and_op(self):
        count = 777
        for dtype in ["f32", "f64", "f16", "bf16", "i32", "i64", "u8"]:
            for op in ["sum", "avg", "min", "max", "prod"]:
                def fn(r, s):
                    a = s.empty(count, np.uint16 if dtype == "bf16" else NP[dtype])
                    a[:] = as_dtype(data(dtype, count, r, op), dtype)
                    s.allreduce(a, op=op, dtype=dtype).wait(30)
                    return from_dtype(a, dtype)
                out, errors = on_ranks(fn)
                self.assertEqual(errors, [None] * WORLD, (dtype, op))
                want = reduce([data(dtype, count, r, op) for r in range(WORLD)], op)
                if dtype in ("i32", "i64", "u8") and op == "avg":
                    want = np.trunc(want)
                for r in range(WORLD):
                    np.testing.assert_array_equal(out[r], want, err_msg=f"{dtype} {op} rank {r}")

    def test_premul_sum_multiplies_each_ranks_array_by_its_own_factor(self):
        count = 1001
        factors = [0.5, -2.0, 0.25, 4.0][:WORLD]
        for dtype in ["f32", "f64", "f16", "bf16"]:
            def fn(r, s):
                a = s.empty(count, np.uint16 if dtype == "bf16" else NP[dtype])
                a[:] = as_dtype(data(dtype, count, r, "sum"), dtype)
                s.allreduce(a, op="premul_sum", factor=factors[r], dtype=dtype).wait(30)
                b = s.empty(count * WORLD, NP[dtype] if dtype != "bf16" else np.uint16)
                b[:] = as_dtype(np.tile(data(dtype, count, r, "sum"), WORLD), dtype)
                s.reduce_scatter(b, op="premul_sum", factor=factors[r], dtype=dtype).wait(30)
                return from_dtype(a, dtype), from_dtype(b[r * count:(r + 1) * count], dtype)
            out, errors = on_ranks(fn)
            self.assertEqual(errors, [None] * WORLD, dtype)
            want = sum(data(dtype, count, r, "sum") * factors[r] for r in range(WORLD))
            for r in range(WORLD):
                np.testing.assert_array_equal(out[r][0], want, err_msg=f"{dtype} rank {r}")
                np.testing.assert_array_equal(out[r][1], want, err_msg=f"{dtype} rs rank {r}")

    def test_blocked_and_rooted_collectives(self):
        block = 50

        def fn(r, s):
            res = {}
            rs = s.empty(WORLD * block, np.float32)
            rs[:] = np.arange(WORLD * block) + 100 * r
            s.reduce_scatter(rs).wait(30)
            res["rs"] = rs[r * block:(r + 1) * block].copy()
            ag = s.empty(WORLD * block, np.int32)
            ag[r * block:(r + 1) * block] = r + 1
            s.allgather(ag).wait(30)
            res["ag"] = ag.copy()
            bc = s.empty(block, np.float64)
            bc[:] = 3.5 if r == WORLD - 1 else 0
            s.broadcast(bc, root=WORLD - 1).wait(30)
            res["bc"] = bc.copy()
            rd = s.empty(block, np.int64)
            rd[:] = r + 1
            s.reduce(rd, root=0, op="max").wait(30)
            res["rd"] = rd.copy()
            a2a = s.empty(WORLD * block, np.uint8)
            for j in range(WORLD):
                a2a[j * block:(j + 1) * block] = 10 * r + j
            s.alltoall(a2a).wait(30)
            res["a2a"] = a2a.copy()
            res["barrier"] = s.barrier().wait(30).algorithm
            return res
        out, errors = on_ranks(fn)
        self.assertEqual(errors, [None] * WORLD)
        for r in range(WORLD):
            want_rs = sum(np.arange(r * block, (r + 1) * block) + 100 * q for q in range(WORLD))
            np.testing.assert_array_equal(out[r]["rs"], want_rs)
            np.testing.assert_array_equal(out[r]["ag"], np.repeat(np.arange(1, WORLD + 1), block))
            np.testing.assert_array_equal(out[r]["bc"], np.full(block, 3.5))
            for i in range(WORLD):
                np.testing.assert_array_equal(out[r]["a2a"][i * block:(i + 1) * block], 10 * i + r)
        np.testing.assert_array_equal(out[0]["rd"], np.full(block, WORLD))
        np.testing.assert_array_equal(out[1]["rd"], np.full(block, 2))  # non-roots unchanged

    def test_gather_and_scatter_from_every_root(self):
        block = 37

        def fn(r, s):
            res = {}
            for root in range(WORLD):
                g = s.empty(WORLD * block, np.float64)
                g[:] = -1.0  # every block but this rank's own is garbage
                g[r * block:(r + 1) * block] = np.arange(block) * 0.5 + 1000 * r + root
                s.gather(g, root=root).wait(30)
                res[("g", root)] = g.copy()
                sc = s.empty(WORLD * block, np.int32)
                sc[:] = -7
                if r == root:
                    sc[:] = np.arange(WORLD * block) + 100000 * root
                s.scatter(sc, root=root).wait(30)
                res[("s", root)] = sc.copy()
            return res
        out, errors = on_ranks(fn)
        self.assertEqual(errors, [None] * WORLD)
        def own(q, root):  # rank q's block in the gather to `root`
            return np.arange(block) * 0.5 + 1000 * q + root
        for root in range(WORLD):
            for r in range(WORLD):
                g = out[r][("g", root)]
                for j in range(WORLD):
                    part = g[j * block:(j + 1) * block]
                    if r == root or j == r:
                        np.testing.assert_array_equal(part, own(j, root), err_msg=f"gather root {root}")
                    else:  # a non-root's other blocks are left as they were
                        np.testing.assert_array_equal(part, np.full(block, -1.0))
                sc = out[r][("s", root)]
                src = np.arange(WORLD * block) + 100000 * root
                for j in range(WORLD):
                    part = sc[j * block:(j + 1) * block]
                    if r == root or j == r:
                        np.testing.assert_array_equal(part, src[j * block:(j + 1) * block],
                                                      err_msg=f"scatter root {root} rank {r}")
                    else:
                        np.testing.assert_array_equal(part, np.full(block, -7))

    def test_codecs_compress_and_every_rank_gets_the_same_values(self):
        """An op's codec runs on the ring between the daemons: every rank ends
        with the same bits, within the codec's bound of the exact sum (n
        quantizations of at most `bound` x the block's largest partial sum);
        a job's codec applies where it can; a bad codec is refused."""
        count = 3 * 4096 + 5
        bounds = {"bf16": 2 ** -8, "fp16": 2 ** -11, "fp8e4m3": 2 ** -4, "fp8e5m2": 2 ** -3,
                  "int8": 1 / 254 * 1.001}
        rng = np.random.default_rng(5)
        inputs = [rng.standard_normal(count).astype(np.float32) for _ in range(WORLD)]
        exact = np.sum(np.stack(inputs).astype(np.float64), axis=0)
        amax = np.max(np.sum(np.abs(np.stack(inputs).astype(np.float64)), axis=0))
        for codec, bound in bounds.items():
            def fn(r, s):
                a = s.empty(count, np.float32)
                a[:] = inputs[r]
                res = s.allreduce(a, codec=codec).wait(30)
                return a.copy(), res.algorithm
            out, errors = on_ranks(fn)
            self.assertEqual(errors, [None] * WORLD, codec)
            for r in range(WORLD):
                self.assertEqual(out[r][1], f"ring+{codec}", codec)
                np.testing.assert_array_equal(out[r][0], out[0][0], err_msg=f"{codec} rank {r}")
            err = np.max(np.abs(out[0][0].astype(np.float64) - exact))
            self.assertLessEqual(err, WORLD * bound * amax * 1.01, codec)
            self.assertGreater(err, 0, f"{codec}: a lossy codec changed nothing")

        # The job's codec: an f32 allreduce goes through it, an i32 one runs dense.
        job = job_name("jobcodec")

        def job_fn(r):
            with gradsync.Client(TARGETS[r]) as c, \
                    c.open_session(job, WORLD, rank=r, timeout=30, codec="bf16") as s:
                a = s.empty(count, np.float32)
                a[:] = inputs[r]
                b = s.empty(count, np.int32)
                b[:] = r + 1
                return (s.allreduce(a).wait(30).algorithm, s.allreduce(b).wait(30).algorithm,
                        int(b[0]))
        results = [None] * WORLD
        threads = [threading.Thread(target=lambda r=r: results.__setitem__(r, job_fn(r)))
                   for r in range(WORLD)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        for r in range(WORLD):
            self.assertEqual(results[r][0], "ring+bf16", r)
            self.assertNotIn("+", results[r][1], r)  # dense, whatever the algorithm
            self.assertEqual(results[r][2], sum(range(1, WORLD + 1)), r)

        def bad(r, s):
            with self.assertRaises(gradsync.InvalidArgument) as ctx:
                s.allreduce(s.empty(count, np.int32), codec="int8")
            with self.assertRaises(gradsync.InvalidArgument) as ctx2:
                s.allreduce(s.empty(count, np.float32), codec="zip")
            return str(ctx.exception), str(ctx2.exception)
        out, errors = on_ranks(bad)
        self.assertEqual(errors, [None] * WORLD)
        self.assertIn("codec 'int8' does not apply: codecs encode f32 values, not i32", out[0][0])
        self.assertIn("unknown codec 'zip'", out[0][1])

    def test_async_ops_overlap_and_report_their_plan(self):
        def fn(r, s):
            arrays = [s.empty(1000 * (i + 1), np.float32) for i in range(4)]
            for i, a in enumerate(arrays):
                a[:] = r + i
            works = [s.allreduce(a, name=f"bucket{i}") for i, a in enumerate(arrays)]
            results = [w.wait(30) for w in works]
            return [a[0] for a in arrays], results
        out, errors = on_ranks(fn)
        self.assertEqual(errors, [None] * WORLD)
        for r in range(WORLD):
            firsts, results = out[r]
            self.assertEqual(firsts, [sum(q + i for q in range(WORLD)) for i in range(4)])
            for res in results:
                self.assertTrue(res.algorithm)
                self.assertGreaterEqual(res.run_us, 0)


class Errors(unittest.TestCase):
    def test_bad_arguments_raise_before_anything_runs(self):
        def fn(r, s):
            a = s.empty(10, np.float32)
            caught = []
            for call in (lambda: s.allreduce(a, op="median"),
                         lambda: s.allreduce(np.zeros(10, np.float32)),
                         lambda: s.submit("allscatter", a),
                         lambda: s.allgather(s.empty(WORLD * 3 + 1, np.float32)),
                         lambda: s.allreduce(a, op="premul_sum"),
                         lambda: s.allreduce(s.empty(10, np.int32), op="premul_sum", factor=2)):
                with self.assertRaises(gradsync.InvalidArgument) as cm:
                    call()
                caught.append(str(cm.exception))
            s.allreduce(a).wait(30)  # the session still works
            return caught
        out, errors = on_ranks(fn)
        self.assertEqual(errors, [None] * WORLD)
        msgs = out[0]
        self.assertIn("unknown reduce op 'median'", msgs[0])
        self.assertIn("does not lie in a buffer of this session", msgs[1])
        self.assertIn("unknown collective 'allscatter'", msgs[2])
        self.assertIn("equal blocks", msgs[3])
        self.assertIn("reduce op premul_sum takes a factor", msgs[4])
        self.assertIn("reduce op premul_sum needs a float dtype", msgs[5])

    def test_an_op_a_rank_never_submits_fails_naming_it(self):
        gave_up = threading.Event()

        def fn(r, s):
            if r == 1:  # never submits; stays in the job until rank 0 gave up
                gave_up.wait(30)
                return None
            a = s.empty(100, np.float32)
            w = s.allreduce(a, timeout=1.5)
            with self.assertRaises(gradsync.GradsyncError) as cm:
                w.wait(20)
            # The failure is the op's own: remembered, not mistaken for "still running".
            self.assertTrue(w.done())
            with self.assertRaises(gradsync.DeadlineExceeded) as again:
                w.wait(1)
            self.assertIs(again.exception, cm.exception)
            gave_up.set()
            return cm.exception
        out, errors = on_ranks(fn, world=2)
        self.assertEqual(errors, [None, None])
        e = out[0]
        self.assertIsInstance(e, gradsync.DeadlineExceeded)
        self.assertNotIsInstance(e, gradsync.StillRunning)  # the op's own deadline
        self.assertIn("waiting for rank(s) 1 to submit op 1", str(e))

    def test_a_wait_that_runs_out_says_so_and_the_op_goes_on(self):
        def fn(r, s):
            a = s.empty(10, np.float32)
            a[:] = 1
            if r == 0:
                w = s.allreduce(a)
                with self.assertRaises(gradsync.StillRunning) as pending:
                    w.wait(0.2)  # rank 1 comes later
                self.assertIsInstance(pending.exception, gradsync.DeadlineExceeded)
                self.assertEqual(pending.exception.code, 100)
                self.assertFalse(w.done())
                return w.wait(30).algorithm, a[0]
            import time
            time.sleep(1.0)
            s.allreduce(a).wait(30)
            return None, a[0]
        out, errors = on_ranks(fn, world=2)
        self.assertEqual(errors, [None, None])
        self.assertEqual(out[0][1], 2.0)
        self.assertEqual(out[1][1], 2.0)

    def test_close_waits_for_a_wait_on_another_thread(self):
        # Rank 1 never submits: rank 0's op fails at its 1 s deadline while
        # another thread of rank 0 waits for it and the session is closed.
        gave_up = threading.Event()

        def fn(r, sess):
            if r == 1:
                gave_up.wait(30)
                return None
            a = sess.empty(8, np.float32)
            w = sess.allreduce(a, timeout=1.0)
            got = []
            t = threading.Thread(target=lambda: got.append(self._raises(w)))
            t.start()
            import time
            time.sleep(0.2)  # the other thread is inside the C wait now
            sess.close()     # waits for that call instead of freeing the session under it
            t.join(20)
            gave_up.set()
            return got
        out, errors = on_ranks(fn, world=2)
        self.assertEqual(errors, [None, None])
        self.assertEqual(len(out[0]), 1)
        self.assertIsInstance(out[0][0], gradsync.DeadlineExceeded)

    @staticmethod
    def _raises(work):
        try:
            work.wait(20)
        except gradsync.GradsyncError as e:
            return e
        return None

    def test_closed_session(self):
        c = gradsync.Client(TARGETS[0])
        s = c.open_session(job_name("closed"), 1, rank=0, timeout=10)
        a = s.empty(4, np.float32)
        s.close()
        a[:] = 2  # the mapping outlives the session
        with self.assertRaises(gradsync.FailedPrecondition) as cm:
            s.allreduce(a)
        self.assertIn("closed", str(cm.exception))
        c.close()

    def test_registered_memfd_is_reduced_in_place(self):
        import mmap
        count = 5000

        def fn(r, s):
            fd = os.memfd_create(f"py-rank{r}", os.MFD_ALLOW_SEALING)
            try:
                os.ftruncate(fd, mmap.PAGESIZE + count * 4)
                mine = mmap.mmap(fd, mmap.PAGESIZE + count * 4)
                view = np.frombuffer(mine, np.int32, count, offset=mmap.PAGESIZE)
                view[:] = data("i32", count, r, "sum")
                buf = s.register_fd(fd, count * 4, offset=mmap.PAGESIZE)
                s.allreduce(buf.numpy(np.int32, count)).wait(30)
                got = view.copy()  # read through this process's own mapping
                buf.free()
                with self.assertRaises(OSError):  # sealed against shrinking
                    os.ftruncate(fd, 0)
                with self.assertRaises(gradsync.InvalidArgument) as cm:
                    s.register_fd(fd, 1 << 30)
                del view
                mine.close()
                return got, str(cm.exception)
            finally:
                os.close(fd)
        out, errors = on_ranks(fn)
        self.assertEqual(errors, [None] * WORLD)
        want = reduce([data("i32", count, r, "sum") for r in range(WORLD)], "sum")
        for r in range(WORLD):
            np.testing.assert_array_equal(out[r][0], want)
            self.assertIn("needs 1073741824", out[r][1])

    def test_device_buffers_without_cuda_say_why(self):
        with gradsync.Client(TARGETS[0]) as c, \
                c.open_session(job_name("device"), 1, rank=0, timeout=10) as s:
            with self.assertRaises(gradsync.FailedPrecondition) as cm:
                s.alloc_device(1 << 20, 0)
            self.assertIn("device buffers need CUDA in this process", str(cm.exception))
            with self.assertRaises(gradsync.FailedPrecondition) as cm:
                s.register_device(0x7f0000000000, 4096)
            self.assertIn("RegisterDeviceBuffer", str(cm.exception))
            host = s.alloc(64)
            self.assertEqual(host.cuda_device, -1)  # a host buffer
            self.assertEqual(len(host.bytes), host.nbytes)

    def test_unreachable_daemon(self):
        with self.assertRaises(gradsync.Unavailable) as cm:
            gradsync.Client("unix-abstract:gradsync-no-such-daemon", timeout=0.5)
        self.assertIn("no-such-daemon", str(cm.exception))


class Docs(unittest.TestCase):
    def test_help_is_useful(self):
        import pydoc
        text = pydoc.render_doc(gradsync, renderer=pydoc.plaintext)
        for word in ("allreduce", "open_session", "GradsyncError", "wait"):
            self.assertIn(word, text)


if __name__ == "__main__":
    unittest.main(verbosity=2)
