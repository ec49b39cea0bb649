"""torch's own distributed test suite (torch.testing._internal.distributed.
distributed_test, DistributedTest._DistTestBase, shipped with Debian's
python3-torch) against a backend, as torch's test_distributed_spawn.py runs it:

    /usr/bin/python3 tests/torch_suite/run_torch_suite.py --backend gradsync --world 3 [-k REGEX]

The skip rules are evaluated as for gloo (BACKEND=gloo while the suite is
imported), so that no failure hides as a skip; with --backend gradsync every
process group the suite makes is then a gradsync one (the default group and
new_group's), each rank on daemon LOCAL_RANK of $GRADSYNC_DAEMONS (a local
cluster: `gradsync cluster --ranks N`, which --cluster starts). CPU tests only
(no GPU here). Prints one line per test (PASS, FAIL, ERROR, SKIP) and a summary;
exits 1 if any failed.
"""

import argparse
import os
import re
import sys
import tempfile
import logging
import unittest

# Read once, at import, by the suite (its skip decorators) and by the ranks,
# which re-import this module (spawn).
os.environ.setdefault("BACKEND", "gloo")
os.environ.setdefault("WORLD_SIZE", "3")
os.environ.setdefault("TEMP_DIR", tempfile.mkdtemp(prefix="torch-suite-"))
os.environ.setdefault("GRADSYNC_TORCH_SUITE_BACKEND", "gloo")
# torch's test utilities import `expecttest`, which Debian does not package.
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "shim"))

import torch.distributed as dist  # noqa: E402
from torch.testing._internal.distributed.distributed_test import (  # noqa: E402
    DistributedTest, TestDistBackend)

_TARGET = os.environ["GRADSYNC_TORCH_SUITE_BACKEND"]
logging.disable(logging.INFO)  # c10d's and the harness's per-rank chatter


def _as_target(backend):
    """The suite asks for gloo; the run's backend is what it gets."""
    if _TARGET != "gloo" and backend is not None and str(backend).lower() == "gloo":
        return _TARGET
    return backend


if _TARGET == "gradsync":
    import importlib
    importlib.import_module("gradsync.torch")  # registers the backend "gradsync"

    _init, _new_group = dist.init_process_group, dist.new_group

    def _init_process_group(*args, backend=None, rank=-1, **kwargs):
        if rank is not None and rank >= 0:
            os.environ["LOCAL_RANK"] = str(rank)  # this rank's daemon in $GRADSYNC_DAEMONS
        return _init(*args, backend=_as_target(backend), rank=rank, **kwargs)

    def _new_group_as_target(*args, backend=None, **kwargs):
        return _new_group(*args, backend=_as_target(backend), **kwargs)

    dist.init_process_group = _init_process_group
    dist.new_group = _new_group_as_target
    # torch 1.13's dist.monitored_barrier refuses every backend but gloo;
    # gradsync offers the same call (docs/python.md).
    dist.monitored_barrier = importlib.import_module("gradsync.torch").monitored_barrier


class TestDistBackendWithSpawn(TestDistBackend, DistributedTest._DistTestBase):
    def setUp(self):
        super().setUp()
        self._spawn_processes()


class _Table(unittest.TextTestResult):
    def __init__(self, *a, **kw):
        super().__init__(*a, **kw)
        self.rows = []

    def _row(self, test, what, detail=""):
        name = test.id().split(".")[-1]
        self.rows.append((name, what, detail))
        print(f"{what:5} {name}{(': ' + detail) if detail else ''}", flush=True)

    def addSuccess(self, test):
        super().addSuccess(test)
        self._row(test, "PASS")

    @staticmethod
    def _why(err) -> str:
        """The line of a rank's error that says what went wrong (the suite relays
        whole tracebacks, C++ frames included)."""
        lines = [l.strip() for l in str(err[1]).strip().splitlines() if l.strip()]
        said = [l for l in lines if re.search(r"(Error|Exception|gradsync)\b.*:", l)
                and not l.startswith("frame #")]
        return (said[-1] if said else lines[-1] if lines else "")[:240]

    def addFailure(self, test, err):
        super().addFailure(test, err)
        self._row(test, "FAIL", self._why(err))

    def addError(self, test, err):
        super().addError(test, err)
        self._row(test, "ERROR", self._why(err))

    def addSkip(self, test, reason):
        super().addSkip(test, reason)
        self._row(test, "SKIP", reason[:120])


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--backend", default="gradsync", choices=["gradsync", "gloo"])
    ap.add_argument("--world", type=int, default=3)
    ap.add_argument("-k", "--pattern", default="", help="run the tests whose name matches")
    ap.add_argument("--list", action="store_true", help="only list the tests that would run")
    args = ap.parse_args()
    if os.environ["GRADSYNC_TORCH_SUITE_BACKEND"] != args.backend or \
            os.environ["WORLD_SIZE"] != str(args.world):
        # The module-level settings are read at import (here and in every
        # rank): run again with them in the environment.
        env = dict(os.environ, GRADSYNC_TORCH_SUITE_BACKEND=args.backend,
                   WORLD_SIZE=str(args.world))
        os.execve(sys.executable, [sys.executable] + sys.argv, env)
    if args.backend == "gradsync" and "GRADSYNC_DAEMONS" not in os.environ:
        sys.exit("run_torch_suite: set GRADSYNC_DAEMONS (gradsync cluster --ranks N --env_file F)")
    names = sorted(n for n in unittest.defaultTestLoader.getTestCaseNames(TestDistBackendWithSpawn)
                   if re.search(args.pattern, n))
    if args.list:
        print("\n".join(names))
        return
    suite = unittest.TestSuite(TestDistBackendWithSpawn(n) for n in names)
    runner = unittest.TextTestRunner(resultclass=_Table, verbosity=0, stream=open(os.devnull, "w"))
    result = runner.run(suite)
    counts = {k: sum(1 for r in result.rows if r[1] == k) for k in ("PASS", "FAIL", "ERROR", "SKIP")}
    print(f"# {args.backend} at world size {args.world}: {len(result.rows)} tests: " +
          ", ".join(f"{v} {k.lower()}" for k, v in counts.items()))
    sys.exit(0 if counts["FAIL"] == counts["ERROR"] == 0 else 1)


if __name__ == "__main__":
    main()
